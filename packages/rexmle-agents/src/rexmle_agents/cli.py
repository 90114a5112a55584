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

from rexmle_agents.integrations.export_cli import runs_export_command
from rexmle_grade.cli import make_app
from rexmle_grade.errors import UnknownNameError, UserInputError
from rexmle_grade.text import printable

console = Console()
agents_app = make_app(help="Agents: the installed agents (built-in, scaffolds and plug-ins).")
runs_app = make_app(help="Runs: status of run folders and their group reports.")
sandbox_app = make_app(help="Sandboxes: run a command in exactly the sandbox a run's code gets.")

TASK_TYPES = ("segmentation", "instance_segmentation", "detection", "classification", "regression", "enhancement")
DIMS = ("2d", "3d")
DEFAULT_RUNS_DIR = Path("runs")


def safe(text: object) -> str:
    """Agent-controlled text for a rich console: control characters escaped, markup escaped."""
    return escape(printable(text))


# ---------------------------------------------------------------------------------------------------------------
# parsing


def select_tasks(expression: str) -> list[str]:
    """Task ids from ``T1,T2``, ``all``, ``lite`` (:mod:`rexmle_tasks.lite`), a dimension (``2d``, ``3d``) or a
    task type (``segmentation``...)."""
    from rexmle_tasks.lite import lite_tasks
    from rexmle_tasks.registry import all_tasks

    tasks = all_tasks()
    chosen: list[str] = []
    for token in (t.strip() for t in expression.split(",")):
        if not token:
            continue
        if token == "all":
            matches = list(tasks)
        elif token == "lite":
            matches = lite_tasks(tasks)
        elif token in DIMS:
            matches = [t for t, task in tasks.items() if task.meta.dim == token]
        elif token in TASK_TYPES:
            matches = [t for t, task in tasks.items() if task.meta.task_type == token]
        elif token in tasks:
            matches = [token]
        else:
            raise UnknownNameError("task or task group", token, [*tasks, "all", "lite", *DIMS, *TASK_TYPES])
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


def parse_sbatch_options(values: list[str]) -> dict[str, str]:
    """``--sbatch qos=long --sbatch exclusive``: sbatch options by their long name, without the dashes."""
    options: dict[str, str] = {}
    for value in values:
        key, _, setting = value.partition("=")
        key = key.strip().lstrip("-")
        if not key or key in ("array", "output", "requeue", "job-name", "open-mode"):
            raise UserInputError(f"--sbatch {value!r}: " + ("no option name" if not key else
                                                            f"rexmle sets --{key} itself"),
                                 hint="e.g. --sbatch qos=long or --sbatch constraint=a100")
        options[key] = setting
    return options


