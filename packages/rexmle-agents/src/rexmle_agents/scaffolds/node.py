"""One node of a search: what an operator proposed (plan + code), what running it did, and what the review said.

Nodes are plain JSON-serialisable records: the whole tree is saved through the run journal after every node
(:meth:`rexmle_agents.harness.context.RunContext.save_state`), so a killed run resumes with it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from rexmle_grade.errors import RexmleError


class Stage(str, Enum):
    DRAFT = "draft"
    DEBUG = "debug"
    IMPROVE = "improve"
    MERGE = "merge"  # crossover of two working nodes (``parent`` and ``merged_with``)


class NodeStatus(str, Enum):
    PENDING = "pending"  # chosen and saved, its step not finished: a resumed run redoes it
    DONE = "done"


@dataclass
class ExecSummary:
    """The journal-sized summary of one execution of a node's script."""

    exit_code: int | None
    stopped_by: str | None
    output_tail: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.stopped_by is None

    def describe(self, *, timed: bool = True) -> str:
        """``timed=False`` leaves the wall-clock reading out (prompts of a run meant to replay exactly)."""
        took = f" after {self.seconds:.1f} s" if timed else ""
        if self.stopped_by == "timeout":
            return f"stopped: it exceeded its time limit{took}"
        if self.stopped_by:
            return f"stopped by the sandbox ({self.stopped_by}){took}"
        return f"exit status {self.exit_code}{took}"


@dataclass
class Node:
    id: int
    stage: str
    parent: int | None = None
    children: list[int] = field(default_factory=list)
    status: str = NodeStatus.PENDING.value
    plan: str = ""
    code: str = ""
    hypothesis: str = ""  # R&D loop: what this node set out to test
    lesson: str = ""  # R&D loop: what the feedback said to remember
    execution: ExecSummary | None = None
    sample_execution: ExecSummary | None = None  # R&D loop: the quick run on a data sample
    analysis: str = ""
    metric: float | None = None
    lower_is_better: bool | None = None  # the task's validation metric's direction (never the model's guess)
    metric_name: str = ""  # what the review says the printed number measures
    is_buggy: bool = True
    bug_reason: str = ""
    submission_valid: bool = False
    snapshot_id: str | None = None
    # a submission that validated although the node is not valid (the review found a bug, or another metric was
    # reported): kept only as the run's fallback when no node is valid, never compared with valid nodes
    fallback_snapshot: str | None = None
    duplicate_of: int | None = None  # its script was identical to this node's: not run again
    merged_with: int | None = None  # a merge node's second parent
    debug_depth: int = 0
    thinking: str = ""  # the reasoning the model returned with the code (adaptive memory feeds it to children)
    turns: int = 0  # multi-turn nodes: shell commands run before the script was committed
    revisions: list[str] = field(default_factory=list)  # R&D loop: the code reviewer's feedback, one per revision
    accepted: bool | None = None  # R&D loop: the feedback model made it the new best
    # MCTS statistics (other policies leave them at zero)
    visits: int = 0
    value_sum: float = 0.0
    reward: float | None = None
    worker: int = 0
    step: int | None = None

    @property
    def done(self) -> bool:
        return self.status == NodeStatus.DONE.value

    @property
    def has_metric(self) -> bool:
        """A metric that can be compared: a finite number (a NaN or infinite one, however it arrived, is none)."""
        return isinstance(self.metric, (int, float)) and math.isfinite(self.metric)

    @property
    def works(self) -> bool:
        """Its development succeeded (done or not yet marked done): not buggy, a finite metric, a submission that
        validated."""
        return not self.is_buggy and self.has_metric and self.submission_valid

    @property
    def is_valid(self) -> bool:
        """Usable as a final answer: done, not buggy, a metric, and a submission snapshot that validated."""
        return self.done and self.works

    @property
    def score(self) -> float | None:
        """The metric turned so that higher is better, read in the node's own direction (None without a finite
        metric: never compared)."""
        if not self.has_metric:
            return None
        return -self.metric if self.lower_is_better else self.metric

    def outcome(self) -> str:
        """What developing the node produced so far, whether or not it is marked done."""
        if self.duplicate_of is not None:
            return f"DUPLICATE of node {self.duplicate_of}: the same script, not run again"
        if self.is_buggy:
            return f"BUGGY: {self.bug_reason or 'failed'}"
        if not self.has_metric:
            return "NO METRIC: no finite validation metric was reported"
        direction = "lower is better" if self.lower_is_better else "higher is better"
        name = f"{self.metric_name} " if self.metric_name else ""
        return f"validation metric {name}{self.metric:.6g} ({direction})"

    def summary(self) -> str:
        """A few lines for other nodes' prompts (memory) and for the journal."""
        parents = f"child of nodes {self.parent} and {self.merged_with}" if self.merged_with is not None else (
            f"child of node {self.parent}")
        head = f"node {self.id} ({self.stage}" + (f", {parents}" if self.parent is not None else "")
        if not self.done:
            return head + "): not run yet"
        lines = [head + f"): {self.outcome()}"]
        if self.plan:
            lines.append("  plan: " + _one_line(self.plan, 400))
        if self.analysis:
            lines.append("  review: " + _one_line(self.analysis, 400))
        return "\n".join(lines)

    def journal_record(self) -> dict[str, Any]:
        """What the journal keeps per node (no code: the code_written event has it)."""
        return {
            "node": self.id, "stage": self.stage, "parent": self.parent, "is_buggy": self.is_buggy,
            "bug_reason": self.bug_reason, "metric": self.metric, "lower_is_better": self.lower_is_better,
            "metric_name": self.metric_name, "valid": self.is_valid, "snapshot": self.snapshot_id,
            "fallback_snapshot": self.fallback_snapshot, "debug_depth": self.debug_depth,
            **({"merged_with": self.merged_with} if self.merged_with is not None else {}),
            **({"duplicate_of": self.duplicate_of} if self.duplicate_of is not None else {}),
            **({"turns": self.turns} if self.turns else {}),
            **({"revisions": len(self.revisions)} if self.revisions else {}),
            **({"accepted": self.accepted} if self.accepted is not None else {}),
            "exit": None if self.execution is None else self.execution.describe(),
            "summary": self.summary(),
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Node:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise RexmleError(f"a saved search node has unknown field(s) {unknown}",
                              hint="the run was written by a newer rexmle-agents; resume it with that version")
        values = dict(data)
        for key in ("execution", "sample_execution"):
            if values.get(key) is not None:
                values[key] = ExecSummary(**values[key])
        return cls(**values)


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
