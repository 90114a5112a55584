"""Grading reports: totals, by-type grouping, JSON round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from rexmle_grade.report import GradingReport, ReportEntry


def entry(task: str, *, valid: bool, percentile: float | None = None, medal: str | None = None,
          task_type: str = "segmentation") -> ReportEntry:
    return ReportEntry(task_id=task, grader_id=task, task_type=task_type, dim="3d", submission_path="x",
                       submission_exists=True, valid_submission=valid,
                       status="valid" if valid else "invalid_submission",
                       leaderboard_rows=10, percentile=percentile, gold_medal=medal == "gold",
                       bronze_medal=medal == "bronze", any_medal=medal is not None, above_median=bool(medal))


def test_totals_count_invalid_as_zero_percentile(tmp_path: Path) -> None:
    report = GradingReport.build([
        entry("a", valid=True, percentile=1.0, medal="gold"),
        entry("b", valid=True, percentile=0.5, medal="bronze", task_type="detection"),
        entry("c", valid=False),
    ])
    t = report.totals
    assert (t.total_runs, t.total_valid_submissions, t.total_medals, t.total_gold_medals) == (3, 2, 2, 1)
    assert t.valid_rate == pytest.approx(2 / 3)
    assert t.mean_percentile == pytest.approx(0.5)
    assert t.median_percentile == pytest.approx(0.5)
    assert t.mean_percentile_valid == pytest.approx(0.75)
    assert set(report.by_task_type) == {"segmentation", "detection"}
    assert report.by_task_type["segmentation"].total_runs == 2
    path = report.write(tmp_path / "r.json")
    again = GradingReport.read(path)
    assert again == report
    assert again.schema_version == 1 and "rexmle-grade" in again.rexmle_versions


def test_missing_submission_counts_as_zero_percentile(tmp_path: Path) -> None:
    from rexmle_grade.evaluate import evaluate_submission
    from rexmle_grade.grader import Direction
    from rexmle_grade.ranking import Leaderboard
    from rexmle_grade.targets import GradingTarget

    lb = tmp_path / "lb.csv"
    lb.write_text("rank,team,mean_position,dice,dice_position\n1,A,1,0.9,1\n")
    board = Leaderboard.from_csv(lb, {"dice": Direction.HIGHER_BETTER}, version="1")
    target = GradingTarget(task_id="isles22", task_version="1", grader_id="isles22", public_dir=tmp_path,
                           private_dir=tmp_path, leaderboard=board)
    missing = evaluate_submission(target, tmp_path / "absent")
    assert missing.status == "missing" and missing.leaderboard_rows == 1
    report = GradingReport.build([missing, entry("b", valid=True, percentile=1.0, medal="gold")])
    assert report.totals.mean_percentile == pytest.approx(0.5)
