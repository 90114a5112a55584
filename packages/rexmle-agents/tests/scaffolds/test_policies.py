"""The policies' choices on hand-made trees: greedy draft/debug/improve (seeded), MCTS selection and backup."""

from __future__ import annotations

import math

import pytest

from rexmle_agents.scaffolds.node import ExecSummary, Node, NodeStatus
from rexmle_agents.scaffolds.policies import Greedy, Mcts, RdLoop
from rexmle_agents.scaffolds.tree import Tree


def finished(tree: Tree, stage: str, parent: int | None = None, *, metric: float | None = None,
             lower_is_better: bool = False) -> Node:
    node = tree.new_node(stage, parent)
    node.status = NodeStatus.DONE.value
    node.code = "print(1)\n"
    node.execution = ExecSummary(exit_code=0 if metric is not None else 1, stopped_by=None, output_tail="",
                                 seconds=1.0)
    if metric is not None:
        node.is_buggy, node.metric, node.lower_is_better, node.submission_valid = False, metric, lower_is_better, True
        node.snapshot_id = f"snap{node.id}"
    return node


def greedy(**params: float) -> Greedy:
    return Greedy({**Greedy.defaults, **params}, seed=0)


def test_greedy_drafts_until_num_drafts_then_improves_the_best() -> None:
    tree = Tree()
    policy = greedy(num_drafts=2, debug_prob=0.0)
    assert policy.choose(tree) == ("draft", None)
    finished(tree, "draft", metric=0.5)
    assert policy.choose(tree) == ("draft", None)
    finished(tree, "draft", metric=0.7)
    assert policy.choose(tree) == ("improve", 1)


def test_greedy_debugs_buggy_leaves_within_the_depth_and_drafts_when_nothing_works() -> None:
    tree = Tree()
    policy = greedy(num_drafts=1, debug_prob=1.0, max_debug_depth=2)
    buggy = finished(tree, "draft")
    assert policy.choose(tree) == ("debug", buggy.id)
    deeper = finished(tree, "debug", buggy.id)
    assert deeper.debug_depth == 1 and policy.choose(tree) == ("debug", deeper.id)
    deepest = finished(tree, "debug", deeper.id)  # depth 2 = max: debugged once more, as AIDE's <= does
    assert policy.choose(tree) == ("debug", deepest.id)
    finished(tree, "debug", deepest.id)  # depth 3 > max: no more debugging, and nothing works yet
    assert policy.choose(tree) == ("draft", None)


def test_greedy_choice_is_seeded_and_mixes_debug_and_improve() -> None:
    def choices(seed: int) -> list[str]:
        out = []
        for size in range(40):
            tree = Tree()
            finished(tree, "draft", metric=0.5)
            finished(tree, "draft")
            for _ in range(size):
                tree.nodes[max(tree.nodes) + 1] = Node(id=max(tree.nodes) + 1, stage="improve", parent=0)
            out.append(Greedy({**Greedy.defaults, "num_drafts": 2, "debug_prob": 0.5}, seed=seed).choose(tree)[0])
        return out

    assert choices(3) == choices(3)
    assert {"debug", "improve"} == set(choices(3))
    assert choices(3) != choices(4)


def mcts(**params: float) -> Mcts:
    return Mcts({**Mcts.defaults, **params}, seed=0)


def test_mcts_backup_adds_rewards_along_the_path_and_rewards_improvement() -> None:
    tree = Tree()
    policy = mcts(reward_buggy=-1.0, reward_valid=1.0, reward_improved=1.0)
    root_child = finished(tree, "draft", metric=0.5)
    policy.backup(tree, root_child)
    worse = finished(tree, "improve", root_child.id, metric=0.4)
    policy.backup(tree, worse)
    better = finished(tree, "improve", worse.id, metric=0.9)
    policy.backup(tree, better)
    bug = finished(tree, "improve", better.id)
    policy.backup(tree, bug)
    assert [n.reward for n in tree] == [2.0, 1.0, 2.0, -1.0]
    assert (root_child.visits, root_child.value_sum) == (4, 4.0)
    assert (worse.visits, worse.value_sum) == (3, 2.0)
    assert (better.visits, better.value_sum) == (2, 1.0)
    assert (bug.visits, bug.value_sum) == (1, -1.0)


def test_mcts_lower_is_better_metrics_count_as_improvements_in_their_own_direction() -> None:
    tree = Tree()
    policy = mcts()
    first = finished(tree, "draft", metric=10.0, lower_is_better=True)
    policy.backup(tree, first)
    second = finished(tree, "draft", metric=5.0, lower_is_better=True)
    policy.backup(tree, second)
    assert second.reward == 2.0 and tree.best() is second


def test_mcts_selection_fills_caps_then_follows_uct() -> None:
    tree = Tree()
    policy = mcts(num_drafts=2, max_improve_children=1, max_debug_children=1, c_start=1.0, c_end=1.0)
    assert policy.select(tree) == ("draft", None)
    good = finished(tree, "draft", metric=0.8)
    policy.backup(tree, good)
    bad = finished(tree, "draft")
    policy.backup(tree, bad)
    # the root is full: UCT picks the rewarded child (Q=2 vs -1, same visits) and expands it by improving
    assert policy.select(tree) == ("improve", good.id)
    child = finished(tree, "improve", good.id, metric=0.6)
    policy.backup(tree, child)
    # good is full now; its only child is open (valid, no children), but bad's UCT: -1 + sqrt(ln 3) < good's
    q_good = good.value_sum / good.visits + math.sqrt(math.log(3) / good.visits)
    q_bad = -1 + math.sqrt(math.log(3) / 1)
    assert q_good > q_bad and policy.select(tree) == ("improve", child.id)


