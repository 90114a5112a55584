"""The policies' run loops on the real workbench with a scripted context (no sandbox, no model): which nodes get
made, redone, backed up, recorded and saved, and how the node and step limits and worker errors end a run."""

from __future__ import annotations

import contextlib
import copy
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from rexmle_agents.scaffolds.engine import STATE_KEY, Settings, Workbench
from rexmle_agents.scaffolds.node import ExecSummary, Node, NodeStatus
from rexmle_agents.scaffolds.policies import Greedy, Mcts, RdLoop
from rexmle_agents.scaffolds.tree import Tree
from rexmle_grade.errors import BudgetExceededError


@dataclass
class FakeStep:
    number: int
    kind: str
    info: dict[str, Any]
    result: dict[str, Any] = field(default_factory=dict)


class FakeContext:
    """What the workbench and the policies use of a run context: steps counted against a step limit (a step that
    cannot start raises ``BudgetExceededError``, like the harness), saved states, final choices, journal events."""

    def __init__(self, *, max_steps: int | None = None, exec_timeout_s: float = 600.0) -> None:
        self.spec = SimpleNamespace(limits=SimpleNamespace(max_steps=max_steps, exec_timeout_s=exec_timeout_s,
                                                           time_limit_s=3600.0))
        self.instructions = "the task"
        self.steps: list[FakeStep] = []
        self.saved: list[dict[str, Any]] = []
        self.selected: list[str] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.journal = SimpleNamespace(append=lambda kind, **data: self.events.append((kind, data)))
        self.current_step: FakeStep | None = None

    @property
    def steps_done(self) -> int:
        return len(self.steps)

    def remaining(self) -> SimpleNamespace:
        limit = self.spec.limits.max_steps
        return SimpleNamespace(steps=None if limit is None else max(0, limit - self.steps_done))

    @contextlib.contextmanager
    def step(self, kind: str, **info: Any) -> Iterator[FakeStep]:
        limit = self.spec.limits.max_steps
        if limit is not None and self.steps_done >= limit:
            raise BudgetExceededError(f"step limit reached: {self.steps_done} of {limit} steps done")
        if self.current_step is not None:
            raise RuntimeError("steps do not nest")
        step = FakeStep(self.steps_done + 1, kind, dict(info))
        self.current_step = step
        try:
            yield step
        finally:
            self.current_step = None
            self.steps.append(step)

    def save_state(self, state: Any, *, key: str = "agent") -> None:
        assert key == STATE_KEY
        self.saved.append(copy.deepcopy(state))

    def select_final(self, snapshot_id: str, *, reason: str = "") -> None:
        self.selected.append(snapshot_id)


Outcome = Callable[[Node], "float | None"]


class ScriptedBench(Workbench):
    """The real workbench, but developing a node asks ``outcome(node)``: a metric (a valid node), None (a buggy
    one), or an exception (raised from the worker)."""

    def __init__(self, ctx: FakeContext, outcome: Outcome, *, workers: int = 1, max_nodes: int | None = None,
                 tree: Tree | None = None, operators: dict[str, Any] | None = None) -> None:
        super().__init__(ctx, Settings(workers=workers, max_nodes=max_nodes), operators or {}, tree or Tree())  # type: ignore[arg-type]
        self.outcome = outcome
        self.developed: list[tuple[int, str, int | None]] = []
        self.workers_used: list[int] = []
        self._lock = threading.Lock()

    def develop(self, node: Node, *, worker: int = 0) -> None:
        with self._lock:
            self.developed.append((node.id, node.stage, node.parent))
            self.workers_used.append(worker)
        node.code = f"print({node.id})\n"
        metric = self.outcome(node)
        if metric is None:
            node.is_buggy, node.bug_reason = True, "it failed"
        else:
            node.is_buggy, node.metric, node.submission_valid = False, metric, True
            node.lower_is_better = False
            node.snapshot_id = f"snap{node.id}"


