"""A Harbor environment that runs rexmle's exported tasks on a plain Docker engine, without Docker Compose.

Harbor's own ``docker`` environment drives every task through ``docker compose`` (the Compose V2 CLI plugin),
which Debian's ``docker.io`` does not ship. rexmle's exported tasks need none of Compose: one image, one container,
no network, the public data either in the image or bound read-only from the folder ``rexmle prepare`` wrote. This
environment gives Harbor exactly that on any engine the ``docker`` CLI reaches (``DOCKER_HOST`` honoured)::

    pip install 'rexmle-agents[harbor]'  # into Harbor's own environment (Python >= 3.12)
    harbor run -p DATASET -a oracle \\
        --environment-import-path rexmle_agents.integrations.harbor_docker:RexmleDockerEnvironment

What each container gets: ``--network none`` (the tasks ask for no network; a task asking for any network is
refused before start, never silently given none), the task's CPUs and memory as hard limits, a process limit,
``no-new-privileges``, and the task's GPUs through ``--gpus`` (the engine needs the NVIDIA container toolkit for
that). Harbor's agent runs commands as the task's agent user; its verifier, in a container of its own (the tasks
set ``environment_mode = "separate"``), receives only the collected submission and the tests.

Files cross as tar streams through ``docker cp``. Whatever comes out of a container is the agent's and treated as
hostile: extracted member by member with the tar data filter (no absolute paths, no ``..``, no links leaving the
target, no device files; such a member is left out and logged, the rest copied), and no more than
``max_download_mb`` in all per copy.

The only Compose file this environment reads is the one rexmle's exporter writes for large data: a ``main``
service with bind ``volumes`` (``${VAR:?message}`` expanded from the environment). Anything else in a Compose file
is refused with its name, so a task that needs Compose proper is never run half-configured.

This module imports only Harbor and the standard library: it is loaded inside Harbor's Python.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shlex
import subprocess
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import yaml
from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.options import EnvironmentOptions
from pydantic import Field

COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
_VARIABLE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::?(?P<op>[?-])(?P<arg>[^}]*))?\}"
                       r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")
_NAME_SAFE = re.compile(r"[^a-z0-9_.-]+")


class DockerOptions(EnvironmentOptions):
    """``--ek`` options of this environment."""

    docker: str = Field(default="docker", description="the docker CLI to run")
    pids_limit: int = Field(default=4096, ge=64, description="processes a container may hold")
    max_download_mb: int = Field(default=20480, ge=1, description="most bytes one copy out of a container may carry")
    keep_containers: bool = Field(default=False, description="leave stopped containers for inspection")
    build_timeout_sec: int | None = Field(default=None, description="override the task's build timeout")


class DefinitionError(RuntimeError):
    """The task's environment/ asks for something this environment does not do (said with the fix)."""


