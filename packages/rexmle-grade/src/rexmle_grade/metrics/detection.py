"""Per-label detection at an IoU threshold, pooled over a test set into F1 (TopCoW Group-2, TopBrain side roads).

Per case and label (``topcow24_eval/metrics/seg_metrics/detection_grp2_labels.py``,
``topbrain25_eval/metrics/detection_sideroad_labels.py``):

* label present in the ground truth: **TP** if the voxel IoU of the label's masks is >= the threshold (inclusive;
  IoU 0 when nothing is predicted), else **FN**;
* label absent from the ground truth: **FP** if any voxel is predicted, else **TN**.

Over the test set the outcomes are counted per label (pooled over cases) and F1 = 2TP / (2TP + FP + FN), with
**0 when TP + FP + FN = 0**: a label that never occurs scores 0 rather than being skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

DEFAULT_IOU_THRESHOLD = 0.25


class Detection(str, Enum):
    TP = "TP"
    FN = "FN"
    FP = "FP"
    TN = "TN"


def detect(gt_voxels: int, pred_voxels: int, intersection: int, *,
           iou_threshold: float = DEFAULT_IOU_THRESHOLD) -> Detection:
    """Detection outcome of one label in one case, from voxel counts."""
    if gt_voxels > 0:
        iou = intersection / (gt_voxels + pred_voxels - intersection)
        return Detection.TP if iou >= iou_threshold else Detection.FN
    return Detection.FP if pred_voxels > 0 else Detection.TN


@dataclass(frozen=True)
class DetectionCounts:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    @classmethod
    def of(cls, outcomes: Iterable[Detection]) -> DetectionCounts:
        found = list(outcomes)
        return cls(tp=found.count(Detection.TP), fp=found.count(Detection.FP), fn=found.count(Detection.FN),
                   tn=found.count(Detection.TN))

    @property
    def f1(self) -> float:
        denominator = 2 * self.tp + self.fp + self.fn
        return 2 * self.tp / denominator if denominator else 0.0

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0


def pooled_counts(cases: Iterable[Mapping[str, Detection | str]], labels: Sequence[int]) -> dict[int, DetectionCounts]:
    """Outcomes per label pooled over cases. Each case maps ``str(label)`` to its outcome for every label."""
    per_label: dict[int, list[Detection]] = {label: [] for label in labels}
    for case in cases:
        for label in labels:
            per_label[label].append(Detection(case[str(label)]))
    return {label: DetectionCounts.of(found) for label, found in per_label.items()}


def mean_pooled_f1(cases: Iterable[Mapping[str, Detection | str]], labels: Sequence[int]) -> float:
    """Unweighted mean over ``labels`` of the pooled per-label F1 (0 for a label never seen)."""
    counts = pooled_counts(cases, labels)
    return sum(c.f1 for c in counts.values()) / len(labels)
