"""The run format as typed records: ``status.json`` and every ``journal.jsonl`` event kind.

``spec.json`` is :class:`~rexmle_agents.harness.spec.RunSpec` and ``grade.json`` is
:class:`~rexmle_grade.report.ReportEntry`; this module types the rest of a run folder (and ``cluster.json``, which
runs of the SLURM executor have: their jobs as SLURM reported them). These models are the source
of the published JSON Schema files (:mod:`rexmle_agents.results.schema`), so the files and the code that reads run
folders cannot drift apart.

Times: every journal event carries ``time`` as Unix seconds (a float). ``model_call`` events written before run
format 1 settled on that carried an ISO-8601 string; they are still read (converted to Unix seconds).
``status.json`` keeps ISO-8601 strings (``started_at``, ``updated_at``, ``finished_at``) for people reading it.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, WithJsonSchema

from rexmle_agents.harness.spec import RUN_FORMAT_VERSION
from rexmle_agents.models.accounting import UsageTotals
from rexmle_agents.models.types import Usage

RUN_STATES = ("pending", "running", "finished", "failed", "timed_out", "cancelled")
# the budgets that can end a run; readers must accept others (a limit added later), so fields are plain strings
LIMITS = ("time", "steps", "tokens", "cost", "disk", "run_folder")
LimitName = Annotated[str | None, Field(description="the budget that ended the run: " + ", ".join(LIMITS)
                                                    + " (None: none did)")]


def _epoch(value: Any) -> Any:
    """Unix seconds from a float, or from the ISO-8601 string older ``model_call`` events carry."""
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            return value  # left for the float check to reject with its own message
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.timezone.utc)
        return parsed.timestamp()
    return value


Epoch = Annotated[float, Field(description="Unix seconds (UTC)")]
# Read: a float, or the ISO-8601 string of model_call events written before the time format was unified.
LegacyEpoch = Annotated[
    float,
    BeforeValidator(_epoch),
    WithJsonSchema({"anyOf": [{"type": "number"},
                              {"type": "string", "format": "date-time", "deprecated": True,
                               "description": "written by rexmle-agents before the unified time format; read as "
                                              "Unix seconds"}],
                    "description": "Unix seconds (UTC)"}),
]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------------------------------------------
# status.json


class Hardware(_Record):
    """What the run had, as the harness measured it (never declared by the user)."""

    cpus: int = Field(description="CPU cores the run may use")
    cpu_model: str = ""
    memory_gb: float = Field(description="memory limit of the run, or the machine's memory without a limit")
    gpus: int = 0
    gpu_ids: list[str] = Field(default_factory=list)
    gpu_names: list[str] = Field(default_factory=list)


class SlurmRef(_Record):
    """The SLURM job an attempt ran in (from the job's environment)."""

    job_id: str = Field(description="SLURM's name of the job: ARRAY_TASK for an array task (12_3), else the id")
    array_job_id: str | None = None
    array_task_id: int | None = None
    requeues: int = Field(default=0, description="times SLURM requeued the job before this attempt "
                                                 "(SLURM_RESTART_COUNT)")
    node: str | None = None


class RunStatus(_Record):
    """``status.json``: where a run stands; rewritten at every state change and heartbeat (atomically)."""

    format_version: int | None = Field(default=None, description="run format (absent in folders written before "
                                                                 "status.json carried it)")
    state: Literal["pending", "running", "finished", "failed", "timed_out", "cancelled"]
    reason: str = ""
    limit: LimitName = None
    attempts: int = 0
    steps: int = 0
    elapsed_s: float = Field(default=0.0, description="wall-clock used by all attempts together")
    run_id: str | None = None
    task_id: str | None = None
    agent: str | None = None
    seed: int | None = None
    started_at: str | None = Field(default=None, description="ISO-8601, when the first attempt started")
    updated_at: str | None = None
    finished_at: str | None = None
    pid: int | None = None
    host: str | None = None
    hardware: Hardware | None = None
    model_calls: int | None = None
    tokens: int | None = Field(default=None, description="input + output tokens of every model call")
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = Field(default=None, description="dollars of the calls whose cost is known")
    uncosted_calls: int | None = None
    unknown_usage_calls: int | None = None
    model_retry_s: float | None = Field(default=None, description="time lost to model-API retries (kept apart)")
    final_choice: str | None = Field(default=None, description="why the final submission is the one it is: the "
                                                               "held-out selection split, the agent's choice, the "
                                                               "latest valid snapshot, or a FALLBACK (a submission "
                                                               "that validated from a flagged node, or the sample)")
    slurm: SlurmRef | None = Field(default=None, description="the SLURM job of the latest attempt (absent outside "
                                                             "SLURM)")
    cluster_stop: str | None = Field(
        default=None, description="set when the cluster, not the harness, stopped the run: SLURM's job state "
                                  "(CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, REQUEUED, or PENDING "
                                  "for a job SLURM will never start); such a run has not concluded, and running its "
                                  "group again resumes it")


PENDING_STATUS = RunStatus(state="pending")


# ---------------------------------------------------------------------------------------------------------------
# journal.jsonl: one model per event kind


Repaired = Annotated[dict[str, str] | None, Field(
    description="values JSON cannot hold, repaired where they stood: dotted path -> NaN, Infinity, -Infinity (the "
                "value is null), lone surrogates kept as \\u escapes, or nesting cut")]


class _Event(_Record):
    time: Epoch
    step: int | None = Field(default=None, description="the agent step the event belongs to (absent outside steps)")
    repaired: Repaired = None


class RunStarted(_Event):
    kind: Literal["run_started"]
    attempt: int
    pid: int
    host: str
    consumed_s: float
    steps_done: int
    sandbox: str
    isolating: bool
    limits_mechanism: str | None = None
    gpus: list[str] = Field(default_factory=list)
    rexmle_versions: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, Any] | None = Field(default=None, description="the limits in force (memory, disk, files, "
                                                                    "processes) and how defaults were chosen")
    sandbox_user: str | None = Field(default=None, description="the user agent code ran as, when not the harness's")
    slurm: SlurmRef | None = Field(default=None, description="the SLURM job of this attempt (absent outside SLURM)")