def parse_agent_config(values: list[str]) -> dict[str, Any]:
    """``--agent-config`` as JSON (``'{"num_drafts": 3}'``), a file (``@config.yaml``, or a shipped configuration by
    name: ``@paper-aide.yaml``) or ``key=value``."""
    import yaml

    config: dict[str, Any] = {}
    for value in values:
        if value.startswith("@"):
            from rexmle_agents.scaffolds.configs import config_file, shipped_configs

            path = config_file(value[1:])
            if path is None:
                raise UserInputError(f"--agent-config file {value[1:]} does not exist, and no shipped configuration "
                                     "has that name", hint="shipped: " + ", ".join(f"@{n}" for n in shipped_configs()))
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
    tasks: Annotated[str | None, typer.Option(help="T1,T2 | all | lite | 2d | 3d | a task type (segmentation ...).")
                     ] = None,
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
    memory_gb: Annotated[float | None, typer.Option(help="Memory limit per run, GB (default: this machine's memory "
                                                          "less a reserve, shared by the runs at once).")] = None,
    max_file_gb: Annotated[float, typer.Option(help="Largest file agent code may write, GB.")] = 64.0,
    disk_gb: Annotated[float | None, typer.Option(help="Bytes the workspace may hold, GB (default: 100, or half the "
                                                        "free disk shared by the runs at once if less).")] = None,
    max_files: Annotated[int, typer.Option(help="Files and folders the workspace may hold.")] = 1_000_000,
    run_folder_gb: Annotated[float | None, typer.Option(help="Bytes the run folder may hold besides the workspace "
                                                              "(journal, model cassette, logs, snapshots), GB "
                                                              "(default: 5).")] = None,
    sandbox: Annotated[str, typer.Option(help="auto | bwrap | apptainer | docker | none.")] = "auto",
    allow_unsandboxed: Annotated[bool, typer.Option(help="Needed for --sandbox none.")] = False,
    sandbox_image: Annotated[str | None, typer.Option(help="Image for --sandbox apptainer|docker.")] = None,
    selection_cases: Annotated[int, typer.Option(min=0, help="Hold out K training cases; choose the final "
                                                             "submission by its grade on them (default off).")] = 0,
    resume: Annotated[Path | None, typer.Option(help="Resume one run folder (runs/<group>/<run_id>).")] = None,
    partition: Annotated[str | None, typer.Option(help="SLURM partition.")] = None,
    slurm_timeout_min: Annotated[int | None, typer.Option(help="SLURM job limit (default: run limit + 1h).")] = None,
    account: Annotated[str | None, typer.Option(help="SLURM account to charge.")] = None,
    array_parallelism: Annotated[int, typer.Option(min=0, help="SLURM: at most N runs of the group at once "
                                                              "(--array=...%N; 0: no limit).")] = 64,
    sbatch: Annotated[list[str], typer.Option(help="SLURM: any other sbatch option as KEY=VALUE (or KEY), "
                                                   "repeatable: --sbatch qos=long --sbatch constraint=a100.")] = [],  # noqa: B006
    wait: Annotated[bool, typer.Option(help="Wait for SLURM jobs and print the report.")] = True,
    out: Annotated[Path | None, typer.Option(help="Group report path (default: runs/<group>/report.json).")] = None,
    plan: Annotated[str | None, typer.Option(help="Run a plan: a shipped one by name (paper-main, "
                                                  "ablation-time-budget ...) or a YAML file.")] = None,
    dry_run: Annotated[bool, typer.Option(help="Run and write nothing: print the runs' expected GPU-hours and API "
                                                "dollars (per run, per seed, in total); with --plan also its runs "
                                                "and the agent settings that would be refused.")] = False,
    history: Annotated[Path | None, typer.Option(help="With --dry-run: runs folder whose recorded runs of the same "
                                                      "agents give steps per hour and tokens per step.")] = None,
) -> None:
    """Run an agent on tasks (sandboxed, budgeted, resumable), grade every run and print the group's report."""
    from rexmle_agents.executors.common import SlurmOptions, run_specs
    from rexmle_agents.harness.runner import build_spec, read_spec, run_paths
    from rexmle_agents.harness.spec import Limits, Resources, parse_duration
    from rexmle_agents.results.live import LiveRuns, follow

    run_dirs: dict[str, Path] = {}
    if resume is not None and dry_run:
        raise UserInputError("--dry-run forecasts runs not yet started; --resume continues one that was",
                             hint="drop --dry-run to resume it, or drop --resume to forecast new runs")
    if resume is not None:
        spec = read_spec(resume)
        runs_root = resume.resolve().parent.parent
        specs = [spec]
        group = spec.group
        run_dirs[spec.run_id] = resume.resolve()  # acts on PATH itself, wherever it lies (a copy, a moved folder)
        group_dir = resume.resolve().parent
    elif plan is not None:
        if agent or tasks or task or model or agent_config:
            raise UserInputError("--plan defines the runs: drop --agent, --task(s), --model and --agent-config",
                                 hint="or run without --plan")
        built = plan_specs(plan, group=None if group == "default" else group, dry_run=dry_run,
                           allow_unsandboxed=allow_unsandboxed, sandbox_image=sandbox_image, history=history)
        if built is None:
            return
        specs, group = built
        runs_root = runs_dir
        group_dir = runs_dir / group
    else:
        if agent is None:
            raise UserInputError("which agent? pass --agent NAME", hint="see `rexmle agents list`")
        if not tasks and not task:
            raise UserInputError("which tasks? pass --task T or --tasks T1,T2|all|3d|segmentation")
        task_ids = select_tasks(",".join(x for x in (tasks, task) if x))
        seed_list = [seed] if seed is not None else list(range(seeds))
        if dry_run:
            from rexmle_agents.forecast import PlannedRun

            models = parse_models(model)
            print_forecast([PlannedRun(task_id=t, agent=agent, models=models, seed=s,
                                       time_limit_s=parse_duration(time_limit), gpus=gpus_per_run,
                                       max_steps=max_steps, max_tokens=max_tokens, max_cost_usd=max_cost)
                            for t in task_ids for s in seed_list], history=history,
                           title=f"{len(task_ids) * len(seed_list)} run(s) of agent {agent}")
            console.print("dry run: nothing was started or written; `rexmle doctor` with the same --agent, --tasks "
                          "and --model checks what these runs need", markup=False)
            return
        require_prepared(task_ids)
        limits = checked(Limits, time_limit_s=parse_duration(time_limit), exec_timeout_s=parse_duration(exec_timeout),
                         max_steps=max_steps, max_tokens=max_tokens, max_cost_usd=max_cost,
                         extend_for_model_retries=extend_for_retries)
        resources = checked(Resources, gpus=gpus_per_run, cpus=cpus, memory_gb=memory_gb, max_file_gb=max_file_gb,
                            disk_gb=disk_gb, max_files=max_files, run_folder_gb=run_folder_gb)
        models = parse_models(model)
        config = parse_agent_config(agent_config)
        specs = [build_spec(t, agent=agent, agent_config=config, models=models, seed=s, limits=limits,
                            resources=resources, sandbox=sandbox, allow_unsandboxed=allow_unsandboxed, group=group,
                            selection_cases=selection_cases, sandbox_image=sandbox_image)
                 for t in task_ids for s in seed_list]
        runs_root = runs_dir
        group_dir = runs_dir / group
    if not specs:
        raise UserInputError("the group has zero runs")
    check_endpoints(specs, executor=executor)
    started = time.perf_counter()
    console.print(f"{len(specs)} run(s) in {escape(str(group_dir))} ({executor} executor"
                  + (f", {workers} worker(s))" if executor == "local" else ")"))

    def progress(outcome: Any) -> None:
        pct = "-" if outcome.grade is None or outcome.grade.percentile is None else f"{outcome.grade.percentile:.1%}"
        colour = "green" if outcome.state == "finished" else "yellow" if outcome.state == "timed_out" else "red"
        console.print(f"  [{colour}]{outcome.state}[/] {escape(outcome.run_id)}: {safe(outcome.reason)} · "
                      f"{outcome.steps} step(s), {outcome.seconds:.1f} s · percentile {pct}")

    folders = {s.run_id: run_dirs.get(s.run_id) or run_paths(s, runs_root).run_dir for s in specs}
    watch = LiveRuns([(folders[s.run_id], s.limits.time_limit_s, s.limits.max_steps) for s in specs])
    with follow(console, watch, title=f"{len(specs)} run(s) of group {group}"):
        outcomes = run_specs(specs, runs_root, executor=executor, workers=workers, progress=progress,
                             slurm=SlurmOptions(partition=partition, timeout_min=slurm_timeout_min, account=account,
                                                array_parallelism=array_parallelism or None,
                                                extra=parse_sbatch_options(sbatch), wait=wait),
                             run_dirs=run_dirs)
    if not outcomes:
        console.print(f"jobs submitted: `rexmle runs status --runs-dir {safe(runs_root)} --group {safe(group)}` shows "
                      "them; run the same command again later to wait for them and write the report (it submits "
                      "nothing twice)")
        return
    write_group_report(group_dir, out or group_dir / "report.json")
    console.print(f"{len(outcomes)} run(s) in {time.perf_counter() - started:.1f} s")
    failed = [o for o in outcomes if o.state == "failed"]
    if failed:  # a run whose agent could not start or crashed is an error of the command, not a result
        console.print(f"[red]{len(failed)} of {len(outcomes)} run(s) failed[/]; the first: {escape(failed[0].run_id)}: "
                      f"{safe(failed[0].reason)}")
        raise typer.Exit(1)


