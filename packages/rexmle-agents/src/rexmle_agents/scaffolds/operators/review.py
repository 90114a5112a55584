"""``analyse``: a structured review of one execution through the ``submit_review`` tool (never regex guessing).

A model that answers without the tool call is asked once more; after that the node is marked buggy with the reason.
The metric's direction is not asked: it is the task's (the grader's), so no node is ranked in a direction a model
guessed. The review says instead whether the printed number *is* the task's metric; one that is not is never
compared with the others.
"""

from __future__ import annotations

import math
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
            "metric_name": {"type": "string", "description": "what the printed number measures, in a few words"},
            "is_task_metric": {"type": "boolean",
                               "description": "true if it is the task's validation metric (or a faithful proxy)"},
            "summary": {"type": "string", "description": "what was done, what came out, what to do next"},
        },
        "required": ["is_bug", "metric", "metric_name", "is_task_metric", "summary"],
        "additionalProperties": False,
    },
)


@dataclass(frozen=True)
class Review:
    is_bug: bool
    metric: float | None
    metric_name: str
    is_task_metric: bool
    summary: str


# Asked for, but a review without them is still usable: an unnamed metric is taken for the task's (the script
# rules ask every script to print it), as reviews written for the earlier tool did.
OPTIONAL_REVIEW_FIELDS = {"metric_name": (str,), "is_task_metric": (bool,)}


def check_review(arguments: Mapping[str, Any]) -> str:
    present = {k: v for k, v in OPTIONAL_REVIEW_FIELDS.items() if k in arguments}
    return check_fields(arguments, {"is_bug": (bool,), "metric": (int, float, type(None)), "summary": (str,),
                                    **present})


class Analyse:
    name: ClassVar[str] = "analyse"
    role: ClassVar[str] = "feedback"

    def __call__(self, bench: Workbench, node: Node, *, validation: str = "") -> Review | None:
        """Fill the node's analysis, metric and the metric's name; None (node buggy, reason given) without a usable
        review. The direction is the task's (set by the workbench)."""
        run = node.execution
        prompt = render("analyse", task=bench.task_brief(), metric=bench.task_metric.text(), plan=node.plan or "(none)",
                        code=node.code,
                        execution=bench.describe(run) if run else "not run", validation=validation or "not checked",
                        output=run.output_tail if run else "")
        answer = ask_for_tool(bench, self.role, [Message.system(bench.system_prompt), Message.user(prompt)],
                              SUBMIT_REVIEW, check_review)
        if answer.arguments is None:
            node.is_buggy = True
            node.bug_reason = f"no usable review after asking twice: {answer.problem}"
            return None
        args = answer.arguments
        reported = None if args["metric"] is None else float(args["metric"])
        # a NaN or infinite metric is no metric: it can be neither compared nor written as JSON
        review = Review(is_bug=args["is_bug"], metric=reported if reported is not None and math.isfinite(reported)
                        else None,
                        metric_name=args.get("metric_name", "").strip(),
                        is_task_metric=args.get("is_task_metric", True),
                        summary=args["summary"].strip())
        node.analysis = review.summary
        node.metric = review.metric
        node.metric_name = bench.task_metric.name if review.is_task_metric else review.metric_name
        node.lower_is_better = bench.task_metric.lower_is_better
        return review
