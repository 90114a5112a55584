"""Each external agent's own virtual environment, built once and cached under a hash of what defines it.

The key hashes the spec's ``environment`` section, the extras chosen, the interpreter's version and (for a
checkout) the checkout's requirements file, so a changed pin builds a new environment and an unchanged one is
reused by every run. Environments live under ``$REXMLE_AGENT_ENVS`` (default: the user cache,
``~/.cache/rexmle/agent-envs``), are built in place under a file lock (parallel runs build once), are marked
complete only when pip has succeeded (a killed build is redone), and are made readable by others (agent code runs
as the unprivileged sandbox user when the harness is root). rexmle's own ``constraints.txt`` (``PIP_CONSTRAINT``)
never applies to them: an agent's pins are its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rexmle_agents.external.spec import ExternalAgentSpec
from rexmle_grade.errors import ConfigurationError, RexmleError

CACHE_VARIABLE = "REXMLE_AGENT_ENVS"
MARKER = "rexmle-agent-env.json"
NPM_PREFIX = "npm"  # the npm packages' prefix inside the environment
TAIL_LINES = 40
# Variables of the harness's own pip set-up that must not reach an agent's install.
_PIP_VARIABLES_DROPPED = ("PIP_CONSTRAINT", "PIP_REQUIRE_VIRTUALENV", "PIP_TARGET", "PIP_PREFIX", "PIP_USER",
                          "PYTHONPATH", "VIRTUAL_ENV")


class EnvironmentBuildError(RexmleError):
    """An external agent's environment could not be built; the message names the spec and quotes pip."""


@dataclass(frozen=True)
class AgentEnvironment:
    spec_name: str
    key: str
    path: Path
    built: bool  # False: reused from the cache
    seconds: float  # the build's time (of the original build when reused)
    python_version: str

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    @property
    def npm_bin(self) -> Path:
        """The executables of the environment's npm packages (and of its Node.js runtime, when it has one)."""
        return self.path / NPM_PREFIX / "node_modules" / ".bin"

    @property
    def search_path(self) -> list[Path]:
        """The environment's folders for the agent's PATH, first to last."""
        return [self.npm_bin, self.bin] if self.npm_bin.is_dir() else [self.bin]


def cache_root() -> Path:
    configured = os.environ.get(CACHE_VARIABLE)
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("rexmle")) / "agent-envs"


def base_interpreter(spec: ExternalAgentSpec) -> Path:
    """The interpreter the environment is made from: the spec's (a version such as "3.11" or a path), else the
    harness's own base interpreter."""
    wanted = spec.environment.python
    if wanted is None:
        found = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
        return found if found.exists() else Path(getattr(sys, "_base_executable", sys.executable))
    candidate = Path(wanted) if "/" in wanted else None
    if candidate is None:
        located = shutil.which(f"python{wanted}") or shutil.which(wanted)
        candidate = Path(located) if located else None
        if candidate is not None and candidate.parent.name == "shims":
            # a pyenv shim runs only the versions pyenv has selected: take the installed interpreter it stands for
            versions = sorted(candidate.parent.parent.glob(f"versions/{wanted}.*/bin/python{wanted}"),
                              key=lambda p: [int(n) if n.isdigit() else -1 for n in p.parts[-3].split(".")])
            candidate = versions[-1] if versions else candidate
    if candidate is None or not candidate.exists():
        raise ConfigurationError(f"external agent {spec.name!r} asks for Python {wanted!r}, which is not installed "
                                 "here", hint=f"install python{wanted} (e.g. with pyenv), or drop environment.python "
                                 "from the spec to use the harness's interpreter")
    return candidate.resolve()