def by_id(values: dict[int, float | None], default: float | None = 0.5) -> Outcome:
    return lambda node: values.get(node.id, default)


def saved_tree(ctx: FakeContext, index: int = -1) -> Tree:
    """The tree as saved up to the ``index``-th save (full states and deltas folded)."""
    return Tree.from_states(ctx.saved[: len(ctx.saved) if index == -1 else index + 1])


def node_steps(ctx: FakeContext) -> list[int]:
    return [s.info["node"] for s in ctx.steps if s.kind == "node"]


# ---- what every loop shares ------------------------------------------------------------------------------------

POLICIES = {
    "greedy": lambda: Greedy({**Greedy.defaults, "num_drafts": 2, "debug_prob": 0.5}, seed=0),
    "mcts": lambda: Mcts({**Mcts.defaults, "num_drafts": 2}, seed=0),
    "mcts-parallel": lambda: Mcts({**Mcts.defaults, "num_drafts": 2}, seed=0),
}


def bench_for(name: str, ctx: FakeContext, outcome: Outcome, **kwargs: Any) -> ScriptedBench:
    return ScriptedBench(ctx, outcome, workers=2 if name == "mcts-parallel" else 1, **kwargs)


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_run_stops_after_max_nodes_with_every_node_done_and_recorded(name: str) -> None:
    ctx = FakeContext()
    bench = bench_for(name, ctx, by_id({1: None}), max_nodes=5)
    POLICIES[name]().run(bench)
    assert len(bench.tree) == 5 and len(bench.tree.done) == 5
    assert sorted(node_steps(ctx)) == [0, 1, 2, 3, 4]  # one harness step per node
    assert all(bench.tree[s.info["node"]].step == s.number for s in ctx.steps)
    assert [n.stage for n in bench.tree][:2] == ["draft", "draft"]


@pytest.mark.parametrize("name", list(POLICIES))
def test_the_tree_is_saved_after_every_node(name: str) -> None:
    ctx = FakeContext()
    bench = bench_for(name, ctx, by_id({}), max_nodes=4)
    POLICIES[name]().run(bench)
    # for every node: a saved state shows it pending (before its work) and a later one shows it done
    for node_id in range(4):
        states = [saved_tree(ctx, i) for i in range(len(ctx.saved))]
        pending = [i for i, t in enumerate(states) if node_id in t.nodes and not t[node_id].done]
        done = [i for i, t in enumerate(states) if node_id in t.nodes and t[node_id].done]
        assert pending and done and min(pending) < min(done)
    final = saved_tree(ctx)
    assert [n.to_dict() for n in final] == [n.to_dict() for n in bench.tree]


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_node_interrupted_by_a_crash_is_redone_first_on_resume(name: str) -> None:
    tree = Tree()
    draft = tree.new_node("draft")
    draft.status, draft.is_buggy, draft.metric, draft.submission_valid = NodeStatus.DONE.value, False, 0.4, True
    draft.snapshot_id, draft.visits, draft.value_sum, draft.reward = "snap0", 1, 2.0, 2.0
    interrupted = tree.new_node("improve", parent=0)
    interrupted.code, interrupted.worker = "half-written", 1 if name == "mcts-parallel" else 0
    ctx = FakeContext()
    bench = bench_for(name, ctx, by_id({}), tree=Tree.from_state(tree.to_state()), max_nodes=3)
    POLICIES[name]().run(bench)
    assert bench.developed[0] == (1, "improve", 0)  # the same node, before anything new
    assert [d[0] for d in bench.developed].count(1) == 1
    redone = bench.tree[1]
    assert redone.done and redone.code == "print(1)\n" and redone.parent == 0
    assert bench.tree[0].children == [1, 2] or bench.tree[0].children == [1]
    assert len(bench.tree.done) == 3 and node_steps(ctx)[0] == 1


