"""NeurIPS-CellSeg instance F1: worked example, hand-computed cases, tiling, and a brute-force reference."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from rexmle_grade.metrics import instances
from rexmle_grade.metrics.instances import (
    CELLSEG_THRESHOLDS,
    MatchCounts,
    cellseg_f1,
    cellseg_match_counts,
    compact_instances,
    hungarian_true_positives,
    overlap_table,
)


def worked_example() -> tuple[np.ndarray, np.ndarray]:
    """Image ``im1`` of the metrics page (cellseg_puma.md §1)."""
    gt = np.zeros((12, 12), dtype=np.uint16)
    gt[0:2, 0:4] = 3
    gt[3:7, 3:7] = 1
    gt[3:7, 8:10] = 2
    pred = np.zeros((12, 12), dtype=np.uint16)
    pred[3:7, 3:6] = 5
    pred[3:8, 8:10] = 7
    pred[8:10, 4:6] = 9
    pred[10:12, 9:11] = 11
    return gt, pred


def test_worked_example_per_image_and_mean():
    gt, pred = worked_example()
    counts = cellseg_match_counts(gt, pred)
    assert [(c.n_gt, c.n_pred) for c in counts] == [(2, 3)] * 5
    assert [c.tp for c in counts] == [2, 2, 2, 1, 0]
    im1 = cellseg_f1(gt, pred)
    assert im1 == {0.5: 0.8, 0.6: 0.8, 0.7: 0.8, 0.8: 0.4, 0.9: 0.0}
    empty = np.zeros((12, 12), dtype=np.uint16)
    im2 = cellseg_f1(empty, empty)
    assert im2 == dict.fromkeys(CELLSEG_THRESHOLDS, 0.0)
    means = {t: (im1[t] + im2[t]) / 2 for t in CELLSEG_THRESHOLDS}
    assert means == pytest.approx({0.5: 0.4, 0.6: 0.4, 0.7: 0.4, 0.8: 0.2, 0.9: 0.0})


def square(shape=(16, 16), top=5, left=5, size=4, label=1) -> np.ndarray:
    image = np.zeros(shape, dtype=np.int32)
    image[top:top + size, left:left + size] = label
    return image


def test_perfect_prediction_scores_one_whatever_the_ids():
    gt = square() + square(top=10, left=10, size=3, label=2)
    pred = np.where(gt == 1, 40, np.where(gt == 2, 7, 0))
    assert cellseg_f1(gt, pred) == dict.fromkeys(CELLSEG_THRESHOLDS, 1.0)


def test_empty_prediction_empty_truth_and_both_empty_score_zero():
    cell, empty = square(), np.zeros((16, 16), dtype=np.int32)
    for gt, pred in ((cell, empty), (empty, cell), (empty, empty)):
        assert set(cellseg_f1(gt, pred).values()) == {0.0}


def test_shifted_cell_hits_up_to_its_iou():
    # a 4x4 cell shifted by one column: intersection 12, union 20, IoU 0.6 (>= 0.6 counts)
    f1 = cellseg_f1(square(), square(left=6))
    assert f1 == {0.5: 1.0, 0.6: 1.0, 0.7: 0.0, 0.8: 0.0, 0.9: 0.0}


def test_two_pixel_frame_removes_cells_on_both_sides_independently():
    gt = square(top=1, left=6)  # touches row 1: removed
    pred = square(top=2, left=6)  # starts at row 2: kept
    counts = cellseg_match_counts(gt, pred)[0]
    assert (counts.tp, counts.n_gt, counts.n_pred) == (0, 0, 1)
    # the right/bottom frame is columns/rows W-2 and W-1
    assert compact_instances(square(left=10, size=4), border=2)[1] == 1  # columns 10..13 of 16: kept
    assert compact_instances(square(left=11, size=4), border=2)[1] == 0  # reaches column 14: removed


def test_disconnected_id_is_one_instance_and_f1_is_rounded():
    gt = square() + square(top=10, left=10, size=2, label=1)  # one id in two pieces (20 px)
    pred = square(label=3)  # covers the 16-px piece only: IoU 0.8
    assert cellseg_f1(gt, pred)[0.8] == 1.0
    assert cellseg_f1(gt, pred)[0.9] == 0.0
    # 3 true cells, 7 predictions, all matched 3: P 3/7, R 1 -> F1 0.6 exactly; 2 of 3 -> 2*(2/7*2/3)/(2/7+2/3)
    counts = MatchCounts(tp=2, n_gt=3, n_pred=7)
    assert counts.f1 == pytest.approx(0.4)
    assert MatchCounts(tp=1, n_gt=3, n_pred=3).f1 == pytest.approx(1 / 3)
    gt3 = sum((square((20, 20), 3 + 5 * k, 3, 3, k + 1) for k in range(3)), np.zeros((20, 20), dtype=np.int32))
    pred3 = gt3.copy()
    pred3[3:6, 12:15] = 9  # one extra prediction: P 3/4, R 1, F1 6/7 = 0.857142... -> 0.8571
    assert cellseg_f1(gt3, pred3)[0.5] == 0.8571


def test_hungarian_beats_greedy_below_half():
    # GT a overlaps predictions x (IoU 0.4) and y (0.45); GT b overlaps only y (0.35): greedy by IoU gives
    # a-y (1 TP at 0.3), the assignment a-x, b-y gives 2
    table = instances.OverlapTable(2, 2, np.array([0, 0, 1]), np.array([0, 1, 1]), np.array([0.4, 0.45, 0.35]))
    assert hungarian_true_positives(table, [0.3, 0.4, 0.5]) == [2, 1, 0]


def test_large_images_are_tiled(monkeypatch):
    # shrink the tiling constants so the official tiling rule can be checked by hand on a 15x15 image
    monkeypatch.setattr(instances, "TILE_SIZE", 10)
    monkeypatch.setattr(instances, "TILING_MIN_PIXELS", 200)
    gt = np.zeros((15, 15), dtype=np.int32)
    gt[4:7, 4:7] = 1  # inside tile (0, 0): kept
    gt[8:12, 3:6] = 2  # crosses the tile line at row 10: dropped from both maps
    gt[4:7, 12:15] = 3  # touches the right image edge, not a tile line (padded to 20): kept
    gt[0:3, 12:14] = 4  # touches the top edge: dropped
    pred = gt.copy()
    counts = cellseg_match_counts(gt, pred, (0.5,))[0]
    assert (counts.tp, counts.n_gt, counts.n_pred) == (2, 2, 2)
    # below the pixel threshold the same image is scored whole: cell 2 is kept, cells 3 and 4 touch the frame
    monkeypatch.setattr(instances, "TILING_MIN_PIXELS", 226)
    counts = cellseg_match_counts(gt, pred, (0.5,))[0]
    assert (counts.tp, counts.n_gt, counts.n_pred) == (2, 2, 2)
    whole = cellseg_match_counts(gt[:, :11], pred[:, :11], (0.5,))[0]
    assert (whole.n_gt, whole.n_pred) == (2, 2)


def test_huge_ids_take_the_sorting_path():
    gt = square(label=1)
    pred = square(label=2**31 - 1).astype(np.int64)
    pred[12:14, 12:14] = 2**30
    compact, n = compact_instances(pred)
    assert n == 2 and set(np.unique(compact)) == {0, 1, 2}
    assert cellseg_f1(gt, pred)[0.9] == pytest.approx(round(2 * 0.5 * 1 / 1.5, 4))


# ---- brute-force reference: the official algorithm written out literally --------------------------------------
def reference_remove_border(mask: np.ndarray) -> np.ndarray:
    mask = mask.copy()
    height, width = mask.shape
    frame_ids = set()
    for r in range(height):
        for c in range(width):
            if (r < 2 or r >= height - 2 or c < 2 or c >= width - 2) and mask[r, c] != 0:
                frame_ids.add(int(mask[r, c]))
    for i in frame_ids:
        mask[mask == i] = 0
    renumbered = np.zeros_like(mask)
    for new, old in enumerate(sorted(set(np.unique(mask)) - {0}), start=1):
        renumbered[mask == old] = new
    return renumbered


def reference_counts(gt: np.ndarray, pred: np.ndarray, threshold: float) -> tuple[int, int, int]:
    gt, pred = reference_remove_border(gt), reference_remove_border(pred)
    n_gt, n_pred = int(gt.max()), int(pred.max())
    if n_pred == 0 or n_gt == 0:
        return 0, n_gt, n_pred
    iou = np.zeros((n_gt, n_pred))
    for i in range(1, n_gt + 1):
        for j in range(1, n_pred + 1):
            inter = 0
            union = 0
            for a, b in zip(gt.ravel(), pred.ravel(), strict=True):
                inter += a == i and b == j
                union += a == i or b == j
            iou[i - 1, j - 1] = inter / union
    cost = -(iou >= threshold).astype(float) - iou / (2 * min(n_gt, n_pred))
    rows, cols = linear_sum_assignment(cost)
    return int(np.count_nonzero(iou[rows, cols] >= threshold)), n_gt, n_pred


def reference_tiled_counts(gt: np.ndarray, pred: np.ndarray, threshold: float, tile: int) -> tuple[int, int, int]:
    height, width = gt.shape
    padded_h, padded_w = -(-height // tile) * tile, -(-width // tile) * tile
    gt_pad = np.zeros((padded_h, padded_w), dtype=gt.dtype)
    pred_pad = np.zeros_like(gt_pad)
    gt_pad[:height, :width] = gt
    pred_pad[:height, :width] = pred
    total = np.zeros(3, dtype=int)
    for i in range(0, padded_h, tile):
        for j in range(0, padded_w, tile):
            total += reference_counts(gt_pad[i:i + tile, j:j + tile], pred_pad[i:i + tile, j:j + tile], threshold)
    return int(total[0]), int(total[1]), int(total[2])


def random_instances(rng: np.random.Generator, shape: tuple[int, int], n: int) -> np.ndarray:
    image = np.zeros(shape, dtype=np.int32)
    ids = rng.choice(np.arange(1, 60), size=n, replace=False)
    for label in ids:
        h, w = rng.integers(2, 6, size=2)
        top, left = rng.integers(0, shape[0] - h + 1), rng.integers(0, shape[1] - w + 1)
        image[top:top + h, left:left + w] = label
    return image


@pytest.mark.parametrize("seed", range(12))
def test_matches_brute_force_reference(seed):
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(10, 20)), int(rng.integers(10, 20)))
    gt = random_instances(rng, shape, int(rng.integers(0, 7)))
    pred = np.where(rng.random(shape) < 0.9, gt, 0) if seed % 3 == 0 else random_instances(rng, shape, 6)
    thresholds = (0.1, 0.3, 0.5, 0.7)
    fast = instances.match_counts(gt, pred, thresholds)
    for t, counts in zip(thresholds, fast, strict=True):
        ref_tp, ref_gt, ref_pred = reference_counts(gt, pred, t)
        assert (counts.tp, counts.n_gt, counts.n_pred) == (ref_tp, ref_gt, ref_pred)
        expected_f1 = 0.0 if ref_tp == 0 else 2 * ref_tp / (ref_gt + ref_pred)
        assert counts.f1 == pytest.approx(expected_f1, abs=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_tiling_matches_brute_force_reference(seed, monkeypatch):
    monkeypatch.setattr(instances, "TILE_SIZE", 12)
    monkeypatch.setattr(instances, "TILING_MIN_PIXELS", 100)
    rng = np.random.default_rng(100 + seed)
    shape = (int(rng.integers(14, 26)), int(rng.integers(14, 26)))
    gt = random_instances(rng, shape, 8)
    pred = random_instances(rng, shape, 8) if seed % 2 else np.where(rng.random(shape) < 0.85, gt, 0)
    for t, counts in zip((0.3, 0.5), cellseg_match_counts(gt, pred, (0.3, 0.5)), strict=True):
        assert (counts.tp, counts.n_gt, counts.n_pred) == reference_tiled_counts(gt, pred, t, 12)


def test_overlap_table_counts_pixels():
    gt, pred = worked_example()
    gt_c, n_gt = compact_instances(gt, border=2)
    pred_c, n_pred = compact_instances(pred, border=2)
    table = overlap_table(gt_c, pred_c, n_gt, n_pred)
    pairs = {(int(r), int(c)): float(v) for r, c, v in zip(table.rows, table.cols, table.iou, strict=True)}
    assert pairs == {(0, 0): 0.75, (1, 1): 0.8}


@pytest.mark.slow
def test_real_tiling_threshold_at_25_megapixels():
    # 5000 x 5000 = 25,000,000 pixels: tiled; a cell across the tile line at column 2000 is dropped
    gt = np.zeros((5000, 5000), dtype=np.uint16)
    gt[100:110, 100:110] = 1
    gt[100:110, 1995:2005] = 2
    pred = gt.copy()
    tiled = cellseg_match_counts(gt, pred, (0.5,))[0]
    assert (tiled.tp, tiled.n_gt, tiled.n_pred) == (1, 1, 1)
    whole = cellseg_match_counts(gt[:, :4999], pred[:, :4999], (0.5,))[0]
    assert (whole.tp, whole.n_gt, whole.n_pred) == (2, 2, 2)
