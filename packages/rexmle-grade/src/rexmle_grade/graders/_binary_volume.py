"""Shared machinery of graders that score one 3-D binary mask per case against a private label volume.

Used by ``isles22`` and ``panther-task{1,2}``. The contract with the task's ``prepare``:

* ``public/test_manifest.json``: test ids and each test image's geometry (SimpleITK size/spacing/origin/direction).
* ``private/answers.csv``: the id column and ``label_path`` (ground-truth label volume, relative to ``private/``),
  on the test image's grid.
* submission: ``submission.csv`` with the id column and one path column naming a 3-D integer label volume on the
  test image's grid: the same size, and the header fields the grader's :attr:`~rexmle_grade.grader.Grader.header_rule`
  checks equal (spacing within 1e-4 mm, origin within 1e-3 mm, direction within 1e-4); the fields it ignores may
  differ (with a warning): the prediction is then scored on the ground truth's grid. Nothing is resampled or
  relabelled.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rexmle_grade.errors import GraderError, InvalidSubmissionError, TaskDataMissingError
from rexmle_grade.grader import (
    CaseInput,
    Grader,
    HeaderRule,
    TestManifest,
    answer_cases,
    warn_case,
    write_submission_csv,
)
from rexmle_grade.io import Geometry, Volume, read_volume, write_volume
from rexmle_grade.schema import FileColumn

LABEL_PATH = "label_path"


def warn_header_differences(case: CaseInput, column: FileColumn, differences: Sequence[str]) -> None:
    for difference in differences:
        warn_case(f"{column.name} of {case.case_id!r}: {difference}; ignored as the official evaluation does, "
                  "scored on the ground truth's grid")


def align_to_truth(case: CaseInput, column: FileColumn, rule: HeaderRule, truth: Geometry,
                   prediction: Geometry) -> Geometry:
    """The grid a prediction is scored on: the ground truth's, after checking the prediction's against it.

    A task's prediction was already checked against the test manifest on reading, so a difference left here means
    the manifest and the private ground truth disagree: a broken preparation. Without a manifest (files graded
    directly) the checks of :attr:`Grader.header_rule` happen here.
    """
    if case.geometry is None:
        problems = truth.mismatches(prediction, fields=rule.checked, reference="the ground truth")
        if problems:
            raise InvalidSubmissionError([f"{column.name} of {case.case_id!r}: {p}" for p in problems])
        warn_header_differences(case, column, truth.mismatches(prediction, fields=rule.ignored,
                                                               reference="the ground truth"))
        return prediction.with_header_of(truth, rule.ignored)
    problems = truth.mismatches(prediction)
    if problems:
        raise GraderError(f"the test manifest's geometry of {case.case_id!r} differs from its private ground "
                          f"truth ({'; '.join(problems)}); re-run `rexmle prepare TASK --force`")
    return prediction


class BinaryVolumeGrader(Grader):
    """One binary-mask volume per case; subclasses define the value rules, the gold mask and the per-case scores."""

    answer_columns = (LABEL_PATH,)

    @property
    def prediction_column(self) -> FileColumn:
        (column,) = self.schema.file_columns
        return column

    # ---- hooks ------------------------------------------------------------------------------------------------
    def check_values(self, array: np.ndarray, name: str) -> None:
        """Reject voxel values the challenge does not accept (default: negative values)."""
        if array.size and array.min() < 0:
            raise InvalidSubmissionError(
                f"{self.prediction_column.name} {name!r} contains negative values (minimum {array.min()}); "
                "masks hold 0 for background and positive values for the foreground"
            )

    @abstractmethod
    def gold_mask(self, label: np.ndarray) -> np.ndarray:
        """The perfect prediction for a ground-truth label array."""

    # ---- reading ------------------------------------------------------------------------------------------------
    def load_prediction(self, case: CaseInput, column: FileColumn) -> Volume:
        path = case.prediction_path(column)
        volume = read_volume(path, what=f"{column.name} of {case.case_id!r}", expected=case.geometry, integer=True,
                             checked=self.header_rule.checked)
        warn_header_differences(case, column, volume.header_differences)
        try:
            self.check_values(volume.array, path.name)
        except InvalidSubmissionError as exc:  # the hooks name the file; the case is named here, once
            raise InvalidSubmissionError([f"case {case.case_id!r}: {p}" for p in exc.problems]) from None
        return volume

    def read_ground_truth(self, case_id: str, path: Path) -> Volume:
        if not path.is_file():
            raise TaskDataMissingError(f"ground truth {path} of case {case_id!r} is missing",
                                       hint="re-run `rexmle prepare TASK --force`")
        try:
            # float label files are accepted: the ground truth is the organisers' file as distributed
            return read_volume(path, what=f"ground truth of {case_id!r}")
        except InvalidSubmissionError as exc:
            raise TaskDataMissingError(f"ground truth {path} of case {case_id!r} cannot be read: {exc.message}",
                                       hint="re-run `rexmle prepare TASK --force`") from None

    def load_case(self, case: CaseInput) -> tuple[Volume, Volume]:
        """(ground truth, prediction) of one case, on the same grid."""
        prediction = self.load_prediction(case, self.prediction_column)
        truth = self.read_ground_truth(case.case_id, case.answer_path(LABEL_PATH))
        prediction.geometry = align_to_truth(case, self.prediction_column, self.header_rule, truth.geometry,
                                             prediction.geometry)
        return truth, prediction

    # ---- aggregation --------------------------------------------------------------------------------------------
    @staticmethod
    def case_means(cases: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, float]:
        """Arithmetic mean over cases of each per-case metric in ``names``."""
        if not cases:
            raise GraderError("no case was scored")
        return {name: float(np.mean([float(c[name]) for c in cases])) for name in names}

    # ---- reference submissions --------------------------------------------------------------------------------
    def write_sample_submission(self, public_dir: Path, dest: Path) -> None:
        """Empty masks (all background) on every test image's grid."""
        manifest = TestManifest.read(public_dir)
        rows = []
        for case_id in manifest.ids:
            geometry = manifest.geometry_of(case_id)
            row = self.schema.example_row(case_id)
            write_volume(dest / row[self.prediction_column.name],
                         np.zeros(geometry.numpy_shape, dtype=np.uint8), geometry)
            rows.append(row)
        write_submission_csv(dest, self.schema, rows)

    def write_gold_submission(self, private_dir: Path, public_dir: Path, dest: Path) -> None:
        """The ground truth itself, as the masks a perfect participant would submit."""
        rows = []
        for case in answer_cases(self, private_dir, public_dir):
            truth = self.read_ground_truth(case.case_id, case.answer_path(LABEL_PATH))
            row = self.schema.example_row(case.case_id)
            write_volume(dest / row[self.prediction_column.name],
                         self.gold_mask(truth.array).astype(np.uint8), truth.geometry)
            rows.append(row)
        write_submission_csv(dest, self.schema, rows)
