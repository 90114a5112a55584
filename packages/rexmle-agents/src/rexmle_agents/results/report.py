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

from rexmle_agents.harness.spec import RUN_FORMAT_VERSION, data_kind_of, data_variant
from rexmle_agents.results.loader import RunSet, task_facts
from rexmle_agents.results.rows import RunRow, cost_text, run_row
from rexmle_agents.results.stats import (
    BOOTSTRAP_LEVELS,
    DEFAULT_BY,
    FEW_DATA_MARK,
    ROW_KEYS,
    RULES,
    Calibrated,
    ExpertBound,
    ExpertPin,
    TableRow,
    aggregate,
    calibration_rows,
    expert_bounds,
    pad_grid,
    reference_percentiles,
)
from rexmle_grade.csvsafe import frame_to_csv
from rexmle_grade.errors import RexmleError, UserInputError
from rexmle_grade.report import ReportEntry
from rexmle_grade.settings import rexmle_versions
from rexmle_grade.text import printable

GROUP_REPORT_VERSION = 1
DEFAULT_REPLICATES = 2000
# a board this small ranks coarsely: its percentile moves in steps of 1/N, so the raw metric is the better read
FEW_BOARD_ROWS = 20
VARIANT_ORDER = ("real", "synthetic-easy", "synthetic-realistic")


class BoardCaveat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str
    board_rows: int | None
    board_teams: int | None
    note: str
    # what a careful reader must know: the versions the runs used, the task's known issues (task.yaml), whether any
    # run had network (public test labels upstream are then reachable), and the pinned expert bound
    task_versions: list[str] = Field(default_factory=list)
    known_issues: list[str] = Field(default_factory=list)
    runs_with_network: int = 0
    expert_pin: ExpertPin | None = None
    expert_bounds: list[ExpertBound] = Field(default_factory=list)


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
    def variants(self) -> list[str]:
        """The data variants of the table's rows, real first, unknown last: each has its own tables, never pooled."""
        return sorted({r.variant for r in self.rows}, key=lambda v: (
            VARIANT_ORDER.index(v) if v in VARIANT_ORDER else len(VARIANT_ORDER) + (v == "unknown"), v))


def parse_by(text: str | Sequence[str]) -> list[str]:
    keys = [k.strip() for k in (text.split(",") if isinstance(text, str) else text) if k.strip()]
    unknown = [k for k in keys if k not in ROW_KEYS]
    if unknown or not keys:
        raise UserInputError(f"--by {','.join(keys) or '(nothing)'}: unknown row key(s) {unknown}",
                             hint=f"choose from {', '.join(ROW_KEYS)} (default {','.join(DEFAULT_BY)})")
    return keys


def build_group_report(runs: RunSet, *, by: Sequence[str] = DEFAULT_BY, replicates: int = DEFAULT_REPLICATES,
                       seed: int = 0, calibration: Sequence[Any] | None = None,
                       pins: dict[str, ExpertPin] | None = None) -> GroupReport:
    """The report of every run in ``runs``. ``calibration``: baseline calibration records (default: those of the
    data folders the runs used, and the shipped ones, when rexmle-baselines is installed). ``pins``: task -> the
    pinned expert bound of its normalised score (default: :func:`default_pins`)."""
    import pandas as pd

    by = parse_by(by)
    rows = [run_row(run) for run in runs.runs]
    calibration = list(load_calibration(runs, rows) if calibration is None else calibration)
    tasks = sorted({r.task_id for r in rows} | {c.task_id for c in calibration})
    facts = {task: task_facts(task) for task in tasks}
    pins = default_pins(tasks) if pins is None else pins
    bounds = expert_bounds(calibration, pins)
    table: list[TableRow] = []
    duplicates: list[str] = []
    if rows:
        frame = pd.DataFrame([r.model_dump() for r in rows])
        padded, duplicates = pad_grid(frame, by, facts)
        references = reference_percentiles(padded, bounds)
        competition = {task: f.competition for task, f in facts.items()}
        table = aggregate(padded, by, competition=competition, references=references, replicates=replicates,
                          seed=seed)
    table += calibration_rows(calibration, facts)
    entries = [run.grade for run in runs.runs if run.grade is not None]
    return GroupReport(
        sources=[str(s) for s in runs.sources], group_by=list(by),
        bootstrap=Bootstrap(replicates=replicates, seed=seed), runs=rows, rows=table,
        caveats=[_caveat(facts[t]).model_copy(update=_task_notes(t, rows, pins, bounds)) for t in tasks],
        entries=entries, duplicates=duplicates,
        refused=[Refused(run_dir=str(p), reason=why) for p, why in runs.refused],
        problems=[RunProblem(run_id=run.run_id, problem=p) for run in runs.runs for p in run.problems],
    )


