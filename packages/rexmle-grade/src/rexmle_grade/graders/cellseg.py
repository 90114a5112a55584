"""Grader of ``neurips-cellseg`` (NeurIPS 2022 Cell Segmentation): instance F1 at IoU 0.5, 0.6, 0.7, 0.8, 0.9.

Contract with the task (``prepare`` writes these):

* ``public/test_manifest.json``: test image ids and each test image's ``size`` = (width, height);
* ``private/answers.csv``: ``image_id, label_path``; ``label_path`` is the ground-truth instance map (2-D integer
  TIFF or PNG, 0 = background, one positive id per cell) relative to ``private/``.

Submission: ``submission.csv`` with ``image_id, predicted_mask_path``; each path names a 2-D single-channel
integer TIFF (``predictions/<id>_label.tiff``) of exactly the test image's size, 0 = background and one id per
cell in 0..2^31-1 (ids need not be consecutive; an id made of several pieces is one cell).

Metric (:mod:`rexmle_grade.metrics.instances`): per image and threshold, cells touching the 2-pixel image frame are
dropped on both sides, Hungarian matching, TP at IoU >= t, F1 (0 when TP = 0, also for an empty ground truth with
an empty prediction) rounded to 4 decimals; images of >= 25,000,000 pixels are scored in 2000x2000 tiles.
``f1_<t>`` = mean over all test images.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rexmle_grade.errors import InvalidSubmissionError
from rexmle_grade.grader import IMAGE_2D_HEADER, CaseInput, Direction, Grader, MetricSpec, register_grader
from rexmle_grade.graders._images2d import (
    ImageAnswerGrader,
    mean_over_cases,
    read_answer_image,
    read_prediction_image,
    require_same_shape,
    write_tiff,
)
from rexmle_grade.metrics.instances import CELLSEG_THRESHOLDS, cellseg_match_counts
from rexmle_grade.schema import FileColumn, FileKind, SubmissionSchema

MAX_INSTANCE_ID = 2**31 - 1  # the official script casts label images to int32


def _metric_name(threshold: float) -> str:
    return f"f1_{threshold}"


class CellSegGrader(ImageAnswerGrader):
    grader_id = "neurips-cellseg"
    title = "NeurIPS 2022 Cell Segmentation: instance F1 at IoU thresholds 0.5-0.9"
    answer_columns = ("label_path",)
    answer_image_column = "label_path"
    write_image = staticmethod(write_tiff)
    blank_dtype = np.uint16
    reference = ("JunMa11/NeurIPS-CellSeg baseline/compute_metric.py @ 3128e9605f3e079d22f9084e25ea62561688184b "
                 "(multi-threshold version)")
    header_rule = IMAGE_2D_HEADER
    conventions = (
        "Cells with a pixel in the 2-pixel frame of the image are removed from both the ground truth and the "
        "prediction before matching (official rule); images of at least 25,000,000 pixels are scored in "
        "2000x2000 tiles, each with its own 2-pixel frame.",
        "An image with no true positive scores F1 0, including an empty ground truth with an empty prediction "
        "(official rule).",
        "Per-image F1 is rounded to 4 decimals before averaging over images (official rule).",
        "Every test image must have a prediction of exactly its size; the official script skipped missing images "
        "and did not check sizes.",
        "Instance ids must be integers in 0..2^31-1; on tiled images ids are used as they are (the official "
        "script cast the prediction to the ground truth's dtype, which could wrap large ids).",
        IMAGE_2D_HEADER.convention,
    )

    def __init__(self) -> None:
        self.column = FileColumn(
            name="predicted_mask_path",
            kind=FileKind.INSTANCE_IMAGE,
            path_template="predictions/{id}_label.tiff",
            suffixes=(".tiff", ".tif"),
            description="Instance map: 0 = background, one positive integer id per cell (ids up to 2^31-1, "
                        "not necessarily consecutive); an integer-typed TIFF such as uint16 or uint32.",
        )
        self.schema = SubmissionSchema(id_column="image_id", columns=(self.column,))
        self.metrics = tuple(
            MetricSpec(_metric_name(t), Direction.HIGHER_BETTER,
                       f"mean over images of the per-image cell F1 at IoU >= {t} (rounded to 4 dp per image)",
                       best=1.0)
            for t in CELLSEG_THRESHOLDS
        )

    def load_prediction(self, case: CaseInput, column: FileColumn) -> np.ndarray:
        labels = read_prediction_image(case, column, integer=True)
        if labels.size and (labels.min() < 0 or labels.max() > MAX_INSTANCE_ID):
            raise InvalidSubmissionError(
                f"{column.name} of {case.case_id!r} has ids from {labels.min()} to {labels.max()}; instance ids must "
                f"lie in 0..{MAX_INSTANCE_ID}"
            )
        return labels

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        prediction = self.load_prediction(case, self.column)
        truth = read_answer_image(case, "label_path")
        require_same_shape(prediction, truth, case, self.column)
        counts = cellseg_match_counts(truth, prediction, CELLSEG_THRESHOLDS)
        result: dict[str, Any] = {"n_cells": counts[0].n_gt, "n_predicted": counts[0].n_pred}
        for t, c in zip(CELLSEG_THRESHOLDS, counts, strict=True):
            result[_metric_name(t)] = float(np.round(c.f1, 4))
            result[f"tp_{t}"] = c.tp
        return result

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        return mean_over_cases(cases, (m.name for m in self.metrics))


@register_grader("neurips-cellseg")
def _cellseg() -> Grader:
    return CellSegGrader()
