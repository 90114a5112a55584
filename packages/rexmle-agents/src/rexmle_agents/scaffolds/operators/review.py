"""``analyse``: a structured review of one execution through the ``submit_review`` tool (never regex guessing).

A model that answers without the tool call is asked once more; after that the node is marked buggy with the reason.
"""

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

SUBMIT_REVIEW = ToolSpec(
    name="submit_review",
    description="Submit the review of one execution of a script.",
    parameters={
        "type": "object",
        "properties": {
            "is_bug": {"type": "boolean", "description": "true if the run failed or its result cannot be trusted"},
            "metric": {"type": ["number", "null"], "description": "the validation metric printed, or null"},
            "lower_is_better": {"type": "boolean", "description": "true if lower values of the metric are better"},
            "summary": {"type": "string", "description": "what was done, what came out, what to do next"},
        },
        "required": ["is_bug", "metric", "lower_is_better", "summary"],
        "additionalProperties": False,
    },
)


@dataclass(frozen=True)
class Review:
    is_bug: bool
    metric: float | None
    lower_is_better: bool
    summary: str


def check_review(arguments: Mapping[str, Any]) -> str:
    return check_fields(arguments, {"is_bug": (bool,), "metric": (int, float, type(None)),
                                    "lower_is_better": (bool,), "summary": (str,)})


class Analyse:
    name: ClassVar[str] = "analyse"
    role: ClassVar[str] = "feedback"

    def __call__(self, bench: Workbench, node: Node, *, validation: str = "") -> Review | None:
        """Fill the node's analysis, metric and direction; None (node buggy, reason given) without a usable review."""
        run = node.execution
        prompt = render("analyse", task=bench.task_brief(), plan=node.plan or "(none)", code=node.code,
                        execution=bench.describe(run) if run else "not run", validation=validation or "not checked",
                        output=run.output_tail if run else "")
        answer = ask_for_tool(bench, self.role, [Message.system(bench.system_prompt), Message.user(prompt)],
                              SUBMIT_REVIEW, check_review)
        if answer.arguments is None:
            node.is_buggy = True
            node.bug_reason = f"no usable review after asking twice: {answer.problem}"
            return None
        args = answer.arguments
        review = Review(is_bug=args["is_bug"], metric=None if args["metric"] is None else float(args["metric"]),
                        lower_is_better=args["lower_is_better"], summary=args["summary"].strip())
        node.analysis = review.summary
        node.metric = review.metric
        node.lower_is_better = review.lower_is_better
        return review