def _caveat(facts: Any) -> BoardCaveat:
    notes = []
    if facts.board_rows is None:
        notes.append("no human leaderboard: no percentile, position or medal; left out of percentile means")
    else:
        if facts.board_rows < FEW_BOARD_ROWS:
            notes.append(f"only {facts.board_rows} human rows: a percentile can take only {facts.board_rows + 1} "
                         f"values (steps of {1 / facts.board_rows:.0%}), so widely different scores can share one; "
                         "compare the raw metric")
        if facts.board_teams == 1 and facts.board_rows > 1:
            team = f" ({facts.board_team})" if facts.board_team else ""
            notes.append(f"all {facts.board_rows} rows come from a single team{team}: the percentile ranks a run "
                         "among that one team's submissions, not among competing teams")
    return BoardCaveat(task_id=facts.task_id, board_rows=facts.board_rows, board_teams=facts.board_teams,
                       note="; ".join(notes))


# the config whose baseline is every task's expert bound: the paper's full protocol (3 seeds on one GPU)
EXPERT_CONFIG = "full"
EXPERT_PIN_VERSION = "1"


def default_pins(tasks: Sequence[str]) -> dict[str, ExpertPin]:
    """Each task's pinned expert: its strongest baseline in the ``full`` config at the config's own budget (none
    when rexmle-baselines is not installed or no baseline covers the task: then no normalised score)."""
    try:
        from rexmle_baselines.base import preferred_baselines
    except ImportError:  # rexmle-baselines is optional for the harness and the reports
        return {}
    pins = {}
    for task in tasks:
        names = preferred_baselines(task, EXPERT_CONFIG)
        if names:
            pins[task] = ExpertPin(task_id=task, baseline=names[0], config=EXPERT_CONFIG, version=EXPERT_PIN_VERSION)
    return pins


def _task_notes(task: str, rows: Sequence[RunRow], pins: dict[str, ExpertPin],
                bounds: Sequence[ExpertBound]) -> dict[str, Any]:
    try:
        from rexmle_tasks.registry import get_task

        issues = [f"[{i.kind}] {i.text}" for i in get_task(task).meta.known_issues]
    except RexmleError:  # a task the registry no longer knows: nothing recorded to show
        issues = []
    of_task = [r for r in rows if r.task_id == task]
    return {"task_versions": sorted({r.task_version for r in of_task}), "known_issues": issues,
            "runs_with_network": sum(r.network != "none" for r in of_task), "expert_pin": pins.get(task),
            "expert_bounds": [b for b in bounds if b.pin.task_id == task]}


