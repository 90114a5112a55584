"""The workbench every policy drives: it holds the tree, renders the shared prompt pieces, calls operators, runs a
node's script in the sandbox, checks its submission, reviews it, snapshots it, and persists the tree after every
node. Policies only decide *which* node to make next (see ``policies/``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rexmle_agents.models.types import GenerateConfig, Message, ModelResponse, ToolSpec
from rexmle_agents.sandbox.base import SUBMISSION_DIRNAME, WORKING_DIRNAME
from rexmle_agents.scaffolds.node import ExecSummary, Node, NodeStatus
from rexmle_agents.scaffolds.prompting import (
    adaptive_memory_text,
    memory_text,
    remaining_text,
    render,
    system_prompt,
)
from rexmle_agents.scaffolds.tree import Tree
from rexmle_grade.errors import RexmleError

if TYPE_CHECKING:
    from rexmle_agents.harness.context import Candidate, RunContext

STATE_KEY = "scaffold"
FULL_STATE_EVERY = 50  # saves between two full states of the tree (the others are deltas)
SAMPLE_ENV = "SAMPLE"
SUBMISSION_ENV = "SUBMISSION_DIR"
FALLBACK_DIR = f"{WORKING_DIRNAME}/fallback/{SUBMISSION_DIRNAME}"  # where the sample-shaped fallback is assembled
SAMPLE_SUBMISSION = "sample_submission"


@dataclass(frozen=True)
class TaskMetric:
    """The metric every node reports and is compared by: the task's, from its grader (never the model's guess)."""

    name: str
    lower_is_better: bool
    description: str

    def text(self) -> str:
        better = "lower" if self.lower_is_better else "higher"
        return f"`{self.name}` ({better} is better: {self.description})"


@dataclass(frozen=True)
class Settings:
    """Parameters every policy shares (``agent_config`` keys)."""

    expert_report: bool = False  # add the winning team's method summary to the prompts
    domain_pack: bool = False  # add the medical-imaging practice guide to the prompts
    data_preview: bool = True  # AIDE: the data folder's files, CSV columns and image shapes in draft/debug prompts
    memory_nodes: int = 8  # summaries of other nodes shown in a prompt
    # ML-Master's adaptive memory: the parent's and the siblings' insights (and the reasoning the model returned
    # with their code) instead of the best nodes of the whole tree
    adaptive_memory: bool = False
    memory_summary: bool = False  # AIRA: the summarise_memory operator condenses every node into the memory text
    explore_turns: int = 0  # multi-turn nodes: shell commands the model may run before committing its script
    explore_timeout_s: float = 60.0  # per command
    output_tail_chars: int = 4000  # of a script's output shown to the model
    temperature: float | None = None  # None: the provider's default (the presets set the originals' 0.5)
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
        # A policy that decides the best node itself (the R&D loop's feedback) sets this; else the best metric.
        self.choose_best: Callable[[Tree], Node | None] | None = None
        self._selected: str | None = None
        # what the journal holds of the tree (None: nothing yet in this attempt, so the next save is a full state)
        self._saved_nodes: dict[int, dict[str, Any]] | None = None
        self._saved_knowledge: list[dict[str, Any]] = []
        self._deltas = 0
        self._task_metric: TaskMetric | None = None
        self._preview: str | None = None
        self._memory_summary: tuple[int, str] | None = None
        self._summary_lock = threading.Lock()  # parallel workers share one summary per tree size

    # ---- model and prompt pieces --------------------------------------------------------------------------
    def generate(self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        return self.ctx.model(role).generate(list(messages), list(tools), self._config)

    def memory(self, node: Node) -> str:
        if self.settings.memory_summary and "summarise_memory" in self.operators:
            return self.summarised_memory(node)
        if self.settings.adaptive_memory:
            return adaptive_memory_text(self.tree, node, limit=self.settings.memory_nodes)
        return memory_text(self.tree, node, limit=self.settings.memory_nodes)

    def summarised_memory(self, node: Node) -> str:
        """The summarise_memory operator's digest of every finished node, made again only when nodes were added;
        the parent's own summary is always shown in full beside it."""
        done = len(self.tree.done)
        if done == 0:
            return "None yet."
        with self._summary_lock:
            if self._memory_summary is None or self._memory_summary[0] != done:
                self._memory_summary = (done, self.operators["summarise_memory"](self, node))
        if node.parent is None:
            return self._memory_summary[1]
        return f"{self._memory_summary[1]}\n\nThe node this one starts from:\n{self.tree[node.parent].summary()}"

    @property
    def task_metric(self) -> TaskMetric:
        """The task's validation metric and its direction, from the grader (read once)."""
        if self._task_metric is None:
            from rexmle_grade.grader import Direction, get_grader

            spec = get_grader(self.ctx.task.grader_id).validation_metric
            self._task_metric = TaskMetric(spec.name, spec.direction is Direction.LOWER_BETTER, spec.description)
        return self._task_metric

    def data_preview(self) -> str:
        """AIDE's data preview of the task's public folder (read once, by the harness, not through the workspace)."""
        if not self.settings.data_preview:
            return ""
        if self._preview is None:
            from rexmle_agents.scaffolds.preview import data_preview

            text = data_preview(self.ctx.task.public_dir)
            self._preview = render("data_preview", preview=text) if text else ""
        return self._preview

    def script_rules(self) -> str:
        if self.sample_runs:
            sample = (f"When the environment variable `{SAMPLE_ENV}` is `1`, use only a few training and test cases "
                      "and a short training so that the whole script finishes within a minute (a smoke test); "
                      "otherwise use all the data.")
        else:
            sample = "Use all the data you need; there is no separate smoke-test run."
        explore = ""
        if self.settings.explore_turns > 0:
            explore = render("explore_rule", turns=self.settings.explore_turns,
                             timeout=f"{self.settings.explore_timeout_s:g} s")
        return render("script_rules", exec_timeout=f"{self.ctx.spec.limits.exec_timeout_s:g} s",
                      remaining=self.remaining(), sample_rule=sample, metric=self.task_metric.text(),
                      explore_rule=explore)

    def remaining(self) -> str:
        return remaining_text(self.ctx, with_time=not self.settings.replayable)

    def describe(self, run: ExecSummary) -> str:
        return run.describe(timed=not self.settings.replayable)

    def task_brief(self, limit: int = 3000) -> str:
        text = f"{self.ctx.task.title} ({self.ctx.task.task_type}, {self.ctx.task.dim})\n{self.ctx.task.description}"
        return text if len(text) <= limit else text[:limit] + "\n[...]"

    def best(self) -> Node | None:
        """The node the run would submit now: the policy's choice where it makes one, else the best metric."""
        return self.choose_best(self.tree) if self.choose_best is not None else self.tree.best()

    def best_before(self, node: Node) -> str:
        if self.choose_best is not None:
            best = self.best()
        else:
            earlier = [n for n in self.tree.good if n.id < node.id]
            best = max(earlier, key=lambda n: n.score, default=None)  # type: ignore[arg-type,return-value]
        return best.summary() if best is not None and best.id != node.id else "No working solution yet."

    def out_of_nodes(self) -> bool:
        """True once ``max_nodes`` nodes are done. The harness's step limit ends the run from ``ctx.step`` (so the
        run's status names it)."""
        limit = self.settings.max_nodes
        return limit is not None and len(self.tree.done) >= limit

    # ---- one node -----------------------------------------------------------------------------------------
    def save(self) -> None:
        """Journal the tree: the nodes that changed since the last save (a full state on the first save of an
        attempt and every :data:`FULL_STATE_EVERY` saves, so a resume folds a bounded number of deltas)."""
        records = {n.id: n.to_dict() for n in self.tree}
        knowledge = self.tree.knowledge
        appended = (len(knowledge) >= len(self._saved_knowledge)
                    and knowledge[:len(self._saved_knowledge)] == self._saved_knowledge)
        if self._saved_nodes is None or self._deltas >= FULL_STATE_EVERY or not appended:
            self.ctx.save_state(self.tree.to_state(), key=STATE_KEY)
            self._deltas = 0
        else:
            changed = [r for i, r in records.items() if self._saved_nodes.get(i) != r]
            start = len(self._saved_knowledge)
            self.ctx.save_state(Tree.delta(changed, start, knowledge[start:]), key=STATE_KEY)
            self._deltas += 1
        self._saved_nodes = records
        self._saved_knowledge = [dict(k) for k in knowledge]

    @contextlib.contextmanager
    def node_step(self, stage: str, parent: int | None, *, redo: Node | None = None,
                  after: Callable[[Node], None] | None = None, **values: Any) -> Iterator[Node]:
        """One harness step making one node: the step opens first (so a spent budget creates no node), the node is
        saved as pending, and once done ``after`` (a policy's bookkeeping) runs and the tree is saved before the
        step closes. ``redo`` is a node a killed attempt left pending."""
        extra = {"merged_with": values["merged_with"]} if values.get("merged_with") is not None else {}
        with self.ctx.step("node", stage=stage, parent=parent, **extra) as step:
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
        best = self.best()
        if best is node and node.snapshot_id is not None and self._selected != node.snapshot_id:
            self._select(node)
        self.save()

    def develop(self, node: Node, *, worker: int = 0) -> None:
        """Write the node's code with the operator of its stage, then run and review it (an improvement or merge
        that returns a script already run is not run again)."""
        if self.operators[node.stage](self, node) and not self.is_duplicate(node):
            self.evaluate(node, worker=worker)

    def is_duplicate(self, node: Node) -> bool:
        """Mark an improve/merge node whose script is one already run (up to blank lines and trailing spaces)."""
        if node.stage not in ("improve", "merge"):
            return False
        key = _normalised(node.code)
        twin = next((n for n in self.tree.done if n.id != node.id and n.code and _normalised(n.code) == key), None)
        if twin is None:
            return False
        node.duplicate_of = twin.id
        node.is_buggy = True
        node.bug_reason = f"the script is identical to node {twin.id}'s: not run again; make a real change"
        return True

    def evaluate(self, node: Node, *, worker: int = 0) -> None:
        node.execution = self.run_script(node, worker=worker)
        candidate = None
        stray = ""
        if node.execution.ok:
            valid, validation, candidate = self.check_submission(worker)
        else:
            valid, validation = False, "not checked: the script did not finish"
            stray = self.remove_stray_submission(worker)
        try:
            review = self.operators["analyse"](self, node, validation=validation)
            metric = self.task_metric
            node.lower_is_better = metric.lower_is_better  # the task's direction, whatever the review said
            reasons = [] if node.execution.ok else [self.describe(node.execution) + stray]
            if review is None:
                reasons.append(node.bug_reason)
            elif review.is_bug:
                reasons.append("the review found a problem")
            elif review.metric is None:
                reasons.append("no validation metric was reported")
            elif not review.is_task_metric:
                reported = review.metric_name or "another metric"
                reasons.append(f"it reported {reported}, not the task's validation metric `{metric.name}`: its "
                               "number cannot be compared with the other nodes'")
            if node.execution.ok and not valid:
                reasons.append(validation)
            node.submission_valid = valid
            node.is_buggy = bool(reasons)
            node.bug_reason = "; ".join(reasons)
            if candidate is not None and valid:
                metadata = {"node": node.id, "metric_name": metric.name, "lower_is_better": metric.lower_is_better,
                            "stage": node.stage}
                if node.is_buggy:  # validated, but not a valid node: the run's fallback, never compared
                    node.fallback_snapshot = self.ctx.snapshot_submission(
                        f"node{node.id} (fallback: {node.bug_reason[:120]})", candidate=candidate, code=node.code,
                        score=None, metadata={**metadata, "fallback": "validated submission of a node that is "
                                                                      f"not valid: {node.bug_reason}"})
                else:
                    node.snapshot_id = self.ctx.snapshot_submission(
                        f"node{node.id}", candidate=candidate, code=node.code, score=node.metric, metadata=metadata)
                candidate = None
        finally:
            if candidate is not None:
                candidate.discard()

    def submission_dir(self, worker: int) -> Path:
        """The one folder a node's script writes its submission into (``$SUBMISSION_DIR``): one per worker, also
        for worker 0, so that a script never shares it with another worker's; the workspace's own
        ``submission/`` is not used (the chosen snapshot becomes the run's final submission)."""
        return self.ctx.paths.workspace / self.submission_rel(worker)

    @staticmethod
    def submission_rel(worker: int) -> str:
        return f"{WORKING_DIRNAME}/workers/{worker}/{SUBMISSION_DIRNAME}"

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

    def explore(self, node: Node, command: str) -> str:
        """One shell command of a multi-turn node, in the sandbox (journaled like every execution); what the model
        sees of it."""
        node.turns += 1
        result = self.ctx.execute(command, timeout_s=self.settings.explore_timeout_s,
                                  label=f"node{node.id}-turn{node.turns}")
        run = ExecSummary(exit_code=result.exit_code, stopped_by=result.stopped_by, seconds=round(result.wall_s, 3),
                          output_tail=_tail(result.stdout_tail, result.stderr_tail,
                                            self.settings.output_tail_chars // 2))
        return f"{self.describe(run)}\n{run.output_tail}"

    def remove_stray_submission(self, worker: int | None) -> str:
        """Remove what a script wrote into the workspace's own ``submission/`` (a hard-coded path) and say so. Only
        a node that wrote nothing into its own folder (``worker``; None at the end of the run) takes the blame,
        so that a parallel worker's valid node never does."""
        if worker is not None and not self.ctx.fs.is_empty_dir(self.submission_rel(worker)):
            return ""
        if self.ctx.fs.is_empty_dir(SUBMISSION_DIRNAME):
            return ""
        for note in self.ctx.fs.reset_dir(SUBMISSION_DIRNAME):
            self.ctx.log(f"workspace submission folder: {note}")
        where = self.ctx.inside(self.ctx.paths.workspace / SUBMISSION_DIRNAME)
        return f" (files appeared in {where} instead: write only into the folder ${SUBMISSION_ENV} names)"

    def check_submission(self, worker: int) -> tuple[bool, str, Candidate | None]:
        """Collect the worker's submission safely and validate the copy; the candidate is kept for a snapshot.
        Files a script left in the workspace's ``submission/`` instead are removed and named in the verdict."""
        if self.ctx.fs.is_empty_dir(self.submission_rel(worker)):
            stray = self.remove_stray_submission(worker)
            return False, f"the script wrote nothing into ${SUBMISSION_ENV}{stray}", None
        candidate = self.ctx.collect_submission(self.submission_dir(worker))
        validation = candidate.validation
        if validation.ok:
            return True, f"the submission is valid ({validation.n_rows} rows/files)", candidate
        shown = "; ".join(validation.problems[:5])
        return False, f"the submission is invalid: {shown}", candidate

    # ---- the end --------------------------------------------------------------------------------------------
    def finish(self) -> Node | None:
        """Journal every node's summary and make sure a submission is chosen: the best valid node; without one, the
        latest submission that validated (from a node flagged buggy or off-metric, marked as a fallback); without
        that, the task's sample submission (a placeholder, marked as such). Never the workspace's leftovers."""
        self.ctx.journal.append("scaffold_summary", nodes=[n.journal_record() for n in self.tree if n.done])
        self.remove_stray_submission(None)  # never left for the harness to submit
        best = self.best()
        if best is not None and best.snapshot_id is not None:
            if self._selected != best.snapshot_id:
                self._select(best)
            return best
        fallback = max((n for n in self.tree.done if n.fallback_snapshot), key=lambda n: n.id, default=None)
        if fallback is not None:
            self.ctx.select_final(fallback.fallback_snapshot or "", reason=(
                f"FALLBACK: no valid node; node {fallback.id}'s submission validated although the node is not valid "
                f"({fallback.bug_reason})"))
            return None
        self._submit_sample()
        return None

    def _submit_sample(self) -> None:
        """Snapshot and choose the task's sample submission (copied from the harness's public folder into a
        folder of the workspace the engine resets, then collected and validated like any other)."""
        try:
            source = Path(self.ctx.task.public_dir) / SAMPLE_SUBMISSION
            self.ctx.fs.reset_dir(FALLBACK_DIR)
            for path in sorted(source.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    self.ctx.fs.write_bytes(f"{FALLBACK_DIR}/{path.relative_to(source).as_posix()}", path.read_bytes())
            snapshot = self.ctx.snapshot_submission(
                "sample-shaped fallback", source=self.ctx.paths.workspace / FALLBACK_DIR,
                metadata={"fallback": "the task's sample submission: no node produced a submission that validated"})
        except (OSError, RexmleError) as exc:
            self.ctx.journal.append("warning", message=f"no fallback submission could be made: {exc}")
            return
        self.ctx.select_final(snapshot, reason="FALLBACK: no node produced a submission that validated; the task's "
                                               "sample submission (scores like the sample agent)")

    def _select(self, node: Node) -> None:
        direction = "lower" if node.lower_is_better else "higher"
        name = f"{node.metric_name} " if node.metric_name else ""
        # a policy's choice is named only when it made one (rdloop: a round the feedback accepted), not its fallback
        how = "chosen by the feedback" if self.choose_best is not None and node.accepted else "best validation metric"
        self.ctx.select_final(node.snapshot_id or "", reason=f"node {node.id}: {how} {name}{node.metric:.6g} "
                              f"({direction} is better) of {len(self.tree.good)} valid node(s)")
        self._selected = node.snapshot_id


def _normalised(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines() if line.strip())


def _tail(stdout: str, stderr: str, limit: int) -> str:
    stdout, stderr = stdout.rstrip(), stderr.rstrip()
    if not stderr:
        return stdout[-limit:]
    half = limit // 2
    return f"{stdout[-half:]}\n--- stderr ---\n{stderr[-(limit - min(len(stdout), half)):]}"
