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


def parse_duration(text: str | None) -> float | None:
    """Seconds from ``3600``, ``90m``, ``12h`` or ``1d``; None stays None."""
    if text is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    value = text.strip().lower()
    factor = units.get(value[-1:])
    try:
        seconds = float(value[:-1]) * factor if factor else float(value)
    except ValueError:
        raise UserInputError(f"cannot read the duration {text!r}", hint="e.g. 43200, 90m or 12h") from None
    if seconds <= 0:
        raise UserInputError(f"the duration must be positive, got {text!r}")
    return seconds


Config = Annotated[str, typer.Option("--config", "-c", help="quick (CPU, minutes), budget (fits --time-budget on "
                                     "one GPU), full (published recipe, GPU) or smoke (full's networks, few "
                                     "iterations: a GPU code-path check).")]
Device = Annotated[str, typer.Option("--device", help="auto (a GPU when usable), cpu or cuda.")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed (recorded).")]
AllowCpu = Annotated[bool, typer.Option("--allow-cpu", help="Run a GPU-sized config (budget/full/smoke) on a CPU.")]
TimeBudget = Annotated[str | None, typer.Option("--time-budget", help="Time the run may take (e.g. 12h): budget "
                                                "sizes its training to it (default 12h), other configs stop "
                                                "early rather than overrun it.")]
WeightsDir = Annotated[Path | None, typer.Option("--weights-dir", help="Local weights cache (default "
                                                 "$REXMLE_WEIGHTS_DIR or <data>/weights).")]


@app.command("run")
def run_command(
    name: Annotated[str, typer.Argument(help="Baseline name (see `rexmle baselines list`).")],
    task: Annotated[str, typer.Option("--task", "-t", help="Task id.")],
    public_dir: Annotated[Path | None, typer.Option("--public-dir", help="Use only this public/ folder.")] = None,
    config: Config = "quick",
    device: Device = "auto",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Submission folder (emptied first).")] = None,
    work_dir: Annotated[Path | None, typer.Option("--work-dir", help="Scratch folder (kept); default temporary.")]
    = None,
    seed: Seed = 0,
    sets: Annotated[list[str] | None, typer.Option("--set", help="Override a config parameter: key=value.")] = None,
    allow_cpu: AllowCpu = False,
    time_budget: TimeBudget = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the work in --work-dir (after a time limit "
                                         "killed an earlier attempt); --out keeps its submission meanwhile.")]
    = False,
    weights_dir: WeightsDir = None,
    record: Annotated[Path | None, typer.Option("--record", help="Also write what the run did as JSON here.")]
    = None,
) -> None:
    """Run a baseline on a prepared task and write a submission that validates."""
    import dataclasses
    import json

    from rexmle_baselines.api import run_baseline
    from rexmle_grade.settings import data_dir

    result = run_baseline(name, task, public_dir=public_dir, data_root=None if public_dir else data_dir(),
                          out=out, work_dir=work_dir, config=config, overrides=_parse_sets(sets), device=device,
                          seed=seed, log=_log, allow_cpu=allow_cpu, time_budget_s=parse_duration(time_budget),
                          resume=resume, weights_dir=weights_dir)
    if record is not None:
        document = {**dataclasses.asdict(result), "submission_dir": str(result.submission_dir),
                    "gpu_hours": result.gpu_hours}
        record.write_text(json.dumps(document, indent=1, default=str) + "\n")
    status = "valid" if result.valid else "INVALID"
    typer.echo(f"{name} ({config}) on {task}: {status} submission in {result.submission_dir} ({result.seconds:.1f} s)")
    for problem in result.problems:
        typer.echo(f"  - {problem}")
    if not result.valid:
        raise typer.Exit(1)


