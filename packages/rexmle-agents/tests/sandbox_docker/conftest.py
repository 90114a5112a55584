"""A private Docker engine for the docker sandbox's tests, and a small image with Python built for it.

The engine is our own ``dockerd`` (its own data root, exec root, pid file and Unix socket under a temporary folder,
no bridge and no iptables rules: every run uses ``--network none``), so the tests neither need nor touch a Docker
that may already run on the machine. No registry is reachable, so the image is ``docker import`` of a root file
system tarred here from the host's own system Python, its shared libraries, the standard library, ``/bin/sh`` and a
few coreutils.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# the bubblewrap tests' world, loaded by path (a conftest is not importable by name)
_spec = importlib.util.spec_from_file_location("_rexmle_sandbox_fixtures",
                                               Path(__file__).parent.parent / "sandbox" / "conftest.py")
assert _spec is not None and _spec.loader is not None  # a file next to this folder
_sandbox = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _sandbox  # its dataclasses look their module up by name
_spec.loader.exec_module(_sandbox)
World, make_world, host_listener = _sandbox.World, _sandbox.make_world, _sandbox.host_listener

INSTALL = "apt-get install -y docker.io"
IMAGE = "rexmle-test-python:1"
SYSTEM_PYTHON = Path("/usr/bin/python3")
TOOLS = ("sh", "cat", "sleep", "env", "ls", "id", "touch", "ln", "rm", "rmdir", "head")
_LIB_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


@dataclass(frozen=True)
class Engine:
    host: str  # DOCKER_HOST of the private engine
    image: str
    start_s: float
    image_s: float
    image_bytes: int


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    dockerd, docker = shutil.which("dockerd"), shutil.which("docker")
    if dockerd is None or docker is None:
        pytest.skip(f"the Docker engine is not installed ({INSTALL}; tools/setup.sh --dev does it as root)")
    if os.geteuid() != 0:
        pytest.skip("starting a private Docker engine needs root")
    # The socket path must stay short (108 bytes at most), so not under pytest's deep folders.
    root = Path(tempfile.mkdtemp(prefix="rexmle-dockerd-"))
    sock = root / "docker.sock"
    log_path = root / "dockerd.log"
    pidfile = root / "dockerd.pid"
    host = f"unix://{sock}"
    start = time.monotonic()
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen(
            [dockerd, "--data-root", str(root / "data"), "--exec-root", str(root / "exec"), "--pidfile",
             str(pidfile), "-H", host, "--bridge", "none", "--iptables=false", "--ip6tables=false"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    saved = {k: os.environ.get(k) for k in ("DOCKER_HOST", "DOCKER_CONTEXT")}
    try:
        env = {**os.environ, "DOCKER_HOST": host}
        env.pop("DOCKER_CONTEXT", None)
        _wait_for_engine(docker, env, daemon, log_path)
        start_s = time.monotonic() - start
        start = time.monotonic()
        image_bytes = _import_image(docker, env, tmp_path_factory.mktemp("image"))
        image_s = time.monotonic() - start
        os.environ["DOCKER_HOST"] = host
        os.environ.pop("DOCKER_CONTEXT", None)
        yield Engine(host=host, image=IMAGE, start_s=start_s, image_s=image_s, image_bytes=image_bytes)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _stop(daemon)
        shutil.rmtree(root, ignore_errors=True)


def _wait_for_engine(docker: str, env: dict[str, str], daemon: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            break
        done = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], env=env, capture_output=True,
                              timeout=30, check=False)
        if done.returncode == 0:
            return
        time.sleep(0.5)
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
    _stop(daemon)
    pytest.skip(f"a private dockerd did not start (exit status {daemon.poll()}); its log ends:\n{tail}")


def _stop(daemon: subprocess.Popen) -> None:
    """SIGTERM lets dockerd stop its containers and its own containerd; SIGKILL to the group if it hangs."""
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(timeout=10)


def _import_image(docker: str, env: dict[str, str], folder: Path, tag: str = IMAGE,
                  tools: tuple[str, ...] = TOOLS, extra: tuple[tuple[Path, str], ...] = ()) -> int:
    """Tar a root file system holding the host's system Python, ``tools`` and ``extra`` (host path, path in the
    image) and ``docker import`` it as ``tag``; returns the tar's size."""
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"no system Python at {SYSTEM_PYTHON} to build the test image from (apt-get install -y python3)")
    python = SYSTEM_PYTHON.resolve()
    stdlib = Path("/usr/lib") / python.name
    if not stdlib.is_dir():
        pytest.skip(f"the system Python's standard library {stdlib} is missing")
    programs = [python, *(Path(p) for t in tools if (p := shutil.which(t, path="/usr/bin:/bin")) is not None)]
    dynload = sorted((stdlib / "lib-dynload").glob("*.so"))
    libraries: set[Path] = set()
    extensions = [so for source, _ in extra if source.is_dir() for so in source.rglob("*.so*") if so.is_file()]
    bundled = [source.resolve().parent for source, _ in extra]  # numpy.libs and the like come with the packages
    for binary in [*programs, *dynload, *extensions]:
        libraries.update(p for p in _shared_libraries(binary) if not any(p.is_relative_to(b) for b in bundled))
    tar_path = folder / "rootfs.tar"
    with tarfile.open(tar_path, "w") as tar:
        for name in ("bin", "lib", "lib64", "sbin"):  # Debian's merged /usr
            if Path("/" + name).is_symlink():
                _add_link(tar, name, os.readlink("/" + name))
        for name in ("tmp", "workspace", "proc", "sys", "dev", "etc", "root", "home"):
            _add_dir(tar, name, 0o1777 if name == "tmp" else 0o755)
        _add_text(tar, "etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n")
        _add_text(tar, "etc/group", "root:x:0:\nnogroup:x:65534:\n")
        for path in sorted({*programs, *libraries, SYSTEM_PYTHON, Path("/bin/sh")}):
            _add_path(tar, path)
        tar.add(stdlib, arcname=str(stdlib).lstrip("/"), filter=_skip_tests_and_caches)
        for source, name in extra:
            tar.add(source, arcname=name.lstrip("/"), filter=_skip_tests_and_caches)
    with open(tar_path, "rb") as fh:
        done = subprocess.run([docker, "import", "-", tag], stdin=fh, env=env, capture_output=True, timeout=300,
                              check=False)
    if done.returncode != 0:
        pytest.fail(f"docker import of the test image failed: {done.stderr.decode(errors='replace')}")
    size = tar_path.stat().st_size
    tar_path.unlink()
    return size


