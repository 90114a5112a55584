"""The one interface every sandbox runtime implements, and what it returns.

Agent-written code never runs in the harness process: the harness hands an argv to :meth:`Sandbox.run`, which
starts it inside the runtime (bubblewrap, Apptainer, Docker, or — only when explicitly allowed — no isolation),
enforces the wall-clock timeout and the resource limits, keeps the output in log files and returns an
:class:`ExecResult`. Inside an isolating sandbox the run's workspace is at :data:`WORKSPACE` (read-write), the task's
public data at ``WORKSPACE/data`` (read-only), the Python environment and system folders read-only, and nothing else:
no ``private/``, no leaderboard, no API key, no network.

A harness running as root gives each sandbox's commands an unprivileged identity of its own (:mod:`.identity`),
leased when first needed and released by :meth:`Sandbox.close` (or when the harness ends): the run's variants
(:meth:`Sandbox.sibling`) share it. After every command the workspace is swept of set-user-id and set-group-id
bits (nothing the agent leaves there grants its identity to whoever reaches the file), and a released workspace
is given back to the harness (its root folder root's, mode 0700) until the next lease.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import ClassVar

from rexmle_agents.sandbox import _process
from rexmle_agents.sandbox.identity import ACCOUNT_ENV_NAME, IdentityLease, SandboxUser, lease_identity
from rexmle_grade.errors import SandboxError

log = logging.getLogger(__name__)

WORKSPACE = "/workspace"
DATA_DIRNAME = "data"
SUBMISSION_DIRNAME = "submission"
WORKING_DIRNAME = "working"
HOME_DIRNAME = ".home"  # HOME of commands inside: caches and configs persist across steps, within the workspace

# Why a command stopped when it did not simply exit (ExecResult.stopped_by).
STOPPED_TIMEOUT = "timeout"
STOPPED_MEMORY = "memory"
STOPPED_PROCESSES = "processes"
STOPPED_FILE_SIZE = "file_size"
STOPPED_CANCELLED = "cancelled"


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of every command run in one sandbox; ``None`` means no limit of that kind."""

    memory_bytes: int | None = None
    max_processes: int | None = 512
    max_file_bytes: int | None = None
    cpus: int | None = None
    gpus: tuple[str, ...] = ()  # device ids, exported as CUDA_VISIBLE_DEVICES (and passed through by the runtime)


@dataclass(frozen=True)
class ExtraBind:
    """A further host path the harness makes visible inside (e.g. the folder of a model relay's Unix socket, or an
    external agent's own virtual environment), read-only unless ``writable``. It is checked like every mount: one
    that would expose a task's private data is refused."""

    host: Path
    inside: str  # absolute path inside the sandbox (for ``none``: the host path itself is used)
    writable: bool = False


@dataclass(frozen=True)
class SandboxSpec:
    """Everything that defines one run's sandbox; the same spec gives the same sandbox (``rexmle sandbox exec``)."""

    workspace: Path  # host folder mounted read-write at WORKSPACE
    data: Path  # host folder (the task's public/) mounted read-only at WORKSPACE/data
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    env: Mapping[str, str] = field(default_factory=dict)  # extra variables; never secrets
    workdir: str = WORKING_DIRNAME  # relative to the workspace: where commands start
    network: bool = False
    image: str | None = None  # apptainer / docker image
    binds: tuple[ExtraBind, ...] = ()


@dataclass(frozen=True)
class ExecResult:
    """What one command in the sandbox did."""

    argv: tuple[str, ...]
    exit_code: int | None  # None when the sandbox killed it (see stopped_by)
    stopped_by: str | None  # None, or one of the STOPPED_* reasons, or "signal:N"
    stdout_tail: str
    stderr_tail: str
    wall_s: float
    cpu_s: float
    stdout_path: Path | None = None
    stderr_path: Path | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.stopped_by is None


