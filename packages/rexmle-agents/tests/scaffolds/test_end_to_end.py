"""Each preset end to end through the real harness, in bubblewrap, on a synthetic task, with a scripted model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.spec import Limits
from rexmle_agents.scaffolds.engine import STATE_KEY
from rexmle_agents.scaffolds.tree import Tree


def tree_of(run_dir: Path) -> Tree:
    return Tree.from_journal(Journal(run_dir / "journal.jsonl").iter_events(), STATE_KEY)


def events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in Journal(run_dir / "journal.jsonl").iter_events() if e["kind"] == kind]


def assert_submitted_best(outcome: Any, tree: Tree) -> None:
    best = tree.best()
    assert best is not None
    final = json.loads((outcome.run_dir / "final" / "metadata.json").read_text())
    assert final["snapshot"] == best.snapshot_id
    assert (outcome.run_dir / "final" / "best_solution.py").read_text() == best.code
    assert outcome.grade is not None and outcome.grade.valid_submission and outcome.grade.metrics


def test_aide_recovers_from_a_crash_and_a_timeout_within_its_step_budget(run_scaffold, fakes) -> None:
    fake = fakes.FakeModel([fakes.CRASH_SCRIPT, fakes.SLOW_SCRIPT, fakes.good(1.0)])
    outcome, fake = run_scaffold("aide", fake, config={"num_drafts": 3, "debug_prob": 1.0},
                                 limits=Limits(time_limit_s=120, max_steps=6, exec_timeout_s=8))
    assert (outcome.state, outcome.limit) == ("finished", "steps")
    tree = tree_of(outcome.run_dir)
    assert len(tree.done) == 6 and len(events(outcome.run_dir, "step_finished")) == 6
    crashed, slow, drafted = tree[0], tree[1], tree[2]
    assert crashed.is_buggy and crashed.execution.exit_code == 1 and "RuntimeError" in crashed.execution.output_tail
    assert slow.is_buggy and slow.execution.stopped_by == "timeout" and slow.execution.seconds < 15
    assert drafted.is_valid
    debugged = [n for n in tree if n.stage == "debug"]
    assert debugged and all(n.is_valid for n in debugged)
    assert {n.parent for n in debugged} <= {0, 1}
    assert_submitted_best(outcome, tree)
    summary = events(outcome.run_dir, "scaffold_summary")[-1]["nodes"]
    assert [n["node"] for n in summary] == list(range(6))


def test_mcts_expands_in_parallel_workers_and_debugs(run_scaffold, fakes) -> None:
    fake = fakes.FakeModel([fakes.CRASH_SCRIPT, fakes.good(1.0)])
    outcome, fake = run_scaffold("mcts", fake, config={"workers": 2, "num_drafts": 2, "max_nodes": 6},
                                 limits=Limits(time_limit_s=120, exec_timeout_s=10))
    assert outcome.state == "finished", outcome.reason
    tree = tree_of(outcome.run_dir)
    assert len(tree.done) == 6 and not tree.pending
    assert {n.worker for n in tree} == {0, 1}
    # the two drafts ask the model at the same time: whichever got the crashing script is debugged
    buggy = [n.id for n in tree if n.stage == "draft" and n.is_buggy]
    assert buggy and any(n.stage == "debug" and n.parent in buggy for n in tree)
    assert any(n.stage == "improve" for n in tree)
    # every finished node was backed up to the root exactly once
    assert sum(n.visits for n in tree if n.parent is None) == 6
    assert_submitted_best(outcome, tree)


def test_rdloop_runs_a_sample_first_and_keeps_a_knowledge_log(run_scaffold, fakes) -> None:
    fake = fakes.FakeModel([fakes.CRASH_SCRIPT])
    # the policy's own mechanics: no review rounds, the best chosen by the metric (the preset's R&D-Agent
    # mechanisms are tested in test_issue21_mechanisms.py)
    config = {"max_nodes": 3, "coding_rounds": 1, "feedback_decides_best": False}
    outcome, fake = run_scaffold("rdloop", fake, config=config, limits=Limits(time_limit_s=120, exec_timeout_s=10))
    assert outcome.state == "finished", outcome.reason
    tree = tree_of(outcome.run_dir)
    assert [n.stage for n in tree] == ["draft", "debug", "improve"]
    assert tree[0].is_buggy and tree[0].sample_execution is not None and tree[0].execution is None
    assert tree[1].hypothesis == tree[0].hypothesis and tree[1].is_valid
    assert all(n.sample_execution.ok for n in (tree[1], tree[2]))
    assert len(tree.knowledge) == 2 and tree.knowledge[0]["outcome"] == "worked"  # the crash was debugged, not logged
    names = [e["name"] for e in events(outcome.run_dir, "exec_finished")]
    assert any(name.endswith("node1-sample") for name in names) and any(name.endswith("node1") for name in names)
    assert fake.counts["hypothesise"] == 2 and fake.counts["feedback"] == 2, fake.counts
    assert_submitted_best(outcome, tree)


def test_time_limit_ends_the_run_with_the_best_node_submitted(run_scaffold, fakes) -> None:
    fake = fakes.FakeModel([fakes.good(1.0), fakes.SLOW_SCRIPT])
    outcome, _ = run_scaffold("aide", fake, config={"num_drafts": 50},
                              limits=Limits(time_limit_s=6, exec_timeout_s=60))
    assert (outcome.state, outcome.limit) == ("timed_out", "time")
    assert outcome.seconds < 6 + 5
    tree = tree_of(outcome.run_dir)
    assert tree[0].is_valid and all(n.is_buggy or not n.done for n in list(tree)[1:])
    assert_submitted_best(outcome, tree)


@pytest.mark.slow
def test_a_scripted_twenty_node_aide_run_completes_and_grades(run_scaffold, fakes) -> None:
    """Its time is tools/bench_scaffolds.py's figure (target: under 2 minutes on 2 cores)."""
    fake = fakes.FakeModel([fakes.CRASH_SCRIPT, fakes.good(1.0)])
    outcome, _ = run_scaffold("aide", fake, config={"num_drafts": 4}, limits=Limits(time_limit_s=600, max_steps=20,
                                                                                  exec_timeout_s=30))
    assert len(tree_of(outcome.run_dir).done) == 20 and outcome.grade is not None and outcome.grade.valid_submission


def test_one_worker_mcts_develops_each_node_inside_its_own_step(run_scaffold, fakes) -> None:
    """The paper's default is one worker: the serial loop runs each node's scripts inside the node's step (a crash
    then leaves that step open, to be redone on resume); the worker pool journals a node only once it is done."""
    outcome, _ = run_scaffold("mcts", fakes.FakeModel([fakes.good(0.5)]),
                              config={"workers": 1, "num_drafts": 2, "max_nodes": 3},
                              limits=Limits(time_limit_s=120, exec_timeout_s=10))
    assert outcome.state == "finished", outcome.reason
    open_step: int | None = None
    executions = 0
    for event in Journal(outcome.run_dir / "journal.jsonl").iter_events():
        if event["kind"] == "step_started":
            open_step = event["step"]
        elif event["kind"] in ("step_finished", "step_interrupted"):
            open_step = None
        elif event["kind"] == "exec_started":
            executions += 1
            assert open_step is not None, f"{event['name']} ran outside a node's step"
    assert executions >= 3 and len(tree_of(outcome.run_dir).done) == 3
