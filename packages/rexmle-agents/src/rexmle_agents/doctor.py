"""``rexmle doctor``: one table of what a run needs and whether this machine has it.

Each row is ``ok``, ``missing`` or ``warning``, with the one command (or setting) that fixes it. The checks a run
makes before it starts are not written twice: the rows of the sandbox runtime, the task data, the agent and the
model keys come from the functions :func:`rexmle_agents.harness.runner.build_spec` calls (``usable_sandbox``,
``prepared_for_run``, ``ready_agent``, ``require_roles``, ``require_credentials``), and the endpoint rows from
:mod:`rexmle_agents.models.probe`, which ``rexmle run`` calls before any run starts; what they raise is shown as
the row. The doctor only adds what a run finds out later or never (GPUs and driver, free disk, the leak checks,
whether an external agent's environment is built, SLURM), and builds, downloads or writes nothing.

With ``--agent/--tasks/--model`` the rows are exactly what such a ``rexmle run`` needs, and a row that would stop it
is ``missing``; without them every task, provider and external agent is listed, and what is absent is a
``warning``. The exit code is 0 only when no row is ``missing``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from rexmle_grade.errors import RexmleError, TaskDataMissingError

#: free disk below which a run cannot be expected to finish (its workspace, checkpoints, the run folder)
DISK_MISSING_GB = 5.0
#: free disk below which the default workspace limit (100 GB, or half the free disk) is cut
DISK_WARNING_GB = 50.0
NVIDIA_VERSION_FILE = Path("/proc/driver/nvidia/version")
CALL_PROMPT = "Reply with the single word OK."
CALL_MAX_TOKENS = 16


class Status(str, Enum):
    OK = "ok"
    MISSING = "missing"
    WARNING = "warning"


@dataclass(frozen=True)
class Row:
    """One thing a run needs: where it belongs (``area``), what it is (``item``), whether it is there, what was
    found, and the command or setting that fixes it (empty when nothing needs fixing)."""

    area: str
    item: str
    status: Status
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return {"area": self.area, "item": self.item, "status": self.status.value, "detail": self.detail,
                "fix": self.fix}


@dataclass(frozen=True)
class Needs:
    """What the runs asked about need. Nothing asked (no agent, task or model): every task, provider and external
    agent is shown, and what is absent is a warning, not missing."""

    agent: str | None = None
    agent_config: dict[str, Any] = field(default_factory=dict)
    task_ids: tuple[str, ...] = ()
    models: dict[str, str] = field(default_factory=dict)
    sandbox: str = "auto"
    allow_unsandboxed: bool = False
    sandbox_image: str | None = None
    gpus_per_run: int = 0
    executor: str = "local"
    data_root: Path | None = None
    runs_dir: Path = Path("runs")
    call: bool = False  # one authenticated model call per model (costs a few tokens)
    leak_check: bool = True

    @property
    def asked(self) -> bool:
        return bool(self.agent or self.task_ids or self.models)

    @property
    def absent(self) -> Status:
        """The status of something absent that no asked-for run needs for sure."""
        return Status.MISSING if self.asked else Status.WARNING


def _failed(area: str, item: str, exc: RexmleError, status: Status = Status.MISSING) -> Row:
    return Row(area, item, status, exc.message, exc.hint or "")


def diagnose(needs: Needs) -> list[Row]:
    """Every row for ``needs``, in the order the table shows them."""
    rows: list[Row] = []
    for section in (sandbox_rows, gpu_rows, disk_rows, task_rows, agent_rows, model_rows, slurm_rows):
        rows += section(needs)
    return rows


def ready(rows: Iterable[Row]) -> bool:
    return all(row.status is not Status.MISSING for row in rows)


# ---------------------------------------------------------------------------------------------------------------
# sandbox


def sandbox_rows(needs: Needs) -> list[Row]:
    from rexmle_agents.harness.runner import usable_sandbox
    from rexmle_agents.sandbox._cgroups import detect_cgroups
    from rexmle_agents.sandbox.identity import (
        IDS_VARIABLE,
        USER_VARIABLE,
        id_range,
        lease_identity,
        range_conflicts,
        setpriv_path,
    )

    rows = []
    with tempfile.TemporaryDirectory(prefix="rexmle-doctor-") as probe:
        # stands for a task's public folder, which agent code (another user when the harness is root) must read
        Path(probe).chmod(0o755)
        try:
            kind = usable_sandbox(needs.sandbox, Path(probe), image=needs.sandbox_image,
                                  allow_unsandboxed=needs.allow_unsandboxed)
            named = needs.sandbox if needs.sandbox == kind else f"{needs.sandbox} -> {kind}"
            rows.append(Row("sandbox", f"runtime ({named})", Status.OK, f"the {kind} sandbox works here"))
        except RexmleError as exc:
            kind = None
            # a run cannot start without its sandbox, asked for or not
            rows.append(_failed("sandbox", f"runtime ({needs.sandbox})", exc))
    if kind == "none":
        return rows  # no isolation: no identity to drop to, no limits to set
    if os.geteuid() != 0:
        rows.append(Row("sandbox", "identity", Status.OK, "the harness is not root: agent code runs as this user"))
        return rows
    try:
        rows.append(Row("sandbox", "setpriv", Status.OK, f"{setpriv_path()} drops agent code to an unprivileged id"))
    except RexmleError as exc:
        rows.append(_failed("sandbox", "setpriv", exc))
    shared = os.environ.get(USER_VARIABLE, "")
    try:
        if shared:
            lease = lease_identity()  # the one shared user: resolved and checked, nothing leased or scrubbed
            user = lease.user
            rows.append(Row("sandbox", "identity", Status.OK, f"every run as ${USER_VARIABLE}={user.name} "
                                                               f"(uid {user.uid}, gid {user.gid})"))
        else:
            first, count = id_range()
            conflicts = range_conflicts(first, count)
            if conflicts:
                rows.append(Row("sandbox", "identity", Status.MISSING,
                                f"the id range {first}:{count} overlaps ids this machine uses: {conflicts[0]}"
                                + (f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""),
                                f"export {IDS_VARIABLE}=START:COUNT with unused ids (bash tools/setup.sh checks it)"))
            else:
                rows.append(Row("sandbox", "identity", Status.OK,
                                f"a uid of its own per run from {first}:{count} (${IDS_VARIABLE})"))
    except RexmleError as exc:
        rows.append(_failed("sandbox", "identity", exc))
    cgroups = detect_cgroups()
    if cgroups is None:
        rows.append(Row("sandbox", "cgroups", Status.WARNING,
                        "no writable cgroup: memory and process limits fall back to per-process rlimits",
                        "run on a cgroup-v2 host whose cgroup this user may write (a systemd --scope with "
                        "Delegate=yes, or a container started with a private cgroup namespace)"))
    else:
        rows.append(Row("sandbox", "cgroups", Status.OK, f"{cgroups.describe()}: per-run limits"))
    return rows


# ---------------------------------------------------------------------------------------------------------------
# GPUs and disk


def driver_version(version_file: Path = NVIDIA_VERSION_FILE) -> str | None:
    """The NVIDIA kernel module's version, read from the driver's own file (no subprocess)."""
    try:
        first = version_file.read_text(errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    words = first.split()
    candidates = [w for w in words if w.count(".") >= 1 and w.replace(".", "").isdigit()]
    return candidates[0] if candidates else first.strip()


def gpu_rows(needs: Needs) -> list[Row]:
    from rexmle_agents.sandbox.identity import driver_gpus

    gpus = driver_gpus()
    version = driver_version()
    found = f"{len(gpus)} GPU(s), NVIDIA driver {version}" if gpus else "no NVIDIA GPU (no driver listing)"
    if needs.executor == "slurm":
        return [Row("gpus", "GPUs and driver", Status.OK, f"{found} here; SLURM places the runs' GPUs")]
    if needs.gpus_per_run > len(gpus):
        return [Row("gpus", "GPUs and driver", Status.MISSING,
                    f"each run asks for {needs.gpus_per_run} GPU(s); this machine has {found}",
                    "run on a GPU machine (or with --executor slurm), or lower --gpus-per-run")]
    if not gpus:
        return [Row("gpus", "GPUs and driver", Status.OK if needs.asked else Status.WARNING,
                    f"{found}: runs use the CPU (--gpus-per-run 0)",
                    "" if needs.asked else "install the NVIDIA driver on a GPU machine to run with --gpus-per-run")]
    return [Row("gpus", "GPUs and driver", Status.OK, found)]


def _existing(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_rows(needs: Needs) -> list[Row]:
    from rexmle_grade.settings import data_dir

    rows = []
    places = {"data folder": data_dir(needs.data_root), "runs folder": Path(needs.runs_dir)}
    for item, place in places.items():
        free_gb = shutil.disk_usage(_existing(place)).free / 1e9
        detail = f"{free_gb:,.1f} GB free at {place}"
        if free_gb < DISK_MISSING_GB:
            rows.append(Row("disk", item, Status.MISSING, f"{detail}; a run needs at least {DISK_MISSING_GB:g} GB",
                            "free space there, or point --data-dir / --runs-dir at a larger disk"))
        elif free_gb < DISK_WARNING_GB:
            rows.append(Row("disk", item, Status.WARNING,
                            f"{detail}; workspaces get half of it shared by the runs at once (not 100 GB each)",
                            "free space there, or point --data-dir / --runs-dir at a larger disk"))
        else:
            rows.append(Row("disk", item, Status.OK, detail))
    return rows


# ---------------------------------------------------------------------------------------------------------------
# tasks


def task_rows(needs: Needs) -> list[Row]:
    from rexmle_agents.harness.runner import prepared_for_run
    from rexmle_grade.settings import data_dir
    from rexmle_tasks.check import check_task
    from rexmle_tasks.pipeline import task_dirs
    from rexmle_tasks.registry import all_tasks, get_task

    root = data_dir(needs.data_root)
    tasks = [get_task(t) for t in needs.task_ids] if needs.task_ids else list(all_tasks().values())
    rows = []
    unprepared = []
    for task in tasks:
        try:
            info = prepared_for_run(task, root)
        except TaskDataMissingError as exc:
            unprepared.append(task.id)
            if needs.task_ids:
                rows.append(_failed("task data", task.id, exc))
            continue
        except RexmleError as exc:
            rows.append(_failed("task data", task.id, exc, needs.absent))
            continue
        kind = "synthetic" if info.synthetic else "real"
        detail = f"prepared ({kind}), version {info.task_version}, {info.n_train} train / {info.n_test} test"
        if not needs.leak_check:
            rows.append(Row("task data", task.id, Status.OK, detail + "; leak check not run (--no-leak-check)"))
            continue
        try:
            problems = check_task(task, task_dirs(task, root), regenerate=False)
        except RexmleError as exc:
            rows.append(_failed("task data", task.id, exc))
            continue
        if problems:
            # a run would start, but on data whose test labels may be in reach: not a result to defend
            rows.append(Row("task data", task.id, Status.MISSING,
                            f"{detail}; leak check failed: {len(problems)} problem(s), the first: {problems[0]}",
                            f"rexmle prepare {task.id} --force{' --synthetic' if info.synthetic else ''}, then "
                            f"rexmle tasks check {task.id}"))
        else:
            rows.append(Row("task data", task.id, Status.OK, detail + "; leak check passed"))
    if unprepared and not needs.task_ids:  # nothing asked: one row, not one per task
        rows.append(Row("task data", f"{len(unprepared)} of {len(tasks)} task(s)", needs.absent,
                        f"not prepared under {root}: {', '.join(unprepared)}",
                        "rexmle prepare all --synthetic (offline), or rexmle prepare TASK for the real data"))
    return rows


# ---------------------------------------------------------------------------------------------------------------
# agents and their environments


def agent_rows(needs: Needs) -> list[Row]:
    from rexmle_agents.external.agent import ExternalAgent
    from rexmle_agents.harness.agent import all_agents, make_agent

    if needs.agent is None:
        return [_environment_row(name, lambda info=info: info.factory({}), needs)
                for name, info in all_agents().items()
                if isinstance(info.factory, type) and issubclass(info.factory, ExternalAgent)]
    from rexmle_agents.harness.runner import ready_agent, require_roles

    info = None
    for task_id in needs.task_ids or (None,):
        try:
            info = ready_agent(needs.agent, dict(needs.agent_config), task_id)
            require_roles(needs.agent, info.roles, needs.models)
        except RexmleError as exc:
            return [_failed("agent", needs.agent + (f" on {task_id}" if task_id else ""), exc)]
    rows = [Row("agent", needs.agent, Status.OK, f"{info.package} {info.version}; settings accepted")]
    agent = make_agent(needs.agent, dict(needs.agent_config))
    if isinstance(agent, ExternalAgent):
        rows.append(_environment_row(needs.agent, lambda: agent, needs))
    return rows


def _environment_row(name: str, make: Any, needs: Needs) -> Row:
    """Whether an external agent's own environment is built (its first run builds it; the doctor never does)."""
    from rexmle_agents.external.envs import built_environment

    try:
        agent = make()
        path, built = built_environment(agent.spec, extras=agent.extras, checkout=agent.checkout)
    except RexmleError as exc:
        # e.g. an agent run from a checkout, without one: a problem only when that agent is the one asked for
        return _failed("agent environment", name, exc, Status.MISSING if needs.agent else Status.WARNING)
    if built:
        return Row("agent environment", name, Status.OK, f"built in {path}")
    # not missing: the first run builds it (minutes, once), under a lock that parallel runs share
    return Row("agent environment", name, Status.WARNING, f"not built yet ({path}); the first run of the agent "
               "builds it (minutes, once)", "nothing to do; or start one short run of the agent to build it ahead")