class Sandbox(ABC):
    """One run's sandbox. Subclasses build the host command line; :meth:`run` is shared.

    ``limits_mechanism`` says how the limits are enforced here (cgroup v1/v2, rlimits, the container engine)."""

    kind: ClassVar[str]
    isolating: ClassVar[bool] = True
    # Runtimes that report a command killed by signal N as exit status 128+N (bwrap, apptainer, docker).
    signals_as_exit_codes: ClassVar[bool] = True
    # False where the runtime enforces memory/process limits itself (the Docker engine).
    host_limits: ClassVar[bool] = True

    def __init__(self, spec: SandboxSpec, *, identity: IdentityLease | None = None) -> None:
        """``identity``: the lease of the run this sandbox belongs to (a variant of its sandbox); by default a
        harness running as root leases one for this sandbox when a command first needs it."""
        self.spec = spec
        _check_spec(spec)
        # False: the harness is not root and commands run as its own user; else as the run's unprivileged identity
        self.drops_privileges = os.geteuid() == 0
        self._lease = identity
        self._owns_lease = identity is None
        self._closed = False
        self._lease_lock = threading.Lock()
        self._owned_leases: list[IdentityLease] = []
        # a sandbox dropped without close() still frees its id when collected (the next lease scrubs it)
        weakref.finalize(self, _abandon, self._owned_leases)
        limits = spec.limits
        self._plan = _process.plan_limits(
            memory_bytes=limits.memory_bytes if self.host_limits else None,
            max_processes=limits.max_processes if self.host_limits else None,
            max_file_bytes=limits.max_file_bytes, cpus=limits.cpus if self.host_limits else None,
            gpus=bool(limits.gpus))
        self.limits_mechanism = self._plan.mechanism if self.host_limits else self._engine_mechanism()
        self._active: set[_process.Running] = set()
        self._active_lock = threading.Lock()
        log.info("sandbox %s: limits enforced by %s", self.kind, self.limits_mechanism)

    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """None when this runtime works on this machine; else what is missing and how to install or avoid it."""

    @property
    def lease(self) -> IdentityLease | None:
        """The run's hold on its identity (leased on first use); None when the harness is not root."""
        if not self.drops_privileges:
            return None
        with self._lease_lock:
            if self._closed:
                raise SandboxError("this sandbox is closed (its run ended) and its identity released",
                                   hint="make a new sandbox for the run")
            if self._lease is None:
                self._lease = lease_identity()
                if self._lease is not None:
                    self._owned_leases.append(self._lease)
            return self._lease

    @property
    def user(self) -> SandboxUser | None:
        """The unprivileged identity commands run as (None: the harness's own user, which is not root)."""
        lease = self.lease
        return None if lease is None else lease.user

    @property
    def owner(self) -> tuple[int, int] | None:
        """(uid, gid) that folders made for the agent must belong to (None: the harness's own user)."""
        user = self.user
        return None if user is None else user.owner

    def account_env(self) -> dict[str, str]:
        """USER and LOGNAME for commands run under a leased id, which has no password entry to name it."""
        return {"USER": ACCOUNT_ENV_NAME, "LOGNAME": ACCOUNT_ENV_NAME} if self.drops_privileges else {}

    def sibling(self, spec: SandboxSpec) -> Sandbox:
        """A sandbox of the same runtime for another spec of the same run (further binds, another start folder),
        running as the same identity; closing it leaves the identity to this one."""
        return type(self)(spec, identity=self.lease)

    def close(self) -> None:
        """The run is over: kill what still runs, give the workspace back to the harness and release the identity
        (scrubbed for its next holder). Idempotent; a closed sandbox runs nothing more."""
        from rexmle_agents.safe_workspace import Workspace, WorkspaceRefused

        with self._lease_lock:
            if self._closed:
                return
            self._closed = True
            lease = self._lease if self._owns_lease else None
        self.kill_all()
        if lease is None or lease.user.shared:
            return
        try:
            with contextlib.suppress(WorkspaceRefused):  # a workspace already deleted has nothing to give back
                Workspace(self.spec.workspace, owner=(0, 0)).own_root()
        finally:
            lease.release()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def workspace_path(self) -> str:
        """The workspace as commands inside see it."""
        return WORKSPACE

    @abstractmethod
    def command(self, argv: Sequence[str]) -> list[str]:
        """The host command line that runs ``argv`` inside this sandbox."""

    def _engine_mechanism(self) -> str:
        return f"{self.kind} engine"

    def _launch(self, argv: Sequence[str]) -> _process.Launch:
        """How to start ``argv`` on the host; runtimes that need a host environment or folder override this."""
        return _process.Launch(argv=tuple(self.command(argv)), env={"PATH": "/usr/local/bin:/usr/bin:/bin",
                                                                     "LANG": "C.UTF-8"})

    def run(self, argv: Sequence[str], *, timeout_s: float | None = None, log_dir: Path | None = None,
            log_name: str = "exec", cancel: threading.Event | None = None) -> ExecResult:
        """Run ``argv`` inside, wait at most ``timeout_s`` (then kill its whole process tree), keep stdout/stderr in
        ``log_dir/<log_name>.stdout|stderr`` (tails in the result); ``cancel`` set from another thread stops it."""
        if not argv:
            raise SandboxError("no command given to run in the sandbox", hint="pass the program and its arguments")
        self.prepare_workspace()
        logs = Path(tempfile.mkdtemp(prefix="rexmle-exec-")) if log_dir is None else log_dir
        logs.mkdir(parents=True, exist_ok=True)
        stdout_path, stderr_path = logs / f"{log_name}.stdout", logs / f"{log_name}.stderr"
        try:
            outcome = _process.run_host(self._launch(argv), self._plan, stdout_path=stdout_path,
                                        stderr_path=stderr_path, timeout_s=timeout_s, cancel=cancel,
                                        register=self._register_factory())
        finally:
            self.sweep_workspace()
        stdout_tail, stderr_tail = _process.tail(stdout_path), _process.tail(stderr_path)
        exit_code, stopped_by = self._classify(outcome, stderr_tail)
        return ExecResult(argv=tuple(argv), exit_code=exit_code, stopped_by=stopped_by, stdout_tail=stdout_tail,
                          stderr_tail=stderr_tail, wall_s=outcome.wall_s, cpu_s=outcome.cpu_s,
                          stdout_path=stdout_path, stderr_path=stderr_path)

    def interrupt_all(self, signum: int = signal.SIGTERM) -> int:
        """Ask every command this sandbox runs to stop (``signum`` to the command itself, which may handle it:
        the model relay's forwarder passes it to the agent, then runs the agent's own export steps); returns how
        many were signalled. The watchdog's :meth:`kill_all` still ends them at the limit."""
        with self._active_lock:
            running = list(self._active)
        return sum(item.interrupt(signum) for item in running)

    def kill_all(self) -> None:
        """Kill every process this sandbox has started and that still runs (the watchdog calls it)."""
        with self._active_lock:
            running = list(self._active)
        for item in running:
            item.stop(_process.KILL_CANCEL)

    def prepare_workspace(self) -> None:
        """The folders commands need, as real folders (a link planted at one of their names is replaced, never
        followed) that the sandbox's user owns; and the data view's mount point, a real folder the harness owns.
        A workspace that belonged to another identity (an earlier attempt's, given back when it ended) is handed
        over whole to this one."""
        from rexmle_agents.safe_workspace import Workspace

        workspace = Workspace(self.spec.workspace, owner=self.owner)
        if workspace.own_root():
            workspace.sweep(reown=True, skip=(DATA_DIRNAME,))
        for sub in (SUBMISSION_DIRNAME, self.spec.workdir, HOME_DIRNAME):
            workspace.ensure_dir(sub)
        if self.isolating:
            Workspace(self.spec.workspace).ensure_dir(DATA_DIRNAME, own=False)

    def sweep_workspace(self) -> None:
        """Clear every set-user-id and set-group-id bit agent code left in the workspace (links never followed,
        the walk bounded); a tree too large or deep to finish is logged (the watchdog stops such runs)."""
        from rexmle_agents.safe_workspace import Workspace

        swept = Workspace(self.spec.workspace).sweep(skip=(DATA_DIRNAME,))
        if not swept.complete:
            log.warning("the set-id sweep of %s stopped after %d entries (depth %d); what lies beyond keeps its "
                        "modes", self.spec.workspace, swept.entries, swept.depth)

    def _register_factory(self) -> Callable[[_process.Running | None], None]:
        """The callback through which one command enters (its Running) and leaves (None) the set kill_all sees."""
        mine: list[_process.Running] = []

        def register(item: _process.Running | None) -> None:
            with self._active_lock:
                if item is not None:
                    mine.append(item)
                    self._active.add(item)
                else:
                    self._active.difference_update(mine)

        return register

    def _classify(self, outcome: _process.Outcome, stderr_tail: str) -> tuple[int | None, str | None]:
        """(exit_code, stopped_by) from what the host saw: our own kills first, then the limits' traces."""
        code = outcome.returncode
        sig: int | None = -code if code < 0 else None
        if sig is None and self.signals_as_exit_codes and 128 < code <= 128 + 64:
            sig = code - 128
        killed = {_process.KILL_TIMEOUT: STOPPED_TIMEOUT, _process.KILL_CANCEL: STOPPED_CANCELLED,
                  _process.KILL_PROCESSES: STOPPED_PROCESSES}
        if outcome.killed_for is not None:
            return None, killed[outcome.killed_for]
        if code == 0:
            return 0, None
        exit_code = None if sig is not None else code
        limits = self.spec.limits
        if outcome.oom_kills or (limits.memory_bytes is not None and self._plan.memory_by_rlimit
                                 and "MemoryError" in stderr_tail):
            return exit_code, STOPPED_MEMORY
        if outcome.process_limit_hits or (self._plan.processes_by_rlimit
                                          and "Resource temporarily unavailable" in stderr_tail):
            return exit_code, STOPPED_PROCESSES
        if limits.max_file_bytes is not None and (sig == signal.SIGXFSZ or "File too large" in stderr_tail):
            return exit_code, STOPPED_FILE_SIZE
        if sig is not None:
            return None, f"signal:{sig}"
        return code, None


