"""PANTHER pancreatic tumour segmentation on MRI (``panther-task1``: diagnostic T1 arterial; ``panther-task2``:
MR-Linac T2). One class, parameterised by the task number.

Official evaluation: ``DIAGNijmegen/PANTHER_baseline`` @ 0642932 ``Evaluation/evaluate_local.py`` (penalty record
kept per case as in its pull request #3) on top of ``google-deepmind/surface-distance``; see
``metrics/isles_panther.md``.

Task contract
-------------
* ``public/test_manifest.json``: test ids (task 1 like ``10000_0001``, task 2 like ``10303``) with each test
  image's geometry.
* ``private/answers.csv``: ``image_id, label_path``; ``label_path`` is the label volume (``.mha``, relative to
  ``private/``) on the test image's grid, with 0 background, 1 tumour, 2 pancreas. Tumour = label 1.
* Submission: ``submission.csv`` with ``image_id, predicted_mask_path``; each path names a 3-D integer mask
  (``predictions/<image_id>.mha``, ``.nii.gz`` also accepted) on the test image's grid. Accepted value sets:
  {0}, {1}, {0, 1}, or {0, k} with k > 0 (k = tumour). Anything else (e.g. {0, 1, 2}) is rejected.

Per case (spacing from the ground truth): ``dsc`` (voxel Dice), ``msd`` (surface Dice at 5 mm), ``hd95``
(area-weighted 95th-percentile Hausdorff, mm), ``masd`` (mean average surface distance, mm), tumour volumes (mm³).
A prediction that is uniform after binarisation (all 0 or all 1) gets the penalty record: dsc 0, msd 0,
hd95 = masd = L, predicted volume 0, with L = ‖(nz·sx, ny·sy, nx·sz)‖. Aggregates: means over cases; ``rmse`` =
sqrt(mean over cases of (predicted − true volume)²) in mm³.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rexmle_grade.errors import GraderError, InvalidSubmissionError
from rexmle_grade.grader import CaseInput, Direction, Grader, HeaderRule, HeaderUse, MetricSpec, register_grader
from rexmle_grade.graders._binary_volume import BinaryVolumeGrader
from rexmle_grade.metrics.overlap import dice
from rexmle_grade.metrics.surface_elements import (
    mean_average_surface_distance,
    robust_hausdorff,
    surface_dice,
    surface_distances,
)
from rexmle_grade.schema import FileColumn, FileKind, SubmissionSchema

TUMOUR_LABEL = 1
SURFACE_DICE_TOLERANCE_MM = 5.0
HAUSDORFF_PERCENT = 95.0

#: per-case distance metrics and the names of their physically ordered twins
_DISTANCE_METRICS = ("msd", "hd95", "masd")
#: per-case tumour volumes: ground-truth information, kept out of reports (leading "_"), pooled into rmse
_VOLUMES = ("gt_volume_mm3", "pred_volume_mm3")
_MEAN_METRICS = ("dsc", *_DISTANCE_METRICS, *(f"{name}_physical" for name in _DISTANCE_METRICS))

PANTHER_METRICS = (
    MetricSpec("dsc", Direction.HIGHER_BETTER, "Volumetric Dice of the tumour, mean over cases", best=1.0),
    MetricSpec("msd", Direction.HIGHER_BETTER, "Surface Dice at 5 mm tolerance (not a mean surface distance), "
               "official spacing order, mean over cases", best=1.0),
    MetricSpec("hd95", Direction.LOWER_BETTER, "Area-weighted 95th-percentile Hausdorff distance (mm), official "
               "spacing order, mean over cases", best=0.0),
    MetricSpec("masd", Direction.LOWER_BETTER, "Mean average surface distance (mm), official spacing order, mean "
               "over cases", best=0.0),
    MetricSpec("rmse", Direction.LOWER_BETTER, "Tumour-burden RMSE: sqrt(mean over cases of (predicted − true "
               "tumour volume)²), mm³", best=0.0),
    MetricSpec("msd_physical", Direction.HIGHER_BETTER, "msd with the voxel spacing on the right array axes",
               ranked=False, best=1.0),
    MetricSpec("hd95_physical", Direction.LOWER_BETTER, "hd95 (mm) with the voxel spacing on the right array axes",
               ranked=False, best=0.0),
    MetricSpec("masd_physical", Direction.LOWER_BETTER, "masd (mm) with the voxel spacing on the right array axes",
               ranked=False, best=0.0),
)

PANTHER_HEADER_RULE = HeaderRule(HeaderUse.CHECKS, ("spacing",), "the official script fails on a prediction whose "
                                 "spacing differs from the ground truth's by more than 1e-4 mm and reads neither its "
                                 "origin nor its direction.")

PANTHER_CONVENTIONS = (
    "Ranked msd, hd95 and masd (and the penalty distance) use the official spacing order: the ground truth's "
    "SimpleITK spacing (sx, sy, sz) applied to the (z, y, x) array, i.e. array axis 0 (z) gets sx and axis 2 (x) "
    "gets sz, as PANTHER's evaluate_local.py does. The physically correct values are reported as the unranked "
    "msd_physical, hd95_physical and masd_physical.",
    "Tumour = ground-truth label 1 (the test labels come from the training labels, where 2 is pancreas).",
    "A prediction whose values are not {0}, {1}, {0,1} or {0,k} (k > 0) is rejected (official); in particular "
    "{0,1,2}: submit the tumour only. Negative values are rejected.",
    "A prediction that is uniform after binarisation (all background or all tumour) gets the official penalty "
    "record (dsc 0, msd 0, hd95 = masd = ‖(nz·sx, ny·sy, nx·sz)‖, predicted volume 0), which enters the means "
    "(as in the organisers' fix, pull request #3).",
    "Our choice (no official finite value exists): a case whose ground truth has no tumour while the prediction "
    "is not uniform scores dsc 0 and msd 0 (as computed) and hd95 = masd = the penalty distance, instead of the "
    "library's inf and NaN, so that the means stay finite.",
    "Nothing is resampled; a missing prediction is rejected (the official script skipped it); masks must use an "
    "integer voxel type (the official script also read floats).",
    PANTHER_HEADER_RULE.convention,
)


@dataclass(frozen=True)
class PantherCase:
    """Per-case numbers of the PANTHER evaluation (official spacing order, plus physical twins)."""

    outcome: str  # "regular", "uniform_prediction" or "empty_ground_truth"
    dsc: float
    msd: float
    hd95: float
    masd: float
    msd_physical: float
    hd95_physical: float
    masd_physical: float
    gt_volume_mm3: float
    pred_volume_mm3: float


def penalty_distance(shape: Sequence[int], spacing: Sequence[float]) -> float:
    """‖shape ⊙ spacing‖: the image diagonal if ``spacing`` is given per array axis."""
    return float(np.linalg.norm(np.asarray(shape, float) * np.asarray(spacing, float)))


def score_panther_case(gt: np.ndarray, pred: np.ndarray, spacing_xyz: Sequence[float]) -> PantherCase:
    """Score one case: binary (z, y, x) masks, ``spacing_xyz`` = SimpleITK's (sx, sy, sz) of the ground truth."""
    if gt.shape != pred.shape or gt.ndim != 3:
        raise ValueError(f"need two 3-D masks of one shape, got {gt.shape} and {pred.shape}")
    gt = gt.astype(bool, copy=False)
    pred = pred.astype(bool, copy=False)
    official = tuple(float(s) for s in spacing_xyz)  # applied as is to (z, y, x): the official quirk
    physical = official[::-1]
    voxel_mm3 = float(np.prod(official))
    gt_volume = float(np.count_nonzero(gt) * voxel_mm3)
    pred_volume = float(np.count_nonzero(pred) * voxel_mm3)
    if not pred.any() or pred.all():
        return _penalty("uniform_prediction", gt.shape, official, gt_volume, 0.0)
    if not gt.any():
        return _penalty("empty_ground_truth", gt.shape, official, 0.0, pred_volume)
    values: dict[str, float] = {}
    for suffix, spacing in (("", official), ("_physical", physical)):
        distances = surface_distances(gt, pred, spacing)
        values["msd" + suffix] = surface_dice(distances, SURFACE_DICE_TOLERANCE_MM)
        values["hd95" + suffix] = robust_hausdorff(distances, HAUSDORFF_PERCENT)
        values["masd" + suffix] = mean_average_surface_distance(distances)
    return PantherCase(outcome="regular", dsc=dice(gt, pred, empty=math.nan), gt_volume_mm3=gt_volume,
                       pred_volume_mm3=pred_volume, **values)