def check_endpoints(specs: list[Any], *, executor: str) -> None:
    """Open one connection to each model endpoint of the runs before any starts, so that a wrong URL is one line
    (exit code 2) now rather than minutes of retries in every run. A SLURM node may reach endpoints this host
    cannot (a server on the node, a cluster network): for the slurm executor a failed probe is only a warning."""
    from rexmle_agents.models.probe import describe, require_reachable, unreachable

    models = sorted({m for s in specs for m in s.models.values()})
    if executor != "slurm":
        require_reachable(models)
        return
    for endpoint, problem in unreachable(models):
        console.print(f"[yellow]warning: {safe(describe(endpoint, problem))} from this host (the SLURM nodes may "
                      "reach it)[/]")


def write_group_report(group_dir: Path, path: Path, *, by: Any = None) -> Any:
    """The group's report rebuilt from every run folder in ``group_dir`` (not only the runs just made), printed as
    the paper's table and written as JSON (:class:`rexmle_agents.results.report.GroupReport`)."""
    from rexmle_agents.results.loader import load_runs
    from rexmle_agents.results.report import build_group_report, render_terminal
    from rexmle_agents.results.stats import DEFAULT_BY

    runs = load_runs([group_dir])
    report = build_group_report(runs, by=by or DEFAULT_BY)
    render_terminal(report, console)
    console.print(f"report: {safe(report.write(path))} (rebuild it at any time: rexmle report {safe(group_dir)}; "
                  f"pages: rexmle view {safe(group_dir)})")
    for run in runs.runs:
        if run.grade is None and run.status.state not in ("pending", "running"):
            console.print(f"[red]not graded[/] {escape(run.run_id)}: {safe(run.status.reason)}")
    return report


