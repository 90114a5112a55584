"""Grade one submission: validate, score every case (in parallel), aggregate. Never raises for bad input.

The result distinguishes three outcomes:

* ``valid``: metrics computed;
* ``invalid_submission``: the submission breaks the format (every problem listed);
* ``grader_error``: an exception inside rexmle's own code (a bug), with its traceback, never blamed on the
  submission.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rexmle_grade.errors import InvalidSubmissionError, RexmleError
from rexmle_grade.grader import CaseInput, Grader, TestManifest, collect_case_warnings, read_answers
from rexmle_grade.validation import (
    build_cases,
    check_paths,
    check_table,
    parallel_map,
    read_submission_csv,
    summarise,
)

Status = Literal["valid", "invalid_submission", "grader_error"]


@dataclass
class GradeResult:
    grader_id: str
    status: Status
    metrics: dict[str, float] = field(default_factory=dict)
    per_case: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    error: str | None = None  # traceback of a grader bug
    seconds: float = 0.0
    #: accepted departures worth knowing, e.g. prediction header fields that differ and were ignored
    warnings: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.status == "valid"


@dataclass(frozen=True)
class _ScoreCase:
    grader: Grader

    def __call__(self, case: CaseInput) -> tuple[str, Any, list[str]]:
        with collect_case_warnings() as warnings:
            try:
                return "ok", self.grader.score_case(case), warnings
            except InvalidSubmissionError as exc:
                return "invalid", exc.problems, warnings
            except RexmleError as exc:
                return "error", f"{type(exc).__name__}: {exc}", warnings
            except Exception:
                return "error", traceback.format_exc(), warnings


DETAILS = "details"


def public_case_rows(per_case: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per-case dicts for results and reports: the per-case values, and under ``details`` the internal values the
    grader keeps for aggregation (keys starting with '_': detections, volumes, per-class values...), JSON-ready."""
    rows = []
    for row in per_case:
        public = {k: v for k, v in row.items() if not k.startswith("_")}
        details = {k[1:]: json_ready(v) for k, v in row.items() if k.startswith("_")}
        rows.append({**public, DETAILS: details} if details else public)
    return rows


def json_ready(value: Any) -> Any:
    """numpy scalars and arrays, tuples and dicts with non-string keys turned into plain JSON values."""
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return json_ready(value.tolist())
    return value


def grade_submission(grader: Grader, submission_dir: str | Path, public_dir: str | Path, private_dir: str | Path,
                     *, workers: int = 1, progress: Callable[[int, int], None] | None = None) -> GradeResult:
    """Validate and score a submission folder against a prepared task (see module docstring)."""
    started = time.perf_counter()
    submission_dir, public_dir, private_dir = Path(submission_dir), Path(public_dir), Path(private_dir)
    manifest = TestManifest.read(public_dir)
    answers = read_answers(private_dir, grader)
    try:
        rows = read_submission_csv(submission_dir)
    except InvalidSubmissionError as exc:
        return GradeResult(grader_id=grader.grader_id, status="invalid_submission", problems=summarise(exc.problems),
                           seconds=time.perf_counter() - started)
    return grade_rows(grader, rows, manifest, submission_dir, private_dir, answers, workers=workers,
                      progress=progress, started=started)


def grade_rows(grader: Grader, rows: list[dict[str, str]], manifest: TestManifest, submission_dir: Path,
               private_dir: Path, answers: dict[str, dict[str, str]], *, workers: int = 1,
               progress: Callable[[int, int], None] | None = None, started: float | None = None) -> GradeResult:
    """Check and score submission ``rows`` (``submission.csv`` as dicts, paths relative to ``submission_dir``)
    against ``answers`` (``answers.csv`` as {id: row}, paths relative to ``private_dir`` or absolute)."""
    started = time.perf_counter() if started is None else started

    def done(status: Status, **kw: Any) -> GradeResult:
        return GradeResult(grader_id=grader.grader_id, status=status, seconds=time.perf_counter() - started, **kw)

    problems = check_table(grader, rows, manifest) + check_paths(grader, rows, submission_dir)
    if problems:
        return done("invalid_submission", problems=summarise(problems))
    cases = build_cases(rows, grader, manifest, submission_dir, private_dir, answers)
    per_case: list[dict[str, Any]] = []
    errors: list[str] = []
    warnings: list[str] = []
    scored = parallel_map(_ScoreCase(grader), cases, workers, progress)
    for case, (kind, payload, case_warnings) in zip(cases, scored, strict=True):
        warnings += case_warnings
        if kind == "ok":
            per_case.append({grader.schema.id_column: case.case_id, **payload})
        elif kind == "invalid":
            problems += payload
        else:
            errors.append(f"case {case.case_id!r}: {payload}")
    warnings = summarise(warnings)
    if errors:
        return done("grader_error", problems=summarise(problems), error="\n".join(errors), warnings=warnings)
    if problems:
        return done("invalid_submission", problems=summarise(problems), warnings=warnings)
    try:
        metrics = grader.aggregate(per_case, private_dir)
    except InvalidSubmissionError as exc:
        return done("invalid_submission", problems=summarise(exc.problems), warnings=warnings)
    except Exception:
        return done("grader_error", error=traceback.format_exc(), warnings=warnings)
    missing = [m.name for m in grader.metrics if m.name not in metrics]
    if missing:
        return done("grader_error", error=f"grader {grader.grader_id!r} did not compute metrics {missing}")
    metrics = {k: float(v) for k, v in metrics.items()}
    return done("valid", metrics=metrics, per_case=public_case_rows(per_case), warnings=warnings)


def is_finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
