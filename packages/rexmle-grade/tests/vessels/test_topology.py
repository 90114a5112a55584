"""clDice, Betti-0 and label adjacency, with slow references (whole-array skeletons, per-label dilations)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage
from skimage import measure
from skimage.morphology import skeletonize

from rexmle_grade.metrics.overlap import dice
from rexmle_grade.metrics.topology import betti0, betti0_error, cldice, label_adjacency, skeleton


# ---- slow references -----------------------------------------------------------------------------------------
def reference_cldice(gt: np.ndarray, pred: np.ndarray) -> float:
    """The official recipe on whole (x, y, z)-transposed arrays, no cropping."""
    g, p = gt.T.astype(bool), pred.T.astype(bool)

    def score(skel: np.ndarray, image: np.ndarray) -> float:
        return 0.0 if skel.sum() == 0 else float((skel & image).sum() / skel.sum())

    tprec, tsens = score(skeletonize(p), g), score(skeletonize(g), p)
    return 0.0 if tprec + tsens == 0 else 2 * tprec * tsens / (tprec + tsens)


def reference_adjacency(labels: np.ndarray) -> dict[int, frozenset[int]]:
    """Per label: the labels found in its 26-dilation minus itself (zero-padded)."""
    padded = np.pad(labels, 1)
    cube = np.ones((3, 3, 3), bool)
    found = {}
    for label in np.unique(labels[labels > 0]):
        mask = padded == label
        ring = ndimage.binary_dilation(mask, cube) & ~mask
        found[int(label)] = frozenset(int(v) for v in np.unique(padded[ring]) if v != 0)
    return found


def random_tubes(rng: np.random.Generator, shape: tuple[int, int, int], n: int) -> np.ndarray:
    """A few random 1-2 voxel thick polylines: thin structures whose skeletons are not trivial."""
    mask = np.zeros(shape, bool)
    for _ in range(n):
        start, end = rng.uniform(0, np.array(shape) - 1), rng.uniform(0, np.array(shape) - 1)
        for t in np.linspace(0, 1, 60):
            centre = np.round(start + t * (end - start)).astype(int)
            lo = np.maximum(centre - rng.integers(0, 2), 0)
            mask[lo[0]:centre[0] + 1, lo[1]:centre[1] + 1, lo[2]:centre[2] + 1] = True
    return mask


# ---- clDice -------------------------------------------------------------------------------------------------
def test_topcow_e1_cldice_of_bars() -> None:
    # topcow.md §5 E1: skeletons are the voxels themselves; Tprec = Tsens = 3/4
    gt = np.zeros((3, 3, 7), bool)
    pred = gt.copy()
    gt[1, 1, 0:4] = True
    pred[1, 1, 0:3] = True
    pred[1, 1, 5] = True
    assert cldice(gt, pred) == pytest.approx(0.75)


def test_topbrain_e5_t_shape() -> None:
    # topbrain_sega.md §1.6 E5: GT = T (row 1 cols 1-5 plus col 3 rows 1-5), prediction = top bar: Dice 0.7143,
    # clDice 0.6667 (in every orientation of the slice)
    gt = np.zeros((3, 7, 7), bool)
    gt[1, 1, 1:6] = True
    gt[1, 1:6, 3] = True
    pred = np.zeros((3, 7, 7), bool)
    pred[1, 1, 1:6] = True
    assert dice(gt, pred, empty=0.0) == pytest.approx(0.7143, abs=1e-4)
    for axes in ((0, 1, 2), (1, 0, 2), (2, 1, 0)):
        assert cldice(gt.transpose(axes), pred.transpose(axes)) == pytest.approx(2 / 3)


def test_cldice_conventions() -> None:
    empty = np.zeros((5, 5, 5), bool)
    solid = empty.copy()
    solid[1:4, 1:4, 1:4] = True
    assert cldice(empty, empty) == 0.0
    assert cldice(solid, empty) == 0.0
    assert cldice(empty, solid) == 0.0
    assert cldice(solid, solid) == 1.0
    tiny = empty.copy()
    tiny[1:3, 1:3, 1:3] = True  # Lee thinning erases a 2x2x2 cube: both skeletons empty -> 0
    assert cldice(tiny, tiny) == 0.0
    with pytest.raises(ValueError, match="shapes differ"):
        cldice(solid, solid[:3])


@pytest.mark.parametrize("seed", range(5))
def test_cropped_skeletons_equal_whole_array_skeletons(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = (14, 18, 16)
    gt, pred = random_tubes(rng, shape, 3), random_tubes(rng, shape, 3)
    pred |= ndimage.binary_dilation(gt, iterations=1) & (rng.random(shape) < 0.5)
    assert np.array_equal(skeleton(gt), skeletonize(gt.T).T)
    assert cldice(gt, pred) == pytest.approx(reference_cldice(gt, pred), abs=1e-12)


def test_skeleton_axis_order_is_x_y_z() -> None:
    # Lee thinning is not axis-symmetric: the skeleton must be the one of the (x, y, z) array
    rng = np.random.default_rng(3)
    blob = ndimage.binary_dilation(random_tubes(rng, (12, 14, 16), 4), iterations=2)
    assert np.array_equal(skeleton(blob), skeletonize(np.ascontiguousarray(blob.T)).T)


# ---- Betti-0 ------------------------------------------------------------------------------------------------
def test_betti0_uses_26_connectivity() -> None:
    mask = np.zeros((4, 4, 4), bool)
    assert betti0(mask) == 0
    mask[0, 0, 0] = mask[1, 1, 1] = True  # corner-touching: one component
    assert betti0(mask) == 1
    mask[3, 3, 3] = True
    assert betti0(mask) == 2
    assert betti0_error(mask, np.zeros_like(mask)) == 2
    assert betti0_error(np.zeros_like(mask), mask) == 2


def test_betti0_matches_skimage_label() -> None:
    rng = np.random.default_rng(8)
    for _ in range(5):
        mask = rng.random((9, 10, 11)) < 0.15
        assert betti0(mask) == measure.label(mask, connectivity=3, return_num=True)[1]


# ---- adjacency ----------------------------------------------------------------------------------------------
def test_topbrain_e3_adjacency() -> None:
    labels = np.zeros((3, 4, 5), np.uint8)
    labels[1] = [[0, 0, 0, 0, 33], [0, 0, 0, 0, 0], [1, 1, 1, 2, 2], [0, 5, 0, 0, 0]]
    assert label_adjacency(labels) == {1: frozenset({2, 5}), 2: frozenset({1}), 5: frozenset({1}), 33: frozenset()}


def test_adjacency_of_diagonal_neighbours_and_empty_maps() -> None:
    labels = np.zeros((3, 3, 3), np.uint8)
    assert label_adjacency(labels) == {}
    labels[0, 0, 0], labels[1, 1, 1], labels[2, 2, 0] = 4, 6, 9
    assert label_adjacency(labels) == {4: frozenset({6}), 6: frozenset({4, 9}), 9: frozenset({6})}
    with pytest.raises(ValueError, match="3-D"):
        label_adjacency(labels[0])


@pytest.mark.parametrize("seed", range(5))
def test_adjacency_matches_per_label_dilation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = (rng.integers(1, 7, (8, 9, 10)) * (rng.random((8, 9, 10)) < 0.25)).astype(np.uint8)
    assert label_adjacency(labels) == reference_adjacency(labels)
