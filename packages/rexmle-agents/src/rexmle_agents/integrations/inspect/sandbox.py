"""The ``rexmle`` sandbox of Inspect: each sample gets the workspace a ``rexmle run`` gets.

:meth:`RexmleSandboxEnvironment.sample_init` makes a run folder for the sample (under ``work_dir``, by default
``$TMPDIR/rexmle-inspect``) and its sandbox through the harness's own :func:`make_run_sandbox`: bubblewrap, the
task's public data read-only at ``/workspace/data``, no network, no key, only the sample's GPUs, the memory,
process and file-size limits, agent code as an unprivileged identity of its own when the harness is root.

- ``exec`` runs the command through :meth:`Sandbox.run` (a thread, so Inspect's event loop goes on), in ``cwd``
  with ``env`` added by a fixed wrapper (``/bin/sh`` and ``/usr/bin/env`` by absolute path), standard input from
  a file the harness wrote into the workspace; a command past its timeout raises ``TimeoutError``; once the
  workspace is over its disk limit (``-T disk_gb``, else the machine's share, measured as the run watchdog does)
  every later command is refused (a ``ToolError`` the model sees) and the submission is scored as it is;
- ``read_file`` reads through :mod:`rexmle_agents.safe_workspace` on the harness side (never following a link
  the agent planted); ``/workspace/data`` is read from the task's public folder;
- ``write_file`` is done by the agent's own identity inside the sandbox (the file is the agent's, as if its code
  had written it), fed from a harness-written file; ``/workspace/data`` and everything outside ``/workspace``
  are refused.

Inspect's ``user`` argument is refused: commands run as the sample's own identity, never as another.
"""

from __future__ import annotations

import collections
import functools
import os
import posixpath
import re
import shlex
import stat
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal, Union, overload

import anyio
from inspect_ai.tool import ToolError
from inspect_ai.util import ExecResult, OutputLimitExceededError, SandboxEnvironment, sandboxenv
from inspect_ai.util._sandbox.environment import SandboxEnvironmentConfigType, SandboxUserUnsupportedError
from inspect_ai.util._sandbox.limits import SandboxEnvironmentLimits
from pydantic import BaseModel, ConfigDict

from rexmle_agents.harness.limits import EffectiveLimits
from rexmle_agents.harness.paths import INSTRUCTIONS_FILENAME, RunPaths
from rexmle_agents.harness.spec import RunSpec
from rexmle_agents.safe_workspace import Workspace
from rexmle_agents.sandbox.base import (
    DATA_DIRNAME,
    HOME_DIRNAME,
    STOPPED_TIMEOUT,
    WORKSPACE,
)
from rexmle_grade.errors import SandboxError, UserInputError

SANDBOX_NAME = "rexmle"
DEFAULT_WORK_DIR = "rexmle-inspect"  # under the system's temporary folder
# cd to $1, take standard input from $2 (none: /dev/null), then run the rest through env (assignments, then argv)
_WRAPPER = ('cd -- "$1" || exit 126; shift; in=$1; shift; '
            'if [ -n "$in" ]; then exec /usr/bin/env "$@" < "$in"; fi; exec /usr/bin/env "$@" < /dev/null')
_WRITER = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_STDIN_PREFIX = ".rexmle-inspect-stdin-"


class RexmleSandboxConfig(BaseModel):
    """The sandbox of one sample: its run spec (JSON text: Inspect hashes configurations), where its run folder
    goes, whether it is kept."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: str
    work_dir: str | None = None
    keep: bool = False  # keep the sample's run folder (workspace, exec logs) after the sample


class _GpuPool:
    """The machine's GPUs, each given to one sample at a time (as the local executor gives them to runs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: collections.deque[str] | None = None

    def take(self, count: int) -> tuple[str, ...]:
        if count == 0:
            return ()
        from rexmle_agents.harness.hardware import gpu_ids

        with self._lock:
            if self._free is None:
                self._free = collections.deque(gpu_ids())
            if count > len(self._free):
                raise SandboxError(f"the sample needs {count} GPU(s) (-T gpus={count}), but {len(self._free)} "
                                   "are free on this machine",
                                   hint="lower -T gpus, or run fewer samples at once (--max-samples / "
                                        "--max-sandboxes)")
            return tuple(self._free.popleft() for _ in range(count))

    def give_back(self, gpus: tuple[str, ...]) -> None:
        if gpus:
            with self._lock:
                if self._free is None:
                    self._free = collections.deque()
                self._free.extend(gpus)