class RexmleDockerEnvironment(BaseEnvironment):
    """One container per environment on a plain Docker engine (see the module docstring)."""

    options_model = DockerOptions
    options: DockerOptions
    _build_locks: ClassVar[dict[str, asyncio.Lock]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._container = _NAME_SAFE.sub("-", f"rexmle-hb-{self.session_id}".lower())[:120]
        self._image: str | None = None
        self._built = False

    @staticmethod
    def type() -> str:
        return "rexmle-docker"

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True)

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True, gpus=True)

    def is_path_mounted(self, environment_path: Any, host_path: Path) -> bool:
        return super().is_path_mounted(environment_path, host_path)

    # ---- the definition ----------------------------------------------------------------------------------------
    def _validate_definition(self) -> None:
        dockerfile = self.environment_dir / "Dockerfile"
        if not dockerfile.is_file() and not self.task_env_config.docker_image:
            raise FileNotFoundError(f"{dockerfile} is missing and the task names no docker_image")
        if self.extra_docker_compose_paths:
            raise DefinitionError("extra Docker Compose files were given; this environment runs no Compose "
                                  "(use Harbor's own docker environment for them)")
        self._binds = self._compose_binds()
        if not self._network_disabled:
            raise DefinitionError(f"the task asks for network mode {self.network_policy!r}; this environment "
                                  "runs containers without a network only (rexmle's tasks set "
                                  "network_mode = \"no-network\")")

    def _compose_binds(self) -> list[tuple[str, str, bool]]:
        """(host source, container target, read only) of the ``main`` service's bind volumes, if a Compose file
        is there; anything else in it is refused."""
        found = [self.environment_dir / name for name in COMPOSE_FILES if (self.environment_dir / name).is_file()]
        if not found:
            return []
        document = yaml.safe_load(found[0].read_text()) or {}
        extra = sorted(set(document) - {"services"})
        services = document.get("services") or {}
        if extra or set(services) - {"main"}:
            raise DefinitionError(f"{found[0].name} holds {', '.join(extra + sorted(set(services) - {'main'}))}: "
                                  "this environment reads only the main service's bind volumes")
        main = services.get("main") or {}
        if set(main) - {"volumes"}:
            raise DefinitionError(f"{found[0].name}: the main service sets {', '.join(sorted(set(main) - {'volumes'}))}"
                                  "; this environment reads only its volumes")
        binds = []
        for entry in main.get("volumes") or []:
            if not isinstance(entry, str):
                raise DefinitionError(f"{found[0].name}: volume {entry!r} is not in the short form SOURCE:TARGET[:ro]")
            parts = _expand(entry, found[0].name).split(":")
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
                raise DefinitionError(f"{found[0].name}: volume {entry!r} is not SOURCE:TARGET[:ro]")
            source = Path(parts[0])
            if not source.is_absolute() or not source.exists():
                raise DefinitionError(f"{found[0].name}: the volume's source {source} does not exist on this host")
            binds.append((str(source.resolve()), parts[1], len(parts) == 3 and parts[2] == "ro"))
        return binds

    # ---- the container -----------------------------------------------------------------------------------------
    async def start(self, force_build: bool) -> None:
        prebuilt = self.task_env_config.docker_image
        dockerfile = self.environment_dir / "Dockerfile"
        if prebuilt and (not force_build or not dockerfile.is_file()):
            self._image = prebuilt
        else:
            self._image = f"rexmle-hb/{_NAME_SAFE.sub('-', self.environment_name.lower())}:{self._definition_hash()}"
            lock = self._build_locks.setdefault(self._image, asyncio.Lock())
            async with lock:
                present = await self._docker(["image", "inspect", self._image], check=False)
                if force_build or present.return_code != 0:
                    timeout = self.options.build_timeout_sec or int(self.task_env_config.build_timeout_sec)
                    await self._docker(["build", "-t", self._image, "-f", str(dockerfile.resolve()),
                                        str(self.environment_dir.resolve())], timeout_sec=timeout)
                    self._built = True
        await self._docker(["rm", "-f", self._container], check=False)
        command = ["run", "-d", "--name", self._container, "--network", "none", "--init",
                   "--security-opt", "no-new-privileges", "--pids-limit", str(self.options.pids_limit)]
        if (cpus := self._effective_cpus) is not None:
            command += ["--cpus", str(cpus)]
        if (memory_mb := self._effective_memory_mb) is not None:
            command += ["--memory", f"{memory_mb}m", "--memory-swap", f"{memory_mb}m"]
        if (gpus := self._effective_gpus) > 0:
            command += ["--gpus", str(gpus)]
        for key, value in self._startup_env().items():
            command += ["-e", f"{key}={value}"]
        for source, target, read_only in self._binds:
            command += ["--mount", f"type=bind,source={source},target={target}" + (",readonly" if read_only else "")]
        for mount in self._host_mounts:
            if mount.get("type") == "bind":
                command += ["--mount", f"type=bind,source={mount['source']},target={mount['target']}"
                            + (",readonly" if mount.get("read_only") else "")]
        command += ["--entrypoint", "sleep", self._image, "infinity"]
        await self._docker(command)
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()

    async def stop(self, delete: bool) -> None:
        if self.options.keep_containers:
            await self._docker(["stop", "-t", "5", self._container], check=False)
            return
        await self._docker(["rm", "-f", self._container], check=False)
        if delete and self._built and self._image:
            await self._docker(["image", "rm", self._image], check=False)

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        user = self._resolve_user(user)
        merged = self._merge_env(env) or {}
        argv = ["exec"]
        workdir = cwd or self.task_env_config.workdir
        if workdir:
            argv += ["-w", workdir]
        for key, value in merged.items():
            argv += ["-e", f"{key}={value}"]
        if user is not None:
            argv += ["-u", str(user)]
        # the time limit is kept inside the container too: killing the docker client alone leaves the command
        inner = ["timeout", "-k", "5", str(int(timeout_sec)), "bash", "-c", command] if timeout_sec else \
            ["bash", "-c", command]
        return await self._docker([*argv, self._container, *inner], check=False,
                                  timeout_sec=None if timeout_sec is None else int(timeout_sec) + 15)

    # ---- files ---------------------------------------------------------------------------------------------------
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        source, target = Path(source_path), PurePosixPath(target_path)
        await self._mkdir(str(target.parent))
        await asyncio.to_thread(self._tar_in, [(source, target.name)], str(target.parent))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        source = Path(source_dir)
        await self._mkdir(target_dir)
        await asyncio.to_thread(self._tar_in, [(child, child.name) for child in sorted(source.iterdir())],
                                target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        source = PurePosixPath(source_path)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".rexmle-download-") as landing:
            await asyncio.to_thread(self._tar_out, str(source), Path(landing))
            pulled = Path(landing) / source.name
            if pulled.is_symlink() or not pulled.is_file():
                raise RuntimeError(f"{source_path} in the container is not a regular file")
            pulled.replace(target)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._tar_out, source_dir.rstrip("/") + "/.", target)

    def _tar_in(self, members: list[tuple[Path, str]], target_dir: str) -> None:
        process = subprocess.Popen([self.options.docker, "cp", "-", f"{self._container}:{target_dir}"],
                                   stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert process.stdin is not None  # PIPE
        try:
            with tarfile.open(fileobj=process.stdin, mode="w|") as tar:
                for path, name in members:
                    tar.add(str(path), arcname=name)
        finally:
            process.stdin.close()
            stderr = process.stderr.read() if process.stderr else b""
            code = process.wait()
        if code != 0:
            raise RuntimeError(f"copying into {self._container}:{target_dir} failed: "
                               f"{stderr.decode(errors='replace').strip()}")

    def _tar_out(self, source: str, target: Path) -> None:
        """``docker cp`` out as a tar stream, extracted with the data filter and a byte limit."""
        limit = self.options.max_download_mb * 2**20
        process = subprocess.Popen([self.options.docker, "cp", f"{self._container}:{source}", "-"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert process.stdout is not None  # PIPE
        carried = 0
        try:
            with tarfile.open(fileobj=process.stdout, mode="r|") as tar:
                for member in tar:
                    if member.isdev() or member.isfifo():
                        continue
                    carried += max(0, member.size)
                    if carried > limit:
                        raise RuntimeError(f"copying {source} out of the container passed "
                                           f"{self.options.max_download_mb} MB; stopped")
                    try:
                        tar.extract(member, target, filter="data")
                    except tarfile.FilterError as refused:  # a link out of the target, an absolute path...
                        self.logger.warning(f"not copied out of the container: {member.name!r} ({refused})")
        except tarfile.ReadError as error:
            stderr = process.stderr.read().decode(errors="replace").strip() if process.stderr else ""
            raise RuntimeError(f"copying {source} out of {self._container} failed: {stderr or error}") from None
        finally:
            process.kill()
            process.wait()

    async def _mkdir(self, folder: str) -> None:
        done = await self.exec(f"mkdir -p {shlex.quote(folder)}", user="root")
        if done.return_code != 0:
            raise RuntimeError(f"mkdir -p {folder} failed in the container: {done.stderr}")

    # ---- the docker CLI --------------------------------------------------------------------------------------
    async def _docker(self, args: list[str], *, check: bool = True, timeout_sec: int | None = None) -> ExecResult:
        process = await asyncio.create_subprocess_exec(self.options.docker, *args, stdin=asyncio.subprocess.DEVNULL,
                                                       stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout=timeout_sec)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            process.kill()
            await process.wait()
            raise
        result = ExecResult(stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"),
                            return_code=process.returncode or 0)
        if check and result.return_code != 0:
            raise RuntimeError(f"docker {' '.join(args[:3])} ... failed ({result.return_code}): "
                               f"{(result.stderr or '').strip()[-2000:]}")
        return result

    def _definition_hash(self) -> str:
        digest = hashlib.sha256()
        for path in sorted(p for p in self.environment_dir.rglob("*") if p.is_file()):
            digest.update(path.relative_to(self.environment_dir).as_posix().encode() + b"\0")
            with path.open("rb") as fh:
                for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    digest.update(chunk)
        return digest.hexdigest()[:16]


def _expand(text: str, where: str) -> str:
    """Compose's variable forms used in rexmle's exports: ``$NAME``, ``${NAME}``, ``${NAME:-default}`` and
    ``${NAME:?message}`` (refused, with the message, when unset or empty)."""

    def one(match: re.Match[str]) -> str:
        name = match["braced"] or match["bare"]
        value = os.environ.get(name, "")
        if value:
            return value
        if match["op"] == "?":
            raise DefinitionError(f"{where}: {match['arg'] or name + ' is not set'}")
        return match["arg"] if match["op"] == "-" else ""

    return _VARIABLE.sub(one, text)
