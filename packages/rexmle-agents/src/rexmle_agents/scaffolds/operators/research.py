"""The research operators: ``hypothesise`` (the next testable change, from the knowledge log), ``feedback`` (was
it supported, what to remember, and does the round replace the best so far: R&D-Agent's decision, with the metric
as evidence), ``critique`` (R&D-Agent's code evaluator: is a script ready for its full run, judged from the code
and its run on a data sample) and ``summarise_memory`` (AIRA: every node condensed into the memory of prompts).
The tool-call answers are asked for once more if missing."""

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
            "replace_best": {"type": "boolean",
                             "description": "should this round's solution become the best so far (the next base)"},
        },
        "required": ["supported", "observations", "lesson", "replace_best"],
        "additionalProperties": False,
    },
)

SUBMIT_CODE_REVIEW = ToolSpec(
    name="submit_code_review",
    description="Judge whether a script is ready for its full run.",
    parameters={
        "type": "object",
        "properties": {
            "ready": {"type": "boolean", "description": "true if the script can go to its full run as it is"},
            "feedback": {"type": "string", "description": "what is wrong and how to fix it (empty when ready)"},
        },
        "required": ["ready", "feedback"],
        "additionalProperties": False,
    },
)


@dataclass(frozen=True)
class Feedback:
    supported: bool
    observations: str
    lesson: str
    replace_best: bool | None = None  # None: no decision (not asked for: the metric decides)


@dataclass(frozen=True)
class CodeReview:
    ready: bool
    feedback: str


def knowledge_text(bench: Workbench, limit: int = 30) -> str:
    """The knowledge log as the prompts show it: outcome, the metric reached, hypothesis and lesson per round."""
    entries = bench.tree.knowledge[-limit:]
    if not entries:
        return "Empty: this is the first round."
    lines = []
    for e in entries:
        metric = e.get("metric")
        reached = "" if metric is None else f", validation metric {metric:.6g}"
        lines.append(f"- [{e['outcome']}{reached}] {e['hypothesis']} -> {e['lesson']}")
    return "\n".join(lines)


def best_text(bench: Workbench) -> str:
    best = bench.best()
    return best.summary() if best else "No working solution yet."


def outcome_text(bench: Workbench, node: Node, tail: int = 1500) -> str:
    """What running the round did: its result (from the node as developed, done or not), how the runs ended, and
    the end of the full run's output."""
    lines = [f"node {node.id} ({node.stage}): {node.outcome()}"]
    if node.sample_execution is not None:
        lines.append(f"run on a data sample: {bench.describe(node.sample_execution)}")
    run = node.execution
    if run is not None:
        lines.append(f"full run: {bench.describe(run)}")
        if run.output_tail:
            lines.append("output (tail):\n```\n" + run.output_tail[-tail:] + "\n```")
    if node.analysis:
        lines.append(f"review: {node.analysis}")
    return "\n".join(lines)


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
    """Where the feedback decides the best (the workbench has the policy's ``choose_best``), an answer without its
    decision (``replace_best``) is not usable: it is asked for again like any other missing field, never read as
    "no"."""

    name: ClassVar[str] = "feedback"
    role: ClassVar[str] = "feedback"

    def __call__(self, bench: Workbench, node: Node) -> Feedback | None:
        solution = node.plan or "(no plan)"
        prompt = render("feedback", hypothesis=node.hypothesis or "(none)", outcome=outcome_text(bench, node),
                        solution=solution, best=bench.best_before(node), knowledge=knowledge_text(bench))
        check = _check_decision if bench.choose_best is not None else _check_feedback
        answer = ask_for_tool(bench, self.role, [Message.system(bench.system_prompt), Message.user(prompt)],
                              SUBMIT_FEEDBACK, check)
        if answer.arguments is None:
            return None
        args = answer.arguments
        return Feedback(supported=args["supported"], observations=args["observations"].strip(),
                        lesson=args["lesson"].strip(), replace_best=args.get("replace_best"))


class Critique:
    """R&D-Agent's code evaluator: reads the script and its sample run, says whether it is ready (tool call)."""

    name: ClassVar[str] = "critique"
    role: ClassVar[str] = "feedback"

    def __call__(self, bench: Workbench, node: Node) -> CodeReview | None:
        from rexmle_agents.scaffolds.operators.code import failure_knowledge

        run = node.sample_execution
        prompt = render("critique", metric=bench.task_metric.text(), hypothesis=node.hypothesis or "(none)",
                        code=node.code, execution=bench.describe(run) if run else "not run on a sample",
                        output=run.output_tail if run else "", failures=failure_knowledge(bench))
        answer = ask_for_tool(bench, self.role, [Message.system(bench.system_prompt), Message.user(prompt)],
                              SUBMIT_CODE_REVIEW, _check_code_review)
        if answer.arguments is None:
            return None
        return CodeReview(ready=answer.arguments["ready"], feedback=answer.arguments["feedback"].strip())


class SummariseMemory:
    """AIRA's memory operator: one plain-text digest of every finished node (the workbench caches it)."""

    name: ClassVar[str] = "summarise_memory"
    role: ClassVar[str] = "feedback"

    def __call__(self, bench: Workbench, node: Node) -> str:
        nodes = "\n".join(n.summary() for n in bench.tree.done)
        response = bench.generate(self.role, [Message.system(bench.system_prompt),
                                              Message.user(render("summarise_memory", nodes=nodes))])
        return response.text.strip() or nodes


def _check_hypothesis(arguments: Mapping[str, Any]) -> str:
    problem = check_fields(arguments, {"hypothesis": (str,), "rationale": (str,)})
    if not problem and not arguments["hypothesis"].strip():
        problem = "hypothesis is empty"
    return problem


def _check_feedback(arguments: Mapping[str, Any]) -> str:
    # where the metric decides, replace_best is read by nothing: an answer without it is still usable
    optional = {"replace_best": (bool,)} if "replace_best" in arguments else {}
    return check_fields(arguments, {"supported": (bool,), "observations": (str,), "lesson": (str,), **optional})


def _check_decision(arguments: Mapping[str, Any]) -> str:
    problem = _check_feedback(arguments)
    if "replace_best" not in arguments:
        missing = ("replace_best is missing: the loop needs your decision, true or false, whether this round's "
                   "solution becomes the best so far")
        problem = f"{problem}; {missing}" if problem else missing
    return problem


def _check_code_review(arguments: Mapping[str, Any]) -> str:
    return check_fields(arguments, {"ready": (bool,), "feedback": (str,)})
