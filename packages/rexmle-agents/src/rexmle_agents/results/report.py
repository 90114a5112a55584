"""The group report: always rebuilt from run folders, never from an earlier report.

:func:`build_group_report` reads every run under the given folders (:func:`~rexmle_agents.results.loader.load_runs`)
and returns a :class:`GroupReport`: the per-run rows with their comparability columns, the paper's table in every
scope (:mod:`rexmle_agents.results.stats`, whose rules it carries), the calibrated baselines as reference rows,
the leaderboard caveats, the grading entries (the ``rexmle grade`` entry format, for MLE-bench-style tooling) and
what could not be read. ``rexmle run``, ``rexmle demo`` and ``rexmle report`` all write it through this module.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rexmle_agents.harness.spec import RUN_FORMAT_VERSION
from rexmle_agents.results.loader import RunSet, task_facts
from rexmle_agents.results.rows import RunRow, run_row
from rexmle_agents.results.stats import (
    BOOTSTRAP_LEVELS,
    DEFAULT_BY,
    ROW_KEYS,
    RULES,
    TableRow,
    aggregate,
    calibration_rows,
    pad_grid,
    reference_percentiles,
)
from rexmle_grade.errors import UserInputError
from rexmle_grade.report import ReportEntry
from rexmle_grade.settings import rexmle_versions
from rexmle_grade.text import printable

GROUP_REPORT_VERSION = 1
DEFAULT_REPLICATES = 2000
FEW_BOARD_ROWS = 10


class BoardCaveat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str
    board_rows: int | None
    board_teams: int | None
    note: str


class Bootstrap(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replicates: int
    seed: int
    levels: list[str] = Field(default_factory=lambda: list(BOOTSTRAP_LEVELS))


class Refused(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_dir: str
    reason: str


class RunProblem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    problem: str


class GroupReport(BaseModel):
    """``runs/<group>/report.json`` and ``rexmle report --format json``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = GROUP_REPORT_VERSION
    kind: Literal["rexmle-group-report"] = "rexmle-group-report"
    run_format: int = RUN_FORMAT_VERSION
    created_at: str = Field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    rexmle_versions: dict[str, str] = Field(default_factory=rexmle_versions)
    sources: list[str]
    group_by: list[str]
    rules: dict[str, str] = Field(default_factory=lambda: dict(RULES))
    bootstrap: Bootstrap
    runs: list[RunRow]
    rows: list[TableRow]
    caveats: list[BoardCaveat]
    entries: list[ReportEntry]
    duplicates: list[str] = Field(default_factory=list, description="run ids left out: a later run of the same "
                                                                     "row, task and seed was used")
    refused: list[Refused] = Field(default_factory=list)
    problems: list[RunProblem] = Field(default_factory=list)

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.model_dump_json(indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path

    @property
    def data_kinds(self) -> list[str]:
        return sorted({r.data for r in self.rows}, key=["real", "synthetic", "unknown"].index)


def parse_by(text: str | Sequence[str]) -> list[str]:
    keys = [k.strip() for k in (text.split(",") if isinstance(text, str) else text) if k.strip()]
    unknown = [k for k in keys if k not in ROW_KEYS]
    if unknown or not keys:
        raise UserInputError(f"--by {','.join(keys) or '(nothing)'}: unknown row key(s) {unknown}",
                             hint=f"choose from {', '.join(ROW_KEYS)} (default {','.join(DEFAULT_BY)})")
    return keys


def build_group_report(runs: RunSet, *, by: Sequence[str] = DEFAULT_BY, replicates: int = DEFAULT_REPLICATES,
                       seed: int = 0, calibration: Sequence[Any] | None = None) -> GroupReport:
    """The report of every run in ``runs``. ``calibration``: baseline calibration records (default: those of the
    data folders the runs used, and the shipped ones, when rexmle-baselines is installed)."""
    import pandas as pd

    by = parse_by(by)
    rows = [run_row(run) for run in runs.runs]
    calibration = list(load_calibration(runs, rows) if calibration is None else calibration)
    tasks = sorted({r.task_id for r in rows} | {c.task_id for c in calibration})
    facts = {task: task_facts(task) for task in tasks}
    table: list[TableRow] = []
    duplicates: list[str] = []
    if rows:
        frame = pd.DataFrame([r.model_dump() for r in rows])
        padded, duplicates = pad_grid(frame, by, facts)
        references = reference_percentiles(padded, calibration)
        competition = {task: f.competition for task, f in facts.items()}
        table = aggregate(padded, by, competition=competition, references=references, replicates=replicates,
                          seed=seed)
    table += calibration_rows(calibration, facts)
    entries = [run.grade for run in runs.runs if run.grade is not None]
    return GroupReport(
        sources=[str(s) for s in runs.sources], group_by=list(by),
        bootstrap=Bootstrap(replicates=replicates, seed=seed), runs=rows, rows=table,
        caveats=[_caveat(facts[t]) for t in tasks], entries=entries, duplicates=duplicates,
        refused=[Refused(run_dir=str(p), reason=why) for p, why in runs.refused],
        problems=[RunProblem(run_id=run.run_id, problem=p) for run in runs.runs for p in run.problems],
    )


def _caveat(facts: Any) -> BoardCaveat:
    notes = []
    if facts.board_rows is None:
        notes.append("no human leaderboard: no percentile, position or medal; left out of percentile means")
    else:
        if facts.board_rows < FEW_BOARD_ROWS:
            notes.append(f"only {facts.board_rows} human rows: percentiles move in steps of {1 / facts.board_rows:.0%}")
        if facts.board_teams == 1 and facts.board_rows > 1:
            notes.append("every row is one team's submission")
    return BoardCaveat(task_id=facts.task_id, board_rows=facts.board_rows, board_teams=facts.board_teams,
                       note="; ".join(notes))


def load_calibration(runs: RunSet, rows: Sequence[RunRow]) -> list[Any]:
    """Calibration records of the runs' tasks: the runs' data folders' (measured there) and the shipped ones."""
    try:
        from rexmle_baselines.calibration import PACKAGE_CALIBRATION_DIR, load_results
    except ImportError:  # rexmle-baselines is optional for the harness and the reports
        return []
    folders = dict.fromkeys([*(Path(run.spec.data_root) / "calibration" for run in runs.runs if run.spec.data_root),
                             PACKAGE_CALIBRATION_DIR])
    tasks = sorted({r.task_id for r in rows})
    found: dict[tuple[str, str, str, bool], Any] = {}
    for folder in folders:
        for task in tasks:
            for record in load_results(folder, task):
                found.setdefault((record.task_id, record.baseline, record.config, record.synthetic), record)
    return list(found.values())


# ---------------------------------------------------------------------------------------------------------------
# rendering: the same tables as rich (terminal), Markdown and CSV


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _pct_se(row: TableRow) -> str:
    if row.mean_percentile is None:
        return "n/a"
    se = "" if row.se_percentile is None else f" ± {row.se_percentile:.1%}"
    return f"{row.mean_percentile:.1%}{se}"


def _ci(row: TableRow) -> str:
    return "-" if row.ci_low is None else f"[{row.ci_low:.1%}, {row.ci_high:.1%}]"


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:.2f}"


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 else \
        f"{seconds:.0f} s"