def load_calibration(runs: RunSet, rows: Sequence[RunRow]) -> list[Any]:
    """Calibration records of the runs' tasks: the runs' data folders' (measured there) and the shipped ones."""
    try:
        from rexmle_baselines.calibration import PACKAGE_CALIBRATION_DIR, load_results
    except ImportError:  # rexmle-baselines is optional for the harness and the reports
        return []
    roots = [run.spec.data_root for run in runs.runs if run.spec.data_root]
    folders = dict.fromkeys([*(Path(root) / "calibration" for root in roots), PACKAGE_CALIBRATION_DIR])
    tasks = sorted({r.task_id for r in rows})
    found: dict[tuple[str, str], Any] = {}
    for folder in folders:
        for task in tasks:
            for record in load_results(folder, task):
                # measured on the data prepared beside it: its variant is that preparation's (a shipped record
                # says only whether it was synthetic)
                variant = _prepared_variant(str(folder.parent), task) if record.synthetic else "real"
                entry = Calibrated(record, variant) if variant else record
                # the same record shipped and measured locally counts once; every seed and budget is its own
                found.setdefault((record.model_dump_json(), getattr(entry, "variant", "")), entry)
    return list(found.values())


def _prepared_variant(data_root: str, task_id: str) -> str | None:
    try:
        from rexmle_tasks.pipeline import prepared_info, task_dirs
        from rexmle_tasks.registry import get_task

        info = prepared_info(task_dirs(get_task(task_id), data_root))
    except (RexmleError, OSError):  # a shipped folder, an unknown task or a broken data folder: not known here
        return None
    if info is None or not info.synthetic:
        return None
    return data_variant(synthetic=True, difficulty=info.difficulty)


# ---------------------------------------------------------------------------------------------------------------
# rendering: the same tables as rich (terminal), Markdown and CSV


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _few(row: TableRow, what: str) -> str:
    """The mark of a row whose s.e. or CI rests on too little data (see the stats rule ``few_data``)."""
    return f" {FEW_DATA_MARK}" if any(w.startswith(what) for w in row.interval_warnings) else ""


def _pct_se(row: TableRow) -> str:
    if row.mean_percentile is None:
        return "n/a"
    se = "" if row.se_percentile is None else f" ± {row.se_percentile:.1%}{_few(row, 's.e.')}"
    return f"{row.mean_percentile:.1%}{se}"


def _ci(row: TableRow) -> str:
    return "-" if row.ci_low is None else f"[{row.ci_low:.1%}, {row.ci_high:.1%}]{_few(row, '95% CI')}"


def _money(row: TableRow) -> str:
    return cost_text(row.cost_per_run, row.uncosted_calls)


def _per_seed_cost(row: TableRow) -> str:
    money = cost_text(row.cost_per_seed, row.uncosted_calls)
    return f"{money}, {'-' if row.gpu_hours_per_seed is None else f'{row.gpu_hours_per_seed:.1f}'}"


def raw_metric(row: TableRow) -> str:
    """``dice 0.734 (3 valid)``: the task's primary metric beside its percentile; ``-`` without a valid run."""
    if row.primary_metric is None or row.primary_mean is None:
        return "-"
    return f"{row.primary_metric} {row.primary_mean:.4g} ({row.primary_runs} valid)"


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 else \
        f"{seconds:.0f} s"


def main_columns(report: GroupReport) -> list[str]:
    # rows by task are per-task rows: their raw primary metric stands beside the percentile
    raw = ["raw metric"] if "task" in report.group_by else []
    return [*report.group_by, "data", "runs", "missing", "valid", "mean pct ± s.e.", *raw, "95% CI", "median",
            "mean pos.", "medals (g/s/b)", "> median", "normalised", "cost/run", "per seed: API, GPU-h",
            "time used/budget"]


def main_cells(row: TableRow, marker: str, *, raw: bool = False) -> list[str]:
    keys = [row.keys.get(k, "-") for k in row.keys]
    norm = "-" if row.normalised is None else f"{row.normalised:.2f} ({row.normalised_tasks} t.)"
    variant = f"{row.variant}, {row.task_versions}" if row.task_versions else row.variant
    return [*keys, variant, str(row.n_runs), str(row.n_missing), f"{row.valid_rate:.0%}", _pct_se(row) + marker,
            *([raw_metric(row)] if raw else []), _ci(row),
            fmt_pct(row.median_percentile), "-" if row.mean_position is None else f"{row.mean_position:.2f}",
            f"{row.medals} ({row.gold}/{row.silver}/{row.bronze}){marker}",
            "-" if row.above_median_rate is None else f"{row.above_median_rate:.0%}", norm, _money(row),
            _per_seed_cost(row), f"{_hours(row.time_used_s)} / {_hours(row.time_budget_s)}"]