# the rexmle run option that sets each field of Limits and Resources
OPTION_OF_FIELD = {"time_limit_s": "--time-limit", "exec_timeout_s": "--exec-timeout", "max_steps": "--max-steps",
                   "max_tokens": "--max-tokens", "max_cost_usd": "--max-cost", "gpus": "--gpus-per-run",
                   "cpus": "--cpus", "memory_gb": "--memory-gb", "max_file_gb": "--max-file-gb",
                   "disk_gb": "--disk-gb", "max_files": "--max-files", "run_folder_gb": "--run-folder-gb"}


def checked(model: Any, **values: Any) -> Any:
    """``model(**values)``, a value out of range reported as one line naming its command-line option."""
    from pydantic import ValidationError

    try:
        return model(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "?"
        option = OPTION_OF_FIELD.get(field, "--" + field.replace("_", "-"))
        raise UserInputError(f"{option} {values.get(field)!r}: {error['msg'].lower()}",
                             hint=f"see `rexmle run --help` for {option}") from None


def require_prepared(task_ids: list[str], data_root: Path | None = None) -> None:
    """Every task prepared, or one error listing every task that is not, with the commands that prepare them."""
    from rexmle_tasks.pipeline import prepared_info, task_dirs
    from rexmle_tasks.registry import get_task

    missing = [t for t in task_ids if prepared_info(task_dirs(get_task(t), data_root)) is None]
    if missing:
        commands = " && ".join(f"rexmle prepare {t} --synthetic" for t in missing[:4])
        more = f" (and {len(missing) - 4} more)" if len(missing) > 4 else ""
        raise UserInputError(
            f"{len(missing)} of {len(task_ids)} task(s) are not prepared: {', '.join(missing)}",
            hint=f"{commands}{more} (synthetic data, offline), or `rexmle prepare all --synthetic`; leave out "
                 "--synthetic for the real data")


def print_forecast(runs: list[Any], *, history: Path | None, title: str) -> None:
    """The cost forecast of ``runs`` (:mod:`rexmle_agents.forecast`), from ``history``'s recorded runs where it has
    some of an agent."""
    from rexmle_agents.forecast import forecast, load_history, render

    render(forecast(runs, history=load_history(history) if history is not None else None), console,
           title=f"cost forecast: {title}")


def plan_specs(reference: str, *, group: str | None, dry_run: bool, allow_unsandboxed: bool,
               sandbox_image: str | None, history: Path | None = None) -> tuple[list[Any], str] | None:
    """The checked specs of a plan and its group (None after a dry run, which lists the runs and checks nothing)."""
    from rexmle_agents.harness.runner import build_spec
    from rexmle_agents.harness.spec import Limits, Resources, parse_duration
    from rexmle_agents.models.registry import missing_credentials
    from rexmle_agents.plans import expand, load_plan

    loaded = load_plan(reference)
    requests = expand(loaded, select_tasks=select_tasks, read_config=lambda ref: parse_agent_config([ref]))
    group = group or loaded.group
    if dry_run:
        table = Table(title=f"plan {loaded.name}: {len(requests)} run(s) in group {group}")
        for column in ("agent", "models", "config", "time limit", "tasks", "seeds", "runs"):
            table.add_column(column, overflow="fold")
        cells: dict[tuple[str, str, str, str], list[tuple[str, int]]] = {}
        for r in requests:
            key = (r.agent, ",".join(f"{k}={v}" for k, v in sorted(r.models.items())) or "-",
                   json.dumps(r.agent_config, sort_keys=True), r.options.time_limit)
            cells.setdefault(key, []).append((r.task_id, r.seed))
        for (agent, models, config, limit), runs in cells.items():
            table.add_row(safe(agent), safe(models), safe(config), safe(limit), str(len({t for t, _ in runs})),
                          str(len({s for _, s in runs})), str(len(runs)))
        console.print(table)
        from rexmle_agents.plans import refusals

        for agent, count, problem in refusals(requests):
            console.print(f"[red]would be refused[/]: {count} run(s) of agent {safe(agent)}: {safe(problem)}")
        from rexmle_agents.forecast import PlannedRun

        print_forecast([PlannedRun(task_id=r.task_id, agent=r.agent, models=r.models, seed=r.seed,
                                   time_limit_s=parse_duration(r.options.time_limit), gpus=r.options.gpus_per_run,
                                   max_steps=r.options.max_steps, max_tokens=r.options.max_tokens,
                                   max_cost_usd=r.options.max_cost) for r in requests],
                       history=history, title=f"plan {loaded.name}")
        console.print(f"report it with: rexmle report --plan {safe(reference)} (rows by "
                      f"{','.join(loaded.report.by)})")
        return None
    require_prepared(sorted({r.task_id for r in requests}))
    missing = sorted({v for r in requests for m in r.models.values() for v in missing_credentials(m)})
    if missing:
        raise UserInputError(f"plan {loaded.name!r} needs {', '.join(missing)}, not set in the environment",
                             hint="export " + " ".join(f"{v}=..." for v in missing) + " before running it")
    specs = []
    for r in requests:
        o = r.options
        limits = checked(Limits, time_limit_s=parse_duration(o.time_limit),
                         exec_timeout_s=parse_duration(o.exec_timeout), max_steps=o.max_steps,
                         max_tokens=o.max_tokens, max_cost_usd=o.max_cost,
                         extend_for_model_retries=o.extend_for_retries)
        resources = checked(Resources, gpus=o.gpus_per_run, cpus=o.cpus, memory_gb=o.memory_gb)
        specs.append(build_spec(r.task_id, agent=r.agent, agent_config=r.agent_config, models=r.models, seed=r.seed,
                                limits=limits, resources=resources, sandbox=o.sandbox,
                                allow_unsandboxed=allow_unsandboxed, group=group, selection_cases=o.selection_cases,
                                sandbox_image=sandbox_image))
    return specs, group


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
    cluster: Annotated[bool, typer.Option(help="Ask SLURM about the runs' jobs first (on a submit host).")] = True,
) -> None:
    """Show every run folder's state, model, steps, time, tokens, cost and grade, with a total per group (and each
    run's SLURM job: id and state, brought up to date from SLURM where it can be asked)."""
    from rexmle_agents.results.cli import status_tables

    note = refresh_cluster_records(runs_dir / group if group else runs_dir) if cluster else None
    tables, found = status_tables(runs_dir, group, cluster_note=note)
    if not found:
        from rexmle_grade.settings import data_dir

        demo = data_dir() / "demo-runs"
        where = f"; `rexmle demo` keeps its runs in {demo}: rexmle runs status --runs-dir {demo}" if \
            demo.is_dir() else ""
        raise UserInputError(f"no run folders under {runs_dir}" + (f" in group {group!r}" if group else ""),
                             hint=f"start runs with `rexmle run`, or pass --runs-dir{where}")
    for table in tables:
        console.print(table)


