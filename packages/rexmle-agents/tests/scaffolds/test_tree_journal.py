"""The search tree in the journal: a full state now and then, deltas of the changed nodes in between, folded back
exactly; so a long run's journal grows with its nodes, not with their square."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.spec import Limits
from rexmle_agents.scaffolds.engine import STATE_KEY
from rexmle_agents.scaffolds.tree import Tree
from rexmle_grade.errors import RexmleError


def test_deltas_fold_back_into_the_tree() -> None:
    tree = Tree()
    first = tree.new_node("draft")
    full = tree.to_state()
    second = tree.new_node("improve", parent=first.id)
    tree.knowledge.append({"hypothesis": "h", "metric": 0.5})
    delta = Tree.delta([tree[first.id].to_dict(), second.to_dict()], 0, list(tree.knowledge))
    assert Tree.from_states([full, delta]).to_state() == tree.to_state()
    # a later full state makes what came before it irrelevant
    assert Tree.from_states([{"format": 1, "delta": True, "nodes": []}, full]).to_state() == full
    with pytest.raises(RexmleError, match="no full state"):
        Tree.from_states([delta])
    assert len(Tree.from_states([])) == 0


def test_a_scaffold_journals_deltas_and_resumes_from_them(run_scaffold, fakes) -> None:
    fake = fakes.FakeModel([fakes.CRASH_SCRIPT, fakes.good(1.0)])
    outcome, _ = run_scaffold("aide", fake, config={"num_drafts": 2, "debug_prob": 1.0},
                              limits=Limits(time_limit_s=120, max_steps=5, exec_timeout_s=20))
    events = Journal(outcome.run_dir / "journal.jsonl").events()
    states = [e["state"] for e in events if e["kind"] == "agent_state" and e.get("key") == STATE_KEY]
    assert not states[0].get("delta") and all(s.get("delta") for s in states[1:])
    assert max(len(s["nodes"]) for s in states[1:]) <= 2  # a node and, at most, its parent's children list
    tree = Tree.from_states(states)
    assert len(tree.done) == 5
    largest_delta = max(len(json.dumps(s)) for s in states[1:])
    assert largest_delta < len(json.dumps(tree.to_state())) / 2


def test_the_result_loader_reads_the_folded_tree(run_scaffold, fakes) -> None:
    from rexmle_agents.results.loader import load_run
    from rexmle_agents.results.trajectory import trajectory

    fake = fakes.FakeModel([fakes.good(1.0)])
    outcome, _ = run_scaffold("aide", fake, config={"num_drafts": 1},
                              limits=Limits(time_limit_s=120, max_steps=3, exec_timeout_s=20))
    path = trajectory(load_run(Path(outcome.run_dir)))
    assert path.kind == "tree" and len(path.nodes) == 3
