"""Docker, what workstations offer. The container belongs to the Docker engine, not to us: the engine enforces the
memory and process limits (``--memory``, ``--pids-limit``), and stopping a command means ``docker kill`` of its
container (killing the client alone would leave it running).

``docker run --rm --network none --read-only``: a read-only root with a private /tmp, no network, every
capability dropped, no privilege escalation, running as the harness's uid/gid (so workspace files stay the
user's), or as the run's own leased unprivileged uid/gid when the harness is root (runc gives every container a
new session keyring); the workspace bound read-write at
/workspace and the public data read-only over /workspace/data; the run's GPUs by ``--gpus device=...``. The
image (``spec.image``) must hold Python and the rexmle packages.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rexmle_agents.sandbox import _process
from rexmle_agents.sandbox._container import container_env, require_image
from rexmle_agents.sandbox.base import (
    DATA_DIRNAME,
    STOPPED_MEMORY,
    STOPPED_PROCESSES,
    WORKSPACE,
    Sandbox,
    SandboxSpec,
)

INSTALL_HINT = "install Docker Engine (https://docs.docker.com/engine/install/) and start it"


@functools.cache
def _docker_problem(host: str | None, context: str | None) -> str | None:
    """Asked once per engine address (``DOCKER_HOST``/``DOCKER_CONTEXT``), so a harness pointed at another engine
    later is not answered with the first one's verdict."""
    path = shutil.which("docker")
    if path is None:
        return f"docker is not installed; {INSTALL_HINT}"
    try:
        done = subprocess.run([path, "version", "--format", "{{.Server.Version}}"], capture_output=True, timeout=10,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the Docker engine does not answer ({exc}); {INSTALL_HINT}"
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()
        return (f"the docker client is installed but no Docker engine is reachable "
                f"({detail[-1] if detail else 'no detail'}); {INSTALL_HINT}")
    return None


class DockerSandbox(Sandbox):
    kind = "docker"
    host_limits = False

    def __init__(self, spec: SandboxSpec, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self.image = require_image(spec, self.kind, "ghcr.io/ORG/rexmle:TAG")
        self.env = {**container_env(spec), **self.account_env()}

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return _docker_problem(os.environ.get("DOCKER_HOST"), os.environ.get("DOCKER_CONTEXT"))

    def _engine_mechanism(self) -> str:
        return "docker engine (--memory, --pids-limit, --cpus) + --ulimit fsize"

    def command(self, argv: Sequence[str], *, name: str | None = None) -> list[str]:
        spec, limits = self.spec, self.spec.limits
        args = [shutil.which("docker") or "docker", "run", "--rm", "--init", "--read-only", "--tmpfs", "/tmp",
                "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--user", self._user()]
        if name is not None:
            args += ["--name", name]
        if not spec.network:
            args += ["--network", "none"]
        if limits.memory_bytes is not None:
            args += ["--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes)]
        if limits.max_processes is not None:
            args += ["--pids-limit", str(limits.max_processes)]
        if limits.cpus is not None:
            args += ["--cpus", str(limits.cpus)]
        if limits.max_file_bytes is not None:
            args += ["--ulimit", f"fsize={limits.max_file_bytes}:{limits.max_file_bytes}"]
        if limits.gpus:
            # The quotes keep docker's CSV parser from splitting a list of devices at the comma.
            args += ["--gpus", f'"device={",".join(limits.gpus)}"']
        args += ["-v", f"{spec.workspace.resolve()}:{WORKSPACE}:rw",
                 "-v", f"{spec.data.resolve()}:{WORKSPACE}/{DATA_DIRNAME}:ro",
                 "-w", f"{WORKSPACE}/{spec.workdir}"]
        for bind in spec.binds:
            args += ["-v", f"{Path(bind.host).resolve()}:{bind.inside}:{'rw' if bind.writable else 'ro'}"]
        env = dict(self.env)
        if limits.gpus:
            # Inside the container the engine renumbers the passed GPUs from 0.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(limits.gpus)))
        for key, value in env.items():
            args += ["-e", f"{key}={value}"]
        return [*args, self.image, *argv]

    def _classify(self, outcome: _process.Outcome, stderr_tail: str) -> tuple[int | None, str | None]:
        """The engine's limits leave no counters on the host (its cgroups are its own and ``--rm`` drops the
        container's OOMKilled flag), so their traces are read from the outcome: the engine's OOM killer ends the
        command with SIGKILL (exit status 137 through ``--init``) that we did not send, and a fork refused by
        ``--pids-limit`` fails with EAGAIN."""
        exit_code, stopped_by = super()._classify(outcome, stderr_tail)
        limits = self.spec.limits
        if stopped_by == f"signal:{signal.SIGKILL}" and limits.memory_bytes is not None:
            return exit_code, STOPPED_MEMORY
        if (stopped_by is None and exit_code not in (0, None) and limits.max_processes is not None
                and "Resource temporarily unavailable" in stderr_tail):
            return exit_code, STOPPED_PROCESSES
        return exit_code, stopped_by

    def _user(self) -> str:
        """The harness's own uid:gid, or the run's leased unprivileged uid:gid when the harness is root."""
        user = self.user
        return f"{os.getuid()}:{os.getgid()}" if user is None else f"{user.uid}:{user.gid}"

    def _launch(self, argv: Sequence[str]) -> _process.Launch:
        name = f"rexmle-{uuid.uuid4().hex[:16]}"
        docker = shutil.which("docker") or "docker"

        def kill_container() -> None:
            subprocess.run([docker, "kill", name], capture_output=True, timeout=30, check=False)

        return _process.Launch(argv=tuple(self.command(argv, name=name)), env=_host_env(), on_kill=kill_container)


def _host_env() -> dict[str, str]:
    """The docker client's own environment: how to reach the engine, nothing else."""
    keep = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY")
    return {k: os.environ[k] for k in keep if k in os.environ}
