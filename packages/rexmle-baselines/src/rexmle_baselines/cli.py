"""``rexmle baselines``: list the expert baselines, run one on a task, calibrate them against the task's grader."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rexmle_grade.cli import make_app
from rexmle_grade.errors import UserInputError

app = make_app(help="Expert baselines (nnU-Net v2, MONAI, timm, diffusers).")
err_console = Console(stderr=True)


def _covered_tasks(name: str) -> list[str]:
    from rexmle_baselines.base import get_baseline
    from rexmle_tasks.registry import all_tasks

    baseline = get_baseline(name)
    return [task_id for task_id, task in sorted(all_tasks().items()) if baseline.supports(task_id, task.meta.grader)]


@app.command("list")
def list_command() -> None:
    """List the baselines, whether their extra is installed, and the tasks each covers."""
    from rexmle_baselines.base import baseline_names, get_baseline

    table = Table(title="rexmle baselines")
    for column in ("name", "installed", "tasks", "description"):
        table.add_column(column)
    for name in baseline_names():
        baseline = get_baseline(name)
        installed = "yes" if baseline.installed() else f"no: pip install 'rexmle-baselines[{baseline.extra}]'"
        tasks = _covered_tasks(name)
        table.add_row(escape(name), escape(installed), escape(f"{len(tasks)}: " + ", ".join(tasks)),
                      escape(baseline.description))
    Console().print(table)


def _parse_sets(values: list[str] | None) -> dict[str, str]:
    overrides = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserInputError(f"--set expects key=value, got {item!r}", hint="e.g. --set epochs=5")
        overrides[key.strip()] = value.strip()
    return overrides


def _log(line: str) -> None:
    err_console.print(line, markup=False, highlight=False)


Config = Annotated[str, typer.Option("--config", "-c", help="quick (CPU, minutes) or full (published recipe, GPU).")]
Device = Annotated[str, typer.Option("--device", help="cpu or cuda.")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed (recorded).")]


@app.command("run")
def run_command(
    name: Annotated[str, typer.Argument(help="Baseline name (see `rexmle baselines list`).")],
    task: Annotated[str, typer.Option("--task", "-t", help="Task id.")],
    public_dir: Annotated[Path | None, typer.Option("--public-dir", help="Use only this public/ folder.")] = None,
    config: Config = "quick",
    device: Device = "cpu",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Submission folder (emptied first).")] = None,
    work_dir: Annotated[Path | None, typer.Option("--work-dir", help="Scratch folder (kept); default temporary.")]
    = None,
    seed: Seed = 0,
    sets: Annotated[list[str] | None, typer.Option("--set", help="Override a config parameter: key=value.")] = None,
) -> None:
    """Run a baseline on a prepared task and write a submission that validates."""
    from rexmle_baselines.api import run_baseline
    from rexmle_grade.settings import data_dir

    result = run_baseline(name, task, public_dir=public_dir, data_root=None if public_dir else data_dir(),
                          out=out, work_dir=work_dir, config=config, overrides=_parse_sets(sets), device=device,
                          seed=seed, log=_log)
    status = "valid" if result.valid else "INVALID"
    typer.echo(f"{name} ({config}) on {task}: {status} submission in {result.submission_dir} ({result.seconds:.1f} s)")
    for problem in result.problems:
        typer.echo(f"  - {problem}")
    if not result.valid:
        raise typer.Exit(1)


@app.command("calibrate")
def calibrate_command(
    tasks: Annotated[list[str], typer.Option("--tasks", help="Task ids (repeat or comma-separate).")],
    baselines: Annotated[list[str] | None, typer.Option("--baseline", help="Only these baselines.")] = None,
    config: Config = "quick",
    device: Device = "cpu",
    seed: Seed = 0,
    into: Annotated[Path | None, typer.Option("--into", help="Calibration folder (default <data>/calibration).")]
    = None,
    ship: Annotated[bool, typer.Option("--ship", help="Write into the package's calibration data folder.")] = False,
    work_root: Annotated[Path | None, typer.Option("--work-dir", help="Keep work folders here.")] = None,
) -> None:
    """Run the baselines on prepared tasks, grade and rank them, and store each result as JSON."""
    from rexmle_baselines.calibration import PACKAGE_CALIBRATION_DIR, calibrate
    from rexmle_grade.settings import data_dir

    if ship and into is not None:
        raise UserInputError("--ship and --into name two destinations", hint="give one of them")
    folder = PACKAGE_CALIBRATION_DIR if ship else (into or data_dir() / "calibration")
    task_ids = [t.strip() for item in tasks for t in item.split(",") if t.strip()]
    results = calibrate(task_ids, into=folder, data_root=data_dir(), baselines=baselines, config=config,
                        device=device, seed=seed, work_root=work_root, log=_log)
    table = Table(title=f"calibration ({config}) -> {escape(str(folder))}")
    for column in ("task", "baseline", "seconds", "percentile", "synthetic"):
        table.add_column(column)
    for r in results:
        table.add_row(escape(r.task_id), escape(r.baseline), f"{r.seconds:.0f}",
                      "-" if r.percentile is None else f"{r.percentile:.3f}", "yes" if r.synthetic else "no")
    Console().print(table)
