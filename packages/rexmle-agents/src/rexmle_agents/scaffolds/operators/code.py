"""The operators that write scripts: ``draft`` (a first solution), ``debug`` (fix a failed node from its output)
and ``improve`` (one atomic change to a working node). Each is one prompt + one call of the ``code`` role + parsing
of one fenced ```python block; an answer without one is a parse failure recorded on the node."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rexmle_agents.models.types import Message
from rexmle_agents.scaffolds.operators.base import parse_script
from rexmle_agents.scaffolds.prompting import render

if TYPE_CHECKING:
    from rexmle_agents.scaffolds.engine import Workbench
    from rexmle_agents.scaffolds.node import Node

PARSE_FAILURE = "parse failure: the answer had no ```python code block"


class CodeOperator:
    name: ClassVar[str]
    role: ClassVar[str] = "code"

    def fields(self, bench: Workbench, node: Node) -> dict[str, Any]:
        return {}

    def __call__(self, bench: Workbench, node: Node) -> bool:
        """Fill ``node.plan`` and ``node.code``; False (and the node marked buggy) on a parse failure."""
        hypothesis = f"\n# Hypothesis to implement\n{node.hypothesis}\n" if node.hypothesis else ""
        prompt = render(self.name, **self.fields(bench, node), hypothesis=hypothesis,
                        memory=bench.memory(node), script_rules=bench.script_rules())
        response = bench.generate(self.role, [Message.system(bench.system_prompt), Message.user(prompt)])
        parsed = parse_script(response.text)
        node.plan = parsed.plan
        if parsed.code is None:
            node.is_buggy = True
            node.bug_reason = PARSE_FAILURE
            return False
        node.code = parsed.code
        return True


class Draft(CodeOperator):
    name = "draft"


class Debug(CodeOperator):
    name = "debug"

    def fields(self, bench: Workbench, node: Node) -> dict[str, Any]:
        parent = bench.tree[node.parent] if node.parent is not None else None
        if parent is None:
            return {"plan": "", "code": "", "execution": "", "output": "", "analysis": ""}
        run = parent.execution or parent.sample_execution
        return {"plan": parent.plan, "code": parent.code,
                "execution": bench.describe(run) if run else parent.bug_reason,
                "output": run.output_tail if run else "",
                "analysis": "\n".join(x for x in (parent.bug_reason, parent.analysis) if x) or "none"}


class Improve(CodeOperator):
    name = "improve"

    def fields(self, bench: Workbench, node: Node) -> dict[str, Any]:
        parent = bench.tree[node.parent] if node.parent is not None else None
        if parent is None:
            return {"metric": "n/a", "plan": "", "code": "", "output": ""}
        direction = "lower is better" if parent.lower_is_better else "higher is better"
        return {"metric": f"{parent.metric:.6g} ({direction})", "plan": parent.plan, "code": parent.code,
                "output": parent.execution.output_tail if parent.execution else ""}