# ---------------------------------------------------------------------------------------------------------------
# models


def model_rows(needs: Needs) -> list[Row]:
    from rexmle_agents.models.registry import PROVIDERS

    if needs.models:
        models = sorted(set(needs.models.values()))
    else:  # nothing asked: each provider whose key is set, by its example model
        models = [p.example for p in PROVIDERS.values() if os.environ.get(p.key_env)]
        unset = [p for p in PROVIDERS.values() if p.key_required and not os.environ.get(p.key_env)]
        rows = [Row("models", f"{p.name} key", Status.WARNING, f"${p.key_env} is not set",
                    f"export {p.key_env}=...") for p in unset]
        return rows + [row for model in models for row in _model_rows(model, needs)]
    return [row for model in models for row in _model_rows(model, needs)]


def _model_rows(model: str, needs: Needs) -> Iterator[Row]:
    from rexmle_agents.harness.runner import check_model_string, require_credentials
    from rexmle_agents.models.probe import describe, unreachable

    try:
        check_model_string(model, role="default")
        require_credentials({"default": model})
    except RexmleError as exc:
        yield _failed("models", f"{model} key", exc)
        return
    from rexmle_agents.models.probe import base_url

    if base_url(model) is None:
        yield Row("models", model, Status.OK, "calls no endpoint (replayed or scripted)")
        return
    yield Row("models", f"{model} key", Status.OK, "set")
    problems = unreachable([model])
    if problems:
        endpoint, problem = problems[0]
        # a SLURM node may reach what this submit host cannot (rexmle run only warns there too)
        status = Status.WARNING if needs.executor == "slurm" else Status.MISSING
        yield Row("models", f"{model} endpoint", status, describe(endpoint, problem),
                  "start the server, or fix the URL (openai-compatible/NAME@URL, $OPENAI_BASE_URL, "
                  "$ANTHROPIC_BASE_URL, $AZURE_OPENAI_ENDPOINT)")
        return
    yield Row("models", f"{model} endpoint", Status.OK, f"{base_url(model)} accepts connections")
    if needs.call:
        yield _call_row(model)


