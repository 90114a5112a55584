"""Fixtures of the scaffold tests: the fake model module, a prepared synthetic LDCT-IQA task (small 2-D images, a
CSV submission: the cheapest task to run end to end), and a helper that runs a preset through the real harness."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rexmle_agents.harness.runner import RunOutcome, build_spec, execute_run
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import Model, RetryPolicy, ScriptedBackend

TASK = "ldct-iqa"
FAKES_PATH = Path(__file__).with_name("fakes.py")
NO_RETRY = RetryPolicy(max_attempts=1)


def load_fakes() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scaffold_fakes", FAKES_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def fakes() -> ModuleType:
    return load_fakes()


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    root = tmp_path_factory.mktemp("scaffold-data")
    task = get_task(TASK)
    prepare_task(task, task_dirs(task, root), synthetic=True, cases=10, seed=0, force=False)
    return root


RunScaffold = Callable[..., tuple[RunOutcome, Any]]


@pytest.fixture
def run_scaffold(data_root: Path, tmp_path: Path) -> RunScaffold:
    """Run ``agent`` with a fake model on the synthetic task, in bubblewrap; returns (outcome, the fake)."""

    def run(agent: str, fake: Any, *, config: Mapping[str, Any] | None = None,
            limits: Limits) -> tuple[RunOutcome, Any]:
        spec = build_spec(TASK, agent=agent, agent_config=dict(config or {}), models={"code": "scripted/model"},
                          seed=0, limits=limits, sandbox="bwrap", data_root=data_root, group="test")
        model = Model(ScriptedBackend(fake), retry=NO_RETRY)
        return execute_run(spec, tmp_path / "runs", models={"code": model}, grace_s=5.0), fake

    return run
