"""Grader of ``usenhance`` (USenhance 2023): ultrasound image enhancement, LNCC / SSIM / PSNR.

Contract with the task:

* ``public/test_manifest.json``: test image ids (``<organ>_<stem>``) and each low-quality test image's ``size``
  = (width, height);
* ``private/answers.csv``: ``image_id, high_quality_path``; the path (under ``private/``) of the high-quality
  reference PNG, of the test image's size (any PIL mode; converted to 8-bit grayscale).

Submission: ``image_id, enhanced_image_path``; each path names an 8-bit single-channel grayscale PNG (PIL mode
``L``, ``enhanced/<id>.png``) of exactly the test image's size. RGB, palette, 16-bit and wrong-sized images are
rejected (the release grader converted colours and resized silently).

Metrics (:mod:`rexmle_grade.metrics.image_quality`; the organisers' code is not public, these are the ReX-MLE
release definitions): per-image LNCC, SSIM and PSNR, each averaged over the test images.
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
from rexmle_grade.metrics.image_quality import LNCC_WINDOW, PSNR_CAP_DB, lncc, psnr, ssim
from rexmle_grade.schema import FileColumn, FileKind, SubmissionSchema

SAMPLE_GRAY = 128


class UsenhanceGrader(ImageAnswerGrader):
    grader_id = "usenhance"
    title = "USenhance 2023: ultrasound image enhancement (LNCC, SSIM, PSNR)"
    answer_columns = ("high_quality_path",)
    answer_image_column = "high_quality_path"
    answer_gray = True
    write_image = staticmethod(write_png)
    blank_value = SAMPLE_GRAY
    reference = ("no official evaluation code is public; definitions of the ReX-MLE release grader "
                 "rajpurkarlab/ReX-MLE @ 477c834037be7e7acb5bdc612b5f1cf140d01e6f rex-mle/rexmle/challenges/usenhance/"
                 "grade.py (unverified against the human leaderboard)")
    header_rule = IMAGE_2D_HEADER
    conventions = (
        "The organisers' evaluation code is not public: LNCC, SSIM and PSNR follow the ReX-MLE release grader and "
        "are not verified against the human leaderboard.",
        f"LNCC: both images min-max scaled to [0, 1], {LNCC_WINDOW}x{LNCC_WINDOW} box-filter local statistics "
        "(reflect-101 border), mean of the local NCC over pixels where both local variances exceed 1e-10.",
        "SSIM: scikit-image defaults (7x7 uniform window, K1 0.01, K2 0.03) with the joint data range "
        "max(max a, max b) - min(min a, min b) of the two images; PSNR uses the same joint data range.",
        f"PSNR is capped at {PSNR_CAP_DB:g} dB, so an image identical to the reference scores {PSNR_CAP_DB:g} "
        "instead of +inf and the mean stays finite.",
        "All metrics are computed in float64 (the release used float32).",
        "The prediction must be an 8-bit grayscale PNG of exactly the test image's size; nothing is resized or "
        "colour-converted.",
        "The leaderboard ranks by the mean of the three per-metric positions.",
        IMAGE_2D_HEADER.convention,
    )

    def __init__(self) -> None:
        self.column = FileColumn(
            name="enhanced_image_path",
            kind=FileKind.GRAY_IMAGE,
            path_template="enhanced/{id}.png",
            suffixes=(".png",),
            description="The enhanced image: 8-bit single-channel grayscale PNG (mode L).",
        )
        self.schema = SubmissionSchema(id_column="image_id", columns=(self.column,))
        self.metrics = (
            MetricSpec("lncc", Direction.HIGHER_BETTER, "mean over images of the local normalised "
                       f"cross-correlation ({LNCC_WINDOW}x{LNCC_WINDOW} window)", best=1.0),
            MetricSpec("ssim", Direction.HIGHER_BETTER, "mean over images of SSIM (joint data range)", best=1.0),
            MetricSpec("psnr", Direction.HIGHER_BETTER,
                       f"mean over images of PSNR in dB (joint data range, capped at {PSNR_CAP_DB:g})",
                       best=PSNR_CAP_DB),
        )

    def load_prediction(self, case: CaseInput, column: FileColumn) -> np.ndarray:
        return read_gray8_prediction(case, column)

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        prediction = self.load_prediction(case, self.column)
        reference = read_answer_image(case, "high_quality_path", gray=True)
        require_same_shape(prediction, reference, case, self.column)
        return {"lncc": lncc(prediction, reference), "ssim": ssim(prediction, reference),
                "psnr": psnr(prediction, reference)}

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        return mean_over_cases(cases, ("lncc", "ssim", "psnr"))


@register_grader("usenhance")
def _usenhance() -> Grader:
    return UsenhanceGrader()
