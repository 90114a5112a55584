"""Run one agent on one task: the run folder, the sandbox, the budgets, resume, the final submission and grading.

:func:`build_spec` checks everything a run needs before anything is written (task prepared, agent known and its
config valid, a model for every role, the sandbox available, GPUs present). :func:`execute_run` then creates or
resumes ``runs/<group>/<run_id>/``, runs the agent under a watchdog, collects the final submission even when a
budget ran out, and grades it outside the sandbox. A finished run is not run again; an unfinished one resumes from
its journal.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rexmle_agents.harness.agent import get_agent_info, make_agent
from rexmle_agents.harness.context import RunContext, TaskInfo
from rexmle_agents.harness.hardware import describe
from rexmle_agents.harness.instructions import render_instructions
from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.limits import GIB, EffectiveLimits, RunFolderWatch, recorded_limits, resolve_limits
from rexmle_agents.harness.paths import INSTRUCTIONS_FILENAME, RunPaths
from rexmle_agents.harness.spec import RUN_FORMAT_VERSION, Limits, Resources, RunSpec, data_variant
from rexmle_agents.models._jsonl import clean_json
from rexmle_agents.models.accounting import Budget, UsageLedger, UsageTotals
from rexmle_agents.models.base import Model
from rexmle_agents.safe_workspace import MAX_DEPTH, Workspace
from rexmle_agents.sandbox.base import DATA_DIRNAME, SUBMISSION_DIRNAME
from rexmle_grade.errors import BudgetExceededError, RexmleError, UserInputError
from rexmle_grade.report import ReportEntry
from rexmle_grade.schema import SUBMISSION_CSV

logger = logging.getLogger(__name__)

STATES = ("pending", "running", "finished", "failed", "timed_out", "cancelled")
TERMINAL_STATES = frozenset({"finished", "failed", "timed_out", "cancelled"})
SCRIPTED_PROVIDER = "scripted"  # model strings of tests: the Model object is passed to execute_run
REPLAY_PREFIX = "replay:"
# After the deadline the agent gets this long to notice (its sandboxed command is already killed) before the
# harness collects the submission without it.
GRACE_S = 20.0
HEARTBEAT_S = 15.0


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    run_dir: Path
    state: str
    reason: str
    limit: str | None  # which budget ended the run: time, steps, tokens, cost (None if none did)
    steps: int
    seconds: float
    grade: ReportEntry | None


# ---------------------------------------------------------------------------------------------------------------
# building a spec


def mirror_digest(dirs: Any) -> str | None:
    """Which synthetic mirror a prepared task holds: a one-way digest of its secret (kept in ``private/``), so runs
    on two mirrors of one task and seed (prepared again with ``--force``) never share a run id or a run folder.
    None for a preparation made before mirrors had secrets."""
    from rexmle_tasks.pipeline import SYNTHETIC_SECRET, read_secret

    secret = read_secret(dirs.private / SYNTHETIC_SECRET)
    if secret is None:
        return None
    return hashlib.sha256(b"rexmle-synthetic-mirror\0" + secret).hexdigest()[:16]


def build_spec(task_id: str, *, agent: str, agent_config: Mapping[str, Any] | None = None,
               models: Mapping[str, str] | None = None, seed: int = 0, limits: Limits | None = None,
               resources: Resources | None = None, sandbox: str = "auto", allow_unsandboxed: bool = False,
               data_root: str | Path | None = None, group: str = "default", selection_cases: int = 0,
               sandbox_image: str | None = None) -> RunSpec:
    """A checked :class:`RunSpec`; every problem is one clear error, and nothing is written."""
    from rexmle_grade.settings import data_dir, rexmle_versions
    from rexmle_tasks.pipeline import task_dirs
    from rexmle_tasks.registry import get_task

    task = get_task(task_id)
    root = data_dir(data_root)
    info = prepared_for_run(task, root)
    config = dict(agent_config or {})
    agent_info = ready_agent(agent, config, task.id)
    models = dict(models or {})
    for role, model in models.items():
        check_model_string(model, role=role)
    require_credentials(models)
    require_roles(agent, agent_info.roles, models)
    resources = resources or Resources()
    # GPUs are not counted here: the executor that places the run does (this machine's for the local one; a SLURM
    # cluster's for sbatch, which refuses a request no node can grant), and a submit host has none of its own
    if selection_cases:  # checked now, so a task that cannot hold K cases out fails before any run; drawn at its start
        from rexmle_tasks.selection import check_selection_request

        check_selection_request(task.id, selection_cases, root)
    kind = usable_sandbox(sandbox, task_dirs(task, root).public, image=sandbox_image,
                          allow_unsandboxed=allow_unsandboxed)
    # the variant comes from the prepared task's own record, so it says what was prepared, not what was asked for
    variant = data_variant(synthetic=info.synthetic, difficulty=info.difficulty)
    return RunSpec(task_id=task.id, task_version=task.meta.version, split_digest=info.split_digest,
                   data_variant=variant, data_digest=mirror_digest(task_dirs(task, root)) if info.synthetic else None,
                   agent=agent,
                   agent_version=agent_info.version, agent_config=config, models=models, seed=seed,
                   limits=limits or Limits(), resources=resources, sandbox=kind, sandbox_image=sandbox_image,
                   allow_unsandboxed=allow_unsandboxed, group=group, data_root=str(root),
                   selection_cases=selection_cases,
                   rexmle_versions=rexmle_versions())


# The checks build_spec makes, each usable alone: `rexmle doctor` (rexmle_agents.doctor) calls the same functions and
# shows what they raise as its rows, so a run and the doctor never disagree on what a run needs.


def prepared_for_run(task: Any, root: Path) -> Any:
    """The preparation record of ``task`` under the data root ``root``, prepared for the installed version."""
    from rexmle_tasks.pipeline import require_prepared, task_dirs

    info = require_prepared(task, task_dirs(task, root))
    if info.task_version != task.meta.version:
        raise UserInputError(f"task {task.id!r} was prepared for version {info.task_version}, but version "
                             f"{task.meta.version} is installed",
                             hint=f"run `rexmle prepare {task.id} --force{' --synthetic' if info.synthetic else ''}`")
    return info


def ready_agent(agent: str, config: dict[str, Any], task_id: str | None) -> Any:
    """The agent's registry entry, after making it with ``config`` and running its preflight for the task (none
    without a task)."""
    agent_info = get_agent_info(agent)
    made = make_agent(agent, config)  # a bad setting fails here, not hours later on a cluster node
    preflight = getattr(made, "preflight", None)
    if callable(preflight) and task_id is not None:  # what the agent needs for this task (e.g. the baseline's
        preflight(task_id)  # extras) is there
    return agent_info


def require_roles(agent: str, roles: Sequence[str], models: Mapping[str, str]) -> None:
    """A model for every role of the agent (one model, or a ``default``, serves them all)."""
    missing = [r for r in roles if r not in models and "default" not in models and len(models) != 1]
    if missing:
        raise UserInputError(
            f"agent {agent!r} needs a model for role(s) {', '.join(missing)}, and none was given",
            hint="pass --model PROVIDER/MODEL (all roles) or --model ROLE=PROVIDER/MODEL, e.g. --model openai/gpt-5",
        )


def require_credentials(models: Mapping[str, str]) -> None:
    """Every key and endpoint variable the models need is set."""
    from rexmle_agents.models.registry import missing_credentials

    unset = sorted({name for model in models.values() for name in missing_credentials(model)})
    if unset:  # caught now, not as a run that stays "pending" forever
        raise UserInputError(f"{' and '.join(unset)} {'is' if len(unset) == 1 else 'are'} not set: the model(s) "
                             f"{', '.join(sorted(set(models.values())))} need {'it' if len(unset) == 1 else 'them'}",
                             hint="export " + " ".join(f"{name}=..." for name in unset)
                                  + ", or replay a recorded run offline (--model replay:RUN/cassette.jsonl)")


def usable_sandbox(sandbox: str, public: Path, *, image: str | None = None, allow_unsandboxed: bool = False) -> str:
    """The sandbox kind ``sandbox`` stands for ("auto": the default), after checking its runtime works here for a
    task whose public data is ``public``."""
    from rexmle_agents.sandbox import SandboxSpec, default_sandbox_kind, get_sandbox

    kind = default_sandbox_kind() if sandbox == "auto" else sandbox
    # unknown, unavailable or refused runtimes fail now; making one has no side effects
    with tempfile.TemporaryDirectory(prefix="rexmle-probe-") as probe:
        get_sandbox(kind, SandboxSpec(workspace=Path(probe), data=public, image=image),
                    allow_unsandboxed=allow_unsandboxed)
    return kind


def check_model_string(model: str, *, role: str) -> None:
    from rexmle_agents.models.registry import parse_model_string

    if model.startswith(REPLAY_PREFIX):
        cassette = Path(model[len(REPLAY_PREFIX):]).expanduser()
        if not cassette.is_file():
            raise UserInputError(f"model for role {role!r}: cassette {cassette} does not exist",
                                 hint="a run records its calls in <run_dir>/cassette.jsonl; pass that path")
        return
    if model.split("/", 1)[0] == SCRIPTED_PROVIDER:
        return
    parse_model_string(model)


# ---------------------------------------------------------------------------------------------------------------
# the run folder


def run_paths(spec: RunSpec, runs_dir: Path) -> RunPaths:
    return RunPaths(Path(runs_dir) / spec.group / spec.run_id)


def read_spec(run_dir: Path) -> RunSpec:
    """The spec of an existing run folder; a folder written by an incompatible harness is refused."""
    path = RunPaths(Path(run_dir)).spec
    if not path.is_file():
        raise UserInputError(f"{run_dir} is not a run folder (no spec.json)",
                             hint="pass a folder runs/<group>/<run_id>/ made by `rexmle run`")
    try:
        raw = json.loads(path.read_text())
    except ValueError as exc:
        raise UserInputError(f"{path} is not valid JSON: {exc}") from exc
    found = raw.get("format_version") if isinstance(raw, dict) else None
    if found != RUN_FORMAT_VERSION:
        raise UserInputError(
            f"{run_dir} was written by a harness with run format {found!r}; this rexmle-agents reads format "
            f"{RUN_FORMAT_VERSION}",
            hint="resume it with the rexmle version that started it, or start the run afresh in another --runs-dir",
        )
    try:
        return RunSpec.model_validate(raw)
    except ValueError as exc:
        raise UserInputError(f"{path} is not a valid run spec: {exc}") from exc


def read_status(paths: RunPaths) -> dict[str, Any]:
    if not paths.status.is_file():
        return {"state": "pending", "attempts": 0}
    try:
        return json.loads(paths.status.read_text())
    except ValueError:  # a crash between write and rename cannot leave this; an edit can
        return {"state": "pending", "attempts": 0}


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    # text repaired (lone surrogates, nesting) by the run files' encoder; a NaN metric of grade.json stays a float
    tmp.write_text(json.dumps(clean_json(data, keep_nonfinite=True)[0], indent=2) + "\n")
    os.replace(tmp, path)


LOCK_PROBE_GRACE_S = 0.5


def flock_within(handle: Any, wait_s: float, *, pause_s: float) -> bool:
    """Take an exclusive flock on the open file ``handle``, trying every ``pause_s`` for up to ``wait_s``; whether it
    was taken."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause_s)


