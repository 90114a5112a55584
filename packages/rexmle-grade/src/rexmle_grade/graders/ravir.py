"""Grader of ``ravir`` (RAVIR 2022): retinal artery/vein segmentation in infrared SLO images, mean Dice.

Contract with the task:

* ``public/test_manifest.json``: test image ids (``IR_Case_NNN``) and each image's ``size`` = (width, height)
  (768x768 for real images);
* ``private/answers.csv``: ``image_id, label_path``; the path (under ``private/``) of the ground-truth mask PNG with
  the challenge's values 0 background, 128 artery, 255 vein.

Submission: ``image_id, predicted_mask_path``; each path names a 2-D single-channel 8-bit PNG (PIL mode ``L``,
``predictions/<id>.png``) of exactly the test image's size with values 0 (background), 128 (artery), 255 (vein)
only. An (H, W, 3) map is rejected, as on the challenge site.

Metrics: per image, Dice and Jaccard of the artery and of the vein class; ``dice`` = mean over images of
(artery Dice + vein Dice) / 2 (the challenge ranks by average Dice; no evaluation code is public).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rexmle_grade.grader import IMAGE_2D_HEADER, CaseInput, Direction, Grader, MetricSpec, register_grader
from rexmle_grade.graders._images2d import (
    ImageAnswerGrader,
    mean_over_cases,
    read_answer_image,
    read_gray8_prediction,
    require_same_shape,
    write_png,
)
from rexmle_grade.metrics.overlap import dice, iou
from rexmle_grade.schema import FileColumn, FileKind, SubmissionSchema

BACKGROUND, ARTERY, VEIN = 0, 128, 255
CLASSES = (("artery", ARTERY), ("vein", VEIN))
EMPTY_CLASS_SCORE = 1.0


class RavirGrader(ImageAnswerGrader):
    grader_id = "ravir"
    title = "RAVIR 2022: retinal artery/vein segmentation, mean Dice"
    answer_columns = ("label_path",)
    answer_image_column = "label_path"
    write_image = staticmethod(write_png)
    gold_dtype = np.uint8
    reference = ("RAVIR challenge page (ravir.grand-challenge.org) and Hatamizadeh et al., IEEE JBHI 2022; "
                 "the evaluation container is not public")
    header_rule = IMAGE_2D_HEADER
    conventions = (
        "The challenge's evaluation code is not public: Dice and Jaccard are computed per image for the artery "
        "(128) and vein (255) classes, and `dice` is the mean over images of the two classes' average.",
        "A class absent from both the ground truth and the prediction of an image scores Dice = Jaccard = 1 for "
        "that image; absent from one side only, 0 (our choice; every real RAVIR image has both classes).",
        "Predictions must hold only the values 0, 128 and 255 (255 is the challenge's 'vein = 256' as stored in "
        "8 bits); nothing is remapped or resized.",
        "No human leaderboard excerpt is available for RAVIR, so no position can be computed.",
        IMAGE_2D_HEADER.convention,
    )

    def __init__(self) -> None:
        self.column = FileColumn(
            name="predicted_mask_path",
            kind=FileKind.LABEL_IMAGE,
            path_template="predictions/{id}.png",
            suffixes=(".png",),
            description="Vessel mask as in the training masks: 0 background, 128 artery, 255 vein; an 8-bit "
                        "single-channel (mode L) PNG.",
            labels=(BACKGROUND, ARTERY, VEIN),
        )
        self.schema = SubmissionSchema(id_column="image_id", columns=(self.column,))
        self.metrics = (
            MetricSpec("dice", Direction.HIGHER_BETTER, "mean over images of (artery Dice + vein Dice) / 2",
                       best=1.0),
            *(MetricSpec(f"{measure}_{name}", Direction.HIGHER_BETTER, f"mean over images of the {name} "
                         f"{measure.capitalize()}", ranked=False, best=1.0)
              for measure in ("dice", "jaccard") for name, _ in CLASSES),
        )

    def load_prediction(self, case: CaseInput, column: FileColumn) -> np.ndarray:
        return read_gray8_prediction(case, column, allowed=column.labels)

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        prediction = self.load_prediction(case, self.column)
        truth = read_answer_image(case, "label_path")
        require_same_shape(prediction, truth, case, self.column)
        result: dict[str, Any] = {}
        for name, value in CLASSES:
            result[f"dice_{name}"] = dice(truth == value, prediction == value, empty=EMPTY_CLASS_SCORE)
            result[f"jaccard_{name}"] = iou(truth == value, prediction == value, empty=EMPTY_CLASS_SCORE)
        result["dice"] = (result["dice_artery"] + result["dice_vein"]) / 2
        return result

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        return mean_over_cases(cases, (m.name for m in self.metrics))


@register_grader("ravir")
def _ravir() -> Grader:
    return RavirGrader()