def test_mcts_exploration_decays_and_terminal_subtrees_are_skipped() -> None:
    policy = mcts(c_start=2.0, c_end=0.5, c_decay_nodes=10, num_drafts=1, max_debug_depth=1, max_debug_children=1)
    assert policy.exploration(0) == 2.0 and policy.exploration(5) == pytest.approx(1.25)
    assert policy.exploration(10) == policy.exploration(50) == 0.5
    tree = Tree()
    bug = finished(tree, "draft")
    policy.backup(tree, bug)
    assert policy.select(tree) == ("debug", bug.id)
    deep = finished(tree, "debug", bug.id)
    policy.backup(tree, deep)
    assert not policy.is_open(tree, bug)  # depth limit and child cap reached: nothing left below the root
    assert policy.select(tree) == ("draft", None)  # falls back to drafting when no node works


def test_mcts_a_stagnation_limit_of_one_ends_a_branch_after_one_failed_improvement() -> None:
    tree = Tree()
    draft = finished(tree, "draft", metric=0.5)
    assert not mcts(stagnation_limit=1).stagnant(tree, draft)  # no improvement tried yet
    finished(tree, "improve", draft.id, metric=0.4)
    assert mcts(stagnation_limit=1).stagnant(tree, draft)  # one of one failed: the branch is spent
    assert mcts(stagnation_limit=1).action(draft, tree) == (None, 0)
    finished(tree, "improve", draft.id, metric=0.7)
    assert not mcts(stagnation_limit=1).stagnant(tree, draft)  # the latest one beat it


def test_mcts_an_improvement_that_only_ties_fails_to_beat_its_parent() -> None:
    tree = Tree()
    draft = finished(tree, "draft", metric=0.5)
    finished(tree, "improve", draft.id, metric=0.5)
    assert mcts(stagnation_limit=1).stagnant(tree, draft)
    assert mcts(stagnation_limit=0).stagnant(tree, draft) is False  # 0 turns the rule off (a bool all the same)


def test_mcts_exploration_reaches_its_end_after_c_decay_nodes_even_when_that_is_one_or_zero() -> None:
    assert mcts(c_start=2.0, c_end=0.5, c_decay_nodes=1).exploration(1) == 0.5
    assert mcts(c_start=2.0, c_end=0.5, c_decay_nodes=0).exploration(0) == 2.0
    assert mcts(c_start=2.0, c_end=0.5, c_decay_nodes=0).exploration(1) == 0.5


def test_mcts_the_improvement_bonus_needs_a_score_above_the_best_backed_up_one() -> None:
    policy = mcts(reward_valid=1.0, reward_improved=1.0)
    tree = Tree()
    for metric in (0.5, 0.9):
        policy.backup(tree, finished(tree, "draft", metric=metric))
    between = finished(tree, "draft", metric=0.7)  # above the worst, below the best: no improvement
    tie = finished(tree, "draft", metric=0.9)  # equal to the best: no improvement either
    assert policy.reward(tree, between) == 1.0 and policy.reward(tree, tie) == 1.0
    assert policy.reward(tree, finished(tree, "draft", metric=0.95)) == 2.0


def test_mcts_an_improvement_still_in_flight_is_no_failed_try() -> None:
    tree = Tree()
    draft = finished(tree, "draft", metric=0.5)
    finished(tree, "improve", draft.id, metric=0.4)
    tree.new_node("improve", draft.id)  # dispatched to a worker, not finished: it has not failed yet
    assert not mcts(stagnation_limit=2).stagnant(tree, draft)


def test_mcts_a_node_still_in_flight_is_closed_and_says_so_with_a_bool() -> None:
    tree = Tree()
    pending = tree.new_node("draft", None)  # not done: selection cannot expand below it yet
    assert mcts().is_open(tree, pending) is False


def test_mcts_improvement_is_measured_against_nodes_already_backed_up_only() -> None:
    policy = mcts(reward_valid=1.0, reward_improved=1.0)
    tree = Tree()
    unrewarded = finished(tree, "draft", metric=0.9)  # finished by another worker, not backed up yet
    first = finished(tree, "draft", metric=0.5)
    assert unrewarded.reward is None and policy.reward(tree, first) == 2.0  # nothing backed up beats it
    policy.backup(tree, first)
    # backing a node up again (a resumed run) does not compare it with its own score
    assert policy.reward(tree, first) == 2.0


def test_rdloop_debugs_the_last_failure_then_improves_the_best() -> None:
    policy = RdLoop(RdLoop.defaults, seed=0)

    class Bench:
        tree = Tree()

    bench = Bench()
    assert policy.next_round(bench) == ("draft", None, "")
    failed = finished(bench.tree, "draft")
    failed.hypothesis = "H1"
    assert policy.next_round(bench) == ("debug", failed.id, "H1")
    fixed = finished(bench.tree, "debug", failed.id, metric=0.3)
    assert policy.next_round(bench) == ("improve", fixed.id, "")
