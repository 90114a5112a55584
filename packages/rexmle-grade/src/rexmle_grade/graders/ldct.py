"""Grader of ``ldct-iqa`` (LDCTIQAC 2023): no-reference CT image quality, |PLCC| + |SROCC| + |KROCC|.

Contract with the task:

* ``public/test_manifest.json``: the test image ids (no geometry is needed);
* ``private/answers.csv``: ``image_id, quality_score``; the score is the mean of the radiologists' 0-4 ratings.

Submission: ``image_id, quality_score``; one finite real number per test image, on any scale (only correlations
are scored).

Metric (:mod:`rexmle_grade.metrics.correlation`): one pooled computation over all test images of |Pearson| +
|Spearman| + |Kendall tau-b|.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rexmle_grade.errors import GraderError, TaskDataMissingError
from rexmle_grade.grader import (
    NO_IMAGE_HEADER,
    CaseInput,
    Direction,
    Grader,
    MetricSpec,
    TestManifest,
    answer_cases,
    register_grader,
    write_submission_csv,
)
from rexmle_grade.metrics.correlation import absolute_correlations
from rexmle_grade.schema import FileColumn, SubmissionSchema, ValueColumn

SAMPLE_SCORE = "2.0"


class LdctGrader(Grader):
    grader_id = "ldct-iqa"
    title = "LDCT-IQA: low-dose CT image quality assessment, |PLCC| + |SROCC| + |KROCC|"
    answer_columns = ("quality_score",)
    reference = ("LDCTIQAC 2023 organisers' scoring snippet (abs of scipy pearsonr, spearmanr, kendalltau, summed), "
                 "as quoted in the ReX-MLE release ldct-iqa/description.md")
    conventions = (
        "Each correlation is taken in absolute value, so a perfectly reversed predictor scores 3 like a perfect "
        "one (official rule).",
        "The three correlations are computed once over all test images pooled (one value per submission).",
        "A constant prediction makes every correlation undefined (the official snippet gave NaN): it scores 0 "
        "and `undefined_correlation` is set to 1.",
        "Every test id needs exactly one finite score; the release ignored extra ids.",
        NO_IMAGE_HEADER.convention,
    )

    def __init__(self) -> None:
        self.column = ValueColumn(
            name="quality_score", dtype=float, example=SAMPLE_SCORE,
            description="predicted image quality (higher = better quality, as the 0-4 radiologist scale; any "
                        "monotone scale works for the rank correlations, Pearson rewards a linear one)",
        )
        self.schema = SubmissionSchema(id_column="image_id", columns=(self.column,))
        self.metrics = (
            MetricSpec("score", Direction.HIGHER_BETTER, "|PLCC| + |SROCC| + |KROCC| over all test images",
                       best=3.0),
            MetricSpec("plcc", Direction.HIGHER_BETTER, "|Pearson r|", ranked=False, best=1.0),
            MetricSpec("srocc", Direction.HIGHER_BETTER, "|Spearman rho|", ranked=False, best=1.0),
            MetricSpec("krocc", Direction.HIGHER_BETTER, "|Kendall tau-b|", ranked=False, best=1.0),
            MetricSpec("undefined_correlation", Direction.LOWER_BETTER,
                       "1 when the correlations are undefined (constant prediction) and were scored 0, else 0",
                       ranked=False, best=0.0),
        )

    def load_prediction(self, case: CaseInput, column: FileColumn) -> Any:
        raise GraderError(f"{self.grader_id} has no prediction files (column {column.name!r} was asked for)")

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        try:
            reference = float(case.answer["quality_score"])
        except (KeyError, ValueError):
            raise TaskDataMissingError(f"private/answers.csv has no valid quality_score for {case.case_id!r}",
                                       hint="re-run `rexmle prepare ldct-iqa --force`") from None
        return {"_prediction": float(case.row[self.column.name]), "_reference": reference}

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        scores = absolute_correlations([c["_prediction"] for c in cases], [c["_reference"] for c in cases])
        return {"score": scores.score, "plcc": scores.plcc, "srocc": scores.srocc, "krocc": scores.krocc,
                "undefined_correlation": float(scores.undefined)}

    def write_gold_submission(self, private_dir: Path, public_dir: Path, dest: Path) -> None:
        rows = [{"image_id": c.case_id, self.column.name: c.answer["quality_score"]}
                for c in answer_cases(self, private_dir, public_dir)]
        write_submission_csv(dest, self.schema, rows)

    def write_sample_submission(self, public_dir: Path, dest: Path) -> None:
        rows = [{"image_id": i, self.column.name: SAMPLE_SCORE} for i in TestManifest.read(public_dir).ids]
        write_submission_csv(dest, self.schema, rows)


@register_grader("ldct-iqa")
def _ldct() -> Grader:
    return LdctGrader()