GPU_POOL = _GpuPool()


@sandboxenv(name=SANDBOX_NAME)
class RexmleSandboxEnvironment(SandboxEnvironment):
    """One sample's rexmle workspace and sandbox (see the module's docstring)."""

    def __init__(self, spec: RunSpec, paths: RunPaths, sandbox: Any, gpus: tuple[str, ...], public_dir: Path,
                 keep: bool, limits: EffectiveLimits) -> None:
        from rexmle_agents.harness.runner import DiskWatch

        super().__init__()
        self.spec = spec
        self.paths = paths
        self.sandbox = sandbox
        self.gpus = gpus
        self.public_dir = public_dir
        self.keep = keep
        self._execs = 0
        self._execs_lock = threading.Lock()
        self.limits = limits
        self._disk = DiskWatch(Workspace(paths.workspace), limits)  # the workspace disk limit, as runs have it
        self.over_limit: str | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return RexmleSandboxConfig(**config)

    @classmethod
    def default_concurrency(cls) -> int | None:
        """Samples at once unless ``--max-sandboxes`` says otherwise: one per GPU of this machine (at least one),
        as ``rexmle run`` runs one run per GPU; each sample's default memory and disk limits are for a run alone."""
        from rexmle_agents.harness.hardware import gpu_ids

        return max(1, len(gpu_ids()))

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        from rexmle_agents.sandbox import default_sandbox_kind

        default_sandbox_kind()  # bubblewrap works here, or the error says how to install it

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        if not isinstance(config, RexmleSandboxConfig):
            raise UserInputError(f"the rexmle sandbox needs its configuration (the sample's run spec), got "
                                 f"{type(config).__name__}",
                                 hint="use the rexmle tasks (inspect eval rexmle/<task>), which configure it")
        return {"default": await anyio.to_thread.run_sync(functools.partial(_make_environment, config))}

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment], interrupted: bool) -> None:
        for environment in environments.values():
            if isinstance(environment, RexmleSandboxEnvironment):
                await anyio.to_thread.run_sync(environment.close)

    def close(self) -> None:
        """Stop what still runs, release the identity and the GPUs; the run folder goes unless kept."""
        try:
            self.sandbox.close()
        finally:
            GPU_POOL.give_back(self.gpus)
        if not self.keep:
            Workspace(self.paths.run_dir).remove(self.paths.workspace.name)  # agent-made: never followed
            Workspace(self.paths.run_dir.parent).remove(self.paths.run_dir.name)

    # -- commands --------------------------------------------------------------------------------------------
    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        # timeout_retry is not honoured: a command that ran out of time (a training run) is not started again
        if user is not None:
            raise SandboxUserUnsupportedError(f"the rexmle sandbox runs commands as the sample's own identity, "
                                              f"not as {user!r}")
        if not cmd:
            raise ValueError("exec needs a command")
        if self.over_limit is not None:  # as a run ends at its disk limit: what the workspace holds is graded
            raise ToolError(f"{self.over_limit}: the sandbox runs no further command; the submission in "
                            f"{WORKSPACE}/submission is graded as it is")
        assignments = []
        for name, value in (env or {}).items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"environment variable name {name!r} is not a shell name")
            assignments.append(f"{name}={value}")
        number = self._next_exec()
        stdin_rel = None
        if input is not None:
            stdin_rel = f"{HOME_DIRNAME}/{_STDIN_PREFIX}{uuid.uuid4().hex}"
            data = input.encode("utf-8") if isinstance(input, str) else bytes(input)
            Workspace(self.paths.workspace).write_bytes(stdin_rel, data)
        argv = ["/bin/sh", "-c", _WRAPPER, "rexmle-exec", self._inside_dir(cwd),
                f"{WORKSPACE}/{stdin_rel}" if stdin_rel else "", "--", *assignments, *cmd]
        limit = self.spec.limits.exec_timeout_s
        timeout_s = limit if timeout is None else min(float(timeout), limit)
        cancel = threading.Event()
        run = functools.partial(self.sandbox.run, argv, timeout_s=timeout_s, log_dir=self.paths.logs / "inspect",
                                log_name=f"exec-{number:05d}", cancel=cancel)
        try:
            result = await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            cancel.set()  # the sample was cancelled: its command is killed, not left running
            raise
        finally:
            if stdin_rel is not None:
                Workspace(self.paths.workspace).remove(stdin_rel)
        stdout, stderr = _take(result.stdout_path), _take(result.stderr_path)
        over = await anyio.to_thread.run_sync(self._disk.check, time.monotonic())
        if over is not None:
            self.over_limit = over
            stderr += f"\n[rexmle sandbox: {over}; the sandbox runs no further command]\n"
        if result.stopped_by == STOPPED_TIMEOUT:
            raise TimeoutError(f"the command ran past its timeout of {timeout_s:g} s and was killed")
        if result.stopped_by is not None:
            stderr += f"\n[rexmle sandbox: the command was stopped ({result.stopped_by})]\n"
        code = result.exit_code
        if code is None:  # killed by a signal or a limit: the shell's convention
            code = 128 + int(result.stopped_by.split(":")[1]) if (result.stopped_by or "").startswith("signal:") \
                else 137
        return ExecResult(success=result.ok, returncode=code, stdout=stdout, stderr=stderr)

    def _next_exec(self) -> int:
        with self._execs_lock:
            self._execs += 1
            return self._execs

    def _inside_dir(self, cwd: str | None) -> str:
        """A path as commands inside see it: relative ones start at the sandbox's start folder (``working/``)."""
        start = f"{WORKSPACE}/{self.sandbox.spec.workdir}"
        if cwd is None:
            return start
        return posixpath.normpath(cwd if cwd.startswith("/") else posixpath.join(start, cwd))

    # -- files -----------------------------------------------------------------------------------------------
    def _locate(self, file: str) -> tuple[Workspace, str, str]:
        """(the folder the harness reads through, the path below it, the path inside) of a sandbox path."""
        inside = self._inside_dir(file)
        if inside == WORKSPACE or not inside.startswith(WORKSPACE + "/"):
            raise PermissionError(f"{file!r} is outside {WORKSPACE}: the rexmle sandbox's files are the "
                                  f"workspace's (the rest of its file system is the host's, read-only)")
        rel = inside[len(WORKSPACE) + 1:]
        if rel == DATA_DIRNAME or rel.startswith(DATA_DIRNAME + "/"):
            below = rel[len(DATA_DIRNAME) + 1:]
            if not below:
                raise IsADirectoryError(f"{inside} is a folder")
            return Workspace(self.public_dir), below, inside
        return Workspace(self.paths.workspace), rel, inside

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str | bytes]:
        data = await anyio.to_thread.run_sync(self._read_bytes, file)
        return data.decode("utf-8") if text else data

    def _read_bytes(self, file: str) -> bytes:
        folder, rel, inside = self._locate(file)
        info = folder.stat(rel)
        if info is None:
            raise FileNotFoundError(f"{inside} does not exist (or a folder on its way is a link)")
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(f"{inside} is a folder")
        if not stat.S_ISREG(info.st_mode):
            raise PermissionError(f"{inside} is not a regular file (the harness never follows links or reads "
                                  "special files)")
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        if info.st_size > limit:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        data = folder.read_bytes(rel, max_bytes=limit)
        if data is None:
            raise FileNotFoundError(f"{inside} changed while it was read (it is no longer a regular file)")
        return data

    async def write_file(self, file: str, contents: str | bytes) -> None:
        inside = self._locate(file)[2]
        if self._is_data(inside):
            raise PermissionError(f"{inside} is in the task's public data, which is read-only")
        done = await self.exec(["/bin/sh", "-c", _WRITER, "rexmle-write", inside], input=contents)
        if not done.success:
            message = f"writing {inside} failed: {done.stderr.strip()}"
            if "Is a directory" in done.stderr:
                raise IsADirectoryError(message)
            raise PermissionError(message)

    @staticmethod
    def _is_data(inside: str) -> bool:
        data = f"{WORKSPACE}/{DATA_DIRNAME}"
        return inside == data or inside.startswith(data + "/")


