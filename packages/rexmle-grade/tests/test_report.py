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
