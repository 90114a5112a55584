"""Class-aware nucleus detection F1 by centroid distance, as computed by the PUMA challenge.

Reference: tueimage/PUMA-challenge-eval-track1 @ 2650261 and -track2 @ cb847d1, ``eval_nuclei.py`` (matching and
per-ROI counts) and ``evaluate.py`` (aggregation); metrics page ``cellseg_puma.md`` §3.

* A nucleus is a polygon with at least 3 vertices; its position is the arithmetic mean of its vertices (a repeated
  closing vertex counts twice), its score the polygon's ``score`` (default 1).
* Matching, per ROI: ground-truth nuclei are visited in file order; each takes, among the still unmatched
  predictions of the *same class name* at Euclidean distance strictly below 15 px, the one with the highest
  score, then the smallest distance, then the earliest in the list. The prediction removed from the pool is the
  first remaining one of that class at exactly the same position (it differs from the chosen one only for exact
  duplicates with different scores).
* Per ROI and class name occurring in that ROI (ground truth or prediction): TP = matches, FP = #pred - TP,
  FN = #gt - TP; precision and recall are 0 when their denominator is 0, F1 = 0 when precision + recall = 0.
* Over ROIs: F1_k = (sum of the ROI F1s of class k over the ROIs where k occurs) / (number of ROIs), for every
  class name occurring anywhere (unknown prediction names included); the score is the mean of the F1_k.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MATCH_RADIUS = 15.0
MIN_POLYGON_POINTS = 3
# the k-d tree pre-selects candidates with a slightly larger radius; the strict test uses the official distance
_QUERY_MARGIN = 1e-6


@dataclass(frozen=True)
class Nucleus:
    name: str
    x: float
    y: float
    score: float = 1.0


@dataclass(frozen=True)
class ClassCounts:
    tp: int
    fp: int
    fn: int

    @property
    def f1(self) -> float:
        precision = self.tp / (self.tp + self.fp) if self.tp + self.fp > 0 else 0.0
        recall = self.tp / (self.tp + self.fn) if self.tp + self.fn > 0 else 0.0
        return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def vertex_mean(points: np.ndarray) -> tuple[float, float]:
    """The official nucleus position: the mean of the (x, y) of all vertices, not the area centroid."""
    centre = np.mean(np.asarray(points, dtype=float)[:, :2], axis=0)
    return float(centre[0]), float(centre[1])


def match_nuclei(gt: Sequence[Nucleus], pred: Sequence[Nucleus], *,
                 radius: float = MATCH_RADIUS) -> list[tuple[int, int]]:
    """Greedy class-aware matching in ground-truth order; returns (gt index, pred index) pairs."""
    from scipy.spatial import cKDTree  # imported when used: the grader registry imports every grader module

    by_class: dict[str, list[int]] = defaultdict(list)
    for index, nucleus in enumerate(pred):
        by_class[nucleus.name].append(index)
    # candidates of every ground-truth nucleus, found per class with one k-d tree query
    candidates: list[list[int]] = [[] for _ in gt]
    gt_by_class: dict[str, list[int]] = defaultdict(list)
    for index, nucleus in enumerate(gt):
        gt_by_class[nucleus.name].append(index)
    for name, gt_indices in gt_by_class.items():
        pred_indices = by_class.get(name)
        if not pred_indices:
            continue
        tree = cKDTree([(pred[i].x, pred[i].y) for i in pred_indices])
        hits = tree.query_ball_point([(gt[i].x, gt[i].y) for i in gt_indices], r=radius + _QUERY_MARGIN)
        for gt_index, near in zip(gt_indices, hits, strict=True):
            candidates[gt_index] = sorted(pred_indices[k] for k in near)
    # predictions at an identical position, in list order: the official pool removal takes the first of them
    same_place: dict[tuple[str, float, float], list[int]] = defaultdict(list)
    for index, nucleus in enumerate(pred):
        same_place[(nucleus.name, nucleus.x, nucleus.y)].append(index)
    available = np.ones(len(pred), dtype=bool)
    matches: list[tuple[int, int]] = []
    for gt_index, near in enumerate(candidates):
        g = gt[gt_index]
        best: tuple[float, float, int] | None = None
        for pred_index in near:
            if not available[pred_index]:
                continue
            p = pred[pred_index]
            distance = float(np.sqrt((g.x - p.x) ** 2 + (g.y - p.y) ** 2))
            if distance >= radius:
                continue
            key = (-p.score, distance, pred_index)
            if best is None or key < best:
                best = key
        if best is None:
            continue
        chosen = pred[best[2]]
        removed = next(i for i in same_place[(chosen.name, chosen.x, chosen.y)] if available[i])
        available[removed] = False
        matches.append((gt_index, best[2]))
    return matches


def roi_class_counts(gt: Sequence[Nucleus], pred: Sequence[Nucleus], *,
                     radius: float = MATCH_RADIUS) -> dict[str, ClassCounts]:
    """TP/FP/FN of every class name occurring in this ROI's ground truth or prediction."""
    tp: dict[str, int] = defaultdict(int)
    for gt_index, _ in match_nuclei(gt, pred, radius=radius):
        tp[gt[gt_index].name] += 1
    n_gt: dict[str, int] = defaultdict(int)
    n_pred: dict[str, int] = defaultdict(int)
    for nucleus in gt:
        n_gt[nucleus.name] += 1
    for nucleus in pred:
        n_pred[nucleus.name] += 1
    return {name: ClassCounts(tp[name], n_pred[name] - tp[name], n_gt[name] - tp[name])
            for name in sorted(set(n_gt) | set(n_pred))}


def roi_class_f1(gt: Sequence[Nucleus], pred: Sequence[Nucleus], *,
                 radius: float = MATCH_RADIUS) -> dict[str, float]:
    """F1 of every class name occurring in this ROI."""
    return {name: counts.f1 for name, counts in roi_class_counts(gt, pred, radius=radius).items()}


def macro_f1_over_rois(per_roi: Sequence[Mapping[str, float]]) -> tuple[float, dict[str, float]]:
    """Official aggregation: (macro F1, per-class F1), each class summed over the ROIs where it occurs and divided
    by the number of ROIs. The macro F1 is NaN when no class occurs anywhere."""
    totals: dict[str, float] = defaultdict(float)
    for roi in per_roi:
        for name, f1 in roi.items():
            totals[name] += f1
    n_rois = len(per_roi)
    per_class = {name: totals[name] / n_rois for name in sorted(totals)}
    macro = float(np.mean(list(per_class.values()))) if per_class else float("nan")
    return macro, per_class
