"""``rexmle run``, ``rexmle agents``, ``rexmle runs`` and ``rexmle sandbox``: the harness on the command line."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rexmle_grade.cli import make_app
from rexmle_grade.errors import UnknownNameError, UserInputError

console = Console()
agents_app = make_app(help="Agents: the installed agents (built-in, scaffolds and plug-ins).")
runs_app = make_app(help="Runs: status of run folders and their group reports.")
sandbox_app = make_app(help="Sandboxes: run a command in exactly the sandbox a run's code gets.")

TASK_TYPES = ("segmentation", "instance_segmentation", "detection", "classification", "regression", "enhancement")
DIMS = ("2d", "3d")
DEFAULT_RUNS_DIR = Path("runs")


# ---------------------------------------------------------------------------------------------------------------
# parsing


def select_tasks(expression: str) -> list[str]:
    """Task ids from ``T1,T2``, ``all``, a dimension (``2d``, ``3d``) or a task type (``segmentation``...)."""
    from rexmle_tasks.registry import all_tasks

    tasks = all_tasks()
    chosen: list[str] = []
    for token in (t.strip() for t in expression.split(",")):
        if not token:
            continue
        if token == "all":
            matches = list(tasks)
        elif token in DIMS:
            matches = [t for t, task in tasks.items() if task.meta.dim == token]
        elif token in TASK_TYPES:
            matches = [t for t, task in tasks.items() if task.meta.task_type == token]
        elif token in tasks:
            matches = [token]
        else:
            raise UnknownNameError("task or task group", token, [*tasks, "all", *DIMS, *TASK_TYPES])
        chosen += [m for m in matches if m not in chosen]
    if not chosen:
        raise UserInputError(f"--tasks {expression!r} selects no task", hint="e.g. --tasks isles22,seg_a or all")
    return chosen


def parse_models(values: list[str]) -> dict[str, str]:
    """``--model openai/gpt-5`` (every role) or ``--model code=openai/gpt-5``, repeatable."""
    models: dict[str, str] = {}
    for value in values:
        role, eq, model = value.partition("=")
        if not eq:
            role, model = "default", value
        if not role or not model:
            raise UserInputError(f"--model {value!r} is not [ROLE=]PROVIDER/MODEL",
                                 hint="e.g. --model openai/gpt-5 or --model feedback=anthropic/claude-sonnet-4-5")
        if role in models:
            raise UserInputError(f"--model gives role {role!r} twice")
        models[role] = model
    return models


def parse_agent_config(values: list[str]) -> dict[str, Any]:
    """``--agent-config`` as JSON (``'{"num_drafts": 3}'``), a file (``@config.yaml``) or ``key=value``."""
    import yaml

    config: dict[str, Any] = {}
    for value in values:
        if value.startswith("@"):
            path = Path(value[1:])
            if not path.is_file():
                raise UserInputError(f"--agent-config file {path} does not exist")
            loaded = yaml.safe_load(path.read_text())
        elif value.lstrip().startswith("{"):
            try:
                loaded = json.loads(value)
            except json.JSONDecodeError as exc:
                raise UserInputError(f"--agent-config {value!r} is not valid JSON: {exc}") from None
        else:
            key, eq, raw = value.partition("=")
            if not eq or not key:
                raise UserInputError(f"--agent-config {value!r} is not KEY=VALUE, JSON or @FILE")
            loaded = {key: yaml.safe_load(raw)}
        if not isinstance(loaded, dict):
            raise UserInputError(f"--agent-config {value!r} is not a mapping of settings")
        config.update(loaded)
    return config


# ---------------------------------------------------------------------------------------------------------------
# rexmle run


def run_command(
    agent: Annotated[str | None, typer.Option("--agent", "-a", help="Agent name (see `rexmle agents list`).")] = None,
    tasks: Annotated[str | None, typer.Option(help="T1,T2 | all | 2d | 3d | a task type (segmentation ...).")] = None,
    task: Annotated[str | None, typer.Option(help="One task id (same as --tasks T).")] = None,
    seeds: Annotated[int, typer.Option(min=1, help="Runs per task, with seeds 0..K-1.")] = 1,
    seed: Annotated[int | None, typer.Option(help="Run only this seed.")] = None,
    model: Annotated[list[str], typer.Option("--model", "-m", help="[ROLE=]MODEL, repeatable.")] = [],  # noqa: B006
    agent_config: Annotated[list[str], typer.Option(help="JSON, @file.yaml or key=value; repeatable.")] = [],  # noqa: B006
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Runs at once (local executor).")] = 1,
    executor: Annotated[str, typer.Option(help="local | slurm | submitit-local.")] = "local",
    runs_dir: Annotated[Path, typer.Option(help="Where run folders go.")] = DEFAULT_RUNS_DIR,
    group: Annotated[str, typer.Option(help="Group name: runs/<group>/<run_id>/.")] = "default",
    time_limit: Annotated[str, typer.Option(help="Total wall-clock per run, e.g. 12h, 90m.")] = "12h",
    exec_timeout: Annotated[str, typer.Option(help="Limit of one execution in the sandbox.")] = "4h",
    max_steps: Annotated[int | None, typer.Option(min=1, help="Step limit per run.")] = None,
    max_tokens: Annotated[int | None, typer.Option(min=1, help="Token budget per run (input + output).")] = None,
    max_cost: Annotated[float | None, typer.Option(help="Money budget per run, USD.")] = None,
    extend_for_retries: Annotated[bool, typer.Option(help="Add model-API retry waits to the time limit.")] = False,
    gpus_per_run: Annotated[int, typer.Option(min=0, help="GPUs per run (CUDA_VISIBLE_DEVICES).")] = 0,
    cpus: Annotated[int | None, typer.Option(min=1, help="CPU cores per run.")] = None,
    memory_gb: Annotated[float | None, typer.Option(help="Memory limit per run, GB.")] = None,
    sandbox: Annotated[str, typer.Option(help="auto | bwrap | apptainer | docker | none.")] = "auto",
    allow_unsandboxed: Annotated[bool, typer.Option(help="Needed for --sandbox none.")] = False,
    sandbox_image: Annotated[str | None, typer.Option(help="Image for --sandbox apptainer|docker.")] = None,
    selection_cases: Annotated[int, typer.Option(min=0, help="Hold out K training cases; choose the final "
                                                             "submission by its grade on them (default off).")] = 0,
    resume: Annotated[Path | None, typer.Option(help="Resume one run folder (runs/<group>/<run_id>).")] = None,
    partition: Annotated[str | None, typer.Option(help="SLURM partition.")] = None,
    slurm_timeout_min: Annotated[int | None, typer.Option(help="SLURM job limit (default: run limit + 1h).")] = None,
    wait: Annotated[bool, typer.Option(help="Wait for SLURM jobs and print the report.")] = True,
    out: Annotated[Path | None, typer.Option(help="Group report path (default: runs/<group>/report.json).")] = None,
) -> None:
    """Run an agent on tasks (sandboxed, budgeted, resumable), grade every run and print the group's report."""
    from rexmle_agents.executors.common import SlurmOptions, run_specs
    from rexmle_agents.harness.runner import build_spec, read_spec
    from rexmle_agents.harness.spec import Limits, Resources, parse_duration

    if resume is not None:
        spec = read_spec(resume)
        runs_root = resume.resolve().parent.parent
        specs = [spec]
        group = spec.group
    else:
        if agent is None:
            raise UserInputError("which agent? pass --agent NAME", hint="see `rexmle agents list`")
        if not tasks and not task:
            raise UserInputError("which tasks? pass --task T or --tasks T1,T2|all|3d|segmentation")
        task_ids = select_tasks(",".join(x for x in (tasks, task) if x))
        limits = Limits(time_limit_s=parse_duration(time_limit), exec_timeout_s=parse_duration(exec_timeout),
                        max_steps=max_steps, max_tokens=max_tokens, max_cost_usd=max_cost,
                        extend_for_model_retries=extend_for_retries)
        resources = Resources(gpus=gpus_per_run, cpus=cpus, memory_gb=memory_gb)
        models = parse_models(model)
        config = parse_agent_config(agent_config)
        seed_list = [seed] if seed is not None else list(range(seeds))
        specs = [build_spec(t, agent=agent, agent_config=config, models=models, seed=s, limits=limits,
                            resources=resources, sandbox=sandbox, allow_unsandboxed=allow_unsandboxed, group=group,
                            selection_cases=selection_cases, sandbox_image=sandbox_image)
                 for t in task_ids for s in seed_list]
        runs_root = runs_dir
    if not specs:
        raise UserInputError("the group has zero runs")
    started = time.perf_counter()
    console.print(f"{len(specs)} run(s) in {escape(str(runs_root / group))} ({executor} executor, "
                  f"{workers} worker(s))")

    def progress(outcome: Any) -> None:
        pct = "-" if outcome.grade is None or outcome.grade.percentile is None else f"{outcome.grade.percentile:.1%}"
        colour = "green" if outcome.state == "finished" else "yellow" if outcome.state == "timed_out" else "red"
        console.print(f"  [{colour}]{outcome.state}[/] {escape(outcome.run_id)}: {escape(outcome.reason)} · "
                      f"{outcome.steps} step(s), {outcome.seconds:.1f} s · percentile {pct}")

    outcomes = run_specs(specs, runs_root, executor=executor, workers=workers, progress=progress,
                         slurm=SlurmOptions(partition=partition, timeout_min=slurm_timeout_min, wait=wait))
    if not outcomes:
        console.print("jobs submitted; run the same command again later to collect the report")
        return
    write_group_report(outcomes, out or runs_root / group / "report.json")
    console.print(f"{len(outcomes)} run(s) in {time.perf_counter() - started:.1f} s")


