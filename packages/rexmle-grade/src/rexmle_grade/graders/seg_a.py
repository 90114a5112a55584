"""SEG.A. 2023 grader (``seg_a``): binary aortic-vessel-tree segmentation in CTA.

No official evaluation code is public; ``shared/reference/metrics/topbrain_sega.md`` §2 establishes what the
leaderboard shows and marks the remaining choices as ours (listed in :attr:`SegAGrader.conventions`).

Contract with the task's ``prepare``:

* Case ids are the AVT file stems: ``D1``..``D18``, ``K1``..``K20``, ``R1``..``R18`` (``.seg.nrrd`` stripped).
* ``submission.csv``: ``image_id, predicted_mask_path``; masks at ``predictions/<id>.seg.nrrd`` (``.nrrd``,
  ``.nii.gz`` also read): a 3-D integer mask on the test image's grid (same size, spacing, origin, direction).
  Every value > 0 is aorta; negative values are rejected.
* ``public/test_manifest.json``: test ids and each test image's geometry.
* ``private/answers.csv``: ``image_id, label_path`` (the case's ``.seg.nrrd`` ground truth, relative to ``private/``).

Per case: Dice (DSC) and the symmetric maximum Hausdorff distance over all foreground voxels in mm with the ground
truth's spacing (SimpleITK ``HausdorffDistanceImageFilter`` semantics); the leaderboard columns are their medians
over the test cases (pandas' 50 % quantile, linear interpolation = ``numpy.median``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rexmle_grade.grader import CaseInput, Direction, Grader, HeaderRule, HeaderUse, MetricSpec, register_grader
from rexmle_grade.graders._binary_volume import BinaryVolumeGrader
from rexmle_grade.io import HEADER_FIELDS
from rexmle_grade.metrics.boxes import mask_bounding_box, union_box
from rexmle_grade.metrics.overlap import dice
from rexmle_grade.metrics.surface import contour_hausdorff, grid_diagonal, max_hausdorff
from rexmle_grade.schema import FileColumn, FileKind, SubmissionSchema

CASE_METRICS = {"dsc": "dsc_50pc", "hd": "hd_50pc", "hd95": "hd95_50pc"}  # per-case value -> median column


class SegAGrader(BinaryVolumeGrader):
    grader_id = "seg_a"
    title = "SEG.A. 2023 aortic vessel tree segmentation (CTA)"
    reference = ("no public official code; shared/reference/metrics/topbrain_sega.md §2 (evalutils *_50pc naming, "
                 "organisers' per-case sheets in apepe91/SEGA2023)")
    schema = SubmissionSchema(
        id_column="image_id",
        columns=(FileColumn(
            name="predicted_mask_path", kind=FileKind.LABEL_VOLUME, path_template="predictions/{id}.seg.nrrd",
            suffixes=(".seg.nrrd", ".nrrd", ".nii.gz"),
            description="Binary aortic vessel tree mask (integer voxels, e.g. uint8): 0 background, any positive "
                        "value aorta."),),
    )
    # Dice is what an agent can measure reliably on a few validation volumes; the maximum Hausdorff distance of a
    # handful of cases is dominated by single outlier voxels
    primary_metric = "dsc_50pc"
    metrics = (
        MetricSpec("hd_50pc", Direction.LOWER_BETTER, "median over cases of the symmetric maximum Hausdorff distance "
                   "(mm, ground-truth spacing) between all foreground voxels", best=0.0),
        MetricSpec("dsc_50pc", Direction.HIGHER_BETTER, "median over cases of the Dice similarity coefficient",
                   best=1.0),
        MetricSpec("hd95_50pc", Direction.LOWER_BETTER, "median over cases of the 95th-percentile Hausdorff distance "
                   "(mm) between 26-neighbour contours, maximum of both directions (not ranked)", ranked=False,
                   best=0.0),
    )
    header_rule = HeaderRule(HeaderUse.NOT_PUBLIC, HEADER_FIELDS, "with no official code to follow, we keep the "
                             "strict rule: every header field must match, since distances are in mm.")
    conventions = (
        "Masks are binarised as value > 0 (the ground truth is binary; a mask written with value 2 counts fully).",
        "HD is the maximum (not the 95th percentile) distance, symmetric, over all foreground voxels, in mm with the "
        "ground truth's spacing; the original ReX-MLE release used one direction and voxel units.",
        "Our choice (no official code): an empty prediction for a non-empty ground truth (or the reverse) scores "
        "DSC 0 and HD = HD95 = the image diagonal in mm (distance between opposite corner voxel centres); both "
        "empty scores DSC 1, HD 0.",
        "HD95 (unranked, our addition) uses the TopCoW/TopBrain definition: 26-neighbour contours, maximum of the "
        "two directed 95th percentiles.",
        "Medians use linear interpolation (mean of the two middle cases for an even count).",
        header_rule.convention,
    )

    def gold_mask(self, label: np.ndarray) -> np.ndarray:
        return label > 0

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        truth, prediction = self.load_case(case)
        spacing = truth.spacing_zyx
        # everything below happens inside the box holding both masks: the aorta fills a fraction of a torso scan
        box = union_box(mask_bounding_box(truth.array), mask_bounding_box(prediction.array))
        if box is None:
            return {"dsc": 1.0, "hd": 0.0, "hd95": 0.0}
        gt, pred = truth.array[box] > 0, prediction.array[box] > 0
        has_gt, has_pred = bool(gt.any()), bool(pred.any())
        if has_gt and has_pred:
            return {"dsc": dice(gt, pred, empty=1.0), "hd": max_hausdorff(gt, pred, spacing),
                    "hd95": contour_hausdorff(gt, pred, spacing).hd95}
        if has_gt or has_pred:
            worst = grid_diagonal(truth.array.shape, spacing)
            return {"dsc": 0.0, "hd": worst, "hd95": worst}
        return {"dsc": 1.0, "hd": 0.0, "hd95": 0.0}  # non-zero voxels but none positive (negative ground truth)

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        return {column: float(np.median([c[name] for c in cases])) for name, column in CASE_METRICS.items()}


@register_grader("seg_a")
def seg_a() -> Grader:
    return SegAGrader()