@contextlib.contextmanager
def run_lock(paths: RunPaths) -> Iterator[None]:
    """One harness per run folder at a time (two executors, or a requeued job beside a live one)."""
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    handle = paths.lock.open("a+")
    # a lock held for a moment is a probe (`rexmle run` and `runs status` take it to see whether the run is live):
    # wait that out; a harness running the run holds it far longer
    if not flock_within(handle, LOCK_PROBE_GRACE_S, pause_s=0.02):
        handle.close()
        raise RunLockedError(f"run {paths.run_dir} is being run by another process",
                             hint="wait for it, or stop it first (see `rexmle runs status`)")
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def slurm_job() -> dict[str, Any] | None:
    """The SLURM job this process runs in, from its environment (None outside SLURM): recorded with every attempt
    (``run_started``/``run_resumed`` and ``status.json``), so a requeued job's attempt says which requeue it is."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID", "")
    restarts = os.environ.get("SLURM_RESTART_COUNT", "")
    return {"job_id": f"{array}_{task}" if array and task.isdigit() else job, "array_job_id": array or None,
            "array_task_id": int(task) if task.isdigit() else None,
            "requeues": int(restarts) if restarts.isdigit() else 0, "node": os.environ.get("SLURMD_NODENAME")}


# ---------------------------------------------------------------------------------------------------------------
# resuming: what earlier attempts left in the journal


@dataclass(frozen=True)
class JournalState:
    attempts: int
    consumed_s: float
    steps_started: int  # the highest step number used (the next step is numbered after it)
    open_steps: tuple[int, ...]
    run_totals: UsageTotals
    steps_finished: int = 0  # steps that finished (what --max-steps counts: an interrupted step does not)


def journal_state(events: Sequence[Mapping[str, Any]], status: Mapping[str, Any]) -> JournalState:
    """Attempts so far, wall-clock used (journal times, or the status heartbeat if later), steps, model usage."""
    attempts = 0
    consumed = 0.0
    attempt_start: float | None = None
    last_time: float | None = None
    started: dict[int, bool] = {}
    finished = 0
    totals = UsageTotals()
    for event in events:
        kind = event["kind"]
        t = event.get("time")
        if isinstance(t, str):  # model_call records carry an ISO time
            t = dt.datetime.fromisoformat(t).timestamp()
        if kind in ("run_started", "run_resumed"):
            if attempt_start is not None and last_time is not None:
                consumed += max(0.0, last_time - attempt_start)
            attempts += 1
            attempt_start = t
        elif kind == "step_started":
            started[event["step"]] = False
        elif kind in ("step_finished", "step_interrupted"):
            started[event["step"]] = True
            finished += kind == "step_finished"
        elif kind == "model_call":
            totals = UsageTotals.model_validate(event["run_totals"])
        last_time = t if t is not None else last_time
    if attempt_start is not None and last_time is not None:
        consumed += max(0.0, last_time - attempt_start)
    consumed = max(consumed, float(status.get("elapsed_s") or 0.0))
    return JournalState(attempts=attempts, consumed_s=consumed, steps_started=max(started, default=0),
                        open_steps=tuple(s for s, done in started.items() if not done), run_totals=totals,
                        steps_finished=finished)


class _RunLedger(UsageLedger):
    """The usage ledger of a run, continuing the totals of its earlier attempts."""

    def restore(self, totals: UsageTotals) -> None:
        with self._lock:
            self._run = totals


# ---------------------------------------------------------------------------------------------------------------
# running


class RunLockedError(UserInputError):
    """The run folder is being run by another process (its lock is held)."""


class DiskFullError(RexmleError):
    """The file system of the run folder is full; the run stops where it is and resumes once space is back."""


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def execute_run(spec: RunSpec, runs_dir: str | Path, *, models: Mapping[str, Model] | None = None,
                gpus: Sequence[str] = (), grade: bool = True, grace_s: float = GRACE_S,
                run_dir: Path | None = None, concurrent_runs: int = 1) -> RunOutcome:
    """Run (or resume, or just report) the run of ``spec`` under ``runs_dir`` (or in ``run_dir`` exactly: a run
    folder given by path, e.g. a copy). ``models`` overrides roles with ready :class:`Model` objects (tests,
    notebooks); ``gpus`` are the device ids the executor assigned; ``concurrent_runs`` how many runs share this
    machine (the default memory and disk limits are shares of it)."""
    paths = RunPaths(Path(run_dir)) if run_dir is not None else run_paths(spec, Path(runs_dir))
    try:
        return _execute_locked(spec, paths, models=models, gpus=gpus, grade=grade, grace_s=grace_s,
                               concurrent_runs=concurrent_runs)
    except OSError as exc:
        if exc.errno not in _DISK_FULL:
            raise
        _remove_partial(paths)
        where = f": {exc.filename}" if exc.filename else ""
        raise DiskFullError(f"the disk holding {paths.run_dir} is full ({exc.strerror}{where})",
                            hint="free some space, then run the same command again: the run resumes where it "
                                 "stopped") from None


def _remove_partial(paths: RunPaths) -> None:
    """What a write cut short by a full disk left half-made (never the journal: its torn line is cut on resume)."""
    leftovers = [paths.final.with_name("final.partial"), paths.run_dir / "candidates"]
    if paths.snapshots.is_dir():
        leftovers += list(paths.snapshots.glob("*.partial"))
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    for tmp in paths.run_dir.glob("*.tmp"):
        tmp.unlink(missing_ok=True)


def _execute_locked(spec: RunSpec, paths: RunPaths, *, models: Mapping[str, Model] | None, gpus: Sequence[str],
                    grade: bool, grace_s: float, concurrent_runs: int) -> RunOutcome:
    with run_lock(paths):
        if paths.spec.is_file():
            existing = read_spec(paths.run_dir)
            if existing.identity() != spec.identity():
                raise UserInputError(f"{paths.run_dir} holds another run's spec", hint="use another --runs-dir")
        else:
            write_json_atomic(paths.spec, spec.model_dump(mode="json"))
        status = read_status(paths)
        if status.get("state") in TERMINAL_STATES:
            entry = _grade_if_needed(spec, paths) if grade else _read_grade(paths)
            return _outcome(spec, paths, status, entry)
        return _Attempt(spec, paths, status, models or {}, tuple(gpus), grace_s, concurrent_runs).run(grade=grade)


class _Attempt:
    def __init__(self, spec: RunSpec, paths: RunPaths, status: dict[str, Any], models: Mapping[str, Model],
                 gpus: tuple[str, ...], grace_s: float, concurrent_runs: int = 1) -> None:
        self.spec = spec
        self.concurrent_runs = concurrent_runs
        self.final_choice: str | None = None  # why final/ holds what it holds (set when the run ends)
        self.paths = paths
        self.status = status
        self.model_overrides = models
        self.gpus = gpus
        self.grace_s = grace_s
        self.journal = Journal(paths.journal)
        self.started_mono = time.monotonic()
        self.slurm = slurm_job()

    def run(self, *, grade: bool) -> RunOutcome:
        from rexmle_tasks.pipeline import task_dirs
        from rexmle_tasks.registry import get_task

        spec, paths = self.spec, self.paths
        self.journal.repair()
        previous = journal_state(list(self.journal.iter_events()), self.status)
        attempt = previous.attempts + 1
        for number in previous.open_steps:  # killed mid-step: that step never finished
            self.journal.append("step_interrupted", step=number, attempt=attempt - 1)
        task = get_task(spec.task_id)
        public = task_dirs(task, spec.data_root).public
        scorer = None
        if spec.selection_cases:
            selection = selection_split(spec, paths)
            public = selection.agent_public
            scorer = SelectionScorer(selection, task.grader, paths.run_dir / "selection")
        info = TaskInfo(task_id=task.id, task_version=task.meta.version, grader_id=task.meta.grader,
                        title=task.meta.title, task_type=task.meta.task_type, dim=task.meta.dim,
                        description=(public / "description.md").read_text(encoding="utf-8"), public_dir=public)
        self._prepare_workspace()
        # settled on the first attempt (journaled with run_started) and kept by every later one
        self.limits = recorded_limits(list(self.journal.iter_events())) or resolve_limits(
            spec, workspace=paths.workspace, concurrent_runs=self.concurrent_runs)
        sandbox = self._sandbox(info)
        memory_gb = None if self.limits.memory_bytes is None else self.limits.memory_bytes / GIB
        hardware = describe(self.gpus, spec.resources.cpus, memory_gb)
        instructions = render_instructions(spec, info, sandbox, hardware)
        # rewritten on every attempt: a fresh file renamed over whatever the agent's code left at that name
        Workspace(paths.workspace, owner=sandbox.owner).write_text(INSTRUCTIONS_FILENAME, instructions)
        ledger = _RunLedger(journal=paths.journal,
                            budget=Budget(max_tokens=spec.limits.max_tokens, max_cost_usd=spec.limits.max_cost_usd))
        ledger.restore(previous.run_totals)
        models = self._models(ledger)
        deadline = self.started_mono + spec.limits.time_limit_s - previous.consumed_s
        ctx = RunContext(spec=spec, paths=paths, task=info, instructions=instructions, sandbox=sandbox,
                         journal=self.journal, ledger=ledger, models=models, deadline=deadline,
                         steps_done=previous.steps_finished, last_step=previous.steps_started, hardware=hardware,
                         selection_scorer=scorer)
        ledger.gate = ctx.check_budget  # a call waiting for budget held by others stops at the deadline or a cancel
        self.journal.append("run_started" if attempt == 1 else "run_resumed", attempt=attempt, pid=os.getpid(),
                            host=socket.gethostname(), consumed_s=round(previous.consumed_s, 3),
                            steps_done=previous.steps_finished, sandbox=sandbox.kind, isolating=sandbox.isolating,
                            limits_mechanism=getattr(sandbox, "limits_mechanism", None), gpus=list(self.gpus),
                            rexmle_versions=spec.rexmle_versions, limits=self.limits.to_event(),
                            sandbox_user=None if sandbox.user is None else sandbox.user.name,
                            **({"slurm": self.slurm} if self.slurm else {}))
        if not sandbox.isolating:
            logger.warning("run %s executes agent code WITHOUT a sandbox (--sandbox none)", spec.run_id)
            self.journal.append("warning", message="agent code ran without a sandbox (--sandbox none)")
        self._write_status("running", "", None, attempt, previous.consumed_s)
        try:
            state, reason, limit = self._supervise(ctx, sandbox, attempt, previous.consumed_s)
            self._finalise(ctx)
        finally:
            sandbox.close()  # the run's identity is released (and scrubbed) with this attempt
        elapsed = previous.consumed_s + (time.monotonic() - self.started_mono)
        usage = ctx.ledger.totals()
        self.journal.append("run_finished", state=state, reason=reason, limit=limit, seconds=round(elapsed, 3),
                            steps=ctx.steps_done, model_calls=usage.calls, cost_usd=usage.cost_usd,
                            model_retry_s=round(usage.retry_time_s, 3))
        status = self._write_status(state, reason, limit, attempt, elapsed, steps=ctx.steps_done, finished=True,
                                    usage=usage)
        entry = _grade_if_needed(self.spec, paths) if grade else None
        return _outcome(spec, paths, status, entry)

    # -- set-up ---------------------------------------------------------------------------------------------
    def _prepare_workspace(self) -> None:
        """The harness's own folders; what is inside the workspace is made by the sandbox (owned by its user)."""
        for folder in (self.paths.workspace, self.paths.logs):
            folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.paths.run_dir / "candidates", ignore_errors=True)  # collected by a killed attempt

    def _sandbox(self, info: TaskInfo) -> Any:
        return make_run_sandbox(self.spec, self.paths, info.public_dir, info.grader_id, self.gpus,
                                limits=self.limits)

    def _models(self, ledger: UsageLedger) -> dict[str, Model]:
        from rexmle_agents.models.registry import get_model

        models: dict[str, Model] = {}
        for role, name in self.spec.models.items():
            override = self.model_overrides.get(role)
            if override is not None:
                if override.ledger is None:
                    override.ledger = ledger
                models[role] = override
            elif name.startswith(REPLAY_PREFIX):
                models[role] = replay_model(Path(name[len(REPLAY_PREFIX):]).expanduser(), ledger)
            elif name.split("/", 1)[0] == SCRIPTED_PROVIDER:
                raise UserInputError(f"model {name!r} (role {role!r}) is a test model: pass its Model object to "
                                     "execute_run(models=...)")
            else:
                models[role] = get_model(name, ledger=ledger, record_to=self.paths.cassette)
        for role, override in self.model_overrides.items():
            if role not in models:
                override.ledger = override.ledger or ledger
                models[role] = override
        return models

    # -- supervision ----------------------------------------------------------------------------------------
    def _supervise(self, ctx: RunContext, sandbox: Any, attempt: int, consumed: float) -> tuple[str, str, str | None]:
        agent = make_agent(self.spec.agent, self.spec.agent_config)
        failure: list[BaseException] = []

        def target() -> None:
            try:
                agent.run(ctx)
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=target, name=f"agent-{self.spec.run_id}", daemon=True)
        restore = self._install_signal_handlers(ctx, sandbox)
        retry_extension = 0.0
        disk = DiskWatch(ctx.fs, self.limits)
        folder = RunFolderWatch(self.paths.run_dir, self.limits.run_folder_bytes)
        try:
            thread.start()
            next_beat = time.monotonic() + HEARTBEAT_S
            while thread.is_alive():
                if self.spec.limits.extend_for_model_retries:
                    extra = ctx.ledger.totals().retry_time_s - retry_extension
                    if extra > 0:
                        ctx.extend_deadline(extra)
                        retry_extension += extra
                now = time.monotonic()
                if now >= ctx.deadline and not ctx.cancelled.is_set():
                    ctx.cancel_reason = f"time limit of {self.spec.limits.time_limit_s:g} s reached"
                    ctx.cancelled.set()
                    ctx.kill_all()
                    self.journal.append("budget_exhausted", limit="time", message=ctx.cancel_reason)
                over = None if ctx.cancelled.is_set() else disk.check(now)
                if over is not None:
                    ctx.cancel_reason = over
                    ctx.cancelled.set()
                    ctx.kill_all()
                    self.journal.append("budget_exhausted", limit="disk", message=over, usage=disk.last)
                grown = None if ctx.cancelled.is_set() else folder.check(now)
                if grown is not None:
                    ctx.cancel_reason = grown
                    ctx.cancelled.set()
                    ctx.kill_all()
                    self.journal.append("budget_exhausted", limit=RunFolderWatch.LIMIT, message=grown,
                                        usage=folder.last)
                if ctx.cancelled.is_set():
                    thread.join(self.grace_s)
                    if thread.is_alive():
                        self.journal.append("warning", message=f"agent did not stop within {self.grace_s:g} s of "
                                            "the cancellation; collecting its submission without it")
                    break
                if now >= next_beat:
                    self._write_status("running", "", None, attempt, consumed + now - self.started_mono,
                                       steps=ctx.steps_done)
                    next_beat = now + HEARTBEAT_S
                thread.join(min(0.05 if now - self.started_mono < 1 else 0.5, max(0.0, ctx.deadline - now)))
        finally:
            restore()
        return self._classify(ctx, failure[0] if failure else None)

    def _classify(self, ctx: RunContext, exc: BaseException | None) -> tuple[str, str, str | None]:
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
            raise exc  # not the agent's failure: the run stops here and resumes once there is space
        if ctx.cancelled.is_set():
            reason = ctx.cancel_reason or "cancelled"
            if reason.startswith(DiskWatch.PREFIX):
                return "finished", reason, "disk"
            if reason.startswith(RunFolderWatch.PREFIX):
                return "finished", reason, RunFolderWatch.LIMIT
            return ("timed_out", reason, "time") if reason.startswith("time limit") else ("cancelled", reason, None)
        if exc is None:
            return "finished", "the agent finished", None
        if isinstance(exc, BudgetExceededError):
            text = exc.message
            limit = ("time" if "time limit" in text else "steps" if "step limit" in text
                     else "tokens" if "token budget" in text else "cost" if "money budget" in text else None)
            self.journal.append("budget_exhausted", limit=limit, message=text)
            return ("timed_out" if limit == "time" else "finished"), text, limit
        detail = "".join(traceback.format_exception(exc))
        # an error may quote agent text UTF-8 cannot encode (lone surrogates): kept as \u escapes, never a crash
        (self.paths.logs / "agent_error.txt").write_text(detail, encoding="utf-8", errors="backslashreplace")
        message = exc.message if isinstance(exc, RexmleError) else f"{type(exc).__name__}: {exc}"
        self.journal.append("agent_error", error=message, traceback=detail[-8000:])
        return "failed", f"the agent raised {failure_summary(message)}", None

    def _install_signal_handlers(self, ctx: RunContext, sandbox: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def stop(signum: int, _frame: Any) -> None:
            ctx.cancel_reason = f"stopped by signal {signal.Signals(signum).name}"
            ctx.cancelled.set()
            ctx.kill_all()

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    # -- the end --------------------------------------------------------------------------------------------
    def _finalise(self, ctx: RunContext) -> None:
        """final/: the chosen snapshot (explicit choice, else the latest valid, else the workspace's submission)."""
        paths = self.paths
        chosen, chosen_by = final_choice(list(self.journal.iter_events()))
        if chosen is None and ctx.fs.kind_of(f"{SUBMISSION_DIRNAME}/{SUBMISSION_CSV}") is not None:
            try:
                chosen = ctx.snapshot_submission("workspace submission at the end of the run")
                chosen_by = "the workspace's submission folder at the end (the agent made no snapshot)"
            except (OSError, RexmleError) as exc:
                self.journal.append("warning", message=f"could not snapshot the workspace submission: {exc}")
        if paths.final.exists():
            shutil.rmtree(paths.final)
        partial = paths.final.with_name("final.partial")
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir()
        self.final_choice = chosen_by
        metadata: dict[str, Any] = {"snapshot": chosen, "run_id": self.spec.run_id, "finished_at": _now(),
                                    "agent_choice": agent_choice(list(self.journal.iter_events())),
                                    "chosen_by": chosen_by}
        if chosen is not None:
            source = paths.snapshots / chosen
            shutil.copytree(source / "submission", partial / "submission", symlinks=True)
            if (source / "solution.py").is_file():
                shutil.copy2(source / "solution.py", partial / "best_solution.py")
            metadata.update(next((e for e in self.journal.iter_events()
                                  if e["kind"] == "snapshot" and e["snapshot"] == chosen), {}))
        write_json_atomic(partial / "metadata.json", metadata)
        partial.rename(paths.final)
        self.journal.append("final_collected", snapshot=chosen)

    def _write_status(self, state: str, reason: str, limit: str | None, attempt: int, elapsed: float, *,
                      steps: int = 0, finished: bool = False, usage: UsageTotals | None = None) -> dict[str, Any]:
        """Write ``status.json`` (the typed record :class:`rexmle_agents.results.records.RunStatus`). The status
        read when the attempt began is updated with every write, so ``started_at`` stays the first attempt's."""
        from rexmle_agents.harness.hardware import measured
        from rexmle_agents.results.records import RunStatus

        now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")  # a fast run still orders them
        res = self.spec.resources
        fields: dict[str, Any] = {
            "format_version": RUN_FORMAT_VERSION, "state": state, "reason": reason, "limit": limit,
            "attempts": attempt, "steps": steps, "elapsed_s": round(elapsed, 3), "run_id": self.spec.run_id,
            "task_id": self.spec.task_id, "agent": self.spec.agent, "seed": self.spec.seed,
            "started_at": self.status.get("started_at") or now, "updated_at": now,
            "finished_at": now if finished else None, "pid": os.getpid(), "host": socket.gethostname(),
            "hardware": measured(self.gpus, res.cpus, res.memory_gb), "slurm": self.slurm,
            "final_choice": self.final_choice if finished else None,
        }
        if usage is not None:  # time lost to model API retries is kept apart from the agent's own time
            fields.update(model_calls=usage.calls, tokens=usage.usage.total_tokens,
                          input_tokens=usage.usage.input_tokens, output_tokens=usage.usage.output_tokens,
                          cost_usd=usage.cost_usd, uncosted_calls=usage.uncosted_calls,
                          unknown_usage_calls=usage.unknown_usage_calls, model_retry_s=round(usage.retry_time_s, 3))
        status = RunStatus.model_validate(fields).model_dump(mode="json")
        write_json_atomic(self.paths.status, status)
        self.status = status
        return status


class DiskWatch:
    """The workspace disk limit, checked by the watchdog: bytes allocated, entries and nesting, measured without
    following links, at intervals that grow with the cost of a scan (at least :attr:`MIN_INTERVAL_S`)."""

    PREFIX = "workspace disk limit"
    MIN_INTERVAL_S = 2.0
    COST_FACTOR = 20  # the watchdog spends at most 1/20 of its time measuring

    def __init__(self, fs: Workspace, limits: EffectiveLimits) -> None:
        self.fs = fs
        self.limits = limits
        self.next_at = 0.0
        self.last: dict[str, Any] = {}

    def check(self, now: float) -> str | None:
        """None while the workspace is within its limits; else why it is not."""
        if now < self.next_at:
            return None
        started = time.monotonic()
        usage = self.fs.usage(max_entries=self.limits.max_files, skip=(DATA_DIRNAME,))
        took = time.monotonic() - started
        self.next_at = now + max(self.MIN_INTERVAL_S, self.COST_FACTOR * took)
        self.last = {"bytes": usage.bytes, "entries": usage.entries, "depth": usage.depth, "scan_s": round(took, 4)}
        limit_gib = self.limits.disk_bytes / GIB
        if usage.bytes > self.limits.disk_bytes:
            return (f"{self.PREFIX} exceeded: the workspace holds {usage.bytes / GIB:.2f} GiB, the limit is "
                    f"{limit_gib:.2f} GiB (--disk-gb)")
        if not usage.complete:
            if usage.entries > self.limits.max_files:
                return (f"{self.PREFIX} exceeded: the workspace holds more than {self.limits.max_files} files "
                        "and folders (--max-files)")
            return f"{self.PREFIX} exceeded: folders in the workspace are nested deeper than {MAX_DEPTH} levels"
        return None


def make_run_sandbox(spec: RunSpec, paths: RunPaths, public_dir: Path, grader_id: str,
                     gpus: Sequence[str] = (), *, limits: EffectiveLimits | None = None) -> Any:
    """The sandbox of a run: the same spec always gives the same mounts, limits, environment and folder. Without
    ``limits``, those the run journaled when it first started (else this machine's defaults)."""
    from rexmle_agents.sandbox import SandboxLimits, SandboxSpec, get_sandbox

    if limits is None:
        limits = recorded_limits(list(Journal(paths.journal).iter_events())) or resolve_limits(
            spec, workspace=paths.run_dir if paths.run_dir.is_dir() else Path("."))
    sandbox_limits = SandboxLimits(memory_bytes=limits.memory_bytes, max_processes=limits.max_processes,
                                   max_file_bytes=limits.max_file_bytes, cpus=limits.cpus, gpus=tuple(gpus))
    env = {"REXMLE_TASK_ID": spec.task_id, "REXMLE_GRADER_ID": grader_id}

    def make(env: dict[str, str]) -> Any:
        return get_sandbox(spec.sandbox, SandboxSpec(workspace=paths.workspace, data=public_dir, limits=sandbox_limits,
                                                     env=env, image=spec.sandbox_image),
                           allow_unsandboxed=spec.allow_unsandboxed)

    # where the workspace appears inside depends on the runtime, and the variables naming it need to know
    workspace = make(env).workspace_path
    sandbox = make({**env, "REXMLE_WORKSPACE": workspace, "REXMLE_PUBLIC_DIR": f"{workspace}/data"})
    paths.workspace.mkdir(parents=True, exist_ok=True)
    if sandbox.drops_privileges:  # other ids may not list the run folder; unsandboxed code must reach its workspace
        paths.run_dir.chmod(0o700 if sandbox.isolating else 0o711)
    sandbox.prepare_workspace()  # submission/, working/, the data view's mount point: real folders, never links
    if not sandbox.isolating and Workspace(paths.workspace).kind_of(DATA_DIRNAME) is None:
        paths.data_view.symlink_to(public_dir, target_is_directory=True)
    return sandbox


SUMMARY_LINES = 4  # of an error's output tail, in a failed run's one-line reason
SUMMARY_CHARS = 600


def failure_summary(message: str) -> str:
    """One line for a failed run's status: the error's first line (what happened) and the last meaningful lines of
    the rest (an output tail ends with the error that mattered), bounded. The full text is in ``agent_error``."""
    lines = [line.strip() for line in message.splitlines()]
    head = lines[0] if lines else ""
    tail = [line for line in lines[1:] if any(c.isalnum() for c in line)][-SUMMARY_LINES:]
    if len(head) > SUMMARY_CHARS // 2 and tail:
        head = head[: SUMMARY_CHARS // 2 - 1] + "…"
    text = " | ".join([head, *tail])
    if len(text) <= SUMMARY_CHARS:
        return text
    if not tail:
        return head[: SUMMARY_CHARS - 1] + "…"
    return head + " | …" + " | ".join(tail)[-(SUMMARY_CHARS - len(head) - 4):]


def choose_final(events: Sequence[Mapping[str, Any]]) -> str | None:
    """The snapshot a run submits (see :func:`final_choice`)."""
    return final_choice(events)[0]


def final_choice(events: Sequence[Mapping[str, Any]]) -> tuple[str | None, str]:
    """(the snapshot a run submits, why). With a held-out selection split: the best of the agent's candidates on
    the selection cases (:func:`best_on_selection`); a snapshot the agent marked as a fallback (``metadata.fallback``)
    is no candidate. Otherwise the agent's last choice, else the latest valid snapshot, else the latest."""
    selected = latest_valid = latest = None
    candidates: list[tuple[int, str, Mapping[str, Any]]] = []
    for number, event in enumerate(events):
        if event["kind"] == "final_selected":
            selected = event["snapshot"]
        elif event["kind"] == "snapshot":
            latest = event["snapshot"]
            if event.get("valid"):
                latest_valid = event["snapshot"]
            selection = event.get("selection") or {}
            fallback = (event.get("metadata") or {}).get("fallback")
            graded = selection.get("score") is not None or bool(selection.get("metrics"))
            if event.get("valid") and not fallback and graded and selection.get("status", "valid") == "valid":
                candidates.append((number, event["snapshot"], selection))
    if candidates:
        return best_on_selection(candidates), ("the best of the agent's candidates on the held-out selection cases "
                                               "(the task's ranked metrics; see choose_final)")
    if selected is not None:
        return selected, "the agent's choice"
    if latest_valid is not None:
        return latest_valid, "the latest valid snapshot (the agent chose none)"
    return latest, ("the latest snapshot, not valid (the agent chose none)" if latest else "no snapshot")


def best_on_selection(candidates: Sequence[tuple[int, str, Mapping[str, Any]]]) -> str:
    """The candidate (journal position, snapshot, selection grade) that is best on the selection cases.

    By the task's ranked metrics in their grader's directions (``selection.ranked``): each candidate's position
    among the candidates on each metric (1 + the number strictly better; an undefined value is worst), averaged over
    the metrics, lowest first; one ranked metric is simply compared. Ties go to the better position on the task's
    leaderboard (``selection.score``, the mean position against the human rows), then to the latest snapshot.
    Grades recorded before the directions were (no ``ranked``) are compared by leaderboard position alone."""
    def value(selection: Mapping[str, Any], metric: str) -> float | None:
        number = (selection.get("metrics") or {}).get(metric)
        return None if number is None or number != number else float(number)

    def better(a: float | None, b: float | None, direction: str) -> bool:
        if a is None:
            return False
        return b is None or (a < b if direction == "lower_better" else a > b)

    ranked = next((c[2]["ranked"] for c in reversed(candidates) if c[2].get("ranked")), {})
    keys = []
    for number, snapshot, selection in candidates:
        mean_rank = 0.0
        if ranked:
            mean_rank = sum(1 + sum(better(value(other, m), value(selection, m), d) for _, _, other in candidates)
                            for m, d in ranked.items()) / len(ranked)
        position = selection.get("score")
        keys.append((mean_rank, float("inf") if position is None else float(position), -number, snapshot))
    return min(keys)[3]


def agent_choice(events: Sequence[Mapping[str, Any]]) -> str | None:
    """The snapshot the agent itself selected last (recorded beside a selection-split choice)."""
    return next((e["snapshot"] for e in reversed(events) if e["kind"] == "final_selected"), None)


# ---------------------------------------------------------------------------------------------------------------
# the held-out selection split (--selection-cases)


def selection_split(spec: RunSpec, paths: RunPaths) -> Any:
    """The run's selection split, drawn with its own secret: made on the first attempt and kept in the run folder
    (never mounted into the sandbox), so a resumed attempt and the grading find the same split."""
    from rexmle_tasks.pipeline import read_secret, write_secret
    from rexmle_tasks.selection import SELECTION_SECRET_FILE, new_secret, prepare_selection

    where = paths.run_dir / SELECTION_SECRET_FILE
    secret = read_secret(where)
    if secret is None:
        secret = new_secret()
        write_secret(where, secret)
    return prepare_selection(spec.task_id, spec.selection_cases, Path(spec.data_root), secret=secret)


class SelectionScorer:
    """Grades a candidate submission on the held-out selection cases with the task's own grader (outside the
    sandbox); the agent never sees these numbers unless its policy reads the journal."""

    def __init__(self, selection: Any, grader: Any, scratch: Path) -> None:
        self.selection = selection
        self.id_column = grader.schema.id_column
        self.scratch = scratch
        # what choose_final compares candidates by: the ranked metrics and their directions, from the grader
        self.ranked = {m.name: m.direction.value for m in grader.ranked_metrics}

    def __call__(self, submission_dir: Path) -> dict[str, Any]:
        from rexmle_grade.evaluate import evaluate_submission
        from rexmle_tasks.selection import restrict_submission

        dest = self.scratch / submission_dir.parent.name
        if dest.exists():
            shutil.rmtree(dest)
        restrict_submission(submission_dir, self.selection.selection_ids, dest, id_column=self.id_column)
        entry = evaluate_submission(self.selection.selection, dest)
        shutil.rmtree(dest, ignore_errors=True)
        return {"k": len(self.selection.selection_ids), "status": entry.status, "score": entry.score,
                "percentile": entry.percentile, "metrics": entry.metrics, "ranked": dict(self.ranked)}


def replay_model(cassette: Path, ledger: UsageLedger) -> Model:
    """A model that replays a cassette (its model name read from the cassette itself)."""
    from rexmle_agents.models.replay import ReplayBackend

    name = None
    with cassette.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                name = json.loads(line)["request"]["model"]
                break
    if name is None:
        raise UserInputError(f"cassette {cassette} is empty",
                             hint="record a run first; its calls are in cassette.jsonl")
    return Model(ReplayBackend(cassette, name), ledger=ledger)


# ---------------------------------------------------------------------------------------------------------------
# grading, outside any sandbox


def _read_grade(paths: RunPaths) -> ReportEntry | None:
    return ReportEntry.model_validate_json(paths.grade.read_text()) if paths.grade.is_file() else None


def _grade_if_needed(spec: RunSpec, paths: RunPaths) -> ReportEntry:
    entry = _read_grade(paths)
    if entry is not None:
        return entry
    entry = grade_run(spec, paths)
    write_json_atomic(paths.grade, entry.model_dump(mode="json"))
    Journal(paths.journal).append("graded", status=entry.status, percentile=entry.percentile, metrics=entry.metrics)
    return entry


def grade_run(spec: RunSpec, paths: RunPaths) -> ReportEntry:
    from rexmle_grade.evaluate import evaluate_submission
    from rexmle_grade.targets import resolve_target

    labels = {"agent": spec.agent, "seed": str(spec.seed), "run_id": spec.run_id, "group": spec.group,
              "data_variant": spec.data_variant}
    submission = paths.final_submission
    if spec.selection_cases:  # the task's grade: the real test cases only, on the task's own leaderboard
        from rexmle_grade.grader import get_grader
        from rexmle_tasks.selection import restrict_submission

        selection = selection_split(spec, paths)
        target = selection.test
        submission = paths.run_dir / "final_test_view"
        if submission.exists():
            shutil.rmtree(submission)
        if paths.final_submission.is_dir():
            restrict_submission(paths.final_submission, selection.test_ids, submission,
                                id_column=get_grader(target.grader_id).schema.id_column)
        labels["selection_cases"] = str(spec.selection_cases)
    else:
        target = resolve_target(spec.task_id, spec.data_root)
    if spec.models:
        labels["models"] = ",".join(f"{r}={m}" for r, m in sorted(spec.models.items()))
    if spec.sandbox == "none":
        labels["sandbox"] = "NONE (unsandboxed)"
    return evaluate_submission(target, submission, labels=labels)


def _outcome(spec: RunSpec, paths: RunPaths, status: Mapping[str, Any], entry: ReportEntry | None) -> RunOutcome:
    return RunOutcome(run_id=spec.run_id, run_dir=paths.run_dir, state=status.get("state", "pending"),
                      reason=status.get("reason", ""), limit=status.get("limit"), steps=int(status.get("steps", 0)),
                      seconds=float(status.get("elapsed_s", 0.0)), grade=entry)