@pytest.mark.parametrize("name", ["greedy", "mcts"])
def test_the_step_limit_ends_a_serial_run_between_nodes(name: str) -> None:
    ctx = FakeContext(max_steps=3)
    bench = bench_for(name, ctx, by_id({}))
    with pytest.raises(BudgetExceededError, match="step limit"):
        POLICIES[name]().run(bench)
    assert len(bench.tree) == 3 and len(bench.tree.done) == 3  # no node is created for a step that cannot start


# ---- MCTS -------------------------------------------------------------------------------------------------------


def mcts(**params: Any) -> Mcts:
    return Mcts({**Mcts.defaults, **params}, seed=0)


def test_the_one_worker_mcts_loop_backs_up_every_node_and_expands_by_uct() -> None:
    ctx = FakeContext()
    values = {0: 0.3, 1: None, 2: 0.5, 3: 0.6}
    bench = ScriptedBench(ctx, by_id(values, default=0.1), max_nodes=6)
    mcts(num_drafts=2, max_improve_children=2, c_start=1.0, c_end=1.0).run(bench)
    assert bench.workers_used == [0] * 6
    assert [(n.id, n.stage, n.parent) for n in bench.tree] == [
        (0, "draft", None), (1, "draft", None),  # the root's two drafts
        (2, "improve", 0), (3, "improve", 0),  # the working draft beats the buggy one by UCT, up to its cap
        (4, "improve", 2),  # children 2 and 3 tie on UCT: the earlier one is taken
        (5, "improve", 3),  # now 2 is visited twice with a lower mean (1.5 vs 2): 3 leads
    ]
    assert [n.reward for n in bench.tree] == [2.0, -1.0, 2.0, 2.0, 1.0, 1.0]
    root_children = [n for n in bench.tree if n.parent is None]
    assert sum(n.visits for n in root_children) == 6  # every node's reward reached the top of its path
    assert (bench.tree[0].visits, bench.tree[0].value_sum) == (5, 8.0)
    assert (bench.tree[2].visits, bench.tree[2].value_sum) == (2, 3.0)
    assert ctx.selected == ["snap0", "snap2", "snap3"]  # each new best is submitted when it appears


def test_with_equal_mean_values_mcts_prefers_the_less_visited_child() -> None:
    policy = mcts(num_drafts=2, max_improve_children=1, c_start=1.0, c_end=1.0)
    tree = Tree()
    drafts = [tree.new_node("draft") for _ in range(2)]
    for draft, visits in zip(drafts, (4, 2), strict=True):
        draft.status, draft.is_buggy, draft.metric, draft.submission_valid = NodeStatus.DONE.value, False, 0.5, True
        draft.visits, draft.value_sum = visits, 1.5 * visits  # the same mean value, 1.5
        child = tree.new_node("improve", draft.id)  # its one improve slot is taken: selection descends below it
        child.status, child.visits, child.value_sum = NodeStatus.DONE.value, visits - 1, -1.0 * (visits - 1)
    assert policy.select(tree) == ("debug", drafts[1].children[0])  # the buggy child under the less-visited draft


def test_exploration_can_outweigh_a_better_mean_value() -> None:
    policy = mcts()
    good = Node(id=0, stage="draft", visits=9, value_sum=9 * 0.5)
    rare = Node(id=1, stage="draft", visits=1, value_sum=0.3)
    assert policy.uct(rare, 10, 1.414) > policy.uct(good, 10, 1.414)
    assert policy.uct(rare, 10, 0.0) < policy.uct(good, 10, 0.0)
    expected = 0.3 + 1.414 * math.sqrt(math.log(10) / 1)
    assert policy.uct(rare, 10, 1.414) == pytest.approx(expected)
    assert policy.uct(Node(id=2, stage="draft"), 10, 1.414) == math.inf  # an unvisited child comes first
    assert policy.uct(rare, 0, 2.0) == pytest.approx(0.3)  # ln of fewer than one visit counts as ln 1