def _take(path: Path | None) -> str:
    """A command's output as Inspect gets it: the last MAX_EXEC_OUTPUT_SIZE bytes of its log (whose middle the
    sandbox already cut when it was huge), then the log is gone."""
    if path is None or not path.is_file():
        return ""
    limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - limit))
        data = handle.read()
    path.unlink()
    return data.decode("utf-8", errors="replace")


def _make_environment(config: RexmleSandboxConfig) -> RexmleSandboxEnvironment:
    """The sample's run folder and sandbox; whatever was made is undone when a step fails."""
    spec = RunSpec.model_validate_json(config.spec)
    root = Path(config.work_dir) if config.work_dir else Path(tempfile.gettempdir()) / DEFAULT_WORK_DIR
    root.mkdir(parents=True, exist_ok=True)
    gpus = GPU_POOL.take(spec.resources.gpus)
    paths = RunPaths(root / f"{spec.task_id}.{uuid.uuid4().hex[:12]}")
    sandbox = None
    try:
        for folder in (paths.run_dir, paths.logs, paths.workspace):
            folder.mkdir()
        sandbox, public_dir, limits = _make_sandbox(spec, paths, gpus)
        return RexmleSandboxEnvironment(spec, paths, sandbox, gpus, public_dir, config.keep, limits)
    except BaseException:
        if sandbox is not None:
            sandbox.close()
        GPU_POOL.give_back(gpus)
        if paths.run_dir.exists():
            Workspace(root).remove(paths.run_dir.name)
        raise