def refresh_cluster_records(root: Path) -> str | None:
    """Ask SLURM about the jobs of the runs under ``root`` and record what it says into their folders; the
    cluster's accounting note (None where no run has a job, or SLURM cannot be asked from here)."""
    from rexmle_agents.executors.slurm_accounting import CLUSTER_FILE, SlurmCommandError, refresh

    if not root.is_dir():
        return None
    folders = [p.parent for p in (*root.glob(f"*/{CLUSTER_FILE}"), *root.glob(f"*/*/{CLUSTER_FILE}"))]
    try:
        return refresh(folders)
    except SlurmCommandError as exc:
        console.print(f"[yellow]SLURM could not be asked ({safe(exc.message)}); job states as last recorded[/]")
        return None


@runs_app.command("show")
def runs_show_command(
    run: Annotated[Path, typer.Argument(help="A run folder, or a run id (or its start) under --runs-dir.")],
    runs_dir: Annotated[Path, typer.Option(help="Where run folders are (to find a run id).")] = DEFAULT_RUNS_DIR,
) -> None:
    """One run's trajectory in the terminal: budgets used, why it ended, every node or step, the final grade."""
    from rexmle_agents.results.cli import find_run, show_run

    show_run(find_run(run, runs_dir), console)


runs_app.command("export")(runs_export_command)  # `rexmle runs export RUN --format atif`