def _version(python: Path) -> str:
    done = subprocess.run([str(python), "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ConfigurationError(f"the interpreter {python} does not run: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def environment_key(spec: ExternalAgentSpec, *, extras: Sequence[str], python_version: str,
                    checkout_requirements: str | None = None) -> str:
    env = spec.environment
    unknown = sorted(set(extras) - set(env.extras))
    if unknown:
        raise ConfigurationError(f"external agent {spec.name!r} has no environment extra(s) {unknown}",
                                 hint="its extras: " + (", ".join(sorted(env.extras)) or "none"))
    # fields at their defaults are left out, so a field added to the spec format later keeps existing keys
    material = {"environment": env.model_dump(mode="json", exclude_defaults=True), "extras": sorted(set(extras)),
                "python": python_version, "checkout_requirements": checkout_requirements}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _open_to_others(root: Path) -> None:
    """o+r on files, o+rx on folders and executables (symlinks left alone)."""
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                continue
            wanted = info.st_mode | stat.S_IROTH | stat.S_IRGRP
            if stat.S_ISDIR(info.st_mode) or info.st_mode & stat.S_IXUSR:
                wanted |= stat.S_IXOTH | stat.S_IXGRP
            if wanted != info.st_mode:
                path.chmod(stat.S_IMODE(wanted))
    root.chmod(0o755)


def _locate(spec: ExternalAgentSpec, *, extras: Sequence[str], checkout: Path | None
            ) -> tuple[Path, str, Path | None, str, Path]:
    python = base_interpreter(spec)
    version = _version(python)
    requirements_file = None
    if checkout is not None and spec.source is not None and spec.source.requirements_file:
        requirements_file = checkout / spec.source.requirements_file
        if not requirements_file.is_file():
            raise ConfigurationError(f"the checkout {checkout} has no {spec.source.requirements_file}",
                                     hint="point the agent at a complete checkout")
    key = environment_key(spec, extras=extras, python_version=version,
                          checkout_requirements=requirements_file.read_text() if requirements_file else None)
    # named by the key alone: specs with the same environment section (a test spec, a fork) share one
    return python, version, requirements_file, key, cache_root() / f"env-{key[:16]}"


def built_environment(spec: ExternalAgentSpec, *, extras: Sequence[str] = (), checkout: Path | None = None
                      ) -> tuple[Path, bool]:
    """Where the agent's environment is (or would be) cached, and whether a complete build is there; builds
    nothing (``rexmle doctor``)."""
    path = _locate(spec, extras=extras, checkout=checkout)[-1]
    return path, (path / MARKER).is_file()


def ensure_environment(spec: ExternalAgentSpec, *, extras: Sequence[str] = (), checkout: Path | None = None,
                       source: str = "", log: Callable[[str], None] | None = None) -> AgentEnvironment:
    """The agent's environment, built now if the cache has none for this key. ``source`` says where the spec came
    from (named in errors)."""
    python, version, requirements_file, key, path = _locate(spec, extras=extras, checkout=checkout)
    root = path.parent
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".env-{key[:16]}.lock"):
        marker = path / MARKER
        if marker.is_file():
            recorded = json.loads(marker.read_text())
            return AgentEnvironment(spec.name, key, path, built=False, seconds=float(recorded.get("seconds", 0.0)),
                                    python_version=version)
        if log is not None:
            log(f"building the environment of external agent {spec.name!r} in {path} (once; later runs reuse it)")
        started = time.monotonic()
        _build(spec, path, python, extras=extras, requirements_file=requirements_file, source=source or spec.name,
               build_log=root / f"env-{key[:16]}.build.log")
        seconds = time.monotonic() - started
        freeze = subprocess.run([sys.executable, "-m", "pip", "--python", str(path / "bin" / "python"), "freeze"],
                                capture_output=True, text=True, check=False, env=_pip_env()).stdout
        (path / "pip-freeze.txt").write_text(freeze)
        _open_to_others(path)
        marker.write_text(json.dumps({"spec": spec.name, "key": key, "python": version, "seconds": round(seconds, 1),
                                      "extras": sorted(set(extras)), "built_at": time.time()}, indent=2))
        marker.chmod(0o644)
        return AgentEnvironment(spec.name, key, path, built=True, seconds=seconds, python_version=version)


def _die_with_parent() -> None:
    """In the child before exec: be killed when the process that started it dies (Linux's PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _npm(spec: ExternalAgentSpec) -> str:
    found = shutil.which("npm")
    if found is None:
        raise ConfigurationError(f"external agent {spec.name!r} installs npm packages, and npm is not installed here",
                                 hint="apt-get install -y npm (Debian's Node.js and npm)")
    return found


def _node_arch() -> str:
    """The npm registry's name of this machine's architecture for a Node.js runtime package."""
    machine = os.uname().machine
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    if arch is None:
        raise ConfigurationError(f"no Node.js runtime package is known for the architecture {machine!r}",
                                 hint="drop environment.node from the spec and install Node.js on the system")
    return arch


def _pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PIP_VARIABLES_DROPPED}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _build(spec: ExternalAgentSpec, path: Path, python: Path, *, extras: Sequence[str],
           requirements_file: Path | None, source: str, build_log: Path) -> None:
    if path.exists():  # a build that did not finish (no marker): start again
        shutil.rmtree(path)
    env_spec = spec.environment
    requirements = [*env_spec.requirements, *(r for name in sorted(set(extras)) for r in env_spec.extras[name])]
    # rexmle's own pip installs into the new environment (made without pip: ensurepip costs ~10 s a build)
    pip = [sys.executable, "-m", "pip", "--python", str(path / "bin" / "python"), "install", "--no-input",
           *env_spec.pip_args]
    commands = [[str(python), "-m", "venv", "--without-pip", str(path)]]
    if requirements:
        commands.append([*pip, *requirements])
    if requirements_file is not None:
        commands.append([*pip, "-r", str(requirements_file)])
    if env_spec.no_deps:
        commands.append([*pip, "--no-deps", *env_spec.no_deps])
    packages = [*env_spec.npm, *([f"node-linux-{_node_arch()}@{env_spec.node}"] if env_spec.node else [])]
    if packages:
        commands.append([_npm(spec), "install", "--prefix", str(path / NPM_PREFIX), "--no-audit", "--no-fund",
                         "--no-update-notifier", "--loglevel=error", "--cache", str(build_log.parent / ".npm-cache"),
                         *packages])
    with build_log.open("w") as log_file:
        for command in commands:
            log_file.write(f"$ {' '.join(command)}\n")
            log_file.flush()
            # the installer dies with this process: an orphaned pip writing into the folder would corrupt the next
            # build, which starts by deleting what an unfinished build left
            done = subprocess.run(command, stdout=log_file, stderr=subprocess.STDOUT, env=_pip_env(), check=False,
                                  preexec_fn=_die_with_parent)
            if done.returncode != 0:
                log_file.flush()
                lines = build_log.read_text(errors="replace").splitlines()
                tail = "\n".join(f"    {line}" for line in lines[-TAIL_LINES:])
                shutil.rmtree(path, ignore_errors=True)
                shown = " ".join(command[:6]) + (" ..." if len(command) > 6 else "")
                raise EnvironmentBuildError(
                    f"building the environment of external agent {spec.name!r} (spec {source}) failed: `{shown}` "
                    f"exited with status {done.returncode}; the last lines of its output:\n{tail}",
                    hint=f"fix the pins in the spec's environment section, or check that the package index is "
                         f"reachable; the whole log is {build_log}")