class RunResumed(RunStarted):
    kind: Literal["run_resumed"]  # type: ignore[assignment]


class StepStarted(_Event):
    kind: Literal["step_started"]
    step: int
    step_kind: str
    info: dict[str, Any] = Field(default_factory=dict)


class StepFinished(_Event):
    kind: Literal["step_finished"]
    step: int
    step_kind: str
    status: Literal["ok", "error", "out_of_budget"]
    seconds: float
    result: dict[str, Any] = Field(default_factory=dict)
    model_usage: UsageTotals


class StepInterrupted(_Event):
    kind: Literal["step_interrupted"]
    step: int
    attempt: int


class ExecStarted(_Event):
    kind: Literal["exec_started"]
    name: str = Field(description="also the stem of the full logs: logs/exec/<name>.stdout and .stderr")
    argv: list[str]
    timeout_s: float


class ExecFinished(_Event):
    kind: Literal["exec_finished"]
    name: str
    exit_code: int | None = Field(description="None when the command was killed")
    stopped_by: str | None = Field(description="timeout, memory, processes, file_size, cancelled, signal:N or None")
    wall_s: float
    cpu_s: float
    stdout_tail: str
    stderr_tail: str


class CodeWritten(_Event):
    kind: Literal["code_written"]
    file: str
    code: str
    node: int | None = Field(default=None, description="the search node (scaffolds)")


class ValidationEvent(_Event):
    kind: Literal["validation"]
    folder: str
    ok: bool
    problems: list[str] = Field(default_factory=list)
    n_problems: int = 0


class SnapshotEvent(_Event):
    kind: Literal["snapshot"]
    snapshot: str
    label: str
    score: float | None = Field(default=None, description="the agent's own validation score")
    valid: bool
    has_code: bool
    metadata: dict[str, Any] = Field(default_factory=dict)
    selection: dict[str, Any] | None = Field(default=None, description="the held-out selection split's grade (K, "
                                                                        "status, score, percentile, metrics)")
    files: int | None = Field(default=None, description="files collected out of the workspace")
    bytes: int | None = Field(default=None, description="their size")
    refused: list[str] = Field(default_factory=list, description="what the harness refused to collect, and why")


class CollectRefused(_Event):
    kind: Literal["collect_refused"]
    source: str = Field(description="the workspace folder, relative to the workspace")
    reasons: list[str]
    n_refused: int


class FinalSelected(_Event):
    kind: Literal["final_selected"]
    snapshot: str
    reason: str = ""


class AgentState(_Event):
    kind: Literal["agent_state"]
    key: str
    state: Any = Field(description="the agent's JSON state (scaffolds: the whole search tree, key 'scaffold')")


class LogEvent(_Event):
    model_config = ConfigDict(extra="allow", frozen=True)  # ctx.log(message, **data) adds the agent's own fields

    kind: Literal["log"]
    message: str


class WarningEvent(_Event):
    kind: Literal["warning"]
    message: str


class BudgetExhausted(_Event):
    kind: Literal["budget_exhausted"]
    limit: LimitName
    message: str
    usage: Any = Field(default=None, description="what was measured against the limit (disk: bytes and files)")


class AgentError(_Event):
    kind: Literal["agent_error"]
    error: str
    traceback: str


class FinalCollected(_Event):
    kind: Literal["final_collected"]
    snapshot: str | None


class RunFinished(_Event):
    kind: Literal["run_finished"]
    state: Literal["finished", "failed", "timed_out", "cancelled"]
    reason: str
    limit: LimitName
    seconds: float
    steps: int
    model_calls: int
    cost_usd: float
    model_retry_s: float


class Graded(_Event):
    kind: Literal["graded"]
    status: str
    percentile: float | None
    metrics: dict[str, float | None] = Field(default_factory=dict, description="None: NaN or infinite (see "
                                                                                "repaired)")


