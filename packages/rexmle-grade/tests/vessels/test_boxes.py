"""Voxel boxes: closed-form (boundary) IoU against the official voxel-set definition, ROI parsing and cropping."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rexmle_grade.metrics.boxes import (
    VoxelBox,
    band_iou,
    boundary_iou,
    box_iou,
    crop_slices_zyx,
    mask_bounding_box,
    parse_roi_txt,
    union_box,
)


def band_voxels(box: VoxelBox, ratio: float) -> set[tuple[int, int, int]]:
    """Slow reference: the official ``boundary_points_with_distances`` voxel set, face slab by face slab."""
    widths = [math.ceil(s * ratio) for s in box.size]
    lo, hi = box.location, box.end
    ranges = [range(a, b + 1) for a, b in zip(lo, hi, strict=True)]
    found = set()
    for axis in range(3):
        for step in range(widths[axis]):
            for value in (lo[axis] + step, hi[axis] - step):
                slab = list(ranges)
                slab[axis] = range(value, value + 1)
                found.update((x, y, z) for x in slab[0] for y in slab[1] for z in slab[2])
    return found


def reference_band_iou(first: VoxelBox, second: VoxelBox, ratio: float) -> float:
    a, b = band_voxels(first, ratio), band_voxels(second, ratio)
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def box(location: tuple[int, int, int], size: tuple[int, int, int]) -> VoxelBox:
    return VoxelBox(location=location, size=size)


# ---- worked examples (topcow.md §3, printed by the official code) ----------------------------------------------
def test_shifted_cubes() -> None:
    first, second = box((0, 0, 0), (10, 10, 10)), box((2, 0, 0), (10, 10, 10))
    assert boundary_iou(first, second) == pytest.approx(512 / 1056)
    assert boundary_iou(first, second) == pytest.approx(0.484848, abs=1e-6)
    assert box_iou(first, second) == pytest.approx(800 / 1200)


def test_face_adjacent_boxes_score_zero() -> None:
    first, second = box((0, 0, 0), (10, 10, 10)), box((10, 0, 0), (10, 10, 10))
    assert boundary_iou(first, second) == 0.0
    assert box_iou(first, second) == 0.0


def test_box_strictly_inside() -> None:
    inner, outer = box((1, 1, 1), (3, 3, 3)), box((0, 0, 0), (5, 5, 5))
    assert boundary_iou(inner, outer) == 0.0
    assert box_iou(inner, outer) == pytest.approx(27 / 125)


# ---- hand-computed ---------------------------------------------------------------------------------------------
def test_identical_boxes() -> None:
    b = box((3, -2, 7), (9, 4, 15))
    assert boundary_iou(b, b) == 1.0
    assert box_iou(b, b) == 1.0


def test_band_widths() -> None:
    # ceil(0.2 * size): at least one voxel, at most half the box
    assert box((0, 0, 0), (15, 16, 1)).band_widths(0.2) == (3, 4, 1)
    assert box((0, 0, 0), (10, 2, 3)).band_widths(0.5) == (5, 1, 2)


def test_ratio_half_band_is_the_whole_box() -> None:
    rng = np.random.default_rng(5)
    for _ in range(50):
        a = box(tuple(rng.integers(-3, 5, 3)), tuple(rng.integers(1, 9, 3)))
        b = box(tuple(rng.integers(-3, 5, 3)), tuple(rng.integers(1, 9, 3)))
        assert band_iou(a, b, 0.5) == pytest.approx(box_iou(a, b), abs=1e-12)


def test_closed_form_matches_voxel_sets_on_random_boxes() -> None:
    rng = np.random.default_rng(11)
    for _ in range(120):
        a = box(tuple(rng.integers(-2, 6, 3)), tuple(rng.integers(1, 12, 3)))
        b = box(tuple(rng.integers(-2, 6, 3)), tuple(rng.integers(1, 12, 3)))
        for ratio in (0.2, 0.5, 0.1):
            assert band_iou(a, b, ratio) == pytest.approx(reference_band_iou(a, b, ratio), abs=1e-12)


def test_invalid_boxes() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        box((0, 0, 0), (3, 0, 3))
    with pytest.raises(ValueError, match="different lengths"):
        VoxelBox(location=(0, 0), size=(1, 1, 1))


# ---- ROI txt and crop -------------------------------------------------------------------------------------------
def test_parse_roi_txt() -> None:
    text = "--- ROI Meta Data ---\nSize (Voxels): 96 68 36\nLocation (Voxels): 103 93 77"
    roi = parse_roi_txt(text)
    assert roi == box((103, 93, 77), (96, 68, 36))
    assert roi.end == (198, 160, 112)
    assert parse_roi_txt(text + "\n") == roi


@pytest.mark.parametrize("text", ["--- ROI Meta Data ---\nSize (Voxels): 96 68\nLocation (Voxels): 1 2 3",
                                  "--- ROI Meta Data ---\nSize (Voxels): 96 68 36"])
def test_parse_roi_txt_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError):
        parse_roi_txt(text)


def test_crop_matches_the_documented_example() -> None:
    # ROI size (96, 68, 36) at (103, 93, 77) = nibabel arr[103:199, 93:161, 77:113]; numpy (z, y, x) reversed
    roi = box((103, 93, 77), (96, 68, 36))
    assert crop_slices_zyx(roi, (512, 512, 300)) == (slice(77, 113), slice(93, 161), slice(103, 199))


def test_crop_clips_like_the_official_code() -> None:
    # start = max(0, loc); end = min(dim - 1, start + size - 1): a negative location keeps the full size
    roi = box((-3, 5, 8), (4, 10, 10))
    assert crop_slices_zyx(roi, (20, 12, 14)) == (slice(8, 14), slice(5, 12), slice(0, 4))
    with pytest.raises(ValueError, match="outside"):
        crop_slices_zyx(box((30, 0, 0), (2, 2, 2)), (20, 12, 14))


def test_mask_bounding_box() -> None:
    mask = np.zeros((4, 5, 6), bool)
    assert mask_bounding_box(mask) is None
    mask[1, 2, 3] = mask[2, 4, 1] = True
    assert mask_bounding_box(mask) == (slice(1, 3), slice(2, 5), slice(1, 4))
    assert union_box(None, mask_bounding_box(mask)) == mask_bounding_box(mask)
    assert union_box((slice(0, 1), slice(3, 4)), (slice(2, 3), slice(1, 2))) == (slice(0, 3), slice(1, 4))
