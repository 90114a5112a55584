"""One row per run: what it was, how it scored, and the comparability columns the harness recorded.

Everything in a :class:`RunRow` comes from the run folder (spec, status, grade, cluster.json) or the task registry,
never from what a user declares: hardware as measured, the time budget and the time used, steps, tokens and cost,
the sandbox and therefore the network, whether any held-out signal was reachable, the selection split's K, versions,
the seed, the data variant (real, synthetic-easy, synthetic-realistic), the raw value of the task's primary metric
beside the percentile, and for SLURM runs their job as SLURM reported it and whether the cluster
ended the run. Rows are the tidy per-run table and the input of every aggregate.

Counting rule (also in :data:`RULES`): an invalid, missing or ungraded submission counts as percentile 0 and takes
position N+1 on a board of N rows (last on every metric, which is what percentile 0 means); a task without a human
board (RAVIR) has no percentile and is left out of percentile means, never counted as 0.

Cost rule: ``cost_usd`` is the run's model cost only when every call was priced; a run with an unpriced call (a
model with no price, or usage the provider did not report) has ``cost_usd`` None, shown as "unknown" with its
``uncosted_calls``, never as $0.00 (``cost_known_usd`` keeps the dollars of the priced calls).
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from rexmle_agents.results.loader import SYNTHETIC_UNKNOWN_VARIANT, RunRecord, task_facts
from rexmle_grade.errors import RexmleError

# settings shown in a row's config label; any other setting is folded into a short digest, so runs that differ
# in it are never merged into one row
LABEL_SETTINGS = ("baseline", "config", "policy", "expert_report", "domain_pack", "workers")
ISOLATING_SANDBOXES = ("bwrap", "apptainer", "docker")


class RunRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    group: str
    run_dir: str
    data: Literal["synthetic", "real", "unknown"]
    # real, synthetic-easy, synthetic-realistic, synthetic-unknown or unknown: rows of two variants are never pooled
    variant: str = ""
    synthetic: bool | None
    task_id: str
    task_version: str
    competition: str
    task_type: str
    dim: str
    agent: str
    agent_version: str
    model: str
    config: str
    agent_config: str  # JSON
    budget: str
    seed: int
    state: str
    reason: str
    limit: str | None
    graded: bool
    grade_status: str  # valid | invalid_submission | grader_error | missing | not graded
    valid: bool
    percentile: float | None  # as graded (None: invalid, or no board)
    # the task's primary metric (the grader's validation metric) as graded: the raw score beside the percentile,
    # which on a board of few rows cannot tell different scores apart (None: invalid or not graded)
    primary_metric: str | None = None
    primary_value: float | None = None
    primary_higher_is_better: bool | None = None
    percentile_counted: float | None  # the value every aggregate uses: 0 for an invalid submission on a board
    mean_position: float | None  # as graded
    position_counted: float | None  # N+1 for an invalid submission
    board_rows: int | None
    gold: bool
    silver: bool
    bronze: bool
    any_medal: bool
    above_median: bool
    time_budget_s: float
    time_used_s: float
    exec_timeout_s: float
    steps: int
    max_steps: int | None
    model_calls: int | None
    tokens: int | None
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None  # None: unknown (no usage recorded, or a call without a price: see uncosted_calls)
    uncosted_calls: int | None
    cost_known_usd: float | None = None  # dollars of the priced calls alone (a lower bound when some were not)
    max_tokens: int | None
    max_cost_usd: float | None
    sandbox: str
    network: str
    heldout_reachable: str
    selection_k: int
    gpus: int | None
    gpu_names: str
    # the GPUs the run held times the wall-clock it used (None: its hardware was not recorded)
    gpu_hours: float | None = None
    cpus: int | None
    cpu_model: str
    memory_gb: float | None
    host: str
    rexmle_versions: str
    grader_id: str
    leaderboard_version: str | None
    started_at: str | None
    finished_at: str | None
    problems: int
    # the run's latest SLURM job as SLURM reported it (None outside SLURM), and whether the cluster, not the agent
    # or the harness, ended the run (cancelled, preempted, timed out by SLURM, node failure, out of memory)
    job_id: str | None = None
    job_state: str | None = None
    job_exit_code: str | None = None
    job_elapsed_s: float | None = None
    queue_wait_s: float | None = None
    job_node: str | None = None
    requeues: int | None = None
    job_source: str | None = None
    ended_by_cluster: bool = False

    @model_validator(mode="after")
    def _variant_of_kind(self) -> RunRow:
        if not self.variant:  # a row built without a variant (a test, a notebook) stands for its data kind
            self.variant = {"synthetic": SYNTHETIC_UNKNOWN_VARIANT}.get(self.data, self.data)
        return self


def model_label(models: dict[str, str]) -> str:
    """``openai/gpt-5`` when one model serves every role, else ``code=...,feedback=...``; ``-`` without a model."""
    if not models:
        return "-"
    shown = {role: _short_model(name) for role, name in models.items()}
    if len(set(shown.values())) == 1:
        return next(iter(shown.values()))
    return ",".join(f"{role}={name}" for role, name in sorted(shown.items()))


def _short_model(name: str) -> str:
    if name.startswith("replay:"):
        return "replay:" + name.rsplit("/", 2)[-2] if "/" in name else name
    return name


def config_label(agent_config: dict[str, Any], selection_k: int) -> str:
    """The notable settings (a true flag by its name, a false one left out), a digest of the others, and K."""
    shown = [k if agent_config[k] is True else f"{k}={_text(agent_config[k])}"
             for k in LABEL_SETTINGS if k in agent_config and agent_config[k] is not False]
    rest = {k: v for k, v in agent_config.items() if k not in LABEL_SETTINGS}
    if rest:
        digest = hashlib.sha256(json.dumps(rest, sort_keys=True, default=str).encode()).hexdigest()[:6]
        shown.append(f"cfg#{digest}")
    if selection_k:
        shown.append(f"K={selection_k}")
    return ",".join(shown) or "-"


def _text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (bool, dict, list)) or value is None else str(value)


def cost_text(cost_usd: float | None, uncosted_calls: int | None, *, digits: int = 2) -> str:
    """Dollars when every call was priced; ``unknown (N uncosted calls)`` when some call was not (with the priced
    calls' dollars as a lower bound when there are any); ``-`` when nothing was recorded."""
    if uncosted_calls:
        known = f"≥ ${cost_usd:.{digits}f}, " if cost_usd else ""
        return f"unknown ({known}{uncosted_calls} uncosted call{'s' if uncosted_calls != 1 else ''})"
    return "-" if cost_usd is None else f"${cost_usd:.{digits}f}"


def run_cost(cost_usd: float | None, uncosted_calls: int | None) -> float | None:
    """The run's cost as a number only when it is known in full (see the cost rule in the module docstring)."""
    return None if uncosted_calls else cost_usd


@functools.cache
def primary_metric(grader_id: str) -> tuple[str, bool] | None:
    """(name, higher is better) of the grader's primary metric; None for a grader this install does not have."""
    from rexmle_grade.grader import Direction, get_grader

    try:
        metric = get_grader(grader_id).validation_metric
    except RexmleError:  # a removed plug-in's grader: its runs still load, without a raw metric column
        return None
    return metric.name, metric.direction == Direction.HIGHER_BETTER


def budget_label(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def run_row(run: RunRecord) -> RunRow:
    spec, status, grade = run.spec, run.status, run.grade
    facts = task_facts(spec.task_id)
    board = grade.leaderboard_rows if grade is not None and grade.leaderboard_rows else facts.board_rows
    valid = bool(grade is not None and grade.valid_submission)
    graded_pct = grade.percentile if grade is not None else None
    counted = None if not board else (graded_pct if valid and graded_pct is not None else 0.0)
    position = grade.score if grade is not None else None
    counted_position = None if not board else (position if valid and position is not None else float(board + 1))
    hardware = status.hardware
    primary = primary_metric(grade.grader_id) if grade is not None and grade.grader_id else None
    raw = grade.metrics.get(primary[0]) if primary is not None and valid and grade is not None else None
    isolating = spec.sandbox in ISOLATING_SANDBOXES and not spec.allow_unsandboxed
    return RunRow(
        run_id=run.run_id, group=run.group, run_dir=str(run.run_dir), data=run.data_kind,  # type: ignore[arg-type]
        variant=run.variant, synthetic=run.synthetic, task_id=spec.task_id, task_version=spec.task_version,
        competition=facts.competition, task_type=(grade.task_type if grade and grade.task_type else facts.task_type),
        dim=(grade.dim if grade and grade.dim else facts.dim), agent=spec.agent, agent_version=spec.agent_version,
        model=model_label(spec.models), config=config_label(spec.agent_config, spec.selection_cases),
        agent_config=json.dumps(spec.agent_config, sort_keys=True, default=str),
        budget=budget_label(spec.limits.time_limit_s), seed=spec.seed, state=status.state, reason=status.reason,
        limit=status.limit, graded=grade is not None, grade_status=grade.status if grade is not None else "not graded",
        valid=valid, percentile=graded_pct, primary_metric=primary[0] if primary else None, primary_value=raw,
        primary_higher_is_better=primary[1] if primary else None, percentile_counted=counted, mean_position=position,
        position_counted=counted_position, board_rows=board or None,
        gold=bool(grade and grade.gold_medal), silver=bool(grade and grade.silver_medal),
        bronze=bool(grade and grade.bronze_medal), any_medal=bool(grade and grade.any_medal),
        above_median=bool(grade and grade.above_median), time_budget_s=spec.limits.time_limit_s,
        time_used_s=status.elapsed_s, exec_timeout_s=spec.limits.exec_timeout_s, steps=status.steps,
        max_steps=spec.limits.max_steps, model_calls=status.model_calls, tokens=status.tokens,
        input_tokens=status.input_tokens, output_tokens=status.output_tokens,
        cost_usd=run_cost(status.cost_usd, status.uncosted_calls), cost_known_usd=status.cost_usd,
        uncosted_calls=status.uncosted_calls, max_tokens=spec.limits.max_tokens, max_cost_usd=spec.limits.max_cost_usd,
        sandbox=spec.sandbox, network="none" if isolating else "host (unsandboxed)",
        heldout_reachable="no" if isolating else "yes: agent code ran unsandboxed",
        selection_k=spec.selection_cases, gpus=hardware.gpus if hardware else None,
        gpu_names=", ".join(hardware.gpu_names) if hardware else "", cpus=hardware.cpus if hardware else None,
        gpu_hours=hardware.gpus * status.elapsed_s / 3600 if hardware else None,
        cpu_model=hardware.cpu_model if hardware else "", memory_gb=hardware.memory_gb if hardware else None,
        host=status.host or "",
        rexmle_versions=", ".join(f"{k} {v}" for k, v in sorted(spec.rexmle_versions.items())),
        grader_id=grade.grader_id if grade is not None else "",
        leaderboard_version=grade.leaderboard_version if grade is not None else None,
        started_at=status.started_at, finished_at=status.finished_at, problems=len(run.problems),
        **cluster_columns(run),
    )


def cluster_columns(run: RunRecord) -> dict[str, Any]:
    job = run.cluster.last if run.cluster is not None else None
    if job is None:
        return {"ended_by_cluster": run.status.cluster_stop is not None}
    return {"job_id": job.job_id, "job_state": job.state, "job_exit_code": job.exit_code,
            "job_elapsed_s": job.elapsed_s, "queue_wait_s": job.queue_wait_s, "job_node": job.node,
            "requeues": sum(j.requeues for j in run.cluster.jobs),
            "job_source": job.source, "ended_by_cluster": run.status.cluster_stop is not None}
