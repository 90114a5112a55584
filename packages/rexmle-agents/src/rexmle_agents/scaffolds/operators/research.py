"""The R&D loop's research operators: ``hypothesise`` (the next testable change, from the knowledge log) and
``feedback`` (was it supported, what to remember). Both answer through a tool call, asked for once more if missing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rexmle_agents.models.types import Message, ToolSpec
from rexmle_agents.scaffolds.operators.base import ask_for_tool, check_fields
from rexmle_agents.scaffolds.prompting import render

if TYPE_CHECKING:
    from rexmle_agents.scaffolds.engine import Workbench
    from rexmle_agents.scaffolds.node import Node

PROPOSE_HYPOTHESIS = ToolSpec(
    name="propose_hypothesis",
    description="Propose the hypothesis the next round tests.",
    parameters={
        "type": "object",
        "properties": {
            "hypothesis": {"type": "string", "description": "the concrete change and the effect expected"},
            "rationale": {"type": "string", "description": "why, given what earlier rounds learned"},
        },
        "required": ["hypothesis", "rationale"],
        "additionalProperties": False,
    },
)

SUBMIT_FEEDBACK = ToolSpec(
    name="submit_feedback",
    description="Judge one round of the research loop.",
    parameters={
        "type": "object",
        "properties": {
            "supported": {"type": "boolean", "description": "did the outcome support the hypothesis"},
            "observations": {"type": "string", "description": "what the run showed"},
            "lesson": {"type": "string", "description": "one sentence the loop should remember"},
        },
        "required": ["supported", "observations", "lesson"],
        "additionalProperties": False,
    },
)


@dataclass(frozen=True)
class Feedback:
    supported: bool
    observations: str
    lesson: str


def knowledge_text(bench: Workbench, limit: int = 30) -> str:
    entries = bench.tree.knowledge[-limit:]
    if not entries:
        return "Empty: this is the first round."
    return "\n".join(f"- [{e['outcome']}] {e['hypothesis']} -> {e['lesson']}" for e in entries)


def best_text(bench: Workbench) -> str:
    best = bench.tree.best()
    return best.summary() if best else "No working solution yet."


class Hypothesise:
    name: ClassVar[str] = "hypothesise"
    role: ClassVar[str] = "feedback"

    def __call__(self, bench: Workbench, node: Node) -> bool:
        """Fill ``node.hypothesis``; False (node buggy, reason given) without a usable answer."""
        prompt = render("hypothesise", best=best_text(bench), knowledge=knowledge_text(bench),
                        remaining=bench.remaining())
        answer = ask_for_tool(bench, self.role, [Message.system(bench.system_prompt), Message.user(prompt)],
                              PROPOSE_HYPOTHESIS, _check_hypothesis)
        if answer.arguments is None:
            node.is_buggy = True
            node.bug_reason = f"no usable hypothesis after asking twice: {answer.problem}"
            return False
        node.hypothesis = f"{answer.arguments['hypothesis'].strip()}\n(rationale: {answer.arguments['rationale']})"
        return True


class GiveFeedback:
    name: ClassVar[str] = "feedback"
    role: ClassVar[str] = "feedback"

    def __call__(self, bench: Workbench, node: Node) -> Feedback | None:
        prompt = render("feedback", hypothesis=node.hypothesis or "(none)", outcome=node.summary(),
                        best=bench.best_before(node), knowledge=knowledge_text(bench))
        answer = ask_for_tool(bench, self.role, [Message.system(bench.system_prompt), Message.user(prompt)],
                              SUBMIT_FEEDBACK, _check_feedback)
        if answer.arguments is None:
            return None
        args = answer.arguments
        return Feedback(supported=args["supported"], observations=args["observations"].strip(),
                        lesson=args["lesson"].strip())


def _check_hypothesis(arguments: Mapping[str, Any]) -> str:
    problem = check_fields(arguments, {"hypothesis": (str,), "rationale": (str,)})
    if not problem and not arguments["hypothesis"].strip():
        problem = "hypothesis is empty"
    return problem


def _check_feedback(arguments: Mapping[str, Any]) -> str:
    return check_fields(arguments, {"supported": (bool,), "observations": (str,), "lesson": (str,)})
