"""``rexmle tasks list|info|check`` and ``rexmle prepare`` (registered through the ``rexmle.commands`` entry points).

The data folder comes from the root ``--data-dir`` option or ``$REXMLE_DATA_DIR`` (:mod:`rexmle_grade.settings`).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from rexmle_grade.cli import make_app
from rexmle_grade.errors import RexmleError, UnknownNameError, UserInputError
from rexmle_grade.grader import Direction
from rexmle_tasks.base import Task
from rexmle_tasks.check import check_task
from rexmle_tasks.grading import load_leaderboard
from rexmle_tasks.metadata import DataSource
from rexmle_tasks.pipeline import PreparedInfo, describe_source, prepare_task, prepared_info, task_dirs
from rexmle_tasks.registry import all_tasks, get_task

ALL = "all"

app = make_app(help="The challenges: list them, show one, check a prepared task for leaks.")


def _console() -> Console:
    return Console(highlight=False)


def _selected(task_id: str) -> list[Task]:
    return list(all_tasks().values()) if task_id == ALL else [get_task(task_id)]


def _prepared_label(info: PreparedInfo | None) -> str:
    return "no" if info is None else ("synthetic" if info.synthetic else "real")


@app.command("list")
def list_command() -> None:
    """List every task with its competition, type, modality, size and whether it is prepared."""
    # short forms (the competition's name before any subtitle, the modality before any detail): `info` has the rest
    rows = [
        (task.id, task.meta.competition.split(":")[0], task.meta.task_type.replace("_", " "),
         task.meta.modality.split(" (")[0], task.meta.dim, f"{task.meta.cases.train}/{task.meta.cases.test}",
         _prepared_label(prepared_info(task_dirs(task))))
        for task in all_tasks().values()
    ]
    table = Table(title="rexmle tasks", box=box.SIMPLE_HEAD)
    for column in ("id", "competition", "type", "modality", "dim", "train/test", "prepared"):
        # the ids and the state stay whole (users copy them); free text wraps on a narrow terminal
        table.add_column(column, no_wrap=column in ("id", "prepared"))
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # data, never markup
    _console().print(table)


def _size(n: int | None) -> str:
    if n is None:
        return "size unknown"
    if n < 1024:
        return f"{n} B"
    exponent = min(3, (n.bit_length() - 1) // 10)
    return f"{n / 1024**exponent:.1f} {('KiB', 'MiB', 'GiB')[exponent - 1]}"


def _describe_data_source(source: DataSource) -> list[str]:
    where = {"zenodo": f"Zenodo record {source.record}", "figshare": f"figshare {source.url}"}.get(
        source.kind, source.kind)
    lines = [where + (" (every file of the record)" if source.kind == "zenodo" and not source.files else "")]
    for f in source.files:
        sums = ", ".join(f"{k} {v}" for k, v in (("md5", f.md5), ("sha256", f.sha256)) if v)
        lines.append(f"  {f.name} ({_size(f.size)}{', ' + sums if sums else ''})" + (f" <- {f.url}" if f.url else ""))
    if source.instructions:
        lines.append(f"  by hand{' (optional)' if source.optional else ''}: {source.instructions}")
    return lines


@app.command("info")
def info_command(task_id: Annotated[str, typer.Argument(metavar="TASK", help="Task id.")]) -> None:
    """Show a task's metadata, data sources, leaderboard provenance, and preparation state."""
    task = get_task(task_id)
    meta = task.meta
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    rows: list[tuple[str, str]] = [
        ("id", meta.id), ("title", meta.title), ("competition", meta.competition), ("year", str(meta.year)),
        ("url", meta.url), ("licence", meta.licence), ("modality", f"{meta.modality}, {meta.dim}"),
        ("task type", meta.task_type), ("cases", f"{meta.cases.total} = {meta.cases.train} train + "
                                                 f"{meta.cases.test} test"),
        ("version", meta.version), ("family", meta.family + (f" (raw data shared as {meta.raw_group!r})"
                                                            if meta.raw_group else "")),
        ("data sources", "\n".join(line for s in meta.data_sources for line in _describe_data_source(s))),
    ]
    try:
        grader = task.grader
    except UnknownNameError:
        grader = None
    if grader is None:
        rows.append(("grader", f"{meta.grader} (not installed)"))
    else:
        rows.append(("grader", f"{meta.grader}: " + ", ".join(
            f"{m.name} ({'higher' if m.direction is Direction.HIGHER_BETTER else 'lower'} better"
            f"{'' if m.ranked else ', not ranked'})" for m in grader.metrics)))
    lb = meta.leaderboard
    if lb is None:
        rows.append(("leaderboard", "none"))
    else:
        board = load_leaderboard(task) if grader is not None else None
        rows.append(("leaderboard", (f"{board.n_rows} rows, " if board else "") + f"{lb.phase}\n"
                     f"source: {lb.source_url}\nvia: {lb.via}\nretrieved: {lb.retrieved.isoformat()}"
                     + (f"\n{lb.notes}" if lb.notes else "")))
    dirs = task_dirs(task)
    info = prepared_info(dirs)
    if info is None:
        rows.append(("prepared", f"no (would go to {dirs.root})"))
    else:
        rows.append(("prepared", f"{describe_source(info.source)} in {dirs.root}, {info.n_train} train / "
                                 f"{info.n_test} test, version {info.task_version}, at {info.prepared_at}"))
        rows.append(("split digest", info.split_digest))
    if meta.changelog:
        rows.append(("changelog", "\n".join(f"{e.version} ({e.date.isoformat()}): {e.changes}"
                                             for e in meta.changelog)))
    # for the user reading results, never for agents: task.yaml is not copied into public/
    rows.append(("known issues", "\n".join(f"- [{i.kind}] {i.text}" for i in meta.known_issues) or "none recorded"))
    for key, value in rows:
        grid.add_row(key, Text(value))  # paths and notes are data, never markup
    _console().print(grid)


