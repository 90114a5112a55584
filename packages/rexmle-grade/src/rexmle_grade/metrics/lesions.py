"""Lesion-wise metrics of ISLES'22 (``ezequieldlrosa/isles22_docker_evaluation`` @ fcb59ff, ``eval_metrics_isles.py``).

Masks are binarised as non-zero. Lesions are connected components with 26-connectivity (a full 3x3x3 structuring
element; the source comment's "18-connectivity" is wrong).

* A ground-truth lesion sharing at least one voxel with the prediction is a true positive, otherwise a false
  negative. A predicted lesion sharing no voxel with the ground truth is a false positive; a predicted lesion that
  overlaps is never counted. There is no matching and no IoU threshold: one predicted blob over two true lesions
  gives two true positives, one true lesion split into pieces gives one.
* Lesion F1 = TP / (TP + (FP + FN) / 2); 1.0 when TP + FP + FN = 0 (both masks empty).
* Lesion count difference = | N_pred − N_gt |.
* Absolute volume difference = | |G|·v − |P|·v | in ml, v the voxel volume in ml.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rexmle_grade.io import Geometry
from rexmle_grade.metrics.components import label_components

ISLES_CONNECTIVITY = 26


@dataclass(frozen=True)
class LesionDetection:
    """Lesion counts of one case."""

    n_gt: int
    n_pred: int
    true_positives: int
    false_positives: int
    false_negatives: int

    @property
    def f1(self) -> float:
        """Lesion-wise F1; 1.0 when there is nothing to detect and nothing was predicted."""
        errors = self.false_positives + self.false_negatives
        if self.true_positives + errors == 0:
            return 1.0
        return self.true_positives / (self.true_positives + errors / 2)

    @property
    def count_difference(self) -> int:
        return abs(self.n_pred - self.n_gt)


def detect_lesions(gt: np.ndarray, pred: np.ndarray, *, connectivity: int = ISLES_CONNECTIVITY) -> LesionDetection:
    """Count true-positive, false-positive and false-negative lesions (non-zero voxels are lesion)."""
    if gt.shape != pred.shape:
        raise ValueError(f"mask shapes differ: {gt.shape} vs {pred.shape}")
    gt = gt.astype(bool, copy=False)
    pred = pred.astype(bool, copy=False)
    gt_labels, n_gt = label_components(gt, connectivity)
    pred_labels, n_pred = label_components(pred, connectivity)
    overlap = gt & pred
    detected = np.unique(gt_labels[overlap]).size
    overlapping_pred = np.unique(pred_labels[overlap]).size
    return LesionDetection(n_gt=n_gt, n_pred=n_pred, true_positives=detected,
                           false_positives=n_pred - overlapping_pred, false_negatives=n_gt - detected)


def voxel_volume_ml(geometry: Geometry) -> float:
    """Voxel volume in ml: |det(direction · diag(spacing))| / 1000 (the ISLES'22 container's ``get_voxel_volume``)."""
    if geometry.spacing is None or len(geometry.spacing) != 3:
        raise ValueError(f"a 3-D spacing is needed for a voxel volume, got {geometry.spacing}")
    direction = np.eye(3) if geometry.direction is None else np.asarray(geometry.direction, float).reshape(3, 3)
    return float(abs(np.linalg.det(direction * np.asarray(geometry.spacing, float))) / 1000)


def absolute_volume_difference(gt: np.ndarray, pred: np.ndarray, voxel_ml: float) -> float:
    """| |G|·v − |P|·v | in ml (non-zero voxels counted)."""
    if gt.shape != pred.shape:
        raise ValueError(f"mask shapes differ: {gt.shape} vs {pred.shape}")
    return float(abs(np.count_nonzero(gt) * voxel_ml - np.count_nonzero(pred) * voxel_ml))