def test_in_flight_nodes_are_closed_to_selection() -> None:
    policy = mcts(num_drafts=1, max_improve_children=1)
    tree = Tree()
    draft = tree.new_node("draft")
    draft.status, draft.is_buggy, draft.metric, draft.submission_valid = NodeStatus.DONE.value, False, 0.5, True
    draft.visits, draft.value_sum = 1, 2.0
    in_flight = tree.new_node("improve", 0)  # pending: being developed by a worker
    assert not policy.is_open(tree, in_flight)
    assert not policy.is_open(tree, draft)  # its one improve slot is taken by the node in flight
    assert policy.select(tree) == ("improve", 0)  # nothing open: keep working from the best node


def test_a_buggy_node_is_debugged_up_to_its_cap_and_depth() -> None:
    policy = mcts(max_debug_children=2, max_debug_depth=1)
    buggy = Node(id=0, stage="draft", status=NodeStatus.DONE.value)
    assert policy.action(buggy) == ("debug", 2)
    assert policy.action(Node(id=1, stage="debug", status=NodeStatus.DONE.value, debug_depth=1)) == (None, 0)
    assert policy.action(None) == ("draft", policy.p["num_drafts"])
    valid = Node(id=2, stage="draft", status=NodeStatus.DONE.value, is_buggy=False, metric=1.0,
                 submission_valid=True)
    assert policy.action(valid) == ("improve", policy.p["max_improve_children"])


def test_parallel_workers_develop_nodes_at_once_and_each_finished_node_is_one_step() -> None:
    ctx = FakeContext()
    started = threading.Barrier(2, timeout=10)

    def outcome(node: Node) -> float:
        if node.id < 2:
            started.wait()  # both first nodes are in flight together
        return 0.1 * (node.id + 1)

    bench = ScriptedBench(ctx, outcome, workers=2, max_nodes=4)
    mcts(num_drafts=2).run(bench)
    assert sorted(bench.workers_used[:2]) == [0, 1]
    assert sorted(node_steps(ctx)) == [0, 1, 2, 3]
    assert all(s.kind == "node" and s.info["worker"] == bench.tree[s.info["node"]].worker for s in ctx.steps)
    assert all(n.reward is not None for n in bench.tree)
    assert all(s.result["node"] == s.info["node"] for s in ctx.steps)


def test_parallel_mcts_never_exceeds_max_nodes_counting_nodes_in_flight() -> None:
    ctx = FakeContext()
    bench = ScriptedBench(ctx, by_id({}), workers=3, max_nodes=2)
    mcts(num_drafts=5).run(bench)
    assert len(bench.tree) == 2 and len(bench.tree.done) == 2


def test_parallel_mcts_dispatches_no_more_nodes_than_steps_left_and_then_reports_the_step_limit() -> None:
    ctx = FakeContext(max_steps=3)
    bench = ScriptedBench(ctx, by_id({}), workers=2)
    with pytest.raises(BudgetExceededError, match="step limit reached: 3 of 3 steps done"):
        mcts(num_drafts=5).run(bench)
    assert len(bench.tree) == 3 and len(bench.tree.done) == 3 and len(ctx.steps) == 3


def test_parallel_mcts_ends_quietly_when_the_last_step_makes_the_last_node() -> None:
    ctx = FakeContext(max_steps=3)
    bench = ScriptedBench(ctx, by_id({}), workers=2, max_nodes=3)
    mcts(num_drafts=5).run(bench)  # the node limit is reached with the step limit: no budget error
    assert len(bench.tree.done) == 3


def test_an_error_raised_in_a_worker_fails_the_run_and_the_node_stays_to_be_redone() -> None:
    ctx = FakeContext()

    def outcome(node: Node) -> float:
        if node.id == 1:
            raise ZeroDivisionError("a bug in the worker")
        return 0.5

    bench = ScriptedBench(ctx, outcome, workers=2, max_nodes=6)
    with pytest.raises(ZeroDivisionError, match="a bug in the worker"):
        mcts(num_drafts=3).run(bench)
    assert not bench.tree[1].done
    assert 1 not in node_steps(ctx)
    assert 1 in saved_tree(ctx).nodes and not saved_tree(ctx)[1].done  # saved pending: a resume redoes it