def write_group_report(outcomes: list[Any], path: Path) -> None:
    """One grading report for a group of runs (the `rexmle grade` format), printed as a table and written."""
    from rexmle_grade.report import GradingReport, render_report

    entries = [o.grade for o in outcomes if o.grade is not None]
    failed = [o for o in outcomes if o.grade is None]
    report = GradingReport.build(entries)
    render_report(report, console)
    render_calibration(sorted({e.task_id for e in entries}), console)
    console.print(f"report: {escape(str(report.write(path)))}")
    for outcome in failed:
        console.print(f"[red]not graded[/] {escape(outcome.run_id)}: {escape(outcome.reason)}")


def render_calibration(task_ids: list[str], console: Console) -> None:
    """The expert baselines' calibrated results on the same tasks (the data folder's and the shipped ones), so an
    agent is seen against the human board and against the baselines."""
    try:
        from rexmle_baselines.calibration import PACKAGE_CALIBRATION_DIR, load_results
    except ImportError:  # rexmle-baselines is optional for the harness
        return
    from rexmle_grade.settings import data_dir

    rows = []
    for folder, where in ((data_dir() / "calibration", "measured here"), (PACKAGE_CALIBRATION_DIR, "shipped")):
        for task_id in task_ids:
            rows += [(r, where) for r in load_results(folder, task_id)]
    if not rows:
        return
    table = Table(title="expert baselines on these tasks (rexmle baselines calibrate)")
    for column in ("task", "baseline", "config", "data", "percentile", "seconds"):
        table.add_column(column, no_wrap=True)
    for column in ("hardware", "source"):
        table.add_column(column, overflow="fold")
    for result, where in rows:
        pct = "-" if result.percentile is None else f"{result.percentile:.1%}"
        table.add_row(escape(result.task_id), escape(result.baseline), escape(result.config),
                      "synthetic" if result.synthetic else "real", pct, f"{result.seconds:.0f}",
                      escape(result.hardware.get("gpu") or result.hardware.get("cpu", "?")), where)
    console.print(table)


