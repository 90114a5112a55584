"""Surface elements, areas and distances (DeepMind surface-distance semantics, used by PANTHER)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from rexmle_grade.metrics.overlap import dice
from rexmle_grade.metrics.surface_elements import (
    CORNERS,
    average_surface_distances,
    code_of,
    mean_average_surface_distance,
    neighbour_code_areas,
    neighbourhood_codes,
    robust_hausdorff,
    surface_dice,
    surface_distances,
)

SQRT3 = math.sqrt(3.0)


def summary(gt: np.ndarray, pred: np.ndarray, spacing: tuple[float, float, float]) -> dict[str, float]:
    sd = surface_distances(gt, pred, spacing)
    return {"msd": surface_dice(sd, 5.0), "hd95": robust_hausdorff(sd, 95), "masd": mean_average_surface_distance(sd)}


# ---- the code table, by hand ------------------------------------------------------------------------------------
@pytest.mark.parametrize("spacing", [(1.0, 1.0, 1.0), (0.7, 1.3, 2.9), (3.0, 1.19, 1.19)])
def test_single_corner_is_a_triangle_through_three_edge_midpoints(spacing: tuple[float, float, float]) -> None:
    a, b, c = spacing
    # vertices (a/2, 0, 0), (0, b/2, 0), (0, 0, c/2): half the norm of the cross product
    expected = math.sqrt((b * c) ** 2 + (a * c) ** 2 + (a * b) ** 2) / 8
    areas = neighbour_code_areas(spacing)
    for corner in CORNERS:
        assert areas[code_of([corner])] == pytest.approx(expected, rel=1e-12)
        assert areas[255 - code_of([corner])] == pytest.approx(expected, rel=1e-12)


def test_faces_edges_and_uniform_cells() -> None:
    s = (0.7, 1.3, 2.9)
    areas = neighbour_code_areas(s)
    assert areas[0] == 0.0
    assert areas[255] == 0.0
    for axis in range(3):
        others = [s[k] for k in range(3) if k != axis]
        half = [c for c in CORNERS if c[axis] == 1]
        # four corners on one side: a flat cut through the cell, perpendicular to ``axis``
        assert areas[code_of(half)] == pytest.approx(others[0] * others[1], rel=1e-12)
        # two corners joined along ``axis``: a rectangle of length s[axis], width half the diagonal of the others
        edge = [c for c in CORNERS if all(c[k] == 1 for k in range(3) if k != axis)]
        assert areas[code_of(edge)] == pytest.approx(s[axis] * 0.5 * math.hypot(*others), rel=1e-12)


def test_ambiguous_and_non_planar_codes_at_unit_spacing() -> None:
    areas = neighbour_code_areas((1.0, 1.0, 1.0))
    # two corners on a face diagonal: kept apart, two corner triangles (also for the complement)
    diagonal = code_of([(0, 0, 0), (0, 1, 1)])
    assert areas[diagonal] == pytest.approx(2 * SQRT3 / 8)
    assert areas[255 - diagonal] == pytest.approx(2 * SQRT3 / 8)
    # four alternating corners: four corner triangles
    assert areas[code_of([(0, 0, 0), (0, 1, 1), (1, 0, 1), (1, 1, 0)])] == pytest.approx(4 * SQRT3 / 8)
    # a corner and its three neighbours: the regular hexagon of side sqrt(1/2), planar
    assert areas[code_of([(1, 1, 1), (1, 1, 0), (1, 0, 1), (0, 1, 1)])] == pytest.approx(3 * SQRT3 / 4)
    # three corners of a face: a non-planar pentagon; the largest triangulation is the triangle in the plane
    # x0 = 1/2 (area 1/2) plus a planar trapezoid in x0 + x1 + x2 = 3/2 (area 3 sqrt(3) / 8); other splits are smaller
    assert areas[code_of([(1, 1, 1), (1, 1, 0), (1, 0, 1)])] == pytest.approx(0.5 + 3 * SQRT3 / 8)


def test_a_code_and_its_complement_have_the_same_area() -> None:
    areas = neighbour_code_areas((0.6, 1.7, 2.3))
    assert np.allclose(areas, areas[::-1], rtol=1e-12, atol=0)
    assert (areas[1:255] > 0).all()


def test_single_voxel_surface_is_an_octahedron() -> None:
    mask = np.zeros((3, 3, 3), bool)
    mask[1, 1, 1] = True
    codes = neighbourhood_codes(mask)
    assert codes.shape == (4, 4, 4)
    border = (codes != 0) & (codes != 255)
    assert np.count_nonzero(border) == 8
    assert neighbour_code_areas((1.0, 1.0, 1.0))[codes[border]].sum() == pytest.approx(SQRT3)


# ---- distances, by hand ------------------------------------------------------------------------------------------
def one_voxel(shape: tuple[int, int, int], index: tuple[int, int, int]) -> np.ndarray:
    mask = np.zeros(shape, bool)
    mask[index] = True
    return mask


def test_perfect_prediction() -> None:
    gt = np.zeros((5, 6, 7), bool)
    gt[1:4, 2:5, 1:6] = True
    assert summary(gt, gt.copy(), (2.0, 1.0, 0.5)) == {"msd": 1.0, "hd95": 0.0, "masd": 0.0}


def test_shifted_single_voxel() -> None:
    # corners of the voxel at z=0 lie at z in {0, 1}, those of the voxel at z=2 at z in {2, 3}: every surfel has the
    # same area; half the distances are 1 * 2 mm, half 2 * 2 mm
    gt = one_voxel((4, 2, 2), (0, 0, 0))
    pred = one_voxel((4, 2, 2), (2, 0, 0))
    sd = surface_distances(gt, pred, (2.0, 1.0, 1.0))
    assert list(sd.gt_to_pred) == [2.0] * 4 + [4.0] * 4
    assert list(sd.pred_to_gt) == [2.0] * 4 + [4.0] * 4
    assert robust_hausdorff(sd, 95) == 4.0
    assert robust_hausdorff(sd, 50) == 2.0  # cumulative fraction reaches exactly 0.5 at the 4th surfel
    assert average_surface_distances(sd) == (3.0, 3.0)
    assert mean_average_surface_distance(sd) == 3.0
    assert surface_dice(sd, 2.0) == 0.5  # the tolerance is inclusive
    assert surface_dice(sd, 1.999) == 0.0
    assert surface_dice(sd, 5.0) == 1.0


def test_empty_masks_follow_the_library() -> None:
    gt = one_voxel((3, 3, 3), (1, 1, 1))
    empty = np.zeros_like(gt)
    both = surface_distances(empty, empty, (1.0, 1.0, 1.0))
    assert both.gt_to_pred.size == both.pred_to_gt.size == 0
    assert robust_hausdorff(both, 95) == math.inf
    assert math.isnan(mean_average_surface_distance(both))
    assert math.isnan(surface_dice(both, 5.0))

    missed = surface_distances(gt, empty, (1.0, 1.0, 1.0))  # prediction empty: gt->pred distances are +inf
    assert np.isinf(missed.gt_to_pred).all() and missed.gt_to_pred.size == 8
    assert robust_hausdorff(missed, 95) == math.inf
    gt_to_pred, pred_to_gt = average_surface_distances(missed)
    assert gt_to_pred == math.inf and math.isnan(pred_to_gt)
    assert surface_dice(missed, 5.0) == 0.0


def test_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        surface_distances(np.zeros((2, 2, 2)), np.zeros((2, 2, 3)), (1, 1, 1))
    with pytest.raises(ValueError, match="3-D"):
        surface_distances(np.zeros((2, 2)), np.zeros((2, 2)), (1, 1, 1))
    with pytest.raises(ValueError, match="3 values"):
        surface_distances(np.zeros((2, 2, 2)), np.zeros((2, 2, 2)), (1, 1))


# ---- worked examples of metrics/isles_panther.md (numbers printed by the official code) ---------------------------
def cube_6() -> np.ndarray:
    gt = np.zeros((6, 6, 6), bool)
    gt[1:4, 1:4, 1:4] = True
    return gt


def test_worked_example_1_axis_order() -> None:
    gt = cube_6()
    official = (1.0, 1.0, 3.0)  # SimpleITK (sx, sy, sz) applied to the (z, y, x) array
    physical = (3.0, 1.0, 1.0)
    along_z = np.roll(gt, 1, axis=0)
    along_x = np.roll(gt, 1, axis=2)
    assert dice(gt, along_z, empty=math.nan) == pytest.approx(0.6666666667, abs=1e-10)
    assert summary(gt, along_z, official) == pytest.approx({"msd": 1.0, "hd95": 1.0, "masd": 0.3993979497}, abs=1e-10)
    assert summary(gt, along_z, physical) == pytest.approx({"msd": 1.0, "hd95": 3.0, "masd": 0.5893700275}, abs=1e-10)
    assert summary(gt, along_x, official) == pytest.approx({"msd": 1.0, "hd95": 3.0, "masd": 0.5893700275}, abs=1e-10)
    assert summary(gt, along_x, physical) == pytest.approx({"msd": 1.0, "hd95": 1.0, "masd": 0.3993979497}, abs=1e-10)


def test_worked_example_3_surface_dice_below_one() -> None:
    gt = np.zeros((3, 3, 8), bool)
    pred = np.zeros((3, 3, 8), bool)
    gt[1, 1, 1:4] = True
    pred[1, 1, 4:7] = True
    assert dice(gt, pred, empty=math.nan) == 0.0
    assert summary(gt, pred, (2.0, 2.0, 2.0)) == pytest.approx({"msd": 0.8827938108, "hd95": 6.0, "masd": 3.0},
                                                               abs=1e-10)


def test_worked_example_4_cases() -> None:
    gt = np.zeros((3, 4, 4), bool)
    gt[1, 1:3, 1:3] = True
    grown = gt.copy()
    grown[1, 1, 3] = True
    single = one_voxel((3, 4, 4), (1, 1, 1))
    spacing = (1.0, 1.0, 2.0)
    assert dice(gt, grown, empty=math.nan) == pytest.approx(0.8888888889, abs=1e-10)
    assert summary(gt, grown, spacing) == pytest.approx({"msd": 1.0, "hd95": 2.0, "masd": 0.0660172060}, abs=1e-10)
    assert dice(gt, single, empty=math.nan) == pytest.approx(0.4)
    assert summary(gt, single, spacing) == pytest.approx({"msd": 1.0, "hd95": 2.0, "masd": 0.3277371850}, abs=1e-10)


def test_worked_example_5_empty_ground_truth() -> None:
    pred = cube_6()
    result = summary(np.zeros_like(pred), pred, (1.0, 1.0, 3.0))
    assert result["msd"] == 0.0
    assert result["hd95"] == math.inf
    assert math.isnan(result["masd"])


# ---- a slow, straightforward reference on tiny volumes ----------------------------------------------------------
def reference_surfels(mask: np.ndarray, spacing: tuple[float, float, float]) -> list[tuple[np.ndarray, float]]:
    """(position in mm, area) of every surfel: explicit loops over corners and their eight voxels, whole array."""
    areas = neighbour_code_areas(spacing)
    surfels = []
    for corner in itertools.product(*(range(n + 1) for n in mask.shape)):
        inside = []
        for offset in CORNERS:
            voxel = tuple(c - 1 + o for c, o in zip(corner, offset, strict=True))
            if all(0 <= v < n for v, n in zip(voxel, mask.shape, strict=True)) and mask[voxel]:
                inside.append(offset)
        code = code_of(inside)
        if 0 < code < 255:
            surfels.append((np.array(corner, float) * np.array(spacing), float(areas[code])))
    return surfels


def reference_directed(source: list[tuple[np.ndarray, float]],
                       target: list[tuple[np.ndarray, float]]) -> list[tuple[float, float]]:
    """(distance to the nearest target surfel, area) for every source surfel, sorted."""
    found = []
    for point, area in source:
        nearest = min((math.dist(point, other) for other, _ in target), default=math.inf)
        found.append((nearest, area))
    return sorted(found)


def reference_percentile(pairs: list[tuple[float, float]], percent: float) -> float:
    total = sum(area for _, area in pairs)
    running = 0.0
    for distance, area in pairs:
        running += area
        if running / total >= percent / 100:
            return distance
    return pairs[-1][0]


def reference_metrics(gt: np.ndarray, pred: np.ndarray, spacing: tuple[float, float, float]) -> dict[str, float]:
    gt_surfels, pred_surfels = reference_surfels(gt, spacing), reference_surfels(pred, spacing)
    forward = reference_directed(gt_surfels, pred_surfels)
    backward = reference_directed(pred_surfels, gt_surfels)
    both = forward + backward
    mean_forward = sum(d * a for d, a in forward) / sum(a for _, a in forward)
    mean_backward = sum(d * a for d, a in backward) / sum(a for _, a in backward)
    return {
        "msd": sum(a for d, a in both if d <= 5.0) / sum(a for _, a in both),
        "hd95": max(reference_percentile(forward, 95), reference_percentile(backward, 95)),
        "masd": (mean_forward + mean_backward) / 2,
    }


@pytest.mark.parametrize("seed", range(12))
def test_matches_the_slow_reference_on_random_volumes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(3, 8, size=3))
    spacing = tuple(float(s) for s in rng.uniform(0.4, 3.5, size=3))
    gt = rng.random(shape) < rng.uniform(0.1, 0.5)
    pred = rng.random(shape) < rng.uniform(0.1, 0.5) if seed % 2 else np.roll(gt, 1, axis=seed % 3)
    gt[0, 0, 0] = True  # never empty
    pred[-1, -1, -1] = True
    assert summary(gt, pred, spacing) == pytest.approx(reference_metrics(gt, pred, spacing), abs=1e-6)


def test_cropping_does_not_change_distances() -> None:
    rng = np.random.default_rng(99)
    gt = rng.random((4, 5, 3)) < 0.4
    pred = rng.random((4, 5, 3)) < 0.4
    padded_gt = np.zeros((9, 12, 10), bool)
    padded_pred = np.zeros((9, 12, 10), bool)
    padded_gt[3:7, 4:9, 5:8] = gt
    padded_pred[3:7, 4:9, 5:8] = pred
    spacing = (1.5, 0.8, 2.2)
    assert summary(padded_gt, padded_pred, spacing) == pytest.approx(summary(gt, pred, spacing), abs=1e-12)
