"""ISLES'22 lesion metrics: worked examples, hand cases and a slow flood-fill reference."""

from __future__ import annotations

import itertools
from collections import deque

import numpy as np
import pytest

from rexmle_grade.io import Geometry
from rexmle_grade.metrics.lesions import absolute_volume_difference, detect_lesions, voxel_volume_ml
from rexmle_grade.metrics.overlap import dice


def rows(*lines: str) -> np.ndarray:
    """A (1, y, x) mask from lines of 0/1 digits."""
    return np.array([[[int(c) for c in line.split()] for line in lines]], dtype=np.uint8)


def spacing_geometry(spacing: tuple[float, float, float], direction: tuple[float, ...] | None = None) -> Geometry:
    return Geometry(size=(1, 1, 1), spacing=spacing, origin=(0.0, 0.0, 0.0), direction=direction)


def isles(gt: np.ndarray, pred: np.ndarray, spacing: tuple[float, float, float]) -> dict[str, float]:
    gt, pred = gt != 0, pred != 0
    lesions = detect_lesions(gt, pred)
    return {"dice": dice(gt, pred, empty=1.0), "lesion_f1": lesions.f1, "lesion_count_diff": lesions.count_difference,
            "abs_volume_diff": absolute_volume_difference(gt, pred, voxel_volume_ml(spacing_geometry(spacing)))}


# ---- worked examples of metrics/isles_panther.md -----------------------------------------------------------------
def test_worked_example_1() -> None:
    gt = rows("1 1 0 0 0 0", "0 0 0 0 0 0", "0 0 0 0 0 0", "0 0 0 0 1 1")
    pred = rows("0 1 1 0 0 0", "0 0 0 0 0 0", "1 0 0 0 0 0", "0 0 0 0 0 0")
    lesions = detect_lesions(gt, pred)
    assert (lesions.true_positives, lesions.false_negatives, lesions.false_positives) == (1, 1, 1)
    assert isles(gt, pred, (1, 1, 2)) == pytest.approx(
        {"dice": 0.2857142857, "lesion_f1": 0.5, "lesion_count_diff": 0, "abs_volume_diff": 0.002}, abs=1e-10)


def test_worked_example_2_corner_contact_is_one_lesion() -> None:
    gt = np.zeros((2, 2, 2), np.uint8)
    gt[0, 0, 0] = gt[1, 1, 1] = 1
    assert isles(gt, np.zeros_like(gt), (1, 1, 1)) == pytest.approx(
        {"dice": 0.0, "lesion_f1": 0.0, "lesion_count_diff": 1, "abs_volume_diff": 0.002}, abs=1e-12)


def test_worked_example_3_one_blob_over_two_lesions() -> None:
    gt = np.zeros((1, 4, 6), np.uint8)
    gt[0, 0, 0] = gt[0, 0, 3] = 1
    pred = np.zeros_like(gt)
    pred[0, 0, 0:4] = 1
    assert detect_lesions(gt, pred).true_positives == 2
    assert isles(gt, pred, (1, 1, 1)) == pytest.approx(
        {"dice": 0.6666666667, "lesion_f1": 1.0, "lesion_count_diff": 1, "abs_volume_diff": 0.002}, abs=1e-10)


def test_worked_example_4_empty_and_non_binary() -> None:
    empty = np.zeros((2, 3, 4), np.uint8)
    assert isles(empty, empty, (1, 1, 1)) == {"dice": 1.0, "lesion_f1": 1.0, "lesion_count_diff": 0,
                                              "abs_volume_diff": 0.0}
    gt = empty.copy()
    gt[1, 1, 1] = 1
    pred = empty.copy()
    pred[1, 1, 1] = 2
    assert isles(gt, pred, (1, 1, 1))["dice"] == 1.0


# ---- hand cases -----------------------------------------------------------------------------------------------------
def test_empty_on_one_side() -> None:
    lesion = np.zeros((3, 5, 5), np.uint8)
    lesion[0, 0, 0] = 1
    lesion[2, 3:5, 3:5] = 1  # two lesions, 5 voxels
    empty = np.zeros_like(lesion)
    missed = isles(lesion, empty, (1, 1, 1))
    assert missed == pytest.approx({"dice": 0.0, "lesion_f1": 0.0, "lesion_count_diff": 2, "abs_volume_diff": 0.005})
    invented = isles(empty, lesion, (1, 1, 1))
    assert invented == pytest.approx({"dice": 0.0, "lesion_f1": 0.0, "lesion_count_diff": 2,
                                      "abs_volume_diff": 0.005})