def _abandon(leases: list[IdentityLease]) -> None:
    for lease in leases:
        lease.abandon()


def _check_spec(spec: SandboxSpec) -> None:
    for what, path in (("workspace", spec.workspace), ("data", spec.data)):
        if not Path(path).is_dir():
            raise SandboxError(f"the sandbox's {what} folder {path} does not exist",
                               hint="create the run folder first (the harness does) or pass an existing folder")
    for bind in spec.binds:
        if not Path(bind.host).exists():
            raise SandboxError(f"the extra bind {bind.host} does not exist", hint="create it before the sandbox")
        inside = PurePosixPath(bind.inside)
        if not inside.is_absolute() or ".." in inside.parts or inside == PurePosixPath(WORKSPACE) \
                or PurePosixPath(WORKSPACE) in inside.parents or inside.parts[1:2] in (("proc",), ("dev",)):
            raise SandboxError(f"the extra bind's place inside, {bind.inside!r}, must be an absolute path outside "
                               f"{WORKSPACE}, /proc and /dev", hint="e.g. /run/rexmle/relay")
    workdir = PurePosixPath(spec.workdir)
    if workdir.is_absolute() or ".." in workdir.parts:
        raise SandboxError(f"workdir must be a folder inside the workspace, got {spec.workdir!r}",
                           hint=f"use a relative path such as {WORKING_DIRNAME!r}")
