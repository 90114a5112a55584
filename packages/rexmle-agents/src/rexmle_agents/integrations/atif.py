"""A run's trajectory in Harbor's Agent Trajectory Interchange Format (ATIF), for ``rexmle runs export --format atif``.

ATIF (Harbor's ``harbor.models.trajectories``, schema ``ATIF-v1.8``) is a list of steps, each from the ``user``,
the ``system`` or the ``agent``, with the agent's message, its tool calls, the observations that answered them and
the step's token and cost metrics. A rexmle run maps onto it as:

* step 1 (``user``): the instructions the agent got (``workspace/instructions.md``, read through the workspace
  module, never following the agent's links);
* one ``agent`` step per rexmle step, in order: a terminal agent's turn (``agent_turn``: its text, its tool calls,
  and as observations the outputs that came back with the next turn), a scaffold's node (its plan and analysis as
  the message, the code it wrote and each execution as tool calls ``write_file`` / ``run``, their outputs as
  observations), or any other agent's step (what it wrote and ran);
* each agent step's ``metrics`` sum the ``model_call`` events of that rexmle step (prompt tokens include cached
  ones, as rexmle counts them); ``llm_call_count`` is their number;
* a closing ``system`` step with the grade, and ``final_metrics`` with the run's totals.

Nothing here imports Harbor (it needs Python >= 3.12); the tests validate the output with Harbor's own model.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from typing import Any

from rexmle_agents.results.loader import RunRecord
from rexmle_agents.results.records import AgentTurn, ExecStarted, ModelCall
from rexmle_agents.results.trajectory import NodeView, trajectory

ATIF_VERSION = "ATIF-v1.8"
INSTRUCTIONS_MAX_BYTES = 512 * 1024


def run_to_atif(run: RunRecord) -> dict[str, Any]:
    """The ATIF document (a JSON-ready dict) of one run folder."""
    view = trajectory(run)
    events = run.journal().events
    calls_by_step: dict[int | None, list[ModelCall]] = defaultdict(list)
    for call in view.model_calls:
        calls_by_step[call.step].append(call)
    turns = {e.step: e for e in events if isinstance(e, AgentTurn)}
    outputs = _turn_outputs(turns)
    argvs = {e.name: e.argv for e in events if isinstance(e, ExecStarted)}

    steps: list[dict[str, Any]] = [{
        "step_id": 1, "timestamp": _iso(view.started), "source": "user",
        "message": _instructions(run) or f"rexmle task {run.spec.task_id} (the run folder keeps no instructions)",
    }]
    for node in view.nodes:
        turn = turns.get(node.step)
        step = _turn_step(turn, outputs) if turn is not None else _node_step(node, view.kind, argvs)
        step["step_id"] = len(steps) + 1
        step["timestamp"] = _iso(node.started if turn is None else turn.time)
        step["source"] = "agent"
        calls = calls_by_step.get(node.step, [])
        step["llm_call_count"] = len(calls)
        if calls:
            step["metrics"] = _metrics(calls)
            step["model_name"] = calls[-1].model
        step["extra"] = {"rexmle_step": node.step, "stage": node.stage, "status": node.status,
                         **({"validation_metric": _finite(node.metric)} if node.metric is not None else {}),
                         **({"final": True} if node.final else {})}
        steps.append({k: v for k, v in step.items() if v is not None})
    if run.grade is not None:
        steps.append({"step_id": len(steps) + 1, "source": "system", "message": _grade_message(run.grade),
                      "extra": {"status": run.grade.status, "percentile": run.grade.percentile,
                                "metrics": {k: _finite(v) for k, v in run.grade.metrics.items()}}})

    status = run.status
    totals = _metrics(view.model_calls) if view.model_calls else {}
    models = run.spec.models
    return {
        "schema_version": ATIF_VERSION,
        "session_id": run.spec.run_id,
        "agent": {"name": run.spec.agent, "version": run.spec.agent_version,
                  **({"model_name": models.get("code") or next(iter(models.values()))} if models else {}),
                  "extra": {"agent_config": run.spec.agent_config, "models": models}},
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": status.input_tokens if status.input_tokens is not None
            else totals.get("prompt_tokens"),
            "total_completion_tokens": status.output_tokens if status.output_tokens is not None
            else totals.get("completion_tokens"),
            "total_cached_tokens": totals.get("cached_tokens"),
            # dollars only where every call had a price: rexmle's status sums the priced ones alone
            "total_cost_usd": None if status.uncosted_calls else status.cost_usd if status.cost_usd is not None
            else totals.get("cost_usd"),
            "total_steps": len(steps),
        },
        "notes": f"rexmle run {run.spec.run_id}: {run.spec.agent} on {run.spec.task_id} (run format "
                 f"{run.spec.format_version}); state {status.state}" + (f": {status.reason}" if status.reason else ""),
        "extra": {"rexmle_run_id": run.spec.run_id, "task_id": run.spec.task_id,
                  "task_version": run.spec.task_version, "data_variant": run.variant, "seed": run.spec.seed,
                  "state": status.state, "trajectory_kind": view.kind,
                  "uncosted_calls": status.uncosted_calls or 0},
    }


def _instructions(run: RunRecord) -> str | None:
    from rexmle_agents.harness.paths import INSTRUCTIONS_FILENAME
    from rexmle_agents.safe_workspace import Workspace, WorkspaceRefused

    workspace = run.run_dir / "workspace"
    if not workspace.is_dir():
        return None
    try:
        data = Workspace(workspace).read_bytes(INSTRUCTIONS_FILENAME, max_bytes=INSTRUCTIONS_MAX_BYTES)
    except WorkspaceRefused:
        return None
    return None if data is None else data.decode("utf-8", errors="replace")


def _turn_outputs(turns: dict[int | None, AgentTurn]) -> dict[str, str]:
    """tool call id -> its output: the outputs of a turn's calls arrive with the next turn's request."""
    return {str(result.get("id")): str(result.get("output") or "") for turn in turns.values()
            for result in turn.tool_results}


def _turn_step(turn: AgentTurn, outputs: dict[str, str]) -> dict[str, Any]:
    calls, results = [], []
    for number, call in enumerate(turn.tool_calls):
        call_id = str(call.get("id") or f"step{turn.step}-call{number}")
        arguments = call.get("arguments")
        calls.append({"tool_call_id": call_id, "function_name": str(call.get("name") or "tool"),
                      "arguments": arguments if isinstance(arguments, dict) else {"value": arguments}})
        if call_id in outputs:
            results.append({"source_call_id": call_id, "content": outputs[call_id]})
    return {"message": turn.text, "tool_calls": calls or None,
            "observation": {"results": results} if results else None}


def _node_step(node: NodeView, kind: str, argvs: dict[str, list[str]]) -> dict[str, Any]:
    parts = [node.plan.strip()]
    if node.hypothesis:
        parts.append(f"Hypothesis: {node.hypothesis.strip()}")
    if node.analysis:
        parts.append(f"Analysis: {node.analysis.strip()}")
    if node.buggy and node.bug_reason:
        parts.append(f"Bug: {node.bug_reason}")
    message = "\n\n".join(p for p in parts if p) or f"{kind} {node.stage} {node.id}"
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    if node.code:
        calls.append({"tool_call_id": f"node{node.id}-code", "function_name": "write_file",
                      "arguments": {"code": node.code}})
    for number, execution in enumerate(node.executions):
        call_id = f"node{node.id}-exec{number}"
        calls.append({"tool_call_id": call_id, "function_name": "run", "arguments": {"name": execution.name,
                                                                       "argv": argvs.get(execution.name, [])}})
        results.append({"source_call_id": call_id, "content": execution.output_tail,
                        "extra": {"exit_code": execution.exit_code, "stopped_by": execution.stopped_by,
                                  "seconds": execution.seconds}})
    return {"message": message, "tool_calls": calls or None,
            "observation": {"results": results} if results else None}


def _metrics(calls: list[ModelCall]) -> dict[str, Any]:
    costs = [c.cost_usd for c in calls]
    return {"prompt_tokens": sum(c.usage.input_tokens for c in calls),
            "completion_tokens": sum(c.usage.output_tokens for c in calls),
            "cached_tokens": sum(c.usage.cached_input_tokens for c in calls),
            # a call without a price makes the sum unknown, never a silent undercount
            "cost_usd": None if any(c is None for c in costs) else round(sum(costs), 8)}  # type: ignore[arg-type]


def _grade_message(grade: Any) -> str:
    medal = "gold" if grade.gold_medal else "silver" if grade.silver_medal else "bronze" if grade.bronze_medal \
        else "no"
    percentile = "none" if grade.percentile is None else f"{grade.percentile:.3f}"
    return f"Graded: {grade.status}; percentile {percentile}; {medal} medal."


def _finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity: such a metric is written as null."""
    return value if value is None or math.isfinite(value) else None


def _iso(seconds: float | None) -> str | None:
    return None if seconds is None else dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat()