@app.command("fetch-weights")
def fetch_weights_command(
    names: Annotated[list[str] | None, typer.Argument(help="Weights names (default: every known one).")] = None,
    weights_dir: WeightsDir = None,
    file: Annotated[Path | None, typer.Option("--file", help="Register this local file under the (one) name "
                                              "instead of downloading it.")] = None,
    architecture: Annotated[str | None, typer.Option("--architecture", help="timm model of a --file with a new "
                                                     "name.")] = None,
) -> None:
    """Fetch pretrained weights into the local cache, with checksums (run it before any sandboxed run)."""
    from rexmle_baselines.weights import KNOWN_WEIGHTS, add_local_weights, default_weights_dir, fetch_weights

    folder = weights_dir or default_weights_dir()
    if file is not None:
        if not names or len(names) != 1:
            raise UserInputError("--file registers one file under one name", hint="give exactly one name")
        entry = add_local_weights(names[0], file, folder, architecture=architecture)
        typer.echo(f"{entry.name}: {folder / entry.file} (sha256 {entry.sha256})")
        return
    entries = fetch_weights(names or sorted(KNOWN_WEIGHTS), folder, log=_log)
    table = Table(title=f"weights cache {escape(str(folder))}")
    for column in ("name", "file", "MiB", "sha256"):
        table.add_column(column)
    for entry in entries:
        table.add_row(escape(entry.name), escape(entry.file), f"{entry.size / 2**20:.1f}", entry.sha256)
    Console().print(table)


@app.command("smoke")
def smoke_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the runs and smoke_results.json/.md.")],
    limit: Annotated[str, typer.Option("--limit", help="Time limit of each run (e.g. 300 or 5m).")] = "300",
    only: Annotated[str | None, typer.Option("--only", help="Only these baselines, comma-separated.")] = None,
    device: Device = "cuda",
) -> None:
    """Run every family's smoke config (full networks, few iterations) on synthetic tasks: the GPU code-path check."""
    from rexmle_baselines.base import resolve_device
    from rexmle_baselines.smoke import run_smoke
    from rexmle_grade.settings import data_dir

    resolved = resolve_device(device)
    results = run_smoke(data_dir(), out, limit_s=parse_duration(limit) or 300.0, device=resolved,
                        only=[n.strip() for n in (only or "").split(",") if n.strip()], log=_log)
    typer.echo((out / "smoke_results.md").read_text())
    if not all(r["valid"] for r in results):
        raise typer.Exit(1)


@app.command("calibrate")
def calibrate_command(
    tasks: Annotated[list[str], typer.Option("--tasks", help="Task ids (repeat or comma-separate).")],
    baselines: Annotated[list[str] | None, typer.Option("--baseline", help="Only these baselines.")] = None,
    config: Config = "quick",
    device: Device = "auto",
    seeds: Annotated[str, typer.Option("--seeds", help="Seeds to run, comma-separated (each is its own record).")]
    = "0",
    allow_cpu: AllowCpu = False,
    time_budget: TimeBudget = None,
    weights_dir: WeightsDir = None,
    into: Annotated[Path | None, typer.Option("--into", help="Calibration folder (default <data>/calibration).")]
    = None,
    ship: Annotated[bool, typer.Option("--ship", help="Write into the package's calibration data folder.")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help="Override a config parameter: key=value.")] = None,
    work_root: Annotated[Path | None, typer.Option("--work-dir", help="Keep work folders here.")] = None,
) -> None:
    """Run the baselines on prepared tasks, grade and rank them, and store each result as JSON."""
    from rexmle_baselines.calibration import PACKAGE_CALIBRATION_DIR, calibrate
    from rexmle_grade.settings import data_dir

    if ship and into is not None:
        raise UserInputError("--ship and --into name two destinations", hint="give one of them")
    folder = PACKAGE_CALIBRATION_DIR if ship else (into or data_dir() / "calibration")
    task_ids = [t.strip() for item in tasks for t in item.split(",") if t.strip()]
    try:
        seed_list = [int(v) for v in seeds.split(",") if v.strip()]
    except ValueError:
        raise UserInputError(f"--seeds takes comma-separated integers, got {seeds!r}", hint="e.g. --seeds 0,1,2") \
            from None
    results = calibrate(task_ids, into=folder, data_root=data_dir(), baselines=baselines, config=config,
                        device=device, seeds=seed_list, work_root=work_root, log=_log, allow_cpu=allow_cpu,
                        time_budget_s=parse_duration(time_budget), weights_dir=weights_dir,
                        overrides=_parse_sets(sets))
    table = Table(title=f"calibration ({config}) -> {escape(str(folder))}")
    for column in ("task", "baseline", "seed", "seconds", "GPU-hours", "percentile", "synthetic"):
        table.add_column(column)
    for r in results:
        table.add_row(escape(r.task_id), escape(r.baseline), str(r.seed), f"{r.seconds:.0f}", f"{r.gpu_hours:.3f}",
                      "-" if r.percentile is None else f"{r.percentile:.3f}", "yes" if r.synthetic else "no")
    Console().print(table)
