from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rexmle_agents.sandbox import SandboxLimits, SandboxSpec

SECRET = "SECRET-LABEL-7f3a9c"
PUBLIC_TEXT = "id,label\ncase_001,?\n"

@dataclass(frozen=True)
class World:
    root: Path
    data_root: Path
    public: Path
    private: Path
    workspace: Path
    secret: str = SECRET
    public_text: str = PUBLIC_TEXT
    image: str | None = None  # the image-based runtimes' (tests/sandbox_docker)

    def spec(self, **limits: object) -> SandboxSpec:
        return SandboxSpec(workspace=self.workspace, data=self.public, image=self.image,
                           limits=SandboxLimits(**limits))


@pytest.fixture
def world(tmp_path: Path) -> World:
    """A fake data root (one task with public/ and private/) and a run workspace beside it."""
    return make_world(tmp_path)


@pytest.fixture
def open_world() -> Iterator[World]:
    """The same in a folder every user may traverse: unsandboxed code run as the unprivileged sandbox user (the
    harness as root) must reach its workspace and data by their host paths, and pytest's own folders are 0700."""
    root = Path(tempfile.mkdtemp(prefix="rexmle-open-world-"))
    root.chmod(0o755)
    try:
        yield make_world(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def make_world(tmp_path: Path) -> World:
    data_root = tmp_path / "data"
    public = data_root / "task" / "public"
    private = data_root / "task" / "private"
    public.mkdir(parents=True)
    private.mkdir()
    (public / "train.csv").write_text(PUBLIC_TEXT)
    (private / "labels.txt").write_text(SECRET)
    workspace = tmp_path / "run" / "workspace"
    for sub in ("submission", "working"):
        (workspace / sub).mkdir(parents=True)
    return World(root=tmp_path, data_root=data_root, public=public, private=private, workspace=workspace)


@contextlib.contextmanager
def host_listener() -> Iterator[tuple[int, list[str]]]:
    """A TCP port listening on every address of this host, and those addresses (loopback, the outgoing interface's,
    the host name's), each checked to answer from the host: a connection from inside a sandbox can then fail only
    because the sandbox has no network."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    port = server.getsockname()[1]
    addresses = {"127.0.0.1"}
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with contextlib.suppress(OSError), probe:
        probe.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
        addresses.add(probe.getsockname()[0])
    with contextlib.suppress(OSError):
        addresses.update(socket.gethostbyname_ex(socket.gethostname())[2])
    try:
        for address in addresses:
            socket.create_connection((address, port), timeout=2).close()
        yield port, sorted(addresses)
    finally:
        server.close()
