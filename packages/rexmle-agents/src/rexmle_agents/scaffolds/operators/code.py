"""The operators that write scripts: ``draft`` (a first solution), ``debug`` (fix a failed node from its output),
``improve`` (one atomic change to a working node), ``merge`` (AIRA's crossover of two working nodes) and ``revise``
(the R&D loop's revision of a script after its code review). Each is one prompt + one call of the ``code`` role +
parsing of one fenced ```python block; an answer without one is a parse failure recorded on the node.

With ``explore_turns`` > 0 (multi-turn nodes) the call becomes a short ReAct loop: the model may call
``run_command`` to inspect the data through the sandbox (every command journaled like any execution) before it
answers with the script, which is what the node evaluates. Reasoning the model returns with its answer (a
``reasoning`` field, or ``<think>`` blocks of open reasoning models) is kept on the node for adaptive memory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from rexmle_agents.models.types import Message, ModelResponse, ToolSpec
from rexmle_agents.scaffolds.operators.base import parse_script
from rexmle_agents.scaffolds.prompting import render

if TYPE_CHECKING:
    from rexmle_agents.scaffolds.engine import Workbench
    from rexmle_agents.scaffolds.node import Node

PARSE_FAILURE = "parse failure: the answer had no ```python code block"
THINKING_KEPT = 4000  # characters of a node's reasoning kept on the node
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)

RUN_COMMAND = ToolSpec(
    name="run_command",
    description="Run one shell command in the task's sandbox (in working/, the data at ../data/) and see its output.",
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string", "description": "a shell command, e.g. ls -la ../data/train"}},
        "required": ["command"],
        "additionalProperties": False,
    },
)
NO_TURNS_LEFT = "No commands are left for this script. Answer now: a short plan, then the complete script."


def thinking_of(response: ModelResponse) -> str:
    """The reasoning a response carries: a backend's ``reasoning`` field where it has one, else ``<think>``
    blocks in the text."""
    reasoning = getattr(response, "reasoning", None)
    if isinstance(reasoning, str) and reasoning.strip():
        return reasoning.strip()[:THINKING_KEPT]
    return "\n".join(m.strip() for m in _THINK.findall(response.text))[:THINKING_KEPT]


def converse(bench: Workbench, node: Node, role: str, messages: Sequence[Message]) -> ModelResponse:
    """One model answer; on a multi-turn node, after up to ``explore_turns`` commands run for the model."""
    turns = bench.settings.explore_turns
    if turns <= 0:
        return bench.generate(role, messages)
    conversation = list(messages)
    for _ in range(turns):
        response = bench.generate(role, conversation, tools=[RUN_COMMAND])
        if not response.tool_calls:
            return response
        conversation.append(response.message)
        for call in response.tool_calls:  # every call gets an answer, even one that is not run
            command = call.arguments.get("command") if not call.parse_error else None
            if call.name != RUN_COMMAND.name or not isinstance(command, str) or not command.strip():
                result = f"not run: expected {RUN_COMMAND.name} with a command ({call.parse_error or 'no command'})"
            else:
                result = bench.explore(node, command)
            conversation.append(Message.tool(call.id, result))
    conversation.append(Message.user(NO_TURNS_LEFT))
    return bench.generate(role, conversation)


class CodeOperator:
    name: ClassVar[str]
    role: ClassVar[str] = "code"
    template: ClassVar[str | None] = None  # the prompt template; None: the operator's name

    def fields(self, bench: Workbench, node: Node) -> dict[str, Any]:
        return {}

    def __call__(self, bench: Workbench, node: Node) -> bool:
        """Fill ``node.plan`` and ``node.code``; False (and the node marked buggy) on a parse failure."""
        hypothesis = f"\n# Hypothesis to implement\n{node.hypothesis}\n" if node.hypothesis else ""
        prompt = render(self.template or self.name, **self.fields(bench, node), hypothesis=hypothesis,
                        memory=bench.memory(node), script_rules=bench.script_rules())
        response = converse(bench, node, self.role, [Message.system(bench.system_prompt), Message.user(prompt)])
        node.thinking = thinking_of(response)
        parsed = parse_script(_THINK.sub("", response.text))
        node.plan = parsed.plan
        if parsed.code is None:
            node.is_buggy = True
            node.bug_reason = PARSE_FAILURE
            return False
        node.code = parsed.code
        return True


class Draft(CodeOperator):
    name = "draft"

    def fields(self, bench: Workbench, node: Node) -> dict[str, Any]:
        return {"data_preview": bench.data_preview()}


class Debug(CodeOperator):
    name = "debug"

    def fields(self, bench: Workbench, node: Node) -> dict[str, Any]:
        parent = bench.tree[node.parent] if node.parent is not None else None
        preview = bench.data_preview()
        if parent is None:
            return {"plan": "", "code": "", "execution": "", "output": "", "analysis": "", "data_preview": preview}
        run = parent.execution or parent.sample_execution
        return {"plan": parent.plan, "code": parent.code,
                "execution": bench.describe(run) if run else parent.bug_reason,
                "output": run.output_tail if run else "",
                "analysis": "\n".join(x for x in (parent.bug_reason, parent.analysis) if x) or "none",
                "data_preview": preview}


class Improve(CodeOperator):
    name = "improve"

    def fields(self, bench: Workbench, node: Node) -> dict[str, Any]:
        parent = bench.tree[node.parent] if node.parent is not None else None
        if parent is None:
            return {"metric": "n/a", "plan": "", "code": "", "output": ""}
        return {"metric": metric_text(parent), "plan": parent.plan, "code": parent.code,
                "output": parent.execution.output_tail if parent.execution else ""}


class Merge(CodeOperator):
    """AIRA's crossover: one script from two working parents (``node.parent`` and ``node.merged_with``)."""

    name = "merge"

    def fields(self, bench: Workbench, node: Node) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for key, source in (("a", node.parent), ("b", node.merged_with)):
            parent = bench.tree[source] if source is not None else None
            values.update({f"metric_{key}": metric_text(parent) if parent else "n/a",
                           f"plan_{key}": parent.plan if parent else "", f"code_{key}": parent.code if parent else ""})
        return values


class Revise(CodeOperator):
    """The R&D loop's coder, second and later rounds inside one round: the script revised after its review."""

    name = "revise"

    def fields(self, bench: Workbench, node: Node) -> dict[str, Any]:
        run = node.sample_execution
        return {"code": node.code, "execution": bench.describe(run) if run else "not run",
                "output": run.output_tail if run else "", "review": node.revisions[-1] if node.revisions else "none",
                "failures": failure_knowledge(bench)}


def metric_text(node: Node) -> str:
    if node.metric is None:
        return "n/a"
    direction = "lower is better" if node.lower_is_better else "higher is better"
    name = f"{node.metric_name} " if node.metric_name else ""
    return f"{name}{node.metric:.6g} ({direction})"


def failure_knowledge(bench: Workbench, limit: int = 12) -> str:
    """The R&D loop's knowledge base of past failures: code reviews that sent a script back, and rounds that
    failed, newest last."""
    entries = []
    for node in bench.tree:
        entries += [f"- node {node.id}, review {i + 1}: {text}" for i, text in enumerate(node.revisions)]
        if node.done and node.is_buggy and node.bug_reason:
            entries.append(f"- node {node.id} failed: {node.bug_reason}")
    return "\n".join(entries[-limit:]) or "None yet."
