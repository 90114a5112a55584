"""Contour distances (HD95/HD, Metrics Reloaded) and the all-voxel maximum Hausdorff distance."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import SimpleITK as sitk
from scipy.spatial.distance import cdist

from rexmle_grade.metrics.overlap import dice
from rexmle_grade.metrics.surface import (
    contour,
    contour_hausdorff,
    contour_voxels,
    directed_contour_distances,
    grid_diagonal,
    max_hausdorff,
    nearest_distances,
)


# ---- slow references -----------------------------------------------------------------------------------------
def brute_contour(mask: np.ndarray) -> np.ndarray:
    """Voxels with a background voxel among their 26 neighbours, by explicit shifts of a padded copy."""
    padded = np.pad(mask.astype(bool), 1)
    out = np.zeros(mask.shape, bool)
    inner = tuple(slice(1, n + 1) for n in mask.shape)
    for offset in itertools.product((-1, 0, 1), repeat=mask.ndim):
        shifted = tuple(slice(1 + o, n + 1 + o) for o, n in zip(offset, mask.shape, strict=True))
        out |= ~padded[shifted]
    return out & padded[inner]


def brute_hd(a: np.ndarray, b: np.ndarray, spacing: tuple[float, ...]) -> tuple[float, float]:
    """(HD95, HD) from all pairwise contour distances (float64)."""
    pa = np.argwhere(brute_contour(a)) * np.asarray(spacing)
    pb = np.argwhere(brute_contour(b)) * np.asarray(spacing)
    d = cdist(pa, pb)
    d_ab, d_ba = d.min(axis=1), d.min(axis=0)
    return (max(np.percentile(d_ab, 95), np.percentile(d_ba, 95)), max(d_ab.max(), d_ba.max()))


def official_sitk_hd(a: np.ndarray, b: np.ndarray, spacing_zyx: tuple[float, ...]) -> tuple[float, float]:
    """The official TopCoW/TopBrain pipeline: pad, LabelContour(fullyConnected), |SignedMaurer| maps (float32)."""

    def image(mask: np.ndarray) -> sitk.Image:
        img = sitk.GetImageFromArray(mask.astype(np.uint8))
        img.SetSpacing(tuple(float(s) for s in reversed(spacing_zyx)))
        return sitk.ConstantPad(img, [1, 1, 1], [1, 1, 1], 0)

    def surface(img: sitk.Image) -> tuple[sitk.Image, np.ndarray]:
        edge = sitk.LabelContour(img, fullyConnected=True)
        dist = sitk.Abs(sitk.SignedMaurerDistanceMap(edge, squaredDistance=False, useImageSpacing=True))
        return dist, sitk.GetArrayFromImage(edge).astype(bool)

    dist_a, edge_a = surface(image(a))
    dist_b, edge_b = surface(image(b))
    d_ab = sitk.GetArrayFromImage(dist_b)[edge_a]
    d_ba = sitk.GetArrayFromImage(dist_a)[edge_b]
    return (max(np.percentile(d_ab, 95), np.percentile(d_ba, 95)), max(d_ab.max(), d_ba.max()))


def brute_max_hd(a: np.ndarray, b: np.ndarray, spacing: tuple[float, ...]) -> float:
    d = cdist(np.argwhere(a) * np.asarray(spacing), np.argwhere(b) * np.asarray(spacing))
    return float(max(d.min(axis=1).max(), d.min(axis=0).max()))


def random_blobs(rng: np.random.Generator, shape: tuple[int, ...], density: float) -> np.ndarray:
    from scipy import ndimage

    noise = ndimage.gaussian_filter(rng.random(shape), 1.0)
    mask = noise > np.quantile(noise, 1 - density)
    if not mask.any():
        mask[tuple(rng.integers(0, n) for n in shape)] = True
    return mask


# ---- contour -------------------------------------------------------------------------------------------------
def test_contour_of_a_cube_is_its_shell() -> None:
    mask = np.zeros((6, 6, 6), bool)
    mask[1:5, 1:5, 1:5] = True
    shell = mask.copy()
    shell[2:4, 2:4, 2:4] = False
    assert np.array_equal(contour(mask), shell)


def test_contour_voxels_are_indices_into_the_whole_array() -> None:
    mask = np.zeros((5, 6, 7), bool)
    mask[3, 2, 4] = mask[1, 5, 6] = True
    assert sorted(map(tuple, contour_voxels(mask))) == [(1, 5, 6), (3, 2, 4)]
    assert contour_voxels(np.zeros((2, 2, 2), bool)).shape == (0, 3)


def test_contour_treats_outside_the_array_as_background() -> None:
    full = np.ones((3, 4, 5), bool)
    expected = full.copy()
    expected[1, 1:3, 1:4] = False
    assert np.array_equal(contour(full), expected)


def test_contour_matches_sitk_label_contour_on_random_masks() -> None:
    rng = np.random.default_rng(0)
    for _ in range(10):
        mask = random_blobs(rng, (7, 9, 8), 0.4)
        padded = sitk.ConstantPad(sitk.GetImageFromArray(mask.astype(np.uint8)), [1, 1, 1], [1, 1, 1], 0)
        official = sitk.GetArrayFromImage(sitk.LabelContour(padded, fullyConnected=True))[1:-1, 1:-1, 1:-1]
        assert np.array_equal(contour(mask), official.astype(bool))
        assert np.array_equal(contour(mask), brute_contour(mask))


@pytest.mark.parametrize(("n_far", "path"), [(0, "near"), (40, "far k-d tree"), (600, "feature transform")])
def test_nearest_distances_on_every_search_path(n_far: int, path: str) -> None:
    # targets: a small cube in one corner of a 40^3 box (64000 voxels: more than 250 far queries switch to the
    # feature transform); queries: 30 voxels near the cube plus n_far voxels at least 16 voxels away from it
    rng = np.random.default_rng(n_far)
    targets = np.zeros((40, 40, 40), bool)
    targets[2:6, 3:7, 1:5] = True
    near = rng.integers(0, 10, (30, 3))
    far = rng.integers(24, 40, (n_far, 3))
    queries = np.concatenate([near, far])
    spacing = (0.7, 1.1, 0.4)
    expected = cdist(queries * np.asarray(spacing), np.argwhere(targets) * np.asarray(spacing)).min(axis=1)
    found = nearest_distances(np.argwhere(targets), queries, targets.shape, spacing)
    assert found == pytest.approx(expected, abs=1e-9), path
    assert nearest_distances(np.argwhere(targets), np.zeros((0, 3), int), targets.shape, spacing).shape == (0,)


def test_speckled_prediction_far_from_the_truth_matches_brute_force() -> None:
    # many isolated false positives far from a small ground truth: the feature-transform path of both distances
    rng = np.random.default_rng(9)
    gt = np.zeros((30, 30, 30), bool)
    gt[1:4, 1:4, 1:4] = True
    pred = gt.copy()
    pred[15:, 15:, 15:] = rng.random((15, 15, 15)) < 0.2
    spacing = (1.5, 0.8, 0.8)
    pair = contour_hausdorff(gt, pred, spacing)
    assert (pair.hd95, pair.hd) == pytest.approx(brute_hd(gt, pred, spacing), abs=1e-9)
    assert max_hausdorff(gt, pred, spacing) == pytest.approx(brute_max_hd(gt, pred, spacing), abs=1e-9)


# ---- hand-computed HD95 / HD -------------------------------------------------------------------------------------
def test_identical_masks_have_zero_distance() -> None:
    mask = np.zeros((5, 6, 7), bool)
    mask[1:4, 2:5, 1:6] = True
    pair = contour_hausdorff(mask, mask, (1.0, 2.0, 3.0))
    assert (pair.hd95, pair.hd) == (0.0, 0.0)
    assert max_hausdorff(mask, mask, (1.0, 2.0, 3.0)) == 0.0


def test_shifted_bar() -> None:
    # two 1-voxel-thick bars of length 4 along x, the second shifted by 2 voxels in x (spacing 0.5 mm in x)
    a = np.zeros((1, 1, 8), bool)
    b = np.zeros((1, 1, 8), bool)
    a[0, 0, 0:4] = True
    b[0, 0, 2:6] = True
    d_ab, d_ba = directed_contour_distances(a, b, (1.0, 1.0, 0.5))
    assert sorted(d_ab) == [0.0, 0.0, 0.5, 1.0]
    assert sorted(d_ba) == [0.0, 0.0, 0.5, 1.0]
    pair = contour_hausdorff(a, b, (1.0, 1.0, 0.5))
    assert pair.hd == 1.0
    assert pair.hd95 == pytest.approx(0.5 + 0.85 * 0.5)  # p95 of [0, 0, 0.5, 1] interpolates between 0.5 and 1


def test_empty_masks_have_no_distances() -> None:
    mask = np.zeros((3, 3, 3), bool)
    other = mask.copy()
    other[1, 1, 1] = True
    for a, b in ((mask, other), (other, mask), (mask, mask)):
        with pytest.raises(ValueError, match="non-empty"):
            contour_hausdorff(a, b, (1.0, 1.0, 1.0))
        with pytest.raises(ValueError, match="non-empty"):
            max_hausdorff(a, b, (1.0, 1.0, 1.0))


def test_shape_and_spacing_mismatch() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        contour_hausdorff(np.ones((2, 2, 2), bool), np.ones((2, 2, 3), bool), (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="spacing"):
        contour_hausdorff(np.ones((2, 2, 2), bool), np.ones((2, 2, 2), bool), (1.0, 1.0))


# ---- worked examples (values printed by the official code) ----------------------------------------------------
def test_topcow_e1_hd95_of_the_shortened_bar() -> None:
    # topcow.md §5 E1: GT label 1 at x=0..3, prediction at x=0..2 (y=1, z=1): HD95 0.85, HD 1.0
    gt = np.zeros((3, 3, 7), bool)
    pred = gt.copy()
    gt[1, 1, 0:4] = True
    pred[1, 1, 0:3] = True
    pair = contour_hausdorff(gt, pred, (1.0, 1.0, 1.0))
    assert pair.hd95 == pytest.approx(0.85)
    assert pair.hd == pytest.approx(1.0)


@pytest.mark.parametrize(("spacing_xyz", "expected"), [((1.0, 1.0, 1.0), (2.7835, 4.2426)),
                                                       ((0.5, 0.5, 2.0), (1.3917, 2.1213))])
def test_topbrain_e2_symmetric_hd95_with_spacing(spacing_xyz: tuple[float, ...], expected: tuple[float, float]) -> None:
    # topbrain_sega.md §1.6 E2: 3x3 square vs the square shifted +1 in x plus an outlier at (row 7, col 7)
    gt = np.zeros((1, 8, 8), bool)
    pred = gt.copy()
    gt[0, 2:5, 2:5] = True
    pred[0, 2:5, 3:6] = True
    pred[0, 7, 7] = True
    spacing = tuple(reversed(spacing_xyz))
    for a, b in ((gt, pred), (pred, gt)):
        pair = contour_hausdorff(a, b, spacing)
        assert (pair.hd95, pair.hd) == pytest.approx(expected, abs=1e-4)


def test_seg_a_worked_example() -> None:
    # topbrain_sega.md §2.3: spacing (0.8, 0.8, 1.5); 4x4 block on z=1-2; prediction minus its first column plus
    # one voxel at (z=3, y=1, x=1): DSC 0.8421, HD 1.5 mm
    gt = np.zeros((5, 6, 6), bool)
    gt[1:3, 1:5, 1:5] = True
    pred = gt.copy()
    pred[1:3, 1:5, 1] = False
    pred[3, 1, 1] = True
    assert dice(gt, pred, empty=1.0) == pytest.approx(48 / 57)
    assert dice(gt, pred, empty=1.0) == pytest.approx(0.8421, abs=1e-4)
    assert max_hausdorff(gt, pred, (1.5, 0.8, 0.8)) == pytest.approx(1.5)


# ---- fast path vs slow references on random cases -------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_contour_hausdorff_matches_brute_force_and_sitk(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(4, 12, 3))
    spacing = tuple(float(s) for s in rng.uniform(0.3, 2.0, 3))
    a = random_blobs(rng, shape, rng.uniform(0.05, 0.5))
    b = random_blobs(rng, shape, rng.uniform(0.05, 0.5))
    pair = contour_hausdorff(a, b, spacing)
    brute = brute_hd(a, b, spacing)
    assert (pair.hd95, pair.hd) == pytest.approx(brute, abs=1e-6)
    official = official_sitk_hd(a, b, spacing)  # float32 distance maps: ~1e-6 relative
    assert (pair.hd95, pair.hd) == pytest.approx(official, abs=1e-5, rel=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_max_hausdorff_matches_brute_force_and_sitk(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    shape = tuple(int(n) for n in rng.integers(4, 12, 3))
    spacing = tuple(float(s) for s in rng.uniform(0.3, 2.0, 3))
    a = random_blobs(rng, shape, rng.uniform(0.05, 0.5))
    b = random_blobs(rng, shape, rng.uniform(0.05, 0.5))
    ours = max_hausdorff(a, b, spacing)
    assert ours == pytest.approx(brute_max_hd(a, b, spacing), abs=1e-6)
    images = []
    for mask in (a, b):
        img = sitk.GetImageFromArray(mask.astype(np.uint8))
        img.SetSpacing(tuple(reversed(spacing)))
        images.append(img)
    hausdorff = sitk.HausdorffDistanceImageFilter()
    hausdorff.Execute(*images)
    assert ours == pytest.approx(hausdorff.GetHausdorffDistance(), abs=1e-6)


def test_max_hausdorff_sees_a_far_interior_voxel() -> None:
    # the farthest prediction voxel from a hollow ground truth is the centre of the solid prediction, not its surface
    gt = np.zeros((9, 9, 9), bool)
    gt[0:9, 0:9, 0:9] = True
    gt[1:8, 1:8, 1:8] = False
    pred = np.ones((9, 9, 9), bool)
    assert max_hausdorff(gt, pred, (1.0, 1.0, 1.0)) == pytest.approx(4.0)
    assert max_hausdorff(gt, pred, (1.0, 1.0, 1.0)) == pytest.approx(brute_max_hd(gt, pred, (1.0, 1.0, 1.0)))


def test_grid_diagonal() -> None:
    assert grid_diagonal((3, 4, 5), (2.0, 1.0, 0.5)) == pytest.approx(math.sqrt(16 + 9 + 4))