def test_a_budget_error_in_a_worker_lets_the_nodes_in_flight_finish_then_stops() -> None:
    ctx = FakeContext()
    first_failed = threading.Event()

    def outcome(node: Node) -> float:
        if node.id == 0:
            first_failed.set()
            raise BudgetExceededError("token budget spent")
        assert first_failed.wait(timeout=10)
        return 0.5

    bench = ScriptedBench(ctx, outcome, workers=2, max_nodes=10)
    with pytest.raises(BudgetExceededError, match="token budget spent"):
        mcts(num_drafts=3).run(bench)
    assert len(bench.tree) == 2  # nothing new is dispatched once the budget is spent
    assert node_steps(ctx) == [1] and bench.tree[1].done and not bench.tree[0].done


def test_parallel_workers_are_numbered_and_reused() -> None:
    ctx = FakeContext()
    bench = ScriptedBench(ctx, by_id({}), workers=2, max_nodes=5)
    mcts(num_drafts=5).run(bench)
    assert set(bench.workers_used) == {0, 1}
    assert {n.worker for n in bench.tree} == {0, 1}


# ---- the R&D loop ------------------------------------------------------------------------------------------------


@dataclass
class Feedback:
    observations: str
    lesson: str


class ResearchBench(ScriptedBench):
    """Operators and script runs of the R&D loop, scripted: ``script(node)`` says how the sample and the full run
    of a node go (``"ok"``, ``"sample fails"``, or a metric through ``outcome``)."""

    def __init__(self, ctx: FakeContext, outcome: Outcome, *, sample: Callable[[Node], bool] = lambda n: True,
                 hypothesise: bool = True, write_code: bool = True, feedback: bool = True, **kwargs: Any) -> None:
        operators = {"hypothesise": self._hypothesise, "draft": self._code, "improve": self._code,
                     "debug": self._code, "feedback": self._feedback}
        super().__init__(ctx, outcome, operators=operators, **kwargs)
        self.sample, self.hypothesise_ok, self.write_code, self.feedback_on = sample, hypothesise, write_code, feedback
        self.calls: list[str] = []
        self.sample_timeouts: list[float | None] = []

    def _hypothesise(self, bench: Workbench, node: Node) -> bool:
        self.calls.append(f"hypothesise {node.id}")
        if self.hypothesise_ok:
            node.hypothesis = f"H{node.id}\nwhy it may work"
        return self.hypothesise_ok

    def _code(self, bench: Workbench, node: Node) -> bool:
        self.calls.append(f"{node.stage} {node.id}")
        if self.write_code:
            node.code, node.plan = f"print({node.id})\n", f"plan {node.id}"
        return self.write_code

    def _feedback(self, bench: Workbench, node: Node) -> Feedback | None:
        self.calls.append(f"feedback {node.id}")
        return Feedback(f"saw {node.id}", f"lesson {node.id}") if self.feedback_on else None

    def run_script(self, node: Node, *, worker: int = 0, sample: bool = False,
                   timeout_s: float | None = None) -> ExecSummary:
        assert sample
        self.calls.append(f"sample {node.id}")
        self.sample_timeouts.append(timeout_s)
        ok = self.sample(node)
        return ExecSummary(exit_code=0 if ok else 1, stopped_by=None, output_tail="", seconds=1.0)

    def evaluate(self, node: Node, *, worker: int = 0) -> None:
        self.calls.append(f"evaluate {node.id}")
        metric = self.outcome(node)
        if metric is None:
            node.is_buggy, node.bug_reason = True, "the full run failed"
        else:
            node.is_buggy, node.metric, node.submission_valid, node.snapshot_id = False, metric, True, f"s{node.id}"

    def develop(self, node: Node, *, worker: int = 0) -> None:  # the R&D loop develops through its own steps
        raise AssertionError("RdLoop calls its own develop")