class ClusterEvent(_Event):
    """What the cluster did to the run, written by the SLURM executor (never by the harness): the job stopped
    before the run concluded, was requeued, or will never start."""

    kind: Literal["cluster"]
    event: str = Field(description="stopped (by SLURM: scancel, preemption, node failure), requeued, time_limit, "
                                   "killed (the harness died: out of memory?), never_started, locked")
    job_id: str
    job_state: str | None = Field(default=None, description="SLURM's state of the job when it was seen")
    reason: str | None = Field(default=None, description="SLURM's reason")
    message: str = Field(description="what happened and what happens next, for people")


class AgentTurn(_Event):
    """A terminal coding agent's turn, as the model relay saw it (external agents with ``steps: turn``)."""

    kind: Literal["agent_turn"]
    model: str = Field(description="the model name the agent asked for (an alias)")
    text: str = Field(description="the model's text answer (clipped)")
    tool_calls: list[dict[str, Any]] = Field(description="{id, name, arguments} of each tool call it made")
    tool_results: list[dict[str, Any]] = Field(
        description="{id, output} of the earlier tool calls whose outputs this call carried back")


class ScaffoldSummary(_Event):
    kind: Literal["scaffold_summary"]
    nodes: list[dict[str, Any]]


class ModelCall(_Record):
    """One model call (written by the usage ledger), with the step's and the run's totals after it."""

    kind: Literal["model_call"]
    time: LegacyEpoch
    step: int | None = None
    model: str
    response_id: str | None = None
    finish_reason: str
    usage: Usage
    usage_known: bool = True
    cost_usd: float | None
    duration_s: float
    retry_time_s: float
    step_totals: UsageTotals | None = None
    run_totals: UsageTotals
    repaired: Repaired = None


EVENT_MODELS: tuple[type[BaseModel], ...] = (
    RunStarted, RunResumed, StepStarted, StepFinished, StepInterrupted, ExecStarted, ExecFinished, CodeWritten,
    ValidationEvent, SnapshotEvent, CollectRefused, FinalSelected, AgentState, LogEvent, WarningEvent,
    BudgetExhausted, AgentError, FinalCollected, RunFinished, Graded, ClusterEvent, ScaffoldSummary, AgentTurn,
    ModelCall,
)
EVENT_KINDS: dict[str, type[BaseModel]] = {m.model_fields["kind"].annotation.__args__[0]: m  # type: ignore[union-attr]
                                           for m in EVENT_MODELS}
JournalEvent = Annotated[Union[EVENT_MODELS], Field(discriminator="kind")]  # type: ignore[valid-type]
EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(JournalEvent)

# ---------------------------------------------------------------------------------------------------------------
# cluster.json: the run's SLURM jobs as the scheduler reported them


class SlurmJobRecord(_Record):
    """One SLURM job of a run, as last seen: by its accounting (``sacct``), or while it existed (``squeue``,
    ``scontrol``), or by the job itself."""

    job_id: str = Field(description="ARRAY_TASK for an array task (12_3), else the id")
    array_job_id: str | None = None
    array_task_id: int | None = None
    state: str | None = Field(default=None, description="SLURM's job state: PENDING, RUNNING, COMPLETED, CANCELLED, "
                                                        "TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, FAILED, ...")
    reason: str | None = Field(default=None, description="SLURM's reason (why it waits, or why it ended)")
    exit_code: str | None = Field(default=None, description="EXIT:SIGNAL, as SLURM reports it")
    node: str | None = None
    partition: str | None = None
    submit_time: str | None = Field(default=None, description="ISO-8601")
    start_time: str | None = None
    end_time: str | None = None
    elapsed_s: float | None = Field(default=None, description="run time of the job (its latest start)")
    queue_wait_s: float | None = Field(default=None, description="from submission (or requeue) to start")
    time_limit_s: float | None = None
    requeues: int = 0
    cpus: int | None = None
    memory_mb: int | None = None
    gpus: int | None = None
    log: str | None = Field(default=None, description="the job's output file (the harness's log)")
    source: Literal["sbatch", "squeue", "scontrol", "sacct", "job"] = Field(
        description="where the record came from: the submission, the queue, the controller (while the job is "
                    "known to it), the accounting database, or the job itself")
    observed_at: str = Field(description="ISO-8601, when it was seen")


class ClusterRecord(_Record):
    """``cluster.json``: every SLURM job of a run (oldest first) and whether the cluster keeps accounting."""

    scheduler: Literal["slurm"] = "slurm"
    accounting: str = Field(description="sacct, or why there is none (the records then come from squeue and "
                                        "scontrol while each job existed)")
    jobs: list[SlurmJobRecord] = Field(default_factory=list)

    @property
    def last(self) -> SlurmJobRecord | None:
        return self.jobs[-1] if self.jobs else None


__all__ = ["EVENT_ADAPTER", "EVENT_KINDS", "EVENT_MODELS", "LIMITS", "PENDING_STATUS", "RUN_FORMAT_VERSION",
           "RUN_STATES", "ClusterRecord", "Hardware", "JournalEvent", "RunStatus", "SlurmJobRecord", "SlurmRef"]
