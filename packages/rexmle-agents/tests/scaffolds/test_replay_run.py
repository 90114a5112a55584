"""A recorded run replays exactly: `rexmle run --agent aide --model replay:CASSETTE` makes the same calls in the
same order, builds the same tree and submits the same predictions, offline."""

from __future__ import annotations

import json
from pathlib import Path

from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.runner import build_spec, execute_run
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import Model, RecordingBackend, RetryPolicy, ScriptedBackend
from rexmle_grade.cli import main

TASK = "ldct-iqa"
CONFIG = {"num_drafts": 2, "debug_prob": 1.0, "replayable": True}


def nodes(run_dir: Path) -> list[tuple]:
    summary = [e for e in Journal(run_dir / "journal.jsonl").events() if e["kind"] == "scaffold_summary"][-1]
    return [(n["node"], n.get("stage"), n.get("metric"), n.get("is_buggy")) for n in summary["nodes"]]


def test_a_recorded_aide_run_replays_exactly(data_root: Path, tmp_path: Path, fakes) -> None:
    cassette = tmp_path / "cassette.jsonl"
    fake = fakes.FakeModel([fakes.CRASH_SCRIPT, fakes.good(1.0)])
    recorded = Model(RecordingBackend(ScriptedBackend(fake), cassette), retry=RetryPolicy(max_attempts=1))
    limits = Limits(time_limit_s=120, max_steps=4, exec_timeout_s=20)
    spec = build_spec(TASK, agent="aide", agent_config=CONFIG, models={"code": "scripted/model"}, limits=limits,
                      data_root=data_root, group="record")
    first = execute_run(spec, tmp_path / "runs", models={"code": recorded})
    assert first.state == "finished" and first.grade is not None and first.grade.status == "valid"
    calls = len(cassette.read_text().splitlines())
    assert calls >= 4

    code = main(["--data-dir", str(data_root), "run", "--agent", "aide", "--task", TASK, "--model",
                 f"code=replay:{cassette}", "--agent-config", json.dumps(CONFIG), "--max-steps", "4",
                 "--time-limit", "120s", "--exec-timeout", "20s", "--runs-dir", str(tmp_path / "runs"),
                 "--group", "replay"])
    assert code == 0
    replayed_dir = next((tmp_path / "runs" / "replay").glob(f"{TASK}.aide.*"))
    replayed = json.loads((replayed_dir / "grade.json").read_text())
    assert nodes(replayed_dir) == nodes(first.run_dir)
    assert replayed["metrics"] == first.grade.metrics
    model_calls = [e for e in Journal(replayed_dir / "journal.jsonl").events() if e["kind"] == "model_call"]
    assert len(model_calls) == calls
    assert (replayed_dir / "final" / "best_solution.py").read_text() == (
        first.run_dir / "final" / "best_solution.py").read_text()
