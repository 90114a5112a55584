"""Metric behaviours at their edges, on tiny hand-made arrays: shape checks, empty-mask and degenerate-case rules,
counts worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rexmle_grade.metrics import instances, surface
from rexmle_grade.metrics.correlation import CorrelationScores, absolute_correlations
from rexmle_grade.metrics.overlap import dice, dice_from_counts, iou

# ---- overlap --------------------------------------------------------------------------------------------------


def test_overlap_metrics_reject_masks_of_different_shapes() -> None:
    a, b = np.ones((2, 3), bool), np.ones((3, 2), bool)
    with pytest.raises(ValueError, match=r"mask shapes differ: \(2, 3\) vs \(3, 2\)"):
        dice(a, b, empty=1.0)
    with pytest.raises(ValueError, match="mask shapes differ"):
        iou(a, np.ones((1, 3), bool), empty=1.0)  # would broadcast silently without the check


def test_dice_and_iou_count_overlap_of_nonzero_voxels() -> None:
    a = np.array([[2, 2, 0, 0]])
    b = np.array([[0, 4, 4, 0]])  # any non-zero value is foreground (2 & 4 == 2 & True == 0: no bitwise shortcut)
    assert dice(a, b, empty=0.0) == pytest.approx(2 * 1 / (2 + 2))
    assert iou(a, b, empty=0.0) == pytest.approx(1 / 3)
    c = np.array([[0, 0, 1, 1]])
    assert dice(a, c, empty=1.0) == 0.0 and iou(a, c, empty=1.0) == 0.0
    assert dice(a, a, empty=0.0) == 1.0 and iou(a, a, empty=0.0) == 1.0
    one_sided = np.zeros_like(a)
    assert dice(a, one_sided, empty=1.0) == 0.0 and iou(one_sided, a, empty=1.0) == 0.0


def test_two_empty_masks_score_the_callers_convention() -> None:
    empty = np.zeros((3, 3), np.uint8)
    assert dice(empty, empty, empty=1.0) == 1.0 and dice(empty, empty, empty=0.5) == 0.5
    assert iou(empty, empty, empty=1.0) == 1.0 and math.isnan(iou(empty, empty, empty=math.nan))


def test_dice_from_pooled_counts() -> None:
    assert dice_from_counts(3, 10, empty=1.0) == pytest.approx(0.6)
    assert dice_from_counts(0, 0, empty=0.25) == 0.25
    assert dice_from_counts(0, 4, empty=1.0) == 0.0


# ---- correlation ----------------------------------------------------------------------------------------------


def test_a_perfectly_reversed_predictor_scores_three() -> None:
    scores = absolute_correlations(np.array([3.0, 2.0, 1.0, 0.0]), np.array([0.0, 1.0, 2.0, 3.0]))
    assert (scores.plcc, scores.srocc, scores.krocc) == pytest.approx((1.0, 1.0, 1.0))
    assert scores.score == pytest.approx(3.0) and not scores.undefined


def test_the_score_is_the_sum_of_the_three_absolute_correlations() -> None:
    assert CorrelationScores(0.5, 0.25, 0.125, undefined=False).score == 0.875
    prediction = np.array([1.0, 3.0, 2.0, 5.0, 4.0])
    reference = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    scores = absolute_correlations(prediction, reference)
    assert scores.plcc == pytest.approx(0.8) and scores.srocc == pytest.approx(0.8)
    assert scores.krocc == pytest.approx(0.6) and scores.score == pytest.approx(2.2)


def test_two_values_are_enough_and_a_unit_range_is_not_constant() -> None:
    scores = absolute_correlations(np.array([0.0, 1.0]), np.array([5.0, 6.0]))  # ranges of exactly 1
    assert not scores.undefined and scores.score == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("prediction", "reference"),
    [
        ([2.0], [1.0]),  # fewer than two values
        ([], []),
        ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]),  # constant prediction
        ([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]),  # constant reference
    ],
)
def test_undefined_correlations_count_zero_and_are_flagged(prediction: list[float], reference: list[float]) -> None:
    scores = absolute_correlations(np.array(prediction), np.array(reference))
    assert (scores.plcc, scores.srocc, scores.krocc, scores.undefined) == (0.0, 0.0, 0.0, True)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_one_undefined_correlation_counts_zero_while_the_others_count() -> None:
    # an infinite prediction makes Pearson's r NaN; the rank correlations are still defined
    scores = absolute_correlations(np.array([1.0, 2.0, 3.0, np.inf]), np.array([1.0, 2.0, 3.0, 4.0]))
    assert scores.undefined and scores.plcc == 0.0
    assert scores.srocc == pytest.approx(1.0) and scores.krocc == pytest.approx(1.0)


def test_predictions_and_references_of_different_lengths_are_rejected() -> None:
    with pytest.raises(ValueError, match="differ in length: 3 vs 2"):
        absolute_correlations(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0]))
    # shapes are flattened first: a column and a row of the same length are comparable
    assert absolute_correlations(np.array([[1.0], [2.0], [3.0]]), np.array([1.0, 2.0, 3.0])).score == pytest.approx(3)


# ---- instances (NeurIPS CellSeg F1) ---------------------------------------------------------------------------


def test_instances_are_renumbered_in_order_with_background_kept() -> None:
    labels = np.array([[0, 7, 7], [3, 0, 9]], dtype=np.uint16)
    compact, n = instances.compact_instances(labels)
    assert n == 3 and compact.tolist() == [[0, 2, 2], [1, 0, 3]] and compact.dtype == np.int32
    mask, n_mask = instances.compact_instances(np.array([[True, False]]))
    assert n_mask == 1 and mask.tolist() == [[1, 0]]


def test_degenerate_label_images_have_no_instances() -> None:
    for labels in (np.zeros((0, 4), np.int32), np.zeros((3, 3), np.uint8)):
        compact, n = instances.compact_instances(labels)
        assert n == 0 and compact.shape == labels.shape and not compact.any()


def test_label_images_must_hold_non_negative_integers() -> None:
    with pytest.raises(ValueError, match="must be integers, got float64"):
        instances.compact_instances(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="non-negative"):
        instances.compact_instances(np.array([[0, -1]]))


def test_instances_touching_the_border_frame_are_deleted() -> None:
    labels = np.zeros((7, 7), np.int32)
    labels[3, 3] = 5  # inside the 2-pixel frame
    labels[1, 3] = 6  # in the frame (top)
    labels[3, 6] = 7  # in the frame (right)
    labels[5, 2:4] = 8  # touches the bottom frame with one pixel
    compact, n = instances.compact_instances(labels, border=2)
    assert n == 1 and compact[3, 3] == 1 and np.count_nonzero(compact) == 1
    assert instances.compact_instances(labels, border=0)[1] == 4
    framed_only = np.zeros((5, 5), np.int32)
    framed_only[0, 0] = 1
    assert instances.compact_instances(framed_only, border=1)[1] == 0


def test_huge_instance_ids_are_compacted_like_small_ones() -> None:
    big = 1 << 25  # above the lookup-table limit: the sorting path
    labels = np.zeros((6, 6), np.int64)
    labels[2, 2], labels[3, 3], labels[0, 0] = big + 5, 9, big + 9  # the largest id lies in the frame
    compact, n = instances.compact_instances(labels, border=1)
    assert n == 2 and compact[3, 3] == 1 and compact[2, 2] == 2 and compact[0, 0] == 0
    small = np.where(labels == big + 5, 20, np.where(labels == big + 9, 30, labels))
    assert instances.compact_instances(small, border=1)[0].tolist() == compact.tolist()


def test_the_overlap_table_holds_the_iou_of_every_overlapping_pair() -> None:
    gt = np.array([[1, 1, 1, 0, 2, 2]])
    pred = np.array([[1, 1, 0, 0, 0, 2]])
    table = instances.overlap_table(gt, pred, 2, 2)
    pairs = {(int(r), int(c)): float(v) for r, c, v in zip(table.rows, table.cols, table.iou, strict=True)}
    assert pairs == {(0, 0): pytest.approx(2 / 3), (1, 1): pytest.approx(1 / 2)}
    assert instances.overlap_table(gt, np.zeros_like(pred), 2, 0).iou.size == 0
    assert instances.overlap_table(np.zeros_like(gt), pred, 0, 2).iou.size == 0
    with pytest.raises(ValueError, match="differ in shape"):
        instances.overlap_table(gt, pred[:, :5], 2, 2)


def test_thresholds_must_lie_in_the_unit_interval_open_at_zero() -> None:
    table = instances.overlap_table(np.array([[1]]), np.array([[1]]), 1, 1)
    assert instances.hungarian_true_positives(table, [1.0]) == [1]
    for bad in (0.0, 1.01, -0.5):
        with pytest.raises(ValueError, match="must lie in"):
            instances.hungarian_true_positives(table, [0.5, bad])


def test_one_to_one_matching_counts_each_instance_once() -> None:
    # gt 1 overlaps pred 1 (IoU 3/4) and pred 2 (IoU 1/4); gt 2 overlaps pred 2 only (IoU 2/4)
    gt = np.array([[1, 1, 1, 1, 2, 2, 0, 0]])
    pred = np.array([[1, 1, 1, 2, 2, 2, 0, 3]])
    table = instances.overlap_table(gt, pred, 2, 3)
    assert instances.hungarian_true_positives(table, [0.25, 0.5, 0.75, 0.8]) == [2, 2, 1, 0]
    lone = instances.overlap_table(np.array([[1, 0, 2]]), np.array([[1, 0, 2]]), 2, 2)
    assert instances.hungarian_true_positives(lone, [0.5, 1.0]) == [2, 2]
    empty = instances.overlap_table(np.zeros((1, 3), int), np.zeros((1, 3), int), 0, 0)
    assert instances.hungarian_true_positives(empty, [0.5, 0.9]) == [0, 0]


def test_the_assignment_prefers_a_pair_at_the_threshold_over_a_larger_total_iou() -> None:
    # gt A overlaps P with IoU exactly 0.5 and Q with 1/3; gt B overlaps P with 1/3. Matching A-Q and B-P has the
    # larger IoU sum (2/3) but no true positive; the official cost counts pairs at or above the threshold first.
    gt = np.array([[1] * 12 + [2] * 4])
    pred = np.array([[2] * 4 + [1] * 12])
    counts = instances.match_counts(np.pad(gt, 3), np.pad(pred, 3), [0.5])
    assert counts == [instances.MatchCounts(1, 2, 2)]


def test_f1_is_zero_without_true_positives_and_the_harmonic_mean_otherwise() -> None:
    assert instances.MatchCounts(0, 0, 0).f1 == 0.0 and instances.MatchCounts(0, 3, 2).f1 == 0.0
    assert instances.MatchCounts(2, 4, 2).f1 == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert instances.MatchCounts(1, 2, 3) + instances.MatchCounts(2, 3, 4) == instances.MatchCounts(3, 5, 7)


def test_cellseg_f1_is_rounded_to_four_decimals_per_threshold() -> None:
    gt = np.zeros((12, 12), np.int32)
    pred = np.zeros_like(gt)
    gt[3:6, 3:6], pred[3:6, 3:6] = 1, 1  # a perfect match
    gt[7:9, 7:9] = 2  # missed
    gt[3:6, 7:9] = 3  # missed
    f1 = instances.cellseg_f1(gt, pred, thresholds=(0.5, 0.9))
    assert f1 == {0.5: 0.5, 0.9: 0.5}
    gt[3:6, 3:9] = 1  # one instance of 18 pixels, half predicted (IoU 0.5): a TP at 0.5 only
    pred[3:6, 3:6] = 1
    assert instances.cellseg_f1(gt, pred, thresholds=(0.5, 0.6)) == {0.5: round(2 / 3, 4), 0.6: 0.0}


def test_cellseg_counts_need_two_2d_label_images_of_one_shape() -> None:
    with pytest.raises(ValueError, match="two 2-D label images of one shape"):
        instances.cellseg_match_counts(np.zeros((4, 4, 1), int), np.zeros((4, 4, 1), int))
    with pytest.raises(ValueError, match="two 2-D label images of one shape"):
        instances.cellseg_match_counts(np.zeros((4, 4), int), np.zeros((4, 5), int))


def test_large_images_are_scored_per_tile_with_a_frame_around_every_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instances, "TILE_SIZE", 10)
    monkeypatch.setattr(instances, "TILING_MIN_PIXELS", 15 * 15)
    gt = np.zeros((15, 15), np.int32)
    gt[4:6, 4:6] = 1  # inside tile (0, 0)
    gt[4:6, 9:11] = 2  # across the tile edge: in the frame of both tiles, deleted
    gt[12, 12] = 3  # inside tile (1, 1), away from its frame (the padding puts the frame beyond the image)
    pred = gt.copy()
    counts = instances.cellseg_match_counts(gt, pred, thresholds=(0.5,))
    assert counts == [instances.MatchCounts(2, 2, 2)]
    small = gt[:14, :15].copy()  # fewer pixels than the limit: one image with one frame, where instance 2 is kept
    small[12, 12] = 0
    assert instances.cellseg_match_counts(small, small.copy(), thresholds=(0.5,)) == [instances.MatchCounts(2, 2, 2)]


# ---- surface distances ----------------------------------------------------------------------------------------


def _brute_nearest(targets: np.ndarray, queries: np.ndarray, spacing: tuple[float, ...]) -> np.ndarray:
    from scipy.spatial.distance import cdist

    scale = np.asarray(spacing, dtype=float)
    return cdist(queries * scale, targets * scale).min(axis=1)


def _brute_contour(mask: np.ndarray) -> np.ndarray:
    from scipy import ndimage

    padded = np.pad(mask.astype(bool), 1)
    eroded = ndimage.binary_erosion(padded, structure=np.ones((3,) * mask.ndim, bool))
    return (padded & ~eroded)[(slice(1, -1),) * mask.ndim]


@pytest.mark.parametrize("far_queries", [3, 400])  # a few far queries (k-d tree) or many (feature transform)
def test_nearest_distances_are_exact_near_and_far(far_queries: int) -> None:
    rng = np.random.default_rng(far_queries)
    shape, spacing = (30, 40, 50), (2.0, 1.0, 0.5)
    targets = np.array([[2, 3, 4], [3, 3, 4], [2, 5, 6]])
    near = targets[rng.integers(0, 3, 20)] + rng.integers(-3, 4, size=(20, 3))
    far = np.stack([rng.integers(15, 30, far_queries), rng.integers(25, 40, far_queries),
                    rng.integers(30, 50, far_queries)], axis=1)
    queries = np.clip(np.concatenate([near, far]), 0, np.array(shape) - 1)
    got = surface.nearest_distances(targets, queries, shape, spacing)
    assert got == pytest.approx(_brute_nearest(targets, queries, spacing))
    assert surface.nearest_distances(targets, np.zeros((0, 3), int), shape, spacing).size == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_order_statistics_equal_the_sorted_distances_with_many_far_queries(seed: int) -> None:
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, 6, size=(30, 3))
    queries = np.concatenate([rng.integers(0, 8, size=(200, 3)), rng.integers(20, 60, size=(6000, 3))])
    spacing = (1.0, 0.7, 1.3)
    ordered = np.sort(_brute_nearest(targets, queries, spacing))
    n = queries.shape[0]
    ranks = [np.array([0, 1, 199]), np.array([n // 2, n // 2 + 1]), np.array([n - 2, n - 1])]
    got = surface.order_statistics(targets, queries, ranks, spacing)
    for group, values in zip(ranks, got, strict=True):
        assert values == pytest.approx(ordered[group])


def test_contour_is_the_mask_voxels_with_a_background_neighbour_outside_counting_as_background() -> None:
    rng = np.random.default_rng(3)
    for shape in ((9, 10), (6, 7, 8)):
        mask = rng.random(shape) < 0.6
        assert np.array_equal(surface.contour(mask), _brute_contour(mask))
    thin = np.ones((2, 5, 5), bool)  # thinner than 3 voxels: every voxel touches the outside
    assert surface.contour(thin).all()
    indices = surface.contour_voxels(np.pad(np.ones((3, 3), bool), 2))
    assert sorted(map(tuple, indices.tolist())) == [(r, c) for r in (2, 3, 4) for c in (2, 3, 4) if (r, c) != (3, 3)]
    assert surface.contour_voxels(np.zeros((3, 3), bool)).shape == (0, 2)


def test_hausdorff_distances_match_a_brute_force_reference() -> None:
    rng = np.random.default_rng(7)
    a = np.zeros((20, 24, 18), bool)
    b = np.zeros_like(a)
    a[4:12, 5:15, 3:10] = True
    b[6:14, 4:12, 5:12] = True
    b[17, 20, 15] = True  # a stray voxel far away
    a |= rng.random(a.shape) < 0.01
    spacing = (1.5, 1.0, 0.8)
    edge_a, edge_b = np.argwhere(_brute_contour(a)), np.argwhere(_brute_contour(b))
    ab, ba = _brute_nearest(edge_b, edge_a, spacing), _brute_nearest(edge_a, edge_b, spacing)
    pair = surface.contour_hausdorff(a, b, spacing)
    assert pair.hd95 == pytest.approx(max(np.percentile(ab, 95), np.percentile(ba, 95)))
    assert pair.hd == pytest.approx(max(ab.max(), ba.max()))
    directed = surface.directed_contour_distances(a, b, spacing)
    assert np.sort(directed[0]) == pytest.approx(np.sort(ab)) and np.sort(directed[1]) == pytest.approx(np.sort(ba))
    all_a, all_b = np.argwhere(a), np.argwhere(b)
    expected = max(_brute_nearest(all_b, all_a, spacing).max(), _brute_nearest(all_a, all_b, spacing).max())
    assert surface.max_hausdorff(a, b, spacing) == pytest.approx(expected)
    assert surface.max_hausdorff(a, a, spacing) == 0.0


def test_surface_distances_need_two_non_empty_masks_of_one_shape_and_a_spacing_per_axis() -> None:
    a = np.zeros((4, 4), bool)
    a[1, 1] = True
    with pytest.raises(ValueError, match="mask shapes differ"):
        surface.contour_hausdorff(a, a[:3], (1.0, 1.0))
    with pytest.raises(ValueError, match="does not match a 2-D mask"):
        surface.max_hausdorff(a, a, (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="two non-empty masks"):
        surface.contour_hausdorff(a, np.zeros_like(a), (1.0, 1.0))


def test_the_grid_diagonal_joins_opposite_corner_voxel_centres() -> None:
    assert surface.grid_diagonal((4, 5), (2.0, 1.0)) == pytest.approx(math.hypot(6.0, 4.0))
    assert surface.grid_diagonal((1, 1, 1), (3.0, 3.0, 3.0)) == 0.0