@sandbox_app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sandbox_exec_command(
    ctx: typer.Context,
    run_dir: Annotated[Path, typer.Argument(help="A run folder (runs/<group>/<run_id>).")],
    timeout: Annotated[str, typer.Option(help="Stop the command after this long.")] = "1h",
) -> None:
    """Run a command in exactly the sandbox a run's code gets: `rexmle sandbox exec RUN_DIR -- COMMAND ...`."""
    from rexmle_agents.harness.paths import RunPaths
    from rexmle_agents.harness.runner import make_run_sandbox, read_spec, run_lock
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
    # not beside a live run: the command leases an identity of its own, and the workspace would be handed to it
    with run_lock(paths), make_run_sandbox(spec, paths, task_dirs(task, spec.data_root).public,
                                           task.meta.grader) as sandbox:
        result = sandbox.run(argv, timeout_s=parse_duration(timeout), log_dir=paths.logs / "sandbox-exec",
                             log_name=f"exec-{os.getpid()}")
    for stream, path in (("stdout", result.stdout_path), ("stderr", result.stderr_path)):
        # the log files are bounded (the sandbox keeps a head and a tail); what the code printed is data, shown
        # with control characters escaped
        text = path.read_text(errors="replace") if path is not None and path.is_file() else ""
        if text:
            typer.echo(printable(text), nl=not text.endswith("\n"), err=stream == "stderr")
    if result.stopped_by:
        console.print(f"[red]stopped by the sandbox: {escape(result.stopped_by)}[/]")
    raise typer.Exit(result.exit_code if result.exit_code is not None else 1)
