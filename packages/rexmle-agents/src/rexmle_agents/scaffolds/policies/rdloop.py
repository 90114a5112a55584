"""The R&D-Agent-style research loop: hypothesise -> code -> run on a data sample -> run in full -> feedback ->
record. Each round is one node (a trajectory rather than a wide tree): a draft while nothing works, else an
improvement of the best node, carrying its hypothesis. A round whose script fails (on the sample or in full) is
debugged by the next rounds, up to ``max_debug_depth`` times, before a new hypothesis is drawn. The knowledge log
(saved with the tree) records what worked and what failed, and every hypothesis prompt sees it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from rexmle_agents.scaffolds.node import Node, Stage

if TYPE_CHECKING:
    from rexmle_agents.scaffolds.engine import Workbench


class RdLoop:
    name: ClassVar[str] = "rdloop"
    defaults: ClassVar[dict[str, Any]] = {"max_debug_depth": 2, "sample_first": True, "sample_timeout_s": 300.0}
    slots: ClassVar[tuple[str, ...]] = ("hypothesise", "draft", "debug", "improve", "analyse", "feedback")

    def __init__(self, params: Mapping[str, Any], seed: int) -> None:
        self.max_debug_depth = int(params["max_debug_depth"])
        self.sample_first = bool(params["sample_first"])
        self.sample_timeout_s = float(params["sample_timeout_s"])

    def next_round(self, bench: Workbench) -> tuple[str, int | None, str]:
        """(stage, parent id, hypothesis carried over) of the next round."""
        done = bench.tree.done
        last = done[-1] if done else None
        if last is not None and last.is_buggy and last.code and last.debug_depth < self.max_debug_depth:
            return Stage.DEBUG.value, last.id, last.hypothesis
        best = bench.tree.best()
        if best is None:
            return Stage.DRAFT.value, None, ""
        return Stage.IMPROVE.value, best.id, ""

    def run(self, bench: Workbench) -> None:
        bench.sample_runs = self.sample_first
        for pending in bench.tree.reset_pending():
            with bench.node_step(pending.stage, pending.parent, redo=pending,
                                 after=lambda n: self.record(bench, n)) as node:
                self.develop(bench, node)
        while not bench.out_of_nodes():
            stage, parent, hypothesis = self.next_round(bench)
            with bench.node_step(stage, parent, hypothesis=hypothesis, after=lambda n: self.record(bench, n)) as node:
                self.develop(bench, node)

    def develop(self, bench: Workbench, node: Node) -> None:
        ops = bench.operators
        if not node.hypothesis and not ops["hypothesise"](bench, node):
            return
        if not ops[node.stage](bench, node):
            return
        if self.sample_first:
            timeout = min(self.sample_timeout_s, bench.ctx.spec.limits.exec_timeout_s)
            node.sample_execution = bench.run_script(node, sample=True, timeout_s=timeout)
            if not node.sample_execution.ok:
                node.is_buggy = True
                node.bug_reason = f"the run on a data sample failed: {bench.describe(node.sample_execution)}"
                return
        bench.evaluate(node)
        feedback = ops["feedback"](bench, node)
        node.analysis = "\n".join(x for x in (node.analysis, feedback and f"feedback: {feedback.observations}") if x)
        node.lesson = feedback.lesson if feedback else ""

    def record(self, bench: Workbench, node: Node) -> None:
        """Add the round to the knowledge log once it is settled (worked, or failed with no debugging left)."""
        if node.is_buggy and node.code and node.debug_depth < self.max_debug_depth:
            return
        before = [n.score for n in bench.tree.good if n.id < node.id]
        if node.is_valid:
            improved = not before or node.score > max(before)  # type: ignore[operator]
            outcome = "worked" if improved else "no gain"
        else:
            outcome = "failed"
        bench.tree.knowledge.append({"node": node.id, "hypothesis": node.hypothesis.split("\n")[0] or node.plan[:200],
                                     "outcome": outcome, "metric": node.metric,
                                     "lesson": node.lesson or node.bug_reason or node.analysis[:200]})