@app.command("check")
def check_command(task_id: Annotated[str, typer.Argument(metavar="TASK", help="Task id, or 'all'.")]) -> None:
    """Check prepared tasks for test-label leaks and manifest inconsistencies (exit 1 if any are found)."""
    console = _console()
    dirty = 0
    for task in _selected(task_id):
        dirs = task_dirs(task)
        if task_id == ALL and prepared_info(dirs) is None:
            console.print(f"{task.id}: not prepared, skipped", markup=False)
            continue
        problems = check_task(task, dirs)
        if problems:
            dirty += 1
            console.print(f"[bold red]{escape(task.id)}: {len(problems)} problem(s)[/]")
            for problem in problems:
                console.print(f"  - {problem}", markup=False)
        else:
            console.print(f"[green]{escape(task.id)}: clean[/]")
    if dirty:
        raise typer.Exit(1)


def prepare_command(
    task_id: Annotated[str, typer.Argument(metavar="TASK", help="Task id, or 'all' for every task.")],
    synthetic: Annotated[bool, typer.Option(
        "--synthetic", help="Use a small synthetic mirror of the download (offline, seconds) instead of real data.")
    ] = False,
    cases: Annotated[int | None, typer.Option(
        min=2, help="Synthetic only: number of labelled cases (default: the task's synthetic_cases).")] = None,
    seed: Annotated[int, typer.Option(help=(
        "Synthetic only: seed of the synthetic mirror, mixed with a secret drawn now and kept in private/ "
        "($REXMLE_SYNTHETIC_SECRET pins the secret, for tests only)."))] = 0,
    difficulty: Annotated[str, typer.Option(
        help="Synthetic only: easy (clean contrasts, fast tests) or realistic (noise and bias fields, scanner "
             "variation, distractors, imbalance, small structures, label noise; ldct-iqa, isles22).")] = "easy",
    force: Annotated[bool, typer.Option(
        "--force", help="Prepare again even if prepared (and replace raw data that came from another source).")
    ] = False,
) -> None:
    """Download (or synthesise) a task's raw data and prepare its public and private folders."""
    if not synthetic and (cases is not None or seed != 0 or difficulty != "easy"):
        raise UserInputError("--cases, --seed and --difficulty apply to synthetic data only", hint="add --synthetic")
    console = _console()
    failed = 0
    tasks = _selected(task_id)
    for task in tasks:
        dirs = task_dirs(task)
        before = prepared_info(dirs)
        try:
            info = prepare_task(task, dirs, synthetic=synthetic, cases=cases, seed=seed, force=force,
                                difficulty=difficulty)
        except RexmleError as exc:
            if len(tasks) == 1:
                raise
            failed += 1
            console.print(f"{task.id}: failed: {exc}", style="bold red", markup=False)
            continue
        state = "already prepared (--force prepares again)" if info == before else "prepared"
        console.print(f"[green]{escape(task.id)}[/]: " + escape(
            f"{state} from {describe_source(info.source)} in {dirs.root} ({info.n_train} train / {info.n_test} test, "
            f"split {info.split_digest[:12]}, at {info.prepared_at})"))
    if failed:
        console.print(f"[bold red]{failed} of {len(tasks)} task(s) failed[/]")
        raise typer.Exit(1)
