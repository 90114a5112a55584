"""Shared fixtures of the 2-D task tests: synthetic preparation, grading and leak checks.

Each test module prepares its tasks once (module scope) from the synthetic mirror and then checks the archives,
the prepared folders, the grader round trip (sample and gold submissions) and that a trivial model fitted on the
synthetic training data beats the sample submission.
"""

from __future__ import annotations

import csv
import re
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# importing the families registers them without importing every other (possibly unrelated) family module
import rexmle_tasks.families.cellseg
import rexmle_tasks.families.dentex
import rexmle_tasks.families.ldct
import rexmle_tasks.families.puma
import rexmle_tasks.families.ravir
import rexmle_tasks.families.usenhance  # noqa: F401
from rexmle_grade.grader import TestManifest, write_submission_csv
from rexmle_grade.grading import GradeResult, grade_submission
from rexmle_grade.settings import TaskDirs
from rexmle_grade.validation import validate_submission
from rexmle_tasks.base import Task
from rexmle_tasks.check import check_task
from rexmle_tasks.pipeline import PreparedInfo, prepare_task
from rexmle_tasks.registry import get_task
from rexmle_tasks.splits import sha256_file


@dataclass(frozen=True)
class Prepared:
    """A task prepared from its synthetic mirror."""

    task: Task
    dirs: TaskDirs
    info: PreparedInfo

    @property
    def manifest(self) -> TestManifest:
        return TestManifest.read(self.dirs.public)

    @property
    def test_ids(self) -> tuple[str, ...]:
        return self.manifest.ids

    def answers(self) -> dict[str, dict[str, str]]:
        with (self.dirs.private / "answers.csv").open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        return {r[self.task.grader.schema.id_column]: r for r in rows}

    def grade(self, submission: Path) -> GradeResult:
        result = grade_submission(self.task.grader, submission, self.dirs.public, self.dirs.private)
        assert result.status == "valid", (result.problems, result.error)
        return result

    def grade_sample(self) -> GradeResult:
        sample = self.dirs.public / "sample_submission"
        report = validate_submission(self.task.grader, sample, self.dirs.public)
        assert report.ok, report.problems
        return self.grade(sample)

    def grade_gold(self, dest: Path) -> GradeResult:
        self.task.grader.write_gold_submission(self.dirs.private, self.dirs.public, dest)
        return self.grade(dest)

    def write_files(self, dest: Path, write: Callable[[str, Path], None]) -> Path:
        """A submission with one prediction file per test id, written by ``write(case_id, path)``."""
        schema = self.task.grader.schema
        (column,) = schema.file_columns
        rows = []
        for case_id in self.test_ids:
            path = dest / column.path_for(case_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            write(case_id, path)
            rows.append({schema.id_column: case_id, column.name: column.path_for(case_id)})
        write_submission_csv(dest, schema, rows)
        return dest

    def write_values(self, dest: Path, values: Mapping[str, Any]) -> Path:
        schema = self.task.grader.schema
        (column,) = schema.value_columns
        write_submission_csv(dest, schema, [{schema.id_column: i, column.name: values[i]} for i in self.test_ids])
        return dest

    @property
    def primary_metric(self) -> str:
        return self.task.grader.ranked_metrics[0].name

    def assert_gold_is_best(self, result: GradeResult) -> None:
        for metric in self.task.grader.metrics:
            if metric.best is not None:
                assert result.metrics[metric.name] == pytest.approx(metric.best, abs=1e-9), metric.name

    def assert_no_leaks(self) -> None:
        """The framework's leak checks, plus: no private file's bytes and no test id outside the test inputs."""
        assert check_task(self.task, self.dirs, regenerate=False) == []  # regeneration: tests/test_all_tasks.py
        public = self.dirs.public
        private_sums = {sha256_file(p) for p in self.dirs.private.rglob("*") if p.is_file()}
        allowed_roots = {"test", "sample_submission"}
        allowed_files = {"test_manifest.json", "split_manifest.json", "description.md"}
        for path in public.rglob("*"):
            rel = path.relative_to(public)
            assert not path.is_symlink(), rel
            if not path.is_file() or rel.parts[0] in allowed_roots or rel.as_posix() in allowed_files:
                continue
            assert sha256_file(path) not in private_sums, f"{rel} is a copy of a private file"
            text = path.read_text(errors="ignore") if path.suffix in (".csv", ".json", ".geojson") else ""
            for case_id in self.test_ids:
                # a whole id, not a prefix of another name: test case train_1 beside training image train_10.png
                whole = re.compile(rf"(?<![A-Za-z0-9]){re.escape(case_id)}(?![A-Za-z0-9])")
                assert not whole.search(rel.as_posix()), f"test id {case_id} in {rel}"
                assert not whole.search(text), f"test id {case_id} inside {rel}"


def prepare_synthetic(task_id: str, root: Path, *, cases: int | None = None, seed: int = 0) -> Prepared:
    task = get_task(task_id)
    dirs = TaskDirs.for_task(task_id, raw_group=task.meta.raw_group, root=root)
    info = prepare_task(task, dirs, synthetic=True, cases=cases, seed=seed)
    return Prepared(task=task, dirs=dirs, info=info)


@pytest.fixture(scope="module")
def prepare(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Prepared]:
    """Prepare tasks under one module-wide data folder (tasks sharing a raw group share its download);
    ``own_folder=True`` gives a mirror of other size or seed a data folder of its own."""
    root = tmp_path_factory.mktemp("data")

    def make(task_id: str, *, own_folder: bool = False, **kw) -> Prepared:
        return prepare_synthetic(task_id, tmp_path_factory.mktemp("data") if own_folder else root, **kw)

    return make


class Kit:
    """Small helpers for the tests' archives and trivial models."""

    @staticmethod
    def zip_members(path: Path) -> list[str]:
        """File members of a zip archive, in archive order (folder entries left out)."""
        with zipfile.ZipFile(path) as zf:
            return [name for name in zf.namelist() if not name.endswith("/")]

    @staticmethod
    def nearest_centroid(features: np.ndarray, centroids: np.ndarray) -> np.ndarray:
        """Index of the nearest centroid for each feature vector (last axis = feature)."""
        distances = ((features[..., None, :] - centroids) ** 2).sum(axis=-1)
        return distances.argmin(axis=-1)

    @staticmethod
    def class_means(features: np.ndarray, labels: np.ndarray, classes: Iterable[int]) -> np.ndarray:
        return np.stack([features[labels == c].mean(axis=0) for c in classes])


@pytest.fixture(scope="session")
def kit() -> Kit:
    return Kit()