# ---------------------------------------------------------------------------------------------------------------
# rexmle agents / runs / sandbox


@agents_app.command("list")
def agents_list_command() -> None:
    """List the installed agents: name, package, version, model roles, description."""
    from rexmle_agents.harness.agent import all_agents

    table = Table(title="rexmle agents")
    for column in ("agent", "package", "version", "model roles", "description"):
        table.add_column(column, overflow="fold")
    for info in all_agents().values():
        table.add_row(escape(info.name), escape(info.package), escape(info.version),
                      escape(", ".join(info.roles) or "none"), escape(info.description))
    console.print(table)


@runs_app.command("status")
def runs_status_command(
    runs_dir: Annotated[Path, typer.Option(help="Where run folders are.")] = DEFAULT_RUNS_DIR,
    group: Annotated[str | None, typer.Option(help="Only this group.")] = None,
) -> None:
    """Show every run folder's state, steps, time and grade."""
    from rexmle_agents.harness.paths import RunPaths
    from rexmle_agents.harness.runner import read_status

    table = Table(title=f"runs in {escape(str(runs_dir))}")
    for column in ("group", "run", "state", "reason", "steps", "time", "percentile"):
        table.add_column(column, overflow="fold")
    found = 0
    for spec_path in sorted(runs_dir.glob(f"{group or '*'}/*/spec.json")):
        paths = RunPaths(spec_path.parent)
        status = read_status(paths)
        pct = "-"
        if paths.grade.is_file():
            value = json.loads(paths.grade.read_text()).get("percentile")
            pct = "-" if value is None else f"{value:.1%}"
        table.add_row(escape(spec_path.parent.parent.name), escape(spec_path.parent.name), status.get("state", "?"),
                      escape(str(status.get("reason") or "")), str(status.get("steps", 0)),
                      f"{float(status.get('elapsed_s', 0)):.0f} s", pct)
        found += 1
    if not found:
        raise UserInputError(f"no run folders under {runs_dir}" + (f" in group {group!r}" if group else ""),
                             hint="start runs with `rexmle run`, or pass --runs-dir")
    console.print(table)


