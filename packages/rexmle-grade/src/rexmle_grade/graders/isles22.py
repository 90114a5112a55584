"""ISLES'22 ischemic stroke lesion segmentation (``isles22``).

Official evaluation: ``ezequieldlrosa/isles22_docker_evaluation`` @ fcb59ff (``evaluation.py``,
``eval_metrics_isles.py``) with evalutils 0.3.1 aggregation; see ``metrics/isles_panther.md``.

Task contract
-------------
* ``public/test_manifest.json``: test ids (e.g. ``sub-strokecase0001``) with each DWI image's geometry.
* ``private/answers.csv``: ``case_id, label_path``; ``label_path`` is the lesion mask (``.nii.gz``, relative to
  ``private/``) on the DWI grid. Non-zero voxels are lesion.
* Submission: ``submission.csv`` with ``case_id, predicted_mask_path``; each path names a 3-D integer NIfTI mask
  (``predictions/<case_id>_pred.nii.gz``) on the DWI grid. Non-zero voxels are lesion; negative values are rejected.

Metrics (per case, then the arithmetic mean over all test cases): ``dice`` (1.0 when both masks are empty),
``lesion_f1`` and ``lesion_count_diff`` (26-connected lesions, see :mod:`rexmle_grade.metrics.lesions`),
``abs_volume_diff`` in ml with the voxel volume of the ground-truth header.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rexmle_grade.grader import CaseInput, Direction, Grader, HeaderRule, HeaderUse, MetricSpec, register_grader
from rexmle_grade.graders._binary_volume import BinaryVolumeGrader
from rexmle_grade.io import HEADER_FIELDS
from rexmle_grade.metrics.lesions import absolute_volume_difference, detect_lesions, voxel_volume_ml
from rexmle_grade.metrics.overlap import dice
from rexmle_grade.schema import FileColumn, FileKind, SubmissionSchema

ISLES22_METRICS = (
    MetricSpec("dice", Direction.HIGHER_BETTER, "Voxel Dice of the lesion masks (1 when both are empty), "
               "mean over cases", best=1.0),
    MetricSpec("lesion_f1", Direction.HIGHER_BETTER, "Lesion-wise F1 with 26-connected lesions: a true lesion "
               "touched by the prediction is detected, a predicted lesion touching no true lesion is a false "
               "positive; mean over cases", best=1.0),
    MetricSpec("lesion_count_diff", Direction.LOWER_BETTER, "|number of predicted lesions − number of true "
               "lesions| (26-connectivity), mean over cases", best=0.0),
    MetricSpec("abs_volume_diff", Direction.LOWER_BETTER, "|predicted − true lesion volume| in ml (voxel volume "
               "from the ground-truth header), mean over cases", best=0.0),
)


class Isles22Grader(BinaryVolumeGrader):
    grader_id = "isles22"
    title = "ISLES'22 ischemic stroke lesion segmentation"
    schema = SubmissionSchema(
        id_column="case_id",
        columns=(
            FileColumn(
                name="predicted_mask_path",
                kind=FileKind.LABEL_VOLUME,
                path_template="predictions/{id}_pred.nii.gz",
                suffixes=(".nii.gz", ".nii"),
                description="Binary lesion mask of the case (integer voxels, e.g. uint8): 0 background, "
                            "any positive value lesion.",
            ),
        ),
        notes=("Case ids look like `sub-strokecase0001`. Masks must lie on the DWI/ADC grid of the case (FLAIR has "
               "its own grid: bring predictions made on FLAIR back to the DWI grid before submitting).",),
    )
    metrics = ISLES22_METRICS
    header_rule = HeaderRule(HeaderUse.USES, HEADER_FIELDS, "the official container takes the voxel volume of "
                             "abs_volume_diff from the prediction's header, so a forged spacing could shrink it; every "
                             "header difference is therefore rejected, never ignored.")
    conventions = (
        "Lesions are 26-connected components; a prediction voxel of any non-zero value is lesion (official).",
        "abs_volume_diff uses the voxel volume of the ground-truth header; the official container used the "
        "prediction's header. Predictions must have the ground truth's size and spacing (within 1e-4 mm), so "
        "every accepted submission gets exactly the official value and a prediction header cannot shrink it.",
        "A prediction on a different grid is rejected, never resampled; a missing prediction is rejected; masks "
        "must use an integer voxel type without negative values (the container read any voxel type).",
        "Two identical prediction arrays are accepted (the challenge platform rejected them; not a metric rule).",
        "Scores are kept at full precision; the leaderboard shows 4 decimals.",
        header_rule.convention,
    )
    reference = ("ezequieldlrosa/isles22_docker_evaluation @ fcb59ff18d8ea4ba8cae8a6f5b2a3fb7eba7eb7a "
                 "(eval_metrics_isles.py) + evalutils 0.3.1 (mean over cases)")

    def gold_mask(self, label: np.ndarray) -> np.ndarray:
        return label != 0

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        truth, prediction = self.load_case(case)
        gt = truth.array != 0
        pred = prediction.array != 0
        lesions = detect_lesions(gt, pred)
        return {
            "dice": dice(gt, pred, empty=1.0),
            "lesion_f1": lesions.f1,
            "lesion_count_diff": lesions.count_difference,
            "abs_volume_diff": absolute_volume_difference(gt, pred, voxel_volume_ml(truth.geometry)),
        }

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        return self.case_means(cases, [m.name for m in self.metrics])


@register_grader("isles22")
def isles22() -> Grader:
    return Isles22Grader()