def test_perfect_and_shifted() -> None:
    gt = np.zeros((4, 6, 6), np.uint8)
    gt[1:3, 1:3, 1:3] = 1
    assert isles(gt, gt, (1, 1, 1)) == {"dice": 1.0, "lesion_f1": 1.0, "lesion_count_diff": 0, "abs_volume_diff": 0.0}
    apart = np.roll(gt, 3, axis=2)  # no overlap: one missed lesion, one false positive
    lesions = detect_lesions(gt, apart)
    assert (lesions.true_positives, lesions.false_negatives, lesions.false_positives) == (0, 1, 1)
    assert lesions.f1 == 0.0
    half = np.roll(gt, 1, axis=2)  # half overlap: detected, nothing false
    assert detect_lesions(gt, half).f1 == 1.0
    assert dice(gt, half, empty=1.0) == 0.5


def test_split_lesion_counts_once() -> None:
    gt = np.zeros((1, 1, 7), np.uint8)
    gt[0, 0, :] = 1
    pred = np.zeros_like(gt)
    pred[0, 0, [0, 2, 4, 6]] = 1
    lesions = detect_lesions(gt, pred)
    assert (lesions.true_positives, lesions.false_positives, lesions.false_negatives) == (1, 0, 0)
    assert lesions.count_difference == 3


def test_voxel_volume_from_the_header() -> None:
    assert voxel_volume_ml(spacing_geometry((1.0, 1.0, 2.0))) == pytest.approx(0.002)
    flipped = (0.0, -1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, -1.0)  # a signed permutation: |det| = 1
    assert voxel_volume_ml(spacing_geometry((0.5, 2.0, 3.0), flipped)) == pytest.approx(0.003)
    with pytest.raises(ValueError, match="spacing"):
        voxel_volume_ml(Geometry(size=(2, 2)))


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        detect_lesions(np.zeros((2, 2, 2)), np.zeros((2, 2, 3)))
    with pytest.raises(ValueError, match="shapes differ"):
        absolute_volume_difference(np.zeros((2, 2, 2)), np.zeros((2, 2, 3)), 0.001)


# ---- slow reference: breadth-first flood fill and the official per-lesion loops --------------------------------
NEIGHBOURS = [d for d in itertools.product((-1, 0, 1), repeat=3) if d != (0, 0, 0)]


def flood_labels(mask: np.ndarray) -> tuple[np.ndarray, int]:
    labels = np.zeros(mask.shape, int)
    count = 0
    for start in zip(*np.nonzero(mask), strict=True):
        if labels[start]:
            continue
        count += 1
        labels[start] = count
        queue = deque([start])
        while queue:
            voxel = queue.popleft()
            for step in NEIGHBOURS:
                other = tuple(v + s for v, s in zip(voxel, step, strict=True))
                inside = all(0 <= o < n for o, n in zip(other, mask.shape, strict=True))
                if inside and mask[other] and not labels[other]:
                    labels[other] = count
                    queue.append(other)
    return labels, count


def reference_f1_and_count(gt: np.ndarray, pred: np.ndarray) -> tuple[float, int]:
    gt_labels, n_gt = flood_labels(gt)
    pred_labels, n_pred = flood_labels(pred)
    tp = sum(1 for k in range(1, n_gt + 1) if (pred[gt_labels == k]).any())
    fn = n_gt - tp
    fp = sum(1 for k in range(1, n_pred + 1) if not (gt[pred_labels == k]).any())
    f1 = 1.0 if tp + fp + fn == 0 else tp / (tp + (fp + fn) / 2)
    return f1, abs(n_pred - n_gt)


@pytest.mark.parametrize("seed", range(15))
def test_matches_the_slow_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(2, 9, size=3))
    gt = rng.random(shape) < rng.uniform(0.0, 0.3)
    pred = rng.random(shape) < rng.uniform(0.0, 0.3)
    lesions = detect_lesions(gt, pred)
    f1, count = reference_f1_and_count(gt, pred)
    assert lesions.f1 == pytest.approx(f1, abs=1e-12)
    assert lesions.count_difference == count