def rdloop(**params: Any) -> RdLoop:
    return RdLoop({**RdLoop.defaults, **params}, seed=0)


def test_a_round_hypothesises_codes_runs_a_sample_then_the_full_run_then_asks_for_feedback() -> None:
    ctx = FakeContext(exec_timeout_s=120.0)
    bench = ResearchBench(ctx, by_id({}, default=0.7), max_nodes=1)
    rdloop(sample_timeout_s=300.0).run(bench)
    assert bench.sample_runs is True
    assert bench.calls == ["hypothesise 0", "draft 0", "sample 0", "evaluate 0", "feedback 0"]
    assert bench.sample_timeouts == [120.0]  # the smaller of the sample limit and the execution limit
    node = bench.tree[0]
    assert node.analysis == "feedback: saw 0" and node.lesson == "lesson 0"
    assert bench.tree.knowledge == [{"node": 0, "hypothesis": "H0", "outcome": "worked", "metric": 0.7,
                                     "lesson": "lesson 0"}]


def test_without_a_sample_run_the_full_run_comes_straight_after_the_code() -> None:
    ctx = FakeContext()
    bench = ResearchBench(ctx, by_id({}), feedback=False, max_nodes=1)
    rdloop(sample_first=False, sample_timeout_s=5.0).run(bench)
    assert bench.sample_runs is False
    assert bench.calls == ["hypothesise 0", "draft 0", "evaluate 0", "feedback 0"]
    assert bench.tree[0].lesson == "" and bench.tree[0].analysis == ""


def test_a_failed_sample_run_makes_the_round_buggy_without_the_full_run() -> None:
    ctx = FakeContext(exec_timeout_s=600.0)
    bench = ResearchBench(ctx, by_id({}), sample=lambda n: False, max_nodes=1)
    rdloop(sample_timeout_s=30.0).run(bench)
    assert bench.calls == ["hypothesise 0", "draft 0", "sample 0"]
    assert bench.sample_timeouts == [30.0]
    node = bench.tree[0]
    assert node.is_buggy and node.bug_reason.startswith("the run on a data sample failed: exit status 1")


@pytest.mark.parametrize(("hypothesise", "write_code", "calls"), [
    (False, True, ["hypothesise 0"]),
    (True, False, ["hypothesise 0", "draft 0"]),
])
def test_a_round_stops_where_its_operator_fails(hypothesise: bool, write_code: bool, calls: list[str]) -> None:
    ctx = FakeContext()
    bench = ResearchBench(ctx, by_id({}), hypothesise=hypothesise, write_code=write_code, max_nodes=1)
    rdloop().run(bench)
    assert bench.calls == calls and bench.tree[0].done and bench.tree[0].is_buggy


def test_a_failed_round_is_debugged_with_its_hypothesis_then_recorded_once_settled() -> None:
    ctx = FakeContext()
    bench = ResearchBench(ctx, by_id({0: None, 1: None, 2: 0.4, 3: 0.3, 4: 0.9}), max_nodes=5)
    rdloop(max_debug_depth=2).run(bench)
    stages = [(n.id, n.stage, n.parent, n.debug_depth) for n in bench.tree]
    assert stages == [(0, "draft", None, 0), (1, "debug", 0, 1), (2, "debug", 1, 2), (3, "improve", 2, 0),
                      (4, "improve", 2, 0)]
    assert bench.tree[1].hypothesis == bench.tree[2].hypothesis == "H0\nwhy it may work"
    assert "hypothesise 1" not in bench.calls and "hypothesise 3" in bench.calls  # carried, not asked again
    # rounds 0 and 1 were still being debugged: only settled rounds enter the knowledge log
    assert [(e["node"], e["outcome"]) for e in bench.tree.knowledge] == [(2, "worked"), (3, "no gain"),
                                                                          (4, "worked")]