def _call_row(model: str) -> Row:
    """One authenticated call (``--call``): the key is accepted and the model answers (a few tokens)."""
    from rexmle_agents.models.registry import get_model
    from rexmle_agents.models.types import GenerateConfig

    try:
        response = get_model(model).generate(CALL_PROMPT, config=GenerateConfig(max_tokens=CALL_MAX_TOKENS))
    except RexmleError as exc:
        return _failed("models", f"{model} call", exc)
    cost = "" if response.cost_usd is None else f", ${response.cost_usd:.5f}"
    return Row("models", f"{model} call", Status.OK,
               f"answered ({response.usage.input_tokens + response.usage.output_tokens} tokens{cost})")


# ---------------------------------------------------------------------------------------------------------------
# SLURM


def slurm_rows(needs: Needs) -> list[Row]:
    found = {tool: shutil.which(tool) for tool in ("sbatch", "sinfo")}
    absent = [tool for tool, path in found.items() if path is None]
    if not absent:
        return [Row("slurm", "sbatch, sinfo", Status.OK, ", ".join(str(p) for p in found.values()))]
    if needs.executor == "slurm":
        return [Row("slurm", "sbatch, sinfo", Status.MISSING, f"{', '.join(absent)} not on PATH",
                    "run on the cluster's submit host (or `module load slurm`), or use --executor local")]
    return [Row("slurm", "sbatch, sinfo", Status.WARNING, f"{', '.join(absent)} not on PATH: --executor slurm "
                "is not available here", "only --executor slurm needs them: run on a submit host")]


