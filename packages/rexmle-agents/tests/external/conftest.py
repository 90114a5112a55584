"""Fixtures of the external-agent tests: the synthetic LDCT-IQA task (small 2-D images, a CSV submission: the
cheapest to run end to end), aideml's own environment (built once into the agent-environment cache, then reused
by every run and every later test session), and spec files derived from aideml's spec that share its environment
(so bad-input tests build nothing)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from rexmle_agents.external.envs import AgentEnvironment, ensure_environment
from rexmle_agents.external.spec import SPEC_PACKAGE, load_spec
from rexmle_agents.harness.runner import RunOutcome, build_spec, execute_run
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import Model, RetryPolicy, ScriptedBackend

TASK = "ldct-iqa"


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    root = tmp_path_factory.mktemp("external-data")
    task = get_task(TASK)
    prepare_task(task, task_dirs(task, root), synthetic=True, cases=10, seed=0, force=False)
    return root


@pytest.fixture(scope="session")
def aideml_env() -> AgentEnvironment:
    """aideml 0.2.2's environment: about 1.5 min to build on a fresh machine (2 cores, package index), then
    reused from the cache ($REXMLE_AGENT_ENVS or ~/.cache/rexmle/agent-envs)."""
    started = time.monotonic()
    env = ensure_environment(load_spec("aideml"), source="aideml")
    print(f"aideml environment {'built' if env.built else 'reused'} in {time.monotonic() - started:.1f} s "
          f"({env.path})")
    return env


def aideml_spec_dict() -> dict[str, Any]:
    from importlib import resources

    return yaml.safe_load(resources.files(SPEC_PACKAGE).joinpath("aideml.yaml").read_text())


@pytest.fixture
def aideml_raw() -> dict[str, Any]:
    """aideml's spec as the YAML mapping it is written as."""
    return aideml_spec_dict()


@pytest.fixture
def spec_file(tmp_path: Path) -> Callable[..., Path]:
    """A spec file with aideml's environment (shared cache entry) and the given fields replaced."""

    def make(**fields: Any) -> Path:
        raw = aideml_spec_dict()
        raw.update(name="test-external", settings={}, files={}, env={}, roles=["code"],
                   aliases={"rexmle-code": "code"})
        raw.update(fields)
        path = tmp_path / f"{raw['name']}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return path

    return make


RunExternal = Callable[..., RunOutcome]


@pytest.fixture
def run_external(data_root: Path, tmp_path: Path) -> RunExternal:
    """Run an external agent on the synthetic task in bubblewrap, every role answered by ``answer``."""

    def run(agent: str, answer: Any, *, config: Mapping[str, Any] | None = None, limits: Limits | None = None,
            roles: tuple[str, ...] = ("code", "feedback"), retry: RetryPolicy | None = None) -> RunOutcome:
        spec = build_spec(TASK, agent=agent, agent_config=dict(config or {}),
                          models={role: "scripted/model" for role in roles}, seed=0,
                          limits=limits or Limits(time_limit_s=600), sandbox="bwrap", data_root=data_root,
                          group="test")
        model = Model(ScriptedBackend(answer), retry=retry or RetryPolicy(max_attempts=1))
        return execute_run(spec, tmp_path / "runs", models={role: model for role in roles}, grace_s=5.0)

    return run