def _make_sandbox(spec: RunSpec, paths: RunPaths, gpus: tuple[str, ...]) -> tuple[Any, Path, EffectiveLimits]:
    """The run's sandbox (the harness's own :func:`make_run_sandbox`), its instructions and login profile."""
    from rexmle_agents.harness.limits import GIB, resolve_limits
    from rexmle_agents.harness.runner import make_run_sandbox, selection_split
    from rexmle_agents.integrations.inspect.spec import hardware_of, instructions_text, task_info

    info = task_info(spec)
    if spec.selection_cases:  # the agent sees the selection split's view; its secret stays in the run folder
        info = task_info(spec, selection_split(spec, paths).agent_public)
    limits = resolve_limits(spec, workspace=paths.workspace)
    sandbox = make_run_sandbox(spec, paths, info.public_dir, info.grader_id, gpus, limits=limits)
    try:
        hardware = hardware_of(spec, gpus)
        hardware["memory_gb"] = round((limits.memory_bytes or 0) / GIB, 1) or hardware["memory_gb"]
        fs = Workspace(paths.workspace, owner=sandbox.owner)
        fs.write_text(INSTRUCTIONS_FILENAME, instructions_text(spec, info, hardware))
        # Inspect's tools run `bash --login`, whose /etc/profile resets PATH: the login profile in the sandbox's
        # HOME puts the run's Python environment first again
        search_path = getattr(sandbox, "env", {}).get("PATH")
        if search_path:
            fs.write_text(f"{HOME_DIRNAME}/.bash_profile", f"PATH={shlex.quote(search_path)}\nexport PATH\n")
    except BaseException:
        sandbox.close()
        raise
    return sandbox, info.public_dir, limits
