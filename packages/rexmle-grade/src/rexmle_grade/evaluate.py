"""Grade a submission for a task and rank it: the one function behind ``rexmle grade run`` and ``batch``."""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

from rexmle_grade.errors import InvalidSubmissionError, RexmleError
from rexmle_grade.grader import get_grader
from rexmle_grade.grading import grade_submission
from rexmle_grade.ranking import rank_submission
from rexmle_grade.report import ReportEntry
from rexmle_grade.targets import GradingTarget


def evaluate_submission(target: GradingTarget, submission_dir: str | Path, *, workers: int = 1,
                        labels: Mapping[str, str] | None = None,
                        progress: Callable[[int, int], None] | None = None) -> ReportEntry:
    """Validate, grade and rank ``submission_dir`` for ``target``; bad input gives an invalid entry, not an error."""
    submission_dir = Path(submission_dir)
    grader = get_grader(target.grader_id)
    board = target.leaderboard
    # leaderboard facts are set whatever the outcome, so that totals count a missing/invalid submission as 0
    common = dict(task_id=target.task_id, task_version=target.task_version, grader_id=grader.grader_id,
                  task_type=target.task_type, dim=target.dim, submission_path=str(submission_dir),
                  conventions=list(grader.conventions), labels=dict(labels or {}), synthetic=target.synthetic,
                  leaderboard_version=None if board is None else (board.version or target.task_version),
                  leaderboard_rows=None if board is None else board.n_rows)
    if not submission_dir.is_dir():
        return ReportEntry(**common, submission_exists=False, valid_submission=False, status="missing",
                           problems=[f"submission folder {str(submission_dir)!r} does not exist"])
    result = grade_submission(grader, submission_dir, target.public_dir, target.private_dir, workers=workers,
                              progress=progress)
    entry = ReportEntry(**common, submission_exists=True, valid_submission=result.valid, status=result.status,
                        problems=result.problems, error=result.error, metrics=result.metrics,
                        per_case=result.per_case, warnings=result.warnings, seconds=result.seconds)
    if board is None or not result.valid:
        return entry
    ranked = rank_submission(board, {m: _num(result.metrics.get(m)) for m in board.metrics})
    return entry.model_copy(update=dict(
        positions=ranked.positions, score=ranked.mean_position, percentile=ranked.percentile,
        inserted_rank=ranked.inserted_rank, gold_threshold=ranked.thresholds["gold"],
        silver_threshold=ranked.thresholds["silver"], bronze_threshold=ranked.thresholds["bronze"],
        median_threshold=ranked.thresholds["median"], gold_medal=ranked.gold, silver_medal=ranked.silver,
        bronze_medal=ranked.bronze, any_medal=ranked.any_medal, above_median=ranked.above_median,
        nan_metrics=ranked.nan_metrics,
    ))


def _num(value: float | None) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def failed_entry(task_id: str, submission_dir: str | Path, exc: BaseException, *,
                 labels: Mapping[str, str] | None = None) -> ReportEntry:
    """The report entry of a submission whose grading raised: an invalid submission for a format problem, a grader
    error (with the message, or the traceback of a bug) for anything else, so that a batch keeps its report."""
    common = dict(task_id=task_id, grader_id="", submission_path=str(submission_dir),
                  submission_exists=Path(submission_dir).is_dir(), valid_submission=False, labels=dict(labels or {}))
    if isinstance(exc, InvalidSubmissionError):
        return ReportEntry(**common, status="invalid_submission", problems=exc.problems)
    if isinstance(exc, RexmleError):
        return ReportEntry(**common, status="grader_error", problems=[exc.message], error=str(exc))
    error = "".join(traceback.format_exception(exc))
    return ReportEntry(**common, status="grader_error", problems=[f"{type(exc).__name__}: {exc}"], error=error)
