"""Tiny prepared 2-D tasks written in ``tmp_path`` for the end-to-end grader tests."""

from __future__ import annotations

import csv
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from rexmle_grade.grader import ANSWERS_CSV, Grader, TestManifest
from rexmle_grade.grading import GradeResult, grade_submission
from rexmle_grade.io import Geometry
from rexmle_grade.schema import SUBMISSION_CSV
from rexmle_grade.validation import ValidationReport, validate_submission


@dataclass
class PreparedTask:
    grader: Grader
    root: Path

    @property
    def public(self) -> Path:
        return self.root / "public"

    @property
    def private(self) -> Path:
        return self.root / "private"

    def write_answers(self, rows: Sequence[Mapping[str, str]]) -> None:
        columns = [self.grader.schema.id_column, *self.grader.answer_columns]
        with (self.private / ANSWERS_CSV).open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)

    def gold(self) -> Path:
        dest = self.root / "gold"
        self.grader.write_gold_submission(self.private, self.public, dest)
        return dest

    def sample(self) -> Path:
        dest = self.root / "sample"
        self.grader.write_sample_submission(self.public, dest)
        return dest

    def validate(self, submission: Path) -> ValidationReport:
        return validate_submission(self.grader, submission, self.public)

    def grade(self, submission: Path) -> GradeResult:
        return grade_submission(self.grader, submission, self.public, self.private)

    def grade_ok(self, submission: Path) -> dict[str, float]:
        report = self.validate(submission)
        assert report.ok, report.problems
        result = self.grade(submission)
        assert result.status == "valid", (result.problems, result.error)
        return result.metrics

    def variant(self, submission: Path, name: str) -> Path:
        """A copy of a submission folder to corrupt."""
        dest = self.root / name
        shutil.copytree(submission, dest, symlinks=True)
        return dest

    def rows(self, submission: Path) -> list[dict[str, str]]:
        with (submission / SUBMISSION_CSV).open(newline="") as fh:
            return list(csv.DictReader(fh))

    def write_rows(self, submission: Path, rows: Sequence[Mapping[str, str]]) -> None:
        with (submission / SUBMISSION_CSV).open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)

    def set_cell(self, submission: Path, row: int, column: str, value: str) -> None:
        rows = self.rows(submission)
        rows[row][column] = value
        self.write_rows(submission, rows)

    def assert_invalid(self, submission: Path, *fragments: str) -> None:
        """Validation and grading both reject the submission, listing problems that name ``fragments``."""
        report = self.validate(submission)
        assert not report.ok
        text = "\n".join(report.problems)
        for fragment in fragments:
            assert fragment in text, text
        result = self.grade(submission)
        assert result.status == "invalid_submission", (result.status, result.error)
        graded_text = "\n".join(result.problems)
        for fragment in fragments:
            assert fragment in graded_text, graded_text

    def assert_paths_contained(self, submission: Path, column: str) -> None:
        """Absolute paths, ``..`` and symlinks leading outside the folder are all rejected."""
        outside = self.root / "outside.bin"
        outside.write_bytes(b"secret")
        first = self.rows(submission)[0][column]
        suffix = Path(first).suffix
        cases = {
            "dotdot": ("../outside" + suffix, "'..'"),
            "absolute": (str(self.private / "x") + suffix, "absolute"),
        }
        for name, (value, fragment) in cases.items():
            bad = self.variant(submission, f"escape_{name}")
            self.set_cell(bad, 0, column, value)
            self.assert_invalid(bad, fragment)
        linked = self.variant(submission, "escape_symlink")
        target = linked / first
        target.unlink()
        os.symlink(outside, target)
        self.assert_invalid(linked, "outside the submission folder")


@pytest.fixture
def make_task(tmp_path: Path) -> Callable[..., PreparedTask]:
    """``make_task(grader, ids, sizes)``: public/ with the test manifest, an empty private/ to fill."""

    def make(grader: Grader, ids: Sequence[str], sizes: Mapping[str, tuple[int, int]] | None = None,
             name: str = "task") -> PreparedTask:
        task = PreparedTask(grader, tmp_path / name)
        task.public.mkdir(parents=True)
        task.private.mkdir(parents=True)
        geometry = {i: Geometry(size=tuple(s)) for i, s in (sizes or {}).items()}
        TestManifest(ids=tuple(ids), geometry=geometry).write(task.public)
        return task

    return make