def test_a_round_that_fails_with_no_debugging_left_is_recorded_as_failed() -> None:
    ctx = FakeContext()
    bench = ResearchBench(ctx, by_id({}, default=None), max_nodes=2)
    rdloop(max_debug_depth=1).run(bench)
    assert [(n.stage, n.debug_depth) for n in bench.tree] == [("draft", 0), ("debug", 1)]
    assert bench.tree.knowledge == [{"node": 1, "hypothesis": "H0", "outcome": "failed", "metric": None,
                                     "lesson": "lesson 1"}]


def test_a_round_failing_at_the_debug_depth_limit_is_left_and_the_next_round_improves_the_best() -> None:
    ctx = FakeContext()
    bench = ResearchBench(ctx, by_id({0: 0.5}, default=None), max_nodes=4)
    rdloop(max_debug_depth=1).run(bench)
    assert [(n.id, n.stage, n.parent, n.debug_depth) for n in bench.tree] == [
        (0, "draft", None, 0), (1, "improve", 0, 0), (2, "debug", 1, 1), (3, "improve", 0, 0)]


def test_a_failed_round_without_code_is_not_debugged() -> None:
    ctx = FakeContext()
    bench = ResearchBench(ctx, by_id({}), write_code=False, max_nodes=2)
    rdloop().run(bench)
    assert [n.stage for n in bench.tree] == ["draft", "draft"]
    assert [e["outcome"] for e in bench.tree.knowledge] == ["failed", "failed"]
    assert bench.tree.knowledge[0]["lesson"] == "" and bench.tree.knowledge[0]["hypothesis"] == "H0"


def test_the_knowledge_log_falls_back_on_the_plan_and_the_failure_reason() -> None:
    ctx = FakeContext()
    bench = ResearchBench(ctx, by_id({}, default=None), sample=lambda n: False, max_nodes=1)
    bench.tree = Tree()
    policy = rdloop(max_debug_depth=0)
    node = bench.tree.new_node("draft")
    node.status, node.plan, node.bug_reason, node.code = NodeStatus.DONE.value, "p" * 300, "it broke", "x"
    policy.record(bench, node)
    assert bench.tree.knowledge == [{"node": 0, "hypothesis": "p" * 200, "outcome": "failed", "metric": None,
                                     "lesson": "it broke"}]


def test_without_a_lesson_or_a_failure_reason_the_knowledge_log_keeps_the_start_of_the_analysis() -> None:
    bench = ResearchBench(FakeContext(), by_id({}))
    node = bench.tree.new_node("draft", hypothesis="H\nmore")
    node.status, node.analysis = NodeStatus.DONE.value, "a" * 150 + "b" * 150
    rdloop().record(bench, node)
    assert bench.tree.knowledge == [{"node": 0, "hypothesis": "H", "outcome": "failed", "metric": None,
                                     "lesson": "a" * 150 + "b" * 50}]


def test_a_pending_round_is_redone_first_with_its_hypothesis() -> None:
    tree = Tree()
    first = tree.new_node("draft", hypothesis="H-old")
    first.status, first.is_buggy, first.code = NodeStatus.DONE.value, True, "x"
    tree.new_node("debug", parent=0, hypothesis="H-old")  # interrupted by a crash
    ctx = FakeContext()
    bench = ResearchBench(ctx, by_id({}), tree=Tree.from_state(tree.to_state()), max_nodes=2)
    rdloop().run(bench)
    assert bench.calls[:2] == ["debug 1", "sample 1"]  # its hypothesis is kept: no new one is asked for
    assert bench.tree[1].done and bench.tree[1].hypothesis == "H-old"
    assert [e["node"] for e in bench.tree.knowledge] == [1]
