"""Fixtures of the results tests: real run folders made by the real harness, offline, on a synthetic task.

One session-wide group ``g`` holds a run of every built-in agent that needs no training library: ``sample`` (two
seeds), and the three scaffolds (``aide``, ``mcts`` with two workers, ``rdloop``) driven by the scripted model of
the scaffold tests, all in bubblewrap on synthetic LDCT-IQA (small 2-D images). The ``baseline`` agent trains with
torch inside the sandbox (about 20 s), so its folder is made only by the slow test that checks it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rexmle_agents.harness.runner import build_spec, execute_run
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import Model, RetryPolicy, ScriptedBackend

TASK = "ldct-iqa"
GROUP = "g"
FAKES_PATH = Path(__file__).parents[1] / "scaffolds" / "fakes.py"
# A comment that would close the page's data block if the viewer put run text into the page as markup.
HOSTILE_COMMENT = "# </script><script>document.title='owned'</script><b>not markup</b>\n"

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"),
                                 reason="bubblewrap is not installed (apt-get install -y bubblewrap)")


def load_fakes() -> ModuleType:
    spec = importlib.util.spec_from_file_location("results_scaffold_fakes", FAKES_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    root = tmp_path_factory.mktemp("results-data")
    task = get_task(TASK)
    prepare_task(task, task_dirs(task, root), synthetic=True, cases=10, seed=0, force=False)
    return root


def run_scripted(agent: str, drafts: list[str], config: dict[str, Any], limits: Limits, data_root: Path,
                 runs: Path) -> Path:
    fake = load_fakes().FakeModel(drafts)
    spec = build_spec(TASK, agent=agent, agent_config=config, models={"code": "scripted/model"}, seed=0,
                      limits=limits, sandbox="bwrap", data_root=data_root, group=GROUP)
    model = Model(ScriptedBackend(fake), retry=RetryPolicy(max_attempts=1))
    outcome = execute_run(spec, runs, models={"code": model}, grace_s=5.0)
    assert outcome.state in ("finished", "timed_out"), outcome.reason
    return outcome.run_dir


@pytest.fixture(scope="session")
def agent_runs(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """agent (sample-s0, sample-s1, aide, mcts, rdloop) -> its run folder, all in runs/g/."""
    if shutil.which("bwrap") is None and not os.environ.get("CI"):
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    fakes = load_fakes()
    runs = tmp_path_factory.mktemp("results-runs")
    made: dict[str, Path] = {}
    for seed in (0, 1):
        outcome = execute_run(build_spec(TASK, agent="sample", data_root=data_root, group=GROUP, seed=seed), runs)
        assert outcome.state == "finished", outcome.reason
        made[f"sample-s{seed}"] = outcome.run_dir
    marked = fakes.good(1.0) + HOSTILE_COMMENT
    made["aide"] = run_scripted("aide", [fakes.CRASH_SCRIPT, marked], {"num_drafts": 2, "debug_prob": 1.0},
                                Limits(time_limit_s=120, max_steps=5, exec_timeout_s=20), data_root, runs)
    made["mcts"] = run_scripted("mcts", [fakes.CRASH_SCRIPT, fakes.good(1.0)],
                                {"workers": 2, "num_drafts": 2, "max_nodes": 4},
                                Limits(time_limit_s=120, exec_timeout_s=20), data_root, runs)
    made["rdloop"] = run_scripted("rdloop", [fakes.CRASH_SCRIPT], {"max_nodes": 3},
                                  Limits(time_limit_s=120, exec_timeout_s=20), data_root, runs)
    return made


@pytest.fixture(scope="session")
def group_dir(agent_runs: dict[str, Path]) -> Path:
    return next(iter(agent_runs.values())).parent