# ---------------------------------------------------------------------------------------------------------------
# the command


def render(rows: Sequence[Row], console: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    colours = {Status.OK: "green", Status.MISSING: "bold red", Status.WARNING: "yellow"}
    table = Table(title="rexmle doctor")
    for column in ("area", "item", "status", "found", "fix"):
        table.add_column(column, overflow="fold")
    for row in rows:
        # paths, messages and model names are data, never markup
        table.add_row(Text(row.area), Text(row.item), Text(row.status.value, style=colours[row.status]),
                      Text(row.detail), Text(row.fix))
    console.print(table)


def doctor_command(
    agent: Annotated[str | None, typer.Option("--agent", "-a", help="Check what runs of this agent need.")] = None,
    tasks: Annotated[str | None, typer.Option(help="T1,T2 | all | lite | 2d | 3d | a task type.")] = None,
    task: Annotated[str | None, typer.Option(help="One task id (same as --tasks T).")] = None,
    model: Annotated[list[str], typer.Option("--model", "-m", help="[ROLE=]MODEL, repeatable.")] = [],  # noqa: B006
    agent_config: Annotated[list[str], typer.Option(help="JSON, @file.yaml or key=value; repeatable.")] = [],  # noqa: B006
    sandbox: Annotated[str, typer.Option(help="auto | bwrap | apptainer | docker | none.")] = "auto",
    allow_unsandboxed: Annotated[bool, typer.Option(help="As for rexmle run (--sandbox none).")] = False,
    sandbox_image: Annotated[str | None, typer.Option(help="Image for --sandbox apptainer|docker.")] = None,
    gpus_per_run: Annotated[int, typer.Option(min=0, help="GPUs each run asks for.")] = 0,
    executor: Annotated[str, typer.Option(help="local | slurm | submitit-local.")] = "local",
    runs_dir: Annotated[Path, typer.Option(help="Where run folders would go (its free disk).")] = Path("runs"),
    call: Annotated[bool, typer.Option("--call", help="Make one authenticated call per model (a few tokens, "
                                                      "billed); default: only a connection, no request.")] = False,
    leak_check: Annotated[bool, typer.Option(help="Run each prepared task's leak checks (without regenerating "
                                                  "synthetic data).")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """What a run needs and whether it is here: sandbox, GPUs, disk, task data, agents, model keys and endpoints,
    SLURM. With --agent/--tasks/--model: exactly what that `rexmle run` needs. Exit code 0 only when nothing is
    missing."""
    import json

    from rich.console import Console

    from rexmle_agents.cli import parse_agent_config, parse_models, select_tasks

    chosen = ",".join(x for x in (tasks, task) if x)
    needs = Needs(agent=agent, agent_config=parse_agent_config(agent_config),
                  task_ids=tuple(select_tasks(chosen)) if chosen else (), models=parse_models(model),
                  sandbox=sandbox, allow_unsandboxed=allow_unsandboxed, sandbox_image=sandbox_image,
                  gpus_per_run=gpus_per_run, executor=executor, runs_dir=runs_dir, call=call, leak_check=leak_check)
    rows = diagnose(needs)
    if as_json:
        typer.echo(json.dumps([row.to_json() for row in rows], indent=2))
    else:
        console = Console()
        render(rows, console)
        missing = sum(row.status is Status.MISSING for row in rows)
        warnings = sum(row.status is Status.WARNING for row in rows)
        console.print(f"{missing} missing, {warnings} warning(s): "
                      + ("the runs asked about can start" if needs.asked and not missing else
                         "this machine can start runs" if not missing else "fix the missing rows first"),
                      markup=False)
    if not ready(rows):
        raise typer.Exit(1)
