from __future__ import annotations

import shutil
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

    def spec(self, **limits: object) -> SandboxSpec:
        return SandboxSpec(workspace=self.workspace, data=self.public, limits=SandboxLimits(**limits))


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
