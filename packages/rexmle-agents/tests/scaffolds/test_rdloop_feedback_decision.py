"""R&D loop: a feedback answer without its decision (``replace_best``) is asked for again, never read as "no"; a
round left without a decision is recorded by its metric, and a final choice the feedback did not make is labelled
as the metric's. The failure analysis reads an rdloop round by its final execution (a failed sample run that the
revised script then passed is not a crash)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from rexmle_agents.analysis.failures import run_failures
from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import Model, ModelResponse, RetryPolicy, ScriptedBackend, ToolCall
from rexmle_agents.results.loader import load_runs
from rexmle_agents.scaffolds.engine import TaskMetric
from rexmle_agents.scaffolds.node import ExecSummary, Node, NodeStatus
from rexmle_agents.scaffolds.operators.research import GiveFeedback
from rexmle_agents.scaffolds.policies import RdLoop
from rexmle_agents.scaffolds.tree import Tree


def feedback_call(**arguments: Any) -> ModelResponse:
    return ModelResponse(tool_calls=(ToolCall(id="f1", name="submit_feedback", arguments=arguments),))


class FeedbackBench:
    """What GiveFeedback uses of the workbench, around a scripted model; ``decides``: the feedback decides the
    best (as rdloop's ``feedback_decides_best`` sets it)."""

    system_prompt = "system"
    task_metric = TaskMetric("score", lower_is_better=False, description="a correlation")

    def __init__(self, script: list[Any], *, decides: bool) -> None:
        self.backend = ScriptedBackend(script)
        self.model = Model(self.backend, retry=RetryPolicy(max_attempts=1))
        self.tree = Tree()
        self.choose_best = RdLoop.accepted_best if decides else None

    def generate(self, role: str, messages: Any, tools: Any = ()) -> ModelResponse:
        return self.model.generate(list(messages), list(tools))

    def describe(self, run: ExecSummary) -> str:
        return run.describe(timed=False)

    def best(self) -> Node | None:
        return self.tree.best()

    def best_before(self, node: Node) -> str:
        return "No working solution yet."


def a_round(bench: FeedbackBench) -> Node:
    node = bench.tree.new_node("draft", hypothesis="noise predicts quality")
    node.is_buggy, node.metric, node.lower_is_better, node.submission_valid = False, 0.73, False, True
    node.execution = ExecSummary(exit_code=0, stopped_by=None, output_tail="VALIDATION_METRIC: 0.73", seconds=2.0)
    return node


def test_a_feedback_without_its_decision_is_asked_again_not_read_as_no() -> None:
    undecided = {"supported": True, "observations": "it ran", "lesson": "noise matters"}
    bench = FeedbackBench([feedback_call(**undecided), feedback_call(**undecided, replace_best=True)], decides=True)
    feedback = GiveFeedback()(bench, a_round(bench))
    assert feedback is not None and feedback.replace_best is True
    assert len(bench.backend.requests) == 2
    again = bench.backend.requests[1][0][-1].content
    assert "submit_feedback" in again and "replace_best is missing" in again


def test_a_feedback_that_never_decides_gives_no_decision_and_the_metric_needs_none() -> None:
    undecided = {"supported": True, "observations": "it ran", "lesson": "noise matters"}
    bench = FeedbackBench([feedback_call(**undecided), feedback_call(**undecided)], decides=True)
    assert GiveFeedback()(bench, a_round(bench)) is None
    plain = FeedbackBench([feedback_call(**undecided)], decides=False)  # the metric decides: usable as it is
    feedback = GiveFeedback()(plain, a_round(plain))
    assert feedback is not None and feedback.replace_best is None and len(plain.backend.requests) == 1


def test_a_round_without_a_decision_is_recorded_by_its_metric() -> None:
    policy = RdLoop({**RdLoop.defaults, "feedback_decides_best": True, "sample_first": False}, seed=0)
    tree = Tree()
    bench = SimpleNamespace(tree=tree, operators={
        "hypothesise": lambda b, n: True, "draft": lambda b, n: True, "improve": lambda b, n: True,
        "feedback": lambda b, n: None}, evaluate=lambda n: None)
    first = tree.new_node("draft", hypothesis="H0")
    policy.develop(bench, first)  # type: ignore[arg-type]
    first.status, first.is_buggy, first.metric, first.lower_is_better = NodeStatus.DONE.value, False, 0.5, False
    first.submission_valid, first.snapshot_id = True, "s0"
    assert first.accepted is None  # no usable feedback: no decision, not a refusal
    policy.record(bench, first)  # type: ignore[arg-type]
    assert tree.knowledge[-1]["outcome"] == "worked"  # the first valid round improved on nothing
    assert RdLoop.accepted_best(tree) is first


def test_an_rdloop_run_whose_feedback_never_decides(run_scaffold, fakes) -> None:
    """End to end: the draft crashes on its sample run and its revision passes; the feedback leaves out its
    decision twice (asked again once). The round is not a crash, the knowledge log says it worked, and the final
    choice is labelled as the metric's."""
    fake = fakes.FakeModel([fakes.CRASH_SCRIPT], feedback_without_decision=2)
    outcome, fake = run_scaffold("rdloop", fake, config={"max_nodes": 1},
                                 limits=Limits(time_limit_s=120, exec_timeout_s=20))
    assert outcome.state == "finished", outcome.reason
    assert fake.counts["feedback"] == 2  # asked again once
    events = list(Journal(outcome.run_dir / "journal.jsonl").iter_events())
    state = [e for e in events if e["kind"] == "agent_state"][-1]["state"]
    (node,) = state["nodes"]
    assert node.get("accepted") is None and not node["is_buggy"]
    assert [k["outcome"] for k in state["knowledge"]] == ["worked"]
    (selected,) = [e for e in events if e["kind"] == "final_selected"]
    assert "best validation metric" in selected["reason"] and "chosen by the feedback" not in selected["reason"]

    (run,) = load_runs([outcome.run_dir]).runs
    failures = run_failures(run)
    (step,) = failures.outcomes
    assert step.outcome == "ok" and failures.crashed == 0 and not failures.error_types
    assert "after 1 failed one(s)" in step.detail and "node0-sample" in step.detail