def import_image(engine: Engine, folder: Path, tag: str, tools: tuple[str, ...] = TOOLS,
                 extra: tuple[tuple[Path, str], ...] = ()) -> int:
    """Another image for the private engine (see :func:`_import_image`)."""
    docker = shutil.which("docker")
    assert docker is not None  # the engine fixture found it
    return _import_image(docker, {**os.environ, "DOCKER_HOST": engine.host}, folder, tag, tools, extra)


def _shared_libraries(binary: Path) -> set[Path]:
    done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    return {Path(m.group(1)) for line in done.stdout.splitlines() if (m := _LIB_LINE.search(line))}


def _add_path(tar: tarfile.TarFile, path: Path) -> None:
    """A file by its own name: a link (like sh -> dash or the loader's name) as a link, plus what it points to."""
    seen: set[str] = set()
    while str(path) not in seen:
        seen.add(str(path))
        real_parent = path.parent.resolve()
        here = real_parent / path.name
        if here.is_symlink():
            target = os.readlink(here)
            _add_link(tar, str(here).lstrip("/"), target)
            path = (real_parent / target) if not target.startswith("/") else Path(target)
            continue
        if str(here).lstrip("/") not in tar.getnames():
            tar.add(here, arcname=str(here).lstrip("/"), recursive=False)
        return


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    if name in tar.getnames():
        return
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    tar.addfile(info)


def _add_dir(tar: tarfile.TarFile, name: str, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def _add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def _skip_tests_and_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = Path(info.name).parts
    if "__pycache__" in parts or (len(parts) > 3 and parts[3] in ("test", "idlelib", "tkinter", "ensurepip")):
        return None
    if "_test" in info.name.rsplit("/", 1)[-1] and info.name.endswith(".so"):
        return None
    return info


@pytest.fixture
def world(docker_engine: Engine, tmp_path: Path) -> World:
    """The bubblewrap tests' world (a fake data root with public/ and private/ side by side, a run workspace
    beside it), with the private engine's image."""
    return dataclasses.replace(make_world(tmp_path), image=docker_engine.image)


@pytest.fixture(scope="session")
def image_importer(docker_engine: Engine):
    """``import_image`` bound to the private engine: (folder, tag, tools=..., extra=...) -> the tar's size."""
    return lambda folder, tag, **kwargs: import_image(docker_engine, folder, tag, **kwargs)
