"""What a run did, node by node: the search tree of a scaffold, or the steps of any other agent as a chain.

One :class:`Trajectory` per run, read from its journal, feeds the run page of ``rexmle view``, ``rexmle runs show``,
the per-node table and the search-curve figure. A scaffold's tree is its last saved state (``agent_state`` key
``scaffold``), so every node the run made is there, finished or not; timing, tokens and cost come from the node's
step, its execution logs from the ``exec_finished`` events named after it, the selection-split score from its
snapshot, and the final node is the one whose snapshot the harness collected.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from rexmle_agents.results.loader import RunRecord
from rexmle_agents.results.records import (
    AgentTurn,
    CodeWritten,
    ExecFinished,
    FinalCollected,
    FinalSelected,
    ModelCall,
    RunResumed,
    RunStarted,
    SnapshotEvent,
    StepFinished,
    StepStarted,
)
from rexmle_grade.errors import RexmleError

SCAFFOLD_STATE_KEY = "scaffold"
_NODE_EXEC = re.compile(r"-node(\d+)(-sample)?$")


@dataclass
class Execution:
    name: str
    exit_code: int | None
    stopped_by: str | None
    seconds: float
    output_tail: str
    log_files: tuple[str, ...]  # relative to the run folder: the full output


@dataclass
class NodeView:
    id: int
    parent: int | None
    stage: str
    status: str  # done | pending (scaffold nodes); ok | error | out_of_budget | interrupted | running (steps)
    step: int | None
    plan: str = ""
    code: str = ""
    hypothesis: str = ""
    analysis: str = ""
    lesson: str = ""
    metric: float | None = None
    lower_is_better: bool | None = None
    buggy: bool = False
    bug_reason: str = ""
    valid: bool = False
    snapshot: str | None = None
    final: bool = False
    selection: dict[str, Any] | None = None
    started: float | None = None  # Unix seconds
    finished: float | None = None
    seconds: float | None = None
    model_calls: int = 0
    tokens: int = 0
    cost_usd: float | None = 0.0  # None: a call of the node had no price (see uncosted_calls)
    uncosted_calls: int = 0
    executions: list[Execution] = field(default_factory=list)


@dataclass
class Trajectory:
    kind: str  # "tree" (a scaffold's search) or "steps" (any other agent)
    nodes: list[NodeView]
    model_calls: list[ModelCall]
    started: float | None  # the first attempt's start (Unix seconds)
    final_snapshot: str | None
    knowledge: list[dict[str, Any]] = field(default_factory=list)

    @property
    def final_node(self) -> NodeView | None:
        return next((n for n in self.nodes if n.final), None)

    def search_curve(self) -> list[tuple[NodeView, float, float]]:
        """(node, run seconds at its end, best metric so far) for every node with a metric, in finishing order;
        "best" follows the direction the first scored node reported (higher is better when none said)."""
        scored = sorted((n for n in self.nodes if n.metric is not None and not n.buggy and n.finished is not None),
                        key=lambda n: n.finished or 0.0)
        if not scored:
            return []
        lower = bool(scored[0].lower_is_better)
        best: float | None = None
        curve = []
        for node in scored:
            value = float(node.metric)  # type: ignore[arg-type]
            best = value if best is None else (min(best, value) if lower else max(best, value))
            curve.append((node, (node.finished or 0.0) - (self.started or node.finished or 0.0), best))
        return curve


def trajectory(run: RunRecord) -> Trajectory:
    scan = run.journal()
    events = scan.events
    started_at = next((e.time for e in events if isinstance(e, (RunStarted, RunResumed))), None)
    steps_started = {e.step: e for e in events if isinstance(e, StepStarted)}
    steps_finished = {e.step: e for e in events if isinstance(e, StepFinished)}
    snapshots = {e.snapshot: e for e in events if isinstance(e, SnapshotEvent)}
    final = next((e.snapshot for e in reversed(events) if isinstance(e, FinalCollected)), None)
    if final is None:  # still running: the agent's latest choice
        final = next((e.snapshot for e in reversed(events) if isinstance(e, FinalSelected)), None)
    calls = [e for e in events if isinstance(e, ModelCall)]
    state = None
    if SCAFFOLD_STATE_KEY in scan.state_keys:  # the last full tree and the deltas saved after it, folded
        from rexmle_agents.scaffolds.tree import Tree

        try:
            state = Tree.from_states(scan.states(SCAFFOLD_STATE_KEY)).to_state()
        except RexmleError as exc:
            scan.problems.append(f"{scan.path.name}: the saved search tree cannot be read: {exc.message}")
    if isinstance(state, dict) and isinstance(state.get("nodes"), list):
        nodes = _tree_nodes(state["nodes"], events)
        kind, knowledge = "tree", list(state.get("knowledge") or [])
    else:
        nodes = _step_nodes(events)
        kind, knowledge = "steps", []
    for node in nodes:
        _add_step_facts(node, steps_started.get(node.step), steps_finished.get(node.step))
        snap = snapshots.get(node.snapshot) if node.snapshot else None
        if snap is not None and snap.selection:
            node.selection = dict(snap.selection)
        node.final = final is not None and node.snapshot == final
    return Trajectory(kind=kind, nodes=nodes, model_calls=calls, started=started_at, final_snapshot=final,
                      knowledge=knowledge)


def _tree_nodes(raw_nodes: list[dict[str, Any]], events: list[Any]) -> list[NodeView]:
    runs: dict[int, list[Execution]] = defaultdict(list)
    for event in events:
        if isinstance(event, ExecFinished):
            match = _NODE_EXEC.search(event.name)
            if match:
                runs[int(match.group(1))].append(_execution(event))
    nodes = []
    for raw in raw_nodes:
        node_id = int(raw.get("id", len(nodes)))
        execution = raw.get("execution") or {}
        node = NodeView(
            id=node_id, parent=raw.get("parent"), stage=str(raw.get("stage", "")), status=str(raw.get("status", "")),
            step=raw.get("step"), plan=str(raw.get("plan") or ""), code=str(raw.get("code") or ""),
            hypothesis=str(raw.get("hypothesis") or ""), analysis=str(raw.get("analysis") or ""),
            lesson=str(raw.get("lesson") or ""), metric=raw.get("metric"), lower_is_better=raw.get("lower_is_better"),
            buggy=bool(raw.get("is_buggy", True)) and raw.get("status") == "done", bug_reason=str(
                raw.get("bug_reason") or ""), snapshot=raw.get("snapshot_id"),
            valid=bool(raw.get("submission_valid")) and not raw.get("is_buggy", True),
            executions=runs.get(node_id, []),
        )
        if not node.executions and execution:  # the journal's tail when no exec event names the node
            node.executions.append(Execution(name=f"node{node_id}", exit_code=execution.get("exit_code"),
                                             stopped_by=execution.get("stopped_by"),
                                             seconds=float(execution.get("seconds") or 0.0),
                                             output_tail=str(execution.get("output_tail") or ""), log_files=()))
        nodes.append(node)
    return nodes


def _step_nodes(events: list[Any]) -> list[NodeView]:
    nodes: dict[int, NodeView] = {}
    previous: int | None = None
    calls: dict[str, tuple[NodeView, str]] = {}  # a terminal agent's tool call id -> (its turn, the tool's name)
    for event in events:
        step = getattr(event, "step", None)
        if isinstance(event, StepStarted):
            nodes[event.step] = NodeView(id=event.step, parent=previous, stage=event.step_kind, status="running",
                                         step=event.step, plan=_describe_info(event.info))
            previous = event.step
        elif step is None or step not in nodes:
            continue
        elif isinstance(event, StepFinished):
            node = nodes[step]
            node.status = event.status
            node.buggy = event.status != "ok"
            if event.status != "ok":
                node.bug_reason = f"the step ended with status {event.status}"
        elif isinstance(event, CodeWritten):
            node = nodes[step]
            node.code = (node.code + "\n\n" if node.code else "") + f"# {event.file}\n{event.code}"
        elif isinstance(event, AgentTurn):
            _add_turn(nodes[step], event, calls)
        elif isinstance(event, ExecFinished):
            node = nodes[step]
            node.executions.append(_execution(event))
            if event.exit_code != 0 or event.stopped_by:
                node.buggy = True
                node.bug_reason = node.bug_reason or f"{event.name}: exit {event.exit_code}" + (
                    f", stopped by {event.stopped_by}" if event.stopped_by else "")
        elif isinstance(event, SnapshotEvent):
            node = nodes[step]
            node.snapshot, node.valid = event.snapshot, event.valid
            if event.score is not None:
                node.metric = event.score
                node.lower_is_better = event.metadata.get("lower_is_better")
    for number, node in nodes.items():
        if node.status == "running" and any(getattr(e, "kind", "") == "step_interrupted"
                                            and getattr(e, "step", None) == number for e in events):
            node.status = "interrupted"
    return list(nodes.values())


def _add_turn(node: NodeView, turn: AgentTurn, calls: dict[str, tuple[NodeView, str]]) -> None:
    """A terminal agent's turn: its text is the node's plan, the commands (or tool calls) it asked for its code, and
    the outputs of earlier turns' calls, which arrive with this turn's request, go to the turns that made them."""
    node.plan = turn.text
    lines = []
    for call in turn.tool_calls:
        arguments = call.get("arguments") or {}
        command = next((arguments[k] for k in ("command", "cmd") if k in arguments), None)
        if isinstance(command, list):
            command = " ".join(str(part) for part in command)
        lines.append(f"# {call.get('name')}\n{command}" if command is not None
                     else f"# {call.get('name')}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})")
        calls[str(call.get("id"))] = (node, str(call.get("name") or "tool"))
    if lines:
        node.code = (node.code + "\n\n" if node.code else "") + "\n\n".join(lines)
    for result in turn.tool_results:
        owner, name = calls.get(str(result.get("id")), (node, "tool"))
        owner.executions.append(Execution(name=f"{name} {result.get('id')}", exit_code=None, stopped_by=None,
                                          seconds=0.0, output_tail=str(result.get("output") or ""), log_files=()))


def _describe_info(info: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in info.items())


def _execution(event: ExecFinished) -> Execution:
    tail = event.stdout_tail.rstrip()
    if event.stderr_tail.strip():
        tail = f"{tail}\n--- stderr ---\n{event.stderr_tail.rstrip()}" if tail else event.stderr_tail.rstrip()
    return Execution(name=event.name, exit_code=event.exit_code, stopped_by=event.stopped_by, seconds=event.wall_s,
                     output_tail=tail, log_files=(f"logs/exec/{event.name}.stdout", f"logs/exec/{event.name}.stderr"))


def _add_step_facts(node: NodeView, started: StepStarted | None, finished: StepFinished | None) -> None:
    if started is not None:
        node.started = started.time
    if finished is not None:
        node.finished = finished.time
        node.seconds = finished.seconds
        usage = finished.model_usage
        node.model_calls, node.tokens = usage.calls, usage.usage.total_tokens
        node.cost_usd = None if usage.uncosted_calls else usage.cost_usd
        node.uncosted_calls = usage.uncosted_calls
