"""An original agent's own node tree, converted into the node records rexmle's scaffolds journal.

AIDE (``aideml``) saves its whole search after every node as ``journal.json``: a list of nodes (plan, code, the
terminal output, execution time, exception type, the review's analysis, ``metric: {value, maximize}``, is_buggy,
creation time ``ctime``, ``step``: its index) and ``node2parent`` (node id -> parent id). ML-Master versions that
save a journal use the same layout (its virtual root, stage ``root``, is left out). Each node becomes a
:class:`rexmle_agents.scaffolds.node.Node`, so the run's tree is read by reports, the viewer and the capability
analysis exactly like a scaffold's.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from rexmle_agents.scaffolds.node import ExecSummary, Node, NodeStatus

OUTPUT_TAIL_CHARS = 4000


@dataclass(frozen=True)
class ForeignNode:
    """One node as the original agent recorded it."""

    key: str  # the agent's own node id
    index: int  # its position in the agent's journal (AIDE: ``step``)
    parent: str | None
    plan: str
    code: str
    output: str
    exec_seconds: float
    exception: str | None
    analysis: str
    metric: float | None
    maximize: bool | None
    is_buggy: bool
    created: float | None  # Unix seconds


class TreeFormatError(ValueError):
    """The file is not a tree of the expected format."""


def parse_aide_journal(data: bytes) -> list[ForeignNode]:
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise TreeFormatError(f"not JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list):
        raise TreeFormatError("no list of nodes")
    parents = raw.get("node2parent") or {}
    nodes = []
    for position, item in enumerate(raw["nodes"]):
        if not isinstance(item, dict) or item.get("stage") == "root":
            continue
        metric = item.get("metric") or {}
        value = metric.get("value") if isinstance(metric, dict) else None
        term = item.get("_term_out") or item.get("term_out") or []
        key = str(item.get("id", position))
        nodes.append(ForeignNode(
            key=key, index=int(item["step"]) if isinstance(item.get("step"), int) else position,
            parent=parents.get(key), plan=str(item.get("plan") or ""), code=str(item.get("code") or ""),
            output="".join(term) if isinstance(term, list) else str(term),
            exec_seconds=float(item.get("exec_time") or 0.0), exception=item.get("exc_type"),
            analysis=str(item.get("analysis") or ""),
            metric=float(value) if isinstance(value, (int, float)) else None,
            maximize=metric.get("maximize") if isinstance(metric, dict) else None,
            is_buggy=bool(item.get("is_buggy", True)),
            created=float(item["ctime"]) if isinstance(item.get("ctime"), (int, float)) else None,
        ))
    known = {n.key for n in nodes}  # a parent that is not a node (ML-Master's virtual root) makes a draft
    ordered = sorted(nodes, key=lambda n: n.index)
    return [n if n.parent in known else dataclasses.replace(n, parent=None) for n in ordered]


def bug_reason(node: ForeignNode) -> str:
    if node.exception:
        return f"the script raised {node.exception}"
    if node.metric is None:
        return "no validation metric was reported"
    return "the agent's review found a bug" if node.is_buggy else ""


def to_node(node: ForeignNode, *, node_id: int, parent_id: int | None, parent: Node | None, step: int | None,
            snapshot: str | None, snapshot_valid: bool) -> Node:
    """The rexmle node record of ``node`` (``parent``: the already converted parent, for the stage)."""
    stage = "draft" if parent is None else ("debug" if parent.is_buggy else "improve")
    depth = parent.debug_depth + 1 if parent is not None and stage == "debug" else 0
    timed_out = node.exception == "TimeoutError"
    execution = ExecSummary(exit_code=None if timed_out else (1 if node.exception else 0),
                            stopped_by="timeout" if timed_out else None,
                            output_tail=node.output[-OUTPUT_TAIL_CHARS:], seconds=round(node.exec_seconds, 3))
    return Node(id=node_id, stage=stage, parent=parent_id, status=NodeStatus.DONE.value, plan=node.plan,
                code=node.code, execution=execution, analysis=node.analysis,
                metric=None if node.is_buggy else node.metric,
                lower_is_better=None if node.maximize is None else not node.maximize, is_buggy=node.is_buggy,
                bug_reason=bug_reason(node), submission_valid=snapshot_valid, snapshot_id=snapshot,
                debug_depth=depth, step=step)
