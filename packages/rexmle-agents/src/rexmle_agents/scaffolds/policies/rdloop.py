"""The R&D-Agent-style research loop: hypothesise -> code (-> run on a data sample -> code review -> revise, up to
``coding_rounds`` times) -> run in full -> feedback -> record. Each round is one node (a trajectory rather than a
wide tree): a draft while nothing works, else an improvement of the best node, carrying its hypothesis. A round
whose script fails (on the sample or in full) is debugged by the next rounds, up to ``max_debug_depth`` times,
before a new hypothesis is drawn. The knowledge log (saved with the tree) records what worked and what failed, with
the metric reached, and every hypothesis prompt sees it.

R&D-Agent's two mechanisms beyond that, on in the ``rdloop`` preset (off at the policy's own defaults):
``coding_rounds`` > 1 is its multi-round coder (CoSTEER): before the full run a reviewer (the ``critique``
operator) reads the script and its sample run, and the coder revises it (``revise``), with the knowledge base of
past failures in both prompts; ``feedback_decides_best`` makes the feedback model decide whether a round becomes
the best so far (the base of the next rounds and the submitted node), with the metric as evidence. A feedback
without its decision is asked again; a round left without one (``accepted`` None) is recorded by its metric, and
until the feedback accepts a round the best metric is the choice, labelled as such.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from rexmle_agents.scaffolds.node import Node, Stage
from rexmle_agents.scaffolds.tree import Tree

if TYPE_CHECKING:
    from rexmle_agents.scaffolds.engine import Workbench


class RdLoop:
    name: ClassVar[str] = "rdloop"
    defaults: ClassVar[dict[str, Any]] = {"max_debug_depth": 2, "sample_first": True, "sample_timeout_s": 300.0,
                                          "coding_rounds": 1, "feedback_decides_best": False}
    slots: ClassVar[tuple[str, ...]] = ("hypothesise", "draft", "debug", "improve", "analyse", "feedback",
                                        "critique", "revise")

    def __init__(self, params: Mapping[str, Any], seed: int) -> None:
        self.max_debug_depth = int(params["max_debug_depth"])
        self.sample_first = bool(params["sample_first"])
        self.sample_timeout_s = float(params["sample_timeout_s"])
        self.coding_rounds = max(1, int(params["coding_rounds"]))
        self.feedback_decides_best = bool(params["feedback_decides_best"])

    @staticmethod
    def accepted_best(tree: Tree) -> Node | None:
        """The feedback's choice: the latest valid round it accepted; before any, the best metric."""
        accepted = [n for n in tree.good if n.accepted]
        return accepted[-1] if accepted else tree.best()

    def next_round(self, bench: Workbench) -> tuple[str, int | None, str]:
        """(stage, parent id, hypothesis carried over) of the next round."""
        done = bench.tree.done
        last = done[-1] if done else None
        if last is not None and last.is_buggy and last.code and last.debug_depth < self.max_debug_depth:
            return Stage.DEBUG.value, last.id, last.hypothesis
        best = self.accepted_best(bench.tree) if self.feedback_decides_best else bench.tree.best()
        if best is None:
            return Stage.DRAFT.value, None, ""
        return Stage.IMPROVE.value, best.id, ""

    def run(self, bench: Workbench) -> None:
        bench.sample_runs = self.sample_first
        if self.feedback_decides_best:
            bench.choose_best = self.accepted_best
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
        if not self.code(bench, node):
            return
        bench.evaluate(node)
        feedback = ops["feedback"](bench, node)
        node.analysis = "\n".join(x for x in (node.analysis, feedback and f"feedback: {feedback.observations}") if x)
        node.lesson = feedback.lesson if feedback else ""
        if self.feedback_decides_best:  # no usable feedback, even asked again: no decision (the metric decides)
            node.accepted = None if feedback is None or feedback.replace_best is None else \
                bool(node.works and feedback.replace_best)

    def code(self, bench: Workbench, node: Node) -> bool:
        """The coding rounds before the full run: the sample run, and with ``coding_rounds`` > 1 the code review
        and revisions. False (the node buggy, the reason given) when the script is not fit for the full run."""
        ops = bench.operators
        for round_number in range(1, self.coding_rounds + 1):
            if self.sample_first:
                timeout = min(self.sample_timeout_s, bench.ctx.spec.limits.exec_timeout_s)
                node.sample_execution = bench.run_script(node, sample=True, timeout_s=timeout)
            if self.coding_rounds == 1:
                break
            sample_ok = node.sample_execution is None or node.sample_execution.ok
            review = ops["critique"](bench, node)
            ready = review.ready if review is not None else sample_ok  # no usable review: the sample run decides
            if (ready and sample_ok) or round_number == self.coding_rounds:
                break
            problem = review.feedback if review is not None and review.feedback else (
                "no usable review" if review is None else "the reviewer asked for changes")
            if not sample_ok:
                problem = f"the run on a data sample failed ({bench.describe(node.sample_execution)}); {problem}"
            node.revisions.append(problem)
            if not ops["revise"](bench, node):
                return False
        if node.sample_execution is not None and not node.sample_execution.ok:
            node.is_buggy = True
            node.bug_reason = f"the run on a data sample failed: {bench.describe(node.sample_execution)}"
            return False
        return True

    def record(self, bench: Workbench, node: Node) -> None:
        """Add the round to the knowledge log once it is settled (worked, or failed with no debugging left)."""
        if node.is_buggy and node.code and node.debug_depth < self.max_debug_depth:
            return
        before = [n.score for n in bench.tree.good if n.id < node.id]
        if node.is_valid and self.feedback_decides_best and node.accepted is not None:
            outcome = "worked" if node.accepted else "no gain"
        elif node.is_valid:
            improved = not before or node.score > max(before)  # type: ignore[operator]
            outcome = "worked" if improved else "no gain"
        else:
            outcome = "failed"
        bench.tree.knowledge.append({"node": node.id, "hypothesis": node.hypothesis.split("\n")[0] or node.plan[:200],
                                     "outcome": outcome, "metric": node.metric,
                                     "lesson": node.lesson or node.bug_reason or node.analysis[:200]})
