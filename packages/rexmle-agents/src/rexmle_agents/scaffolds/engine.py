"""The workbench every policy drives: it holds the tree, renders the shared prompt pieces, calls operators, runs a
node's script in the sandbox, checks its submission, reviews it, snapshots it, and persists the tree after every
node. Policies only decide *which* node to make next (see ``policies/``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rexmle_agents.models.types import GenerateConfig, Message, ModelResponse, ToolSpec
from rexmle_agents.sandbox.base import SUBMISSION_DIRNAME, WORKING_DIRNAME
from rexmle_agents.scaffolds.node import ExecSummary, Node, NodeStatus
from rexmle_agents.scaffolds.prompting import memory_text, remaining_text, render, system_prompt
from rexmle_agents.scaffolds.tree import Tree

if TYPE_CHECKING:
    from rexmle_agents.harness.context import Candidate, RunContext

STATE_KEY = "scaffold"
SAMPLE_ENV = "SAMPLE"
SUBMISSION_ENV = "SUBMISSION_DIR"


@dataclass(frozen=True)
class Settings:
    """Parameters every policy shares (``agent_config`` keys)."""

    expert_report: bool = False  # add the winning team's method summary to the prompts
    domain_pack: bool = False  # add the medical-imaging practice guide to the prompts
    memory_nodes: int = 8  # summaries of other nodes shown in a prompt
    output_tail_chars: int = 4000  # of a script's output shown to the model
    temperature: float | None = None
    max_nodes: int | None = None  # stop after this many nodes (the harness's step limit applies too)
    workers: int = 1  # nodes developed at once (policies that support it)
    # Keep wall-clock readings (time left, run seconds) out of prompts, so that a recorded run replays exactly.
    replayable: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Settings:
        return cls(**{k: config[k] for k in cls.__dataclass_fields__ if k in config})


class Workbench:
    def __init__(self, ctx: RunContext, settings: Settings, operators: Mapping[str, Any], tree: Tree) -> None:
        self.ctx = ctx
        self.settings = settings
        self.operators = dict(operators)
        self.tree = tree
        self.system_prompt = system_prompt(ctx, expert_report_mode=settings.expert_report,
                                           domain_pack=settings.domain_pack)
        self._config = GenerateConfig(temperature=settings.temperature)
        # The R&D loop runs every script on a data sample first; the prompt then tells scripts to honour SAMPLE.
        self.sample_runs = False
        self._selected: str | None = None

    # ---- model and prompt pieces --------------------------------------------------------------------------
    def generate(self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        return self.ctx.model(role).generate(list(messages), list(tools), self._config)

    def memory(self, node: Node) -> str:
        return memory_text(self.tree, node, limit=self.settings.memory_nodes)

    def script_rules(self) -> str:
        if self.sample_runs:
            sample = (f"When the environment variable `{SAMPLE_ENV}` is `1`, use only a few training and test cases "
                      "and a short training so that the whole script finishes within a minute (a smoke test); "
                      "otherwise use all the data.")
        else:
            sample = "Use all the data you need; there is no separate smoke-test run."
        return render("script_rules", exec_timeout=f"{self.ctx.spec.limits.exec_timeout_s:g} s",
                      remaining=self.remaining(), sample_rule=sample)

    def remaining(self) -> str:
        return remaining_text(self.ctx, with_time=not self.settings.replayable)

    def describe(self, run: ExecSummary) -> str:
        return run.describe(timed=not self.settings.replayable)

    def task_brief(self, limit: int = 3000) -> str:
        text = f"{self.ctx.task.title} ({self.ctx.task.task_type}, {self.ctx.task.dim})\n{self.ctx.task.description}"
        return text if len(text) <= limit else text[:limit] + "\n[...]"

    def best_before(self, node: Node) -> str:
        earlier = [n for n in self.tree.good if n.id < node.id]
        best = max(earlier, key=lambda n: n.score, default=None)  # type: ignore[arg-type,return-value]
        return best.summary() if best else "No working solution yet."

    def out_of_nodes(self) -> bool:
        """True once ``max_nodes`` nodes are done. The harness's step limit ends the run from ``ctx.step`` (so the
        run's status names it)."""
        limit = self.settings.max_nodes
        return limit is not None and len(self.tree.done) >= limit

    # ---- one node -----------------------------------------------------------------------------------------
    def save(self) -> None:
        self.ctx.save_state(self.tree.to_state(), key=STATE_KEY)

    @contextlib.contextmanager
    def node_step(self, stage: str, parent: int | None, *, redo: Node | None = None,
                  after: Callable[[Node], None] | None = None, **values: Any) -> Iterator[Node]:
        """One harness step making one node: the step opens first (so a spent budget creates no node), the node is
        saved as pending, and once done ``after`` (a policy's bookkeeping) runs and the tree is saved before the
        step closes. ``redo`` is a node a killed attempt left pending."""
        with self.ctx.step("node", stage=stage, parent=parent) as step:
            node = redo or self.tree.new_node(stage, parent, **values)
            node.step = step.number
            step.info["node"] = node.id
            self.save()
            yield node
            self.complete(node, after)
            step.result = node.journal_record()

    def complete(self, node: Node, after: Callable[[Node], None] | None = None) -> None:
        """Mark a node done, let the policy book it, submit it at once if it is the new best (so a run killed
        later still ends with it), and save the tree."""
        node.status = NodeStatus.DONE.value
        if after is not None:
            after(node)
        best = self.tree.best()
        if best is node and node.snapshot_id is not None:
            self._select(node)
        self.save()

    def develop(self, node: Node, *, worker: int = 0) -> None:
        """Write the node's code with the operator of its stage, then run and review it."""
        if self.operators[node.stage](self, node):
            self.evaluate(node, worker=worker)

    def evaluate(self, node: Node, *, worker: int = 0) -> None:
        node.execution = self.run_script(node, worker=worker)
        candidate = None
        if node.execution.ok:
            valid, validation, candidate = self.check_submission(worker)
        else:
            valid, validation = False, "not checked: the script did not finish"
        try:
            review = self.operators["analyse"](self, node, validation=validation)
            reasons = [] if node.execution.ok else [self.describe(node.execution)]
            if review is None:
                reasons.append(node.bug_reason)
            elif review.is_bug:
                reasons.append("the review found a problem")
            elif review.metric is None:
                reasons.append("no validation metric was reported")
            if node.execution.ok and not valid:
                reasons.append(validation)
            node.submission_valid = valid
            node.is_buggy = bool(reasons)
            node.bug_reason = "; ".join(reasons)
            if not node.is_buggy and candidate is not None:
                node.snapshot_id = self.ctx.snapshot_submission(
                    f"node{node.id}", candidate=candidate, code=node.code, score=node.metric,
                    metadata={"node": node.id, "lower_is_better": node.lower_is_better, "stage": node.stage})
                candidate = None
        finally:
            if candidate is not None:
                candidate.discard()

    def submission_dir(self, worker: int) -> Path:
        """Worker 0 writes the workspace's own submission folder; parallel workers get one each."""
        return self.ctx.paths.workspace / self.submission_rel(worker)

    @staticmethod
    def submission_rel(worker: int) -> str:
        return SUBMISSION_DIRNAME if worker == 0 else f"{WORKING_DIRNAME}/workers/{worker}/{SUBMISSION_DIRNAME}"

    def run_script(self, node: Node, *, worker: int = 0, sample: bool = False,
                   timeout_s: float | None = None) -> ExecSummary:
        # emptied, and written afresh, without following anything the agent's code planted there
        notes = self.ctx.fs.reset_dir(self.submission_rel(worker))
        for note in notes:
            self.ctx.log(f"submission folder of worker {worker}: {note}")
        filename = f"node_{node.id:04d}.py"
        self.ctx.fs.write_text(f"{WORKING_DIRNAME}/{filename}", node.code)
        step = self.ctx.current_step
        self.ctx.journal.append("code_written", step=step.number if step else None, file=filename, code=node.code,
                                node=node.id)
        env = [f"{SUBMISSION_ENV}={self.ctx.inside(self.submission_dir(worker))}", f"{SAMPLE_ENV}={1 if sample else 0}"]
        result = self.ctx.execute(["env", *env, "python", filename], timeout_s=timeout_s,
                                  label=f"node{node.id}" + ("-sample" if sample else ""))
        return ExecSummary(exit_code=result.exit_code, stopped_by=result.stopped_by, seconds=round(result.wall_s, 3),
                           output_tail=_tail(result.stdout_tail, result.stderr_tail, self.settings.output_tail_chars))

    def check_submission(self, worker: int) -> tuple[bool, str, Candidate | None]:
        """Collect the worker's submission safely and validate the copy; the candidate is kept for a snapshot."""
        if self.ctx.fs.is_empty_dir(self.submission_rel(worker)):
            return False, f"the script wrote nothing into ${SUBMISSION_ENV}", None
        candidate = self.ctx.collect_submission(self.submission_dir(worker))
        validation = candidate.validation
        if validation.ok:
            return True, f"the submission is valid ({validation.n_rows} rows/files)", candidate
        shown = "; ".join(validation.problems[:5])
        return False, f"the submission is invalid: {shown}", candidate

    # ---- the end --------------------------------------------------------------------------------------------
    def finish(self) -> Node | None:
        """Journal every node's summary and make sure the best valid node (in its own direction) is submitted."""
        self.ctx.journal.append("scaffold_summary", nodes=[n.journal_record() for n in self.tree if n.done])
        best = self.tree.best()
        if best is not None and best.snapshot_id is not None and self._selected != best.snapshot_id:
            self._select(best)
        return best

    def _select(self, node: Node) -> None:
        direction = "lower" if node.lower_is_better else "higher"
        self.ctx.select_final(node.snapshot_id or "", reason=f"node {node.id}: best validation metric "
                              f"{node.metric:.6g} ({direction} is better) of {len(self.tree.good)} valid node(s)")
        self._selected = node.snapshot_id


def _tail(stdout: str, stderr: str, limit: int) -> str:
    stdout, stderr = stdout.rstrip(), stderr.rstrip()
    if not stderr:
        return stdout[-limit:]
    half = limit // 2
    return f"{stdout[-half:]}\n--- stderr ---\n{stderr[-(limit - min(len(stdout), half)):]}"
