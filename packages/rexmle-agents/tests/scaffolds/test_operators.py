"""Operator parsing: fenced code, missing code blocks, reviews through the submit_review tool (asked once more)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from rexmle_agents.models import Message, Model, ModelResponse, RetryPolicy, ScriptedBackend, ToolCall, ToolSpec
from rexmle_agents.scaffolds.engine import Settings, TaskMetric
from rexmle_agents.scaffolds.node import ExecSummary
from rexmle_agents.scaffolds.operators import PARSE_FAILURE, Analyse, Draft, get_operator, parse_script
from rexmle_agents.scaffolds.prompting import render
from rexmle_agents.scaffolds.tree import Tree
from rexmle_grade.errors import ConfigurationError, UnknownNameError


class FakeBench:
    """The part of the workbench operators use, around a scripted model."""

    system_prompt = "system"
    settings = Settings()
    task_metric = TaskMetric("score", lower_is_better=False, description="a correlation")

    def __init__(self, script: Sequence[Any]) -> None:
        self.backend = ScriptedBackend(list(script))
        self.model = Model(self.backend, retry=RetryPolicy(max_attempts=1))
        self.tree = Tree()

    def generate(self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        return self.model.generate(list(messages), list(tools))

    def memory(self, node: Any) -> str:
        return "None yet."

    def script_rules(self) -> str:
        return "rules"

    def data_preview(self) -> str:
        return "the data"

    def task_brief(self) -> str:
        return "task"

    def describe(self, run: ExecSummary) -> str:
        return run.describe()


def review_call(**arguments: Any) -> ModelResponse:
    return ModelResponse(tool_calls=(ToolCall(id="c1", name="submit_review", arguments=arguments),))


def executed_node(bench: FakeBench) -> Any:
    node = bench.tree.new_node("draft")
    node.code = "print('VALIDATION_METRIC: 0.5')\n"
    node.execution = ExecSummary(exit_code=0, stopped_by=None, output_tail="VALIDATION_METRIC: 0.5", seconds=1.0)
    return node


def test_parse_script_takes_the_plan_and_the_first_python_block() -> None:
    parsed = parse_script("Plan: fit a ridge.\n```python\nimport numpy\n```\ntrailing\n```python\nother\n```")
    assert parsed.plan == "Plan: fit a ridge." and parsed.code == "import numpy\n"
    assert parse_script("no code at all").code is None
    assert parse_script("```\nprint(1)\n```").code is None  # an unlabelled block is not taken for Python


def test_a_missing_code_block_is_a_parse_failure_recorded_on_the_node() -> None:
    bench = FakeBench(["I would use a random forest."])
    node = bench.tree.new_node("draft")
    assert Draft()(bench, node) is False
    assert node.is_buggy and node.bug_reason == PARSE_FAILURE and node.plan == "I would use a random forest."
    assert node.code == ""


def test_draft_prompt_carries_the_template_and_memory() -> None:
    bench = FakeBench(["Plan.\n```python\nprint(1)\n```"])
    node = bench.tree.new_node("draft")
    assert Draft()(bench, node) is True and node.code == "print(1)\n"
    messages = bench.backend.requests[0][0]
    assert messages[0].content == "system" and messages[1].content.startswith("# Your job: a first solution")


def test_analyse_reads_the_review_from_the_tool_call() -> None:
    bench = FakeBench([review_call(is_bug=False, metric=0.5, metric_name="score", is_task_metric=True,
                                   summary="fine")])
    node = executed_node(bench)
    review = Analyse()(bench, node, validation="valid")
    assert review is not None and (node.metric, node.lower_is_better, node.analysis) == (0.5, False, "fine")
    assert bench.backend.requests[0][1][0].name == "submit_review"


def test_analyse_asks_once_more_when_the_tool_is_not_called() -> None:
    bench = FakeBench(["The metric is 0.5, looks good.",
                       review_call(is_bug=False, metric=0.5, metric_name="score", is_task_metric=True, summary="ok")])
    node = executed_node(bench)
    assert Analyse()(bench, node) is not None and node.metric == 0.5
    second = bench.backend.requests[1][0]
    assert second[-1].role == "user" and "submit_review" in second[-1].content


@pytest.mark.parametrize("answers", [
    ["no tool", "still no tool"],
    [review_call(is_bug="no", metric=0.5, metric_name="score", is_task_metric=True, summary="x"),
     review_call(is_bug=False)],
])
def test_analyse_marks_the_node_buggy_after_two_unusable_answers(answers: list[Any]) -> None:
    bench = FakeBench(answers)
    node = executed_node(bench)
    node.is_buggy = False
    assert Analyse()(bench, node) is None
    assert node.is_buggy and node.bug_reason.startswith("no usable review after asking twice")
    assert node.metric is None and len(bench.backend.requests) == 2


def test_a_bad_tool_call_is_answered_before_asking_again() -> None:
    bad = ModelResponse(tool_calls=(ToolCall(id="c9", name="submit_review", parse_error="not JSON"),))
    bench = FakeBench([bad, review_call(is_bug=True, metric=None, metric_name="", is_task_metric=False,
                                        summary="crash")])
    node = executed_node(bench)
    review = Analyse()(bench, node)
    assert review is not None and review.is_bug
    retry = bench.backend.requests[1][0]
    assert [m.role for m in retry[-3:]] == ["assistant", "tool", "user"] and retry[-2].tool_call_id == "c9"


def test_unknown_operator_and_template_errors_name_the_fix() -> None:
    with pytest.raises(UnknownNameError):
        get_operator("improv")
    with pytest.raises(ConfigurationError, match="needs a value"):
        render("draft", memory="x")