def _penalty(outcome: str, shape: Sequence[int], official: Sequence[float], gt_volume: float,
             pred_volume: float) -> PantherCase:
    far = penalty_distance(shape, official)
    far_physical = penalty_distance(shape, official[::-1])
    return PantherCase(outcome=outcome, dsc=0.0, msd=0.0, hd95=far, masd=far, msd_physical=0.0,
                       hd95_physical=far_physical, masd_physical=far_physical, gt_volume_mm3=gt_volume,
                       pred_volume_mm3=pred_volume)


def tumour_burden_rmse(gt_volumes: Sequence[float], pred_volumes: Sequence[float]) -> float:
    """sqrt(mean((pred − gt)²)) over cases, in the volumes' unit."""
    if len(gt_volumes) != len(pred_volumes) or not gt_volumes:
        raise ValueError("need one predicted volume per true volume, and at least one case")
    difference = np.asarray(pred_volumes, float) - np.asarray(gt_volumes, float)
    return float(np.sqrt(np.mean(difference**2)))


class PantherGrader(BinaryVolumeGrader):
    metrics = PANTHER_METRICS
    conventions = PANTHER_CONVENTIONS
    header_rule = PANTHER_HEADER_RULE
    reference = ("DIAGNijmegen/PANTHER_baseline @ 06429322b83891b1ae2c4db230b18e1b0f79659e "
                 "(Evaluation/evaluate_local.py; penalty record per case as in refs/pull/3) + "
                 "google-deepmind/surface-distance @ 1f805cea446805e559badc80dd27f34175e4173d")

    def __init__(self, task: int) -> None:
        if task not in (1, 2):
            raise ValueError(f"PANTHER has tasks 1 and 2, not {task}")
        self.task = task
        self.grader_id = f"panther-task{task}"
        modality = "T1 contrast-enhanced arterial-phase MRI" if task == 1 else "MR-Linac T2-weighted MRI"
        self.title = f"PANTHER task {task}: pancreatic tumour segmentation on {modality}"
        example = "10000_0001" if task == 1 else "10303"
        self.schema = SubmissionSchema(
            id_column="image_id",
            columns=(
                FileColumn(
                    name="predicted_mask_path",
                    kind=FileKind.LABEL_VOLUME,
                    path_template="predictions/{id}.mha",
                    suffixes=(".mha", ".nii.gz"),
                    description="Binary tumour mask (integer voxels, e.g. uint8): 0 background, 1 tumour "
                                "({0, k} with one positive k is read as tumour = k). Tumour only: do not include "
                                "the pancreas (label 2 of the training labels); masks with more than one non-zero "
                                "value are rejected.",
                ),
            ),
            notes=(f"Image ids look like `{example}`. An all-background (or all-tumour) mask is valid but gets the "
                   "penalty record: Dice 0, surface Dice 0, HD95 = MASD = ‖(nz·sx, ny·sy, nx·sz)‖ (array shape "
                   "(nz, ny, nx) times the header spacing (sx, sy, sz), as the official script computes it).",),
        )

    def check_values(self, array: np.ndarray, name: str) -> None:
        super().check_values(array, name)
        top = array.max() if array.size else 0
        if top <= 1:
            return
        # two values at most, one of them 0: {0, k}
        if np.any((array != 0) & (array != top)) or not np.any(array == 0):
            present = np.unique(array)
            shown = ", ".join(str(v) for v in present[:10]) + (" ..." if present.size > 10 else "")
            raise InvalidSubmissionError(
                f"{self.prediction_column.name} {name!r} holds the values {{{shown}}}; a PANTHER prediction must "
                "be a binary tumour mask ({0, 1}, or 0 and one positive value). Submit the tumour only: set the "
                "pancreas (label 2) and any other class to 0"
            )

    def gold_mask(self, label: np.ndarray) -> np.ndarray:
        return label == TUMOUR_LABEL

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        truth, prediction = self.load_case(case)
        if truth.geometry.spacing is None:
            raise GraderError(f"ground truth of {case.case_id!r} has no spacing")
        result = score_panther_case(truth.array == TUMOUR_LABEL, prediction.array != 0, truth.geometry.spacing)
        return {("_" + key if key in _VOLUMES else key): value for key, value in asdict(result).items()}

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        means = self.case_means(cases, _MEAN_METRICS)
        rmse = tumour_burden_rmse([float(c["_gt_volume_mm3"]) for c in cases],
                                  [float(c["_pred_volume_mm3"]) for c in cases])
        return {**means, "rmse": rmse}


@register_grader("panther-task1")
def panther_task1() -> Grader:
    return PantherGrader(1)


@register_grader("panther-task2")
def panther_task2() -> Grader:
    return PantherGrader(2)
