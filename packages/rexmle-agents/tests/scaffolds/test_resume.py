"""A run whose harness is SIGKILLed mid-search resumes with its tree: no finished node is lost or redone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rexmle_agents.harness.journal import Journal
from rexmle_agents.scaffolds.engine import STATE_KEY
from rexmle_agents.scaffolds.tree import Tree

DRIVER = textwrap.dedent('''
    import importlib.util, sys
    from pathlib import Path
    from rexmle_agents.harness.runner import build_spec, execute_run
    from rexmle_agents.harness.spec import Limits
    from rexmle_agents.models import Model, RetryPolicy, ScriptedBackend

    fakes_path, data_root, runs_dir, agent = sys.argv[1:5]
    spec = importlib.util.spec_from_file_location("scaffold_fakes", fakes_path)
    fakes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fakes)
    fake = fakes.FakeModel([fakes.CRASH_SCRIPT, fakes.good(1.0)])
    run_spec = build_spec("ldct-iqa", agent=agent, agent_config={"num_drafts": 3}, models={"code": "scripted/model"},
                          seed=0, limits=Limits(time_limit_s=300, max_steps=6, exec_timeout_s=20), sandbox="bwrap",
                          data_root=data_root, group="test")
    outcome = execute_run(run_spec, runs_dir, models={"code": Model(ScriptedBackend(fake),
                                                                    retry=RetryPolicy(max_attempts=1))})
    print("OUTCOME", outcome.state, outcome.run_dir, flush=True)
''')


def _saved_tree(journal: Path) -> Tree:
    return Tree.from_journal(Journal(journal).iter_events(), STATE_KEY)


@pytest.mark.parametrize("agent", ["aide", pytest.param("mcts", marks=pytest.mark.slow)])
def test_a_killed_run_resumes_without_losing_a_finished_node(agent: str, data_root: Path, tmp_path: Path) -> None:
    driver = tmp_path / "drive.py"
    driver.write_text(DRIVER)
    runs = tmp_path / "runs"
    argv = [sys.executable, str(driver), str(Path(__file__).with_name("fakes.py")), str(data_root), str(runs), agent]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    first = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    journal: Path | None = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = list(runs.glob("test/*/journal.jsonl"))
        if found:
            journal = found[0]
            if len(_saved_tree(journal).done) >= 3:
                break
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert journal is not None
    before = _saved_tree(journal).done
    assert len(before) >= 3

    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stdout + second.stderr
    after = _saved_tree(journal)
    assert not after.pending
    for node in before:  # every node finished before the kill is still there, unchanged
        kept = after[node.id]
        assert (kept.code, kept.metric, kept.is_buggy, kept.snapshot_id) == (
            node.code, node.metric, node.is_buggy, node.snapshot_id)
    kinds = [e["kind"] for e in Journal(journal).iter_events()]
    assert "run_resumed" in kinds
    status = json.loads((journal.parent / "status.json").read_text())
    assert status["state"] == "finished" and status["limit"] == "steps"
    assert len(after.done) >= len(before) and (journal.parent / "final" / "best_solution.py").is_file()