@sandbox_app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sandbox_exec_command(
    ctx: typer.Context,
    run_dir: Annotated[Path, typer.Argument(help="A run folder (runs/<group>/<run_id>).")],
    timeout: Annotated[str, typer.Option(help="Stop the command after this long.")] = "1h",
) -> None:
    """Run a command in exactly the sandbox a run's code gets: `rexmle sandbox exec RUN_DIR -- COMMAND ...`."""
    from rexmle_agents.harness.paths import RunPaths
    from rexmle_agents.harness.runner import make_run_sandbox, read_spec
    from rexmle_agents.harness.spec import parse_duration
    from rexmle_tasks.pipeline import task_dirs
    from rexmle_tasks.registry import get_task

    argv = list(ctx.args)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UserInputError("no command given", hint="rexmle sandbox exec RUN_DIR -- python -c 'print(1)'")
    spec = read_spec(run_dir)
    task = get_task(spec.task_id)
    paths = RunPaths(run_dir.resolve())
    sandbox = make_run_sandbox(spec, paths, task_dirs(task, spec.data_root).public, task.meta.grader)
    result = sandbox.run(argv, timeout_s=parse_duration(timeout), log_dir=paths.logs / "sandbox-exec",
                         log_name=f"exec-{os.getpid()}")
    for stream, path in (("stdout", result.stdout_path), ("stderr", result.stderr_path)):
        text = path.read_text(errors="replace") if path is not None and path.is_file() else ""
        if text:
            typer.echo(text, nl=not text.endswith("\n"), err=stream == "stderr")
    if result.stopped_by:
        console.print(f"[red]stopped by the sandbox: {escape(result.stopped_by)}[/]")
    raise typer.Exit(result.exit_code if result.exit_code is not None else 1)