def main_columns(report: GroupReport) -> list[str]:
    return [*report.group_by, "runs", "missing", "valid", "mean pct ± s.e.", "95% CI", "median", "mean pos.",
            "medals (g/s/b)", "> median", "normalised", "cost/run", "time used/budget"]


def main_cells(row: TableRow, marker: str) -> list[str]:
    keys = [row.keys.get(k, "-") for k in row.keys]
    norm = "-" if row.normalised is None else f"{row.normalised:.2f} ({row.normalised_tasks} t.)"
    return [*keys, str(row.n_runs), str(row.n_missing), f"{row.valid_rate:.0%}", _pct_se(row) + marker, _ci(row),
            fmt_pct(row.median_percentile), "-" if row.mean_position is None else f"{row.mean_position:.2f}",
            f"{row.medals} ({row.gold}/{row.silver}/{row.bronze}){marker}",
            "-" if row.above_median_rate is None else f"{row.above_median_rate:.0%}", norm, _money(row.cost_per_run),
            f"{_hours(row.time_used_s)} / {_hours(row.time_budget_s)}"]


def tables(report: GroupReport, data_kind: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """The report's tables for one data kind: (title, columns, cells), shared by every output format."""
    marker = "" if data_kind == "real" else " †"
    rows = [r for r in report.rows if r.data == data_kind and r.reference is None]
    out: list[tuple[str, list[str], list[list[str]]]] = []
    overall = [r for r in rows if r.scope == "all"]
    out.append((f"{data_kind} data: all tasks", main_columns(report), [main_cells(r, marker) for r in overall]))
    for scope, title in (("task_type", "by task type"), ("dim", "by dimension"), ("task", "by task")):
        scoped = [r for r in rows if r.scope == scope]
        values = sorted({r.scope_value for r in scoped})
        if not values:
            continue
        keyed: dict[tuple[str, ...], dict[str, TableRow]] = {}
        for r in scoped:
            keyed.setdefault(tuple(r.keys.values()), {})[r.scope_value] = r
        if scope == "task":
            for r in report.rows:
                if r.data == data_kind and r.reference == "calibration" and r.scope_value in values:
                    keyed.setdefault(tuple(r.keys.get(k, "-") for k in report.group_by), {})[r.scope_value] = r
        cells = []
        for key, by_value in keyed.items():
            cells.append([*key, *(_scope_cell(by_value.get(v), marker) for v in values)])
        out.append((f"{data_kind} data: mean percentile ± s.e. (valid rate) {title}", [*report.group_by, *values],
                    cells))
    return out


def _scope_cell(row: TableRow | None, marker: str) -> str:
    if row is None:
        return "-"
    if row.mean_percentile is None:
        return f"n/a, no board ({row.valid_rate:.0%})"
    return f"{_pct_se(row)}{marker} ({row.valid_rate:.0%})"


def banner(data_kind: str) -> str | None:
    if data_kind == "synthetic":
        return ("SYNTHETIC DATA † — these runs used rexmle's synthetic mirrors of the challenge data: percentiles and "
                "medals are computed against the human leaderboard but are NOT comparable with it")
    if data_kind == "unknown":
        return ("DATA KIND UNKNOWN — these grades do not say whether the data was synthetic (written before grades "
                "recorded it) and the task data is gone: not comparable with the human leaderboard")
    return None


def caveat_lines(report: GroupReport) -> list[str]:
    lines = [f"{c.task_id}: {c.board_rows if c.board_rows is not None else 'no'} human rows"
             + (f" — {c.note}" if c.note else "") for c in report.caveats]
    return lines


def footer_lines(report: GroupReport) -> list[str]:
    lines = [f"{name}: {text}" for name, text in report.rules.items()]
    if any(r.reference == "calibration" for r in report.rows):
        lines.append("rows baseline:NAME are calibrated expert baselines (`rexmle baselines calibrate`): one measured "
                     "run each, on the data kind their row shows; they are references, never padded or totalled")
    if report.duplicates:
        lines.append(f"left out as earlier duplicates of the same cell: {', '.join(report.duplicates)}")
    lines += cluster_lines(report)
    lines += [f"refused {r.run_dir}: {r.reason}" for r in report.refused]
    lines += [f"{p.run_id}: {p.problem}" for p in report.problems[:30]]
    if len(report.problems) > 30:
        lines.append(f"... and {len(report.problems) - 30} more problem(s) (see the JSON report)")
    return lines


def cluster_lines(report: GroupReport) -> list[str]:
    """For runs of the SLURM executor: how their jobs ended, and which runs the cluster ended, not the agent."""
    jobs = [r for r in report.runs if r.job_id]
    if not jobs:
        return []
    states: dict[str, int] = {}
    for row in jobs:
        states[row.job_state or "unknown"] = states.get(row.job_state or "unknown", 0) + 1
    sources = sorted({r.job_source or "?" for r in jobs})
    where = ("SLURM's accounting (sacct)" if sources == ["sacct"] else
             f"{'/'.join(sources)}: the cluster keeps no accounting storage, so jobs were recorded while they "
             "existed" if "sacct" not in sources else "/".join(sources))
    lines = [f"SLURM jobs of {len(jobs)} run(s): " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
             + f"; {sum(r.requeues or 0 for r in jobs)} requeue(s); job records from {where}"]
    lines += [f"ended by the cluster, not the agent: {r.run_id}: {r.state}: {r.reason}"
              for r in report.runs if r.ended_by_cluster]
    return lines


def render_terminal(report: GroupReport, console: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    if not report.rows:
        console.print("no graded runs yet")
    for data_kind in report.data_kinds:
        text = banner(data_kind)
        if text:
            console.print(Text(text, style="bold yellow"))
        for title, columns, cells in tables(report, data_kind):
            table = Table(title=title, title_justify="left")
            for column in columns:
                table.add_column(column, overflow="fold")
            for row in cells:  # cells hold run data: never markup, never a control character
                table.add_row(*(Text(printable(c, one_line=True)) for c in row))
            console.print(table)
    console.print(Text("leaderboards: " + "; ".join(caveat_lines(report)), style="dim"))
    console.print(Text(TERMINAL_RULES, style="dim"))
    for line in footer_lines(report)[len(report.rules):]:
        console.print(Text(printable(line, one_line=True), style="dim"))


# the rules in one line for the terminal (in full in the JSON report and in --format md)
TERMINAL_RULES = ("rules: invalid or missing = percentile 0 (position N+1); every row padded to every task x its "
                  "seeds; no board (RAVIR) = left out of percentile means; s.e. over seeds; 95% CI = bootstrap of "
                  "competitions, tasks, seeds; normalised = sample 0, best calibrated baseline 1 (all: --format md)")


def to_markdown(report: GroupReport) -> str:
    out = io.StringIO()
    for data_kind in report.data_kinds:
        text = banner(data_kind)
        if text:
            out.write(f"> **{text}**\n\n")
        for title, columns, cells in tables(report, data_kind):
            out.write(f"**{title}**\n\n| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n")
            for row in cells:
                out.write("| " + " | ".join(printable(c, one_line=True).replace("|", "\\|") for c in row) + " |\n")
            out.write("\n")
    out.write("Leaderboards: " + "; ".join(caveat_lines(report)) + ".\n\n")
    out.write("".join(f"- {printable(line, one_line=True)}\n" for line in footer_lines(report)))
    return out.getvalue()


def to_csv(report: GroupReport) -> str:
    """The table in long form: one line per (data, row keys, scope), every statistic a column."""
    import pandas as pd

    records = []
    for row in report.rows:
        flat = row.model_dump(exclude={"keys", "tasks_without_board"})
        records.append({**{k: row.keys.get(k, "") for k in report.group_by}, **flat,
                        "tasks_without_board": " ".join(row.tasks_without_board)})
    return pd.DataFrame(records).to_csv(index=False)