def tables(report: GroupReport, variant: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """The report's tables for one data variant: (title, columns, cells), shared by every output format. Per-task
    cells carry the raw primary metric and the normalised score beside the percentile."""
    marker = "" if variant == "real" else " †"
    rows = [r for r in report.rows if r.variant == variant and r.reference is None]
    out: list[tuple[str, list[str], list[list[str]]]] = []
    overall = [r for r in rows if r.scope == "all"]
    out.append((f"{variant} data: all tasks", main_columns(report),
                [main_cells(r, marker, raw="task" in report.group_by) for r in overall]))
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
                if r.variant == variant and r.reference == "calibration" and r.scope_value in values:
                    keyed.setdefault(tuple(r.keys.get(k, "-") for k in report.group_by), {})[r.scope_value] = r
        cells = []
        for key, by_value in keyed.items():
            cells.append([*key, *(_scope_cell(by_value.get(v), marker, raw=scope == "task") for v in values)])
        what = "mean percentile ± s.e. (valid rate)" + ("; raw primary metric; normalised" if scope == "task" else "")
        # the variant is in the title: one more column would squeeze a terminal's table past reading
        out.append((f"{variant} data: {what} {title}", [*report.group_by, *values], cells))
    return out


def _scope_cell(row: TableRow | None, marker: str, *, raw: bool = False) -> str:
    if row is None:
        return "-"
    extra = ""
    if raw:
        norm = "" if row.normalised is None else f"; normalised {row.normalised:.2f}"
        extra = f"; {raw_metric(row)}{norm}"
    if row.mean_percentile is None:
        return f"n/a, no board ({row.valid_rate:.0%}){extra}"
    return f"{_pct_se(row)}{marker} ({row.valid_rate:.0%}){extra}"


def banner(variant: str) -> str | None:
    """The warning above a variant's tables (or a run's page); a data kind (``synthetic``) is taken as well."""
    data_kind = data_kind_of(variant)
    if data_kind == "synthetic":
        level = "" if variant == "synthetic" else f" ({variant})"
        return (f"SYNTHETIC DATA{level} † — these runs used rexmle's synthetic mirrors of the challenge data: "
                "percentiles and medals are computed against the human leaderboard but are NOT comparable with it")
    if data_kind == "unknown":
        return ("DATA KIND UNKNOWN — these grades do not say whether the data was synthetic (written before grades "
                "recorded it) and the task data is gone: not comparable with the human leaderboard")
    return None


def caveat_lines(report: GroupReport) -> list[str]:
    lines = [f"{c.task_id}: {c.board_rows if c.board_rows is not None else 'no'} human rows"
             + (f" — {c.note}" if c.note else "") for c in report.caveats]
    return lines


def task_note_lines(report: GroupReport) -> list[str]:
    """Per task: the versions the runs used, the expert bound of the normalised score, whether any run had network,
    and the task's known issues."""
    lines = []
    for c in report.caveats:
        versions = ", ".join(c.task_versions) or "no runs"
        if c.expert_pin is None:
            bound = "no pinned expert (rexmle-baselines not installed or no baseline covers it): no normalised score"
        elif not c.expert_bounds:
            bound = f"{c.expert_pin.name}: not calibrated yet, no normalised score"
        else:
            bound = "; ".join(b.describe() for b in c.expert_bounds)
        network = (f"{c.runs_with_network} run(s) had network: public upstream test labels were reachable"
                   if c.runs_with_network else "no run had network")
        lines.append(f"{c.task_id}: task version(s) {versions}; expert bound (normalised 1): {bound}; {network}")
        lines += [f"{c.task_id} known issue: {issue}" for issue in c.known_issues]
    return lines


def footer_lines(report: GroupReport) -> list[str]:
    lines = [f"{name}: {text}" for name, text in report.rules.items()]
    lines += task_note_lines(report)
    lines += few_data_lines(report)
    if any(r.reference == "calibration" for r in report.rows):
        lines.append("rows baseline:NAME are calibrated expert baselines (`rexmle baselines calibrate`): one measured "
                     "run each, on the data variant their row shows; they are references, never padded or totalled")
    if report.duplicates:
        lines.append(f"left out as earlier duplicates of the same cell: {', '.join(report.duplicates)}")
    lines += cluster_lines(report)
    lines += [f"refused {r.run_dir}: {r.reason}" for r in report.refused]
    lines += [f"{p.run_id}: {p.problem}" for p in report.problems[:30]]
    if len(report.problems) > 30:
        lines.append(f"... and {len(report.problems) - 30} more problem(s) (see the JSON report)")
    return lines


def few_data_lines(report: GroupReport) -> list[str]:
    """One line per row of the overall table whose s.e. or CI rests on too little data (marked ‡)."""
    return [f"{FEW_DATA_MARK} {row.variant} {'/'.join(row.keys.values())}: {'; '.join(row.interval_warnings)}"
            for row in report.rows if row.scope == "all" and row.reference is None and row.interval_warnings]


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


MAX_FILE_TABLE_WIDTH = 320  # characters of a table printed to a file or a pipe


def render_terminal(report: GroupReport, console: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    if not report.rows:
        console.print("no graded runs yet")
    for variant in report.variants:
        text = banner(variant)
        if text:
            console.print(Text(text, style="bold yellow"))
        for title, columns, cells in tables(report, variant):
            table = Table(title=title, title_justify="left")
            for column in columns:
                table.add_column(column, overflow="fold")
            for row in cells:  # cells hold run data: never markup, never a control character
                table.add_row(*(Text(printable(c, one_line=True)) for c in row))
            # written to a file or a pipe (no terminal to fit), a wide table keeps its natural width instead of
            # being folded into one-letter columns at rich's default 80
            if console.is_terminal:
                console.print(table)
                continue
            natural = console.measure(table, options=console.options.update(max_width=MAX_FILE_TABLE_WIDTH)).maximum
            width, console.width = console.width, max(console.width, natural)
            try:
                console.print(table)
            finally:
                console.width = width
    console.print(Text("leaderboards: " + "; ".join(caveat_lines(report)), style="dim"))
    console.print(Text(TERMINAL_RULES, style="dim"))
    for line in footer_lines(report)[len(report.rules):]:
        console.print(Text(printable(line, one_line=True), style="dim"))


# the rules in one line for the terminal (in full in the JSON report and in --format md)
TERMINAL_RULES = ("rules: one table per data variant, never pooled; invalid or missing = percentile 0 (position "
                  "N+1); every row padded to every task x its seeds; no board (RAVIR) = left out of percentile means; "
                  "s.e. over seeds; 95% CI = bootstrap of competitions, tasks, seeds; ‡ = too few competitions or "
                  "seeds for the s.e./CI to say much; normalised = sample 0, pinned expert bound 1 (per task below); "
                  "cost unknown when a call had no price (all: --format md)")


def to_markdown(report: GroupReport) -> str:
    out = io.StringIO()
    for variant in report.variants:
        text = banner(variant)
        if text:
            out.write(f"> **{text}**\n\n")
        for title, columns, cells in tables(report, variant):
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
        flat = row.model_dump(exclude={"keys", "tasks_without_board", "interval_warnings"})
        records.append({**{k: row.keys.get(k, "") for k in report.group_by}, **flat,
                        "tasks_without_board": " ".join(row.tasks_without_board),
                        "interval_warnings": "; ".join(row.interval_warnings)})
    return frame_to_csv(pd.DataFrame(records))  # agent text in a cell never runs as a spreadsheet formula
