"""Instance-segmentation F1 at IoU thresholds, as computed by the NeurIPS 2022 Cell Segmentation challenge.

Reference: JunMa11/NeurIPS-CellSeg ``baseline/compute_metric.py`` @ 3128e96 (metrics page ``cellseg_puma.md`` §1).
Per image and threshold ``t``:

1. instances (0 = background, every other integer = one instance, not split into connected components) with a
   pixel in the outer frame 2 pixels wide are deleted, separately in the ground truth and the prediction, and the
   rest renumbered 1..n;
2. IoU of every ground-truth/prediction pair from pixel counts;
3. one-to-one Hungarian assignment minimising ``-[IoU >= t] - IoU / (2 min(n_gt, n_pred))``; TP = assigned pairs
   with IoU >= t;
4. F1 = 0 when TP = 0 (also when both images are empty), else the harmonic mean of TP/n_pred and TP/n_gt,
   rounded to 4 decimals.

Images with at least 25,000,000 pixels are zero-padded at the bottom/right to multiples of 2000, cut into
2000x2000 tiles, and steps 1-3 run per tile (frame removal around every tile); TP and instance counts are summed
over tiles before the F1.

Speed: the IoU table is a sparse contingency table of the overlapping pixels, and the assignment is solved per
connected component of the overlap graph (pairs without overlap cost 0, so they never change the optimum nor the
number of pairs at or above the threshold).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CELLSEG_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)
BORDER_WIDTH = 2
TILE_SIZE = 2000
TILING_MIN_PIXELS = 25_000_000
F1_DECIMALS = 4
# above this id a lookup table would cost more memory than sorting: compact through searchsorted instead
_MAX_LOOKUP_ID = 1 << 24


@dataclass(frozen=True)
class MatchCounts:
    """True positives and instance counts of one image (or tile) at one IoU threshold."""

    tp: int
    n_gt: int
    n_pred: int

    def __add__(self, other: MatchCounts) -> MatchCounts:
        return MatchCounts(self.tp + other.tp, self.n_gt + other.n_gt, self.n_pred + other.n_pred)

    @property
    def f1(self) -> float:
        """Unrounded F1; 0 whenever TP is 0 (the official rule, which also scores two empty images 0)."""
        if self.tp == 0:
            return 0.0
        precision = self.tp / self.n_pred
        recall = self.tp / self.n_gt
        return 2.0 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class OverlapTable:
    """Non-zero IoU entries between the instances of two compacted label images (ids 1..n_gt and 1..n_pred)."""

    n_gt: int
    n_pred: int
    rows: np.ndarray  # 0-based ground-truth index of each overlapping pair
    cols: np.ndarray  # 0-based prediction index
    iou: np.ndarray


def compact_instances(labels: np.ndarray, *, border: int = 0) -> tuple[np.ndarray, int]:
    """Renumber the instances of an integer label image to 1..n (0 stays background); returns (labels, n).

    With ``border > 0`` every instance having a pixel in the outer frame ``border`` pixels wide is deleted
    first. Ids keep their relative order, as ``skimage.segmentation.relabel_sequential`` does.
    """
    labels = np.asarray(labels)
    if labels.dtype == bool:
        labels = labels.view(np.uint8)
    if labels.dtype.kind not in "iu":
        raise ValueError(f"instance labels must be integers, got {labels.dtype}")
    if labels.size == 0:
        return np.zeros(labels.shape, dtype=np.int32), 0
    if labels.min() < 0:
        raise ValueError("instance labels must be non-negative")
    top = int(labels.max())
    if top <= _MAX_LOOKUP_ID:
        present = np.flatnonzero(np.bincount(labels.ravel(), minlength=top + 1))
    else:
        present = np.unique(labels)
    present = present[present != 0]
    if border > 0 and present.size:
        frame = np.concatenate([
            labels[:border].ravel(), labels[-border:].ravel(), labels[:, :border].ravel(), labels[:, -border:].ravel()
        ])
        present = np.setdiff1d(present, frame, assume_unique=False)
    n = int(present.size)
    if n == 0:
        return np.zeros(labels.shape, dtype=np.int32), 0
    if top <= _MAX_LOOKUP_ID:
        lookup = np.zeros(top + 1, dtype=np.int32)
        lookup[present] = np.arange(1, n + 1, dtype=np.int32)
        return lookup[labels], n
    index = np.minimum(np.searchsorted(present, labels), n - 1)
    hit = present[index] == labels
    return np.where(hit, index + 1, 0).astype(np.int32), n


def overlap_table(gt: np.ndarray, pred: np.ndarray, n_gt: int, n_pred: int) -> OverlapTable:
    """IoU = |A∩B| / (|A|+|B|-|A∩B|) of every overlapping pair of instances of two compacted label images."""
    if gt.shape != pred.shape:
        raise ValueError(f"label images differ in shape: {gt.shape} vs {pred.shape}")
    empty = np.zeros(0, dtype=np.int64)
    if n_gt == 0 or n_pred == 0:
        return OverlapTable(n_gt, n_pred, empty, empty, np.zeros(0))
    both = (gt > 0) & (pred > 0)
    pair = (gt[both].astype(np.int64) - 1) * n_pred + (pred[both].astype(np.int64) - 1)
    keys, intersection = np.unique(pair, return_counts=True)
    rows, cols = np.divmod(keys, n_pred)
    size_gt = np.bincount(gt.ravel(), minlength=n_gt + 1)[1:]
    size_pred = np.bincount(pred.ravel(), minlength=n_pred + 1)[1:]
    iou = intersection / (size_gt[rows] + size_pred[cols] - intersection)
    return OverlapTable(n_gt, n_pred, rows, cols, iou)


def hungarian_true_positives(table: OverlapTable, thresholds: Sequence[float]) -> list[int]:
    """TP per threshold: pairs at or above the threshold in the official Hungarian assignment."""
    # imported when used: the grader registry imports every grader module
    from scipy import sparse
    from scipy.optimize import linear_sum_assignment
    from scipy.sparse.csgraph import connected_components

    if any(not 0.0 < t <= 1.0 for t in thresholds):
        raise ValueError(f"IoU thresholds must lie in (0, 1], got {list(thresholds)}")
    if table.iou.size == 0:
        return [0 for _ in thresholds]
    n_min = min(table.n_gt, table.n_pred)
    n_nodes = table.n_gt + table.n_pred
    graph = sparse.coo_matrix((np.ones(table.iou.size), (table.rows, table.n_gt + table.cols)),
                              shape=(n_nodes, n_nodes))
    _, component = connected_components(graph, directed=False)
    edge_component = component[table.rows]
    edges_per_component = np.bincount(edge_component)
    lone = edges_per_component[edge_component] == 1
    # a component with a single edge is one isolated pair: the assignment takes it
    tps = [int(np.count_nonzero(table.iou[lone] >= t)) for t in thresholds]
    shared = np.flatnonzero(~lone)
    if shared.size == 0:
        return tps
    order = shared[np.argsort(edge_component[shared], kind="stable")]
    starts = np.flatnonzero(np.diff(edge_component[order], prepend=-1))
    for group in np.split(order, starts[1:]):
        gt_ids, local_rows = np.unique(table.rows[group], return_inverse=True)
        pred_ids, local_cols = np.unique(table.cols[group], return_inverse=True)
        iou = np.zeros((gt_ids.size, pred_ids.size))
        iou[local_rows, local_cols] = table.iou[group]
        for k, t in enumerate(thresholds):
            cost = -(iou >= t).astype(float) - iou / (2 * n_min)
            r, c = linear_sum_assignment(cost)
            tps[k] += int(np.count_nonzero(iou[r, c] >= t))
    return tps


def match_counts(gt: np.ndarray, pred: np.ndarray, thresholds: Sequence[float], *,
                 border: int = BORDER_WIDTH) -> list[MatchCounts]:
    """Counts of one image (or tile) per threshold, after deleting instances in the ``border``-pixel frame."""
    gt_c, n_gt = compact_instances(gt, border=border)
    pred_c, n_pred = compact_instances(pred, border=border)
    tps = hungarian_true_positives(overlap_table(gt_c, pred_c, n_gt, n_pred), thresholds)
    return [MatchCounts(tp, n_gt, n_pred) for tp in tps]


def cellseg_match_counts(gt: np.ndarray, pred: np.ndarray,
                         thresholds: Sequence[float] = CELLSEG_THRESHOLDS) -> list[MatchCounts]:
    """Counts per threshold for one image with the official tiling rule for images of >= 25,000,000 pixels."""
    if gt.ndim != 2 or gt.shape != pred.shape:
        raise ValueError(f"expected two 2-D label images of one shape, got {gt.shape} and {pred.shape}")
    height, width = gt.shape
    if height * width < TILING_MIN_PIXELS:
        return match_counts(gt, pred, thresholds)
    totals = [MatchCounts(0, 0, 0) for _ in thresholds]
    for top in range(0, height, TILE_SIZE):
        for left in range(0, width, TILE_SIZE):
            # tiles are zero-padded to full size so that the frame lies where the official padded tiles put it
            tiles = []
            for image in (gt, pred):
                crop = image[top:top + TILE_SIZE, left:left + TILE_SIZE]
                tile = np.zeros((TILE_SIZE, TILE_SIZE), dtype=image.dtype)
                tile[:crop.shape[0], :crop.shape[1]] = crop
                tiles.append(tile)
            counts = match_counts(tiles[0], tiles[1], thresholds)
            totals = [a + b for a, b in zip(totals, counts, strict=True)]
    return totals


def cellseg_f1(gt: np.ndarray, pred: np.ndarray,
               thresholds: Sequence[float] = CELLSEG_THRESHOLDS) -> dict[float, float]:
    """Per-image F1 per threshold, rounded to 4 decimals with ``np.round`` as the official script stores it."""
    counts = cellseg_match_counts(gt, pred, thresholds)
    return {t: float(np.round(c.f1, F1_DECIMALS)) for t, c in zip(thresholds, counts, strict=True)}
