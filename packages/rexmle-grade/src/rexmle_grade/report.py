"""Versioned grading reports (JSON) and their terminal rendering.

A report holds one entry per graded (task, submission) and totals. Field names follow MLE-bench's grading
report where the concepts coincide (``valid_submission``, ``gold_medal``, ``above_median``, ``*_threshold``,
``is_lower_better`` for the mean position used as score), so tooling written for it reads ours. Every entry carries
the versions needed to trace it: rexmle packages, task version, leaderboard version.

Aggregation conventions: an invalid or missing submission counts as percentile 0 and no medal in
``mean_percentile`` / ``median_percentile`` (``mean_percentile_valid`` averages valid entries only).
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rexmle_grade.settings import rexmle_versions

REPORT_SCHEMA_VERSION = 1
# Labels that identify a run for tools (kept in the JSON) but only clutter the terminal table.
TABLE_HIDDEN_LABELS = frozenset({"run_id", "group"})


class ReportEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str
    task_version: str = ""
    grader_id: str
    task_type: str = ""
    dim: str = ""
    submission_path: str
    submission_exists: bool
    valid_submission: bool
    status: str  # valid | invalid_submission | grader_error | missing
    problems: list[str] = Field(default_factory=list)
    #: accepted departures worth knowing, e.g. prediction header fields that differ and were ignored when scoring
    warnings: list[str] = Field(default_factory=list)
    error: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    per_case: list[dict[str, Any]] = Field(default_factory=list)
    conventions: list[str] = Field(default_factory=list)
    # ranking (None without a leaderboard or without a valid submission)
    leaderboard_version: str | None = None
    leaderboard_rows: int | None = None
    positions: dict[str, int] | None = None
    score: float | None = None  # mean position (lower is better), as MLE-bench's "score"
    is_lower_better: bool = True
    percentile: float | None = None
    inserted_rank: int | None = None
    gold_threshold: float | None = None
    silver_threshold: float | None = None
    bronze_threshold: float | None = None
    median_threshold: float | None = None
    gold_medal: bool = False
    silver_medal: bool = False
    bronze_medal: bool = False
    any_medal: bool = False
    above_median: bool = False
    nan_metrics: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    labels: dict[str, str] = Field(default_factory=dict)  # agent, model, seed, run id... from batch inputs
    #: graded on rexmle's synthetic mirror of the data (None: not recorded, as in reports written before this field):
    #: its percentile and medals are computed against the human board but are not comparable with it
    synthetic: bool | None = None
    created_at: str = Field(default_factory=lambda: _now())


class Totals(BaseModel):
    total_runs: int
    total_runs_with_submissions: int
    total_valid_submissions: int
    valid_rate: float
    total_medals: int
    total_gold_medals: int
    total_silver_medals: int
    total_bronze_medals: int
    total_above_median: int
    mean_percentile: float | None
    median_percentile: float | None
    mean_percentile_valid: float | None
    grader_errors: int


class GradingReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = REPORT_SCHEMA_VERSION
    created_at: str = Field(default_factory=lambda: _now())
    rexmle_versions: dict[str, str] = Field(default_factory=rexmle_versions)
    entries: list[ReportEntry]
    totals: Totals
    by_task_type: dict[str, Totals] = Field(default_factory=dict)
    by_dim: dict[str, Totals] = Field(default_factory=dict)

    @classmethod
    def build(cls, entries: Sequence[ReportEntry]) -> GradingReport:
        by_type: dict[str, list[ReportEntry]] = defaultdict(list)
        by_dim: dict[str, list[ReportEntry]] = defaultdict(list)
        for e in entries:
            by_type[e.task_type or "unknown"].append(e)
            by_dim[e.dim or "unknown"].append(e)
        return cls(entries=list(entries), totals=totals(entries),
                   by_task_type={k: totals(v) for k, v in sorted(by_type.items())},
                   by_dim={k: totals(v) for k, v in sorted(by_dim.items())})

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, path: Path) -> GradingReport:
        return cls.model_validate_json(path.read_text())


def totals(entries: Iterable[ReportEntry]) -> Totals:
    entries = list(entries)
    n = len(entries)
    valid = [e for e in entries if e.valid_submission]
    # every entry of a task with a leaderboard counts; a missing or invalid submission counts as percentile 0
    pct_all = [e.percentile if (e.valid_submission and e.percentile is not None) else 0.0 for e in entries
               if e.leaderboard_rows]
    pct_valid = [e.percentile for e in valid if e.percentile is not None]
    return Totals(
        total_runs=n,
        total_runs_with_submissions=sum(e.submission_exists for e in entries),
        total_valid_submissions=len(valid),
        valid_rate=len(valid) / n if n else 0.0,
        total_medals=sum(e.any_medal for e in entries),
        total_gold_medals=sum(e.gold_medal for e in entries),
        total_silver_medals=sum(e.silver_medal for e in entries),
        total_bronze_medals=sum(e.bronze_medal for e in entries),
        total_above_median=sum(e.above_median for e in entries),
        mean_percentile=statistics.fmean(pct_all) if pct_all else None,
        median_percentile=statistics.median(pct_all) if pct_all else None,
        mean_percentile_valid=statistics.fmean(pct_valid) if pct_valid else None,
        grader_errors=sum(e.status == "grader_error" for e in entries),
    )


def render_report(report: GradingReport, console: Any | None = None) -> None:
    """Print a rich table of the entries and the totals."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    table = Table(title=f"rexmle grading report ({len(report.entries)} submission(s))")
    for col in ("task", "status", "mean pos.", "percentile", "medal", "inserted rank", "key metrics"):
        table.add_column(col, overflow="fold")
    for e in report.entries:
        medal = "gold" if e.gold_medal else "silver" if e.silver_medal else "bronze" if e.bronze_medal else "-"
        status = Text("valid", style="green") if e.valid_submission else Text(e.status, style="red")
        if e.warnings:
            status.append(f" ({len(e.warnings)} warning(s))", style="yellow")
        shown = ", ".join(f"{k} {v:.4g}" for k, v in list(e.metrics.items())[:4])
        # every cell holding user or submission text is a Text, never markup: an id such as 'zz[/]bad' is data
        table.add_row(
            Text(" ".join([e.task_id, *(f"{k}={v}" for k, v in e.labels.items() if k not in TABLE_HIDDEN_LABELS)])),
            status,
            "-" if e.score is None else f"{e.score:.2f} / {e.leaderboard_rows}",
            "-" if e.percentile is None else f"{e.percentile:.1%}",
            medal,
            "-" if e.inserted_rank is None else str(e.inserted_rank),
            Text(shown or "; ".join(e.problems[:2])[:120]),
        )
    console.print(table)
    t = report.totals
    pct = "-" if t.mean_percentile is None else f"{t.mean_percentile:.1%}"
    console.print(
        f"valid {t.total_valid_submissions}/{t.total_runs} ({t.valid_rate:.0%}) · medals {t.total_medals} "
        f"(gold {t.total_gold_medals}, silver {t.total_silver_medals}, bronze {t.total_bronze_medals}) · "
        f"above median {t.total_above_median} · mean percentile {pct}"
        + (f" · [red]{t.grader_errors} grader error(s)[/]" if t.grader_errors else "")
    )
    for e in report.entries:
        if e.problems and not e.valid_submission:
            console.print(Text(f"{e.task_id} problems:", style="red"))
            for p in e.problems[:10]:
                console.print(f"  - {p}", markup=False, highlight=False)
        if e.warnings:
            console.print(Text(f"{e.task_id} warnings:", style="yellow"))
            for w in e.warnings[:10]:
                console.print(f"  - {w}", markup=False, highlight=False)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
