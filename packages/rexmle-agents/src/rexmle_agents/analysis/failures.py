"""Failure analysis from the journal alone (no model): why a run ended, how each node or step ended and why, where
the time went, and whether the final submission was valid.

A step *crashed* when its final execution (the one that ran its final code) exited non-zero or was stopped by the
sandbox; its error type comes from ``stopped_by`` and the last exception in its output (:func:`classify_output`).
A terminal agent's tool output carries no exit status: such a step crashed only when its output shows an error.
An earlier execution that failed (an R&D-loop round's run on a data sample, before the script was revised) does
not make a step crashed: it is named in the outcome's detail. A step that ran cleanly but
whose submission the validator refused is an *invalid submission*, with the validator's first problem as its
reason. Time: ``exec_s`` is agent code running in the sandbox, ``model_s`` the model calls, ``idle_s`` the rest of
the wall-clock (harness work, validation, waiting). Parallel workers overlap, so their execution time can exceed
the run's wall-clock; the idle share is then 0.
"""

from __future__ import annotations

import re

from rexmle_agents.analysis.records import RunFailures, StepOutcome
from rexmle_agents.results.loader import RunRecord
from rexmle_agents.results.records import (
    AgentError,
    ClusterEvent,
    ExecFinished,
    ModelCall,
    RunFinished,
    SnapshotEvent,
    ValidationEvent,
)
from rexmle_agents.results.trajectory import NodeView, Trajectory, trajectory

# error types, most specific first: (type, pattern over the exception line or, failing that, the whole output)
ERROR_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cuda_oom", re.compile(r"CUDA(?: error)?:? out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED"
                            r"|cudaErrorMemoryAllocation|HIP out of memory")),
    ("host_oom", re.compile(r"\bMemoryError\b|Unable to allocate [\d.]+ \w?i?B|std::bad_alloc")),
    ("import_error", re.compile(r"\b(?:ModuleNotFoundError|ImportError)\b")),
    ("network", re.compile(r"URLError|Name or service not known|Temporary failure in name resolution"
                           r"|Network is unreachable|Failed to establish a new connection|ConnectionError"
                           r"|LocalEntryNotFoundError|getaddrinfo failed|Could not resolve host")),
    ("shape_mismatch", re.compile(r"size mismatch|shape mismatch|shapes? .{0,80}(?:not aligned|cannot be multiplied"
                                  r"|do not match|mismatch)|could not be broadcast|mismatch in its core dimension"
                                  r"|must match the size of tensor|Sizes of tensors must match"
                                  r"|Expected input batch_size|expected input\[.{0,80}channels|Given groups="
                                  r"|cannot reshape array|doesn't match the broadcast shape|dimension mismatch"
                                  r"|must have the same shape",
                                  re.IGNORECASE)),
    ("cuda_error", re.compile(r"CUDA error|cuDNN error|no CUDA-capable device|Torch not compiled with CUDA"
                              r"|NCCL error|CUDA driver")),
    ("file_not_found", re.compile(r"\bFileNotFoundError\b|No such file or directory")),
    ("syntax_error", re.compile(r"\b(?:SyntaxError|IndentationError|TabError)\b")),
)
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Exit|Interrupt|Warning))(?::\s*(.*))?$",
                             re.MULTILINE)
STOPPED_TYPES = {"timeout": "timeout", "memory": "host_oom", "processes": "process_limit",
                 "file_size": "file_size_limit", "cancelled": "cancelled"}


def classify_output(text: str, stopped_by: str | None, exit_code: int | None) -> tuple[str, str]:
    """(error type, detail) of a failed execution: the sandbox's reason if it stopped the code, else the last
    exception printed, else the exit status. A clean execution is ``("ok", "")``."""
    if stopped_by:
        kind = STOPPED_TYPES.get(stopped_by, "killed" if stopped_by.startswith("signal") else stopped_by)
        return kind, f"stopped by the sandbox: {stopped_by}"
    exceptions = list(_EXCEPTION_LINE.finditer(text))
    last = exceptions[-1] if exceptions else None
    detail = last.group(0).strip()[:300] if last else ""
    for kind, pattern in ERROR_PATTERNS:
        if (last is not None and pattern.search(last.group(0))) or (last is None and pattern.search(text)):
            return kind, detail or _last_line(text)
    if exit_code == 0:
        # a clean exit can still show a network failure the code caught (used by the external-data detector)
        for kind, pattern in ERROR_PATTERNS:
            if kind == "network" and pattern.search(text):
                return kind, _last_line(text)
        return "ok", ""
    if last is not None:
        return f"exception:{last.group(1)}", detail
    return "nonzero_exit", f"exit {exit_code}" + (f": {_last_line(text)}" if text.strip() else "")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def _validator_reasons(events: list[object]) -> dict[int, str]:
    """The first problem of the last failed validation of each step."""
    reasons: dict[int, str] = {}
    for event in events:
        if isinstance(event, ValidationEvent) and event.step is not None:
            if event.ok:
                reasons.pop(event.step, None)
            else:
                reasons[event.step] = event.problems[0] if event.problems else "refused by the validator"
    return reasons


def _outcome(node: NodeView, reasons: dict[int, str]) -> StepOutcome:
    common = {"node": node.id, "stage": node.stage}
    if not node.executions:
        return StepOutcome(outcome="no_code", detail="nothing was run", **common)
    final = node.executions[-1]
    if final.exit_code is None and final.stopped_by is None:
        # a tool's output as a terminal agent got it back (through the relay, or from an Inspect log): no exit
        # status is known, so the step crashed only when the output shows an error
        kind, detail = classify_output(final.output_tail, None, None)
        if kind != "nonzero_exit":
            return StepOutcome(outcome="crashed", error_type=kind, detail=detail, exit_code=None, **common)
        return StepOutcome(outcome="ok", exit_code=None, detail="exit status unknown (a tool's output)", **common)
    if final.exit_code != 0 or final.stopped_by:
        kind, detail = classify_output(final.output_tail, final.stopped_by, final.exit_code)
        if kind == "ok":  # a clean exit classified as ok cannot be here; keep the exit status
            kind = "nonzero_exit"
        return StepOutcome(outcome="crashed", error_type=kind, detail=detail, exit_code=final.exit_code,
                           stopped_by=final.stopped_by, **common)
    earlier = [e.name for e in node.executions[:-1] if e.exit_code != 0 or e.stopped_by]
    recovered = f"its final execution ran cleanly after {len(earlier)} failed one(s): {', '.join(earlier[:3])}" \
        if earlier else ""
    reason = reasons.get(node.step) if node.step is not None else None
    reason = reason or _engine_reason(node)
    if reason:
        return StepOutcome(outcome="invalid_submission", error_type="invalid_submission", detail=reason,
                           exit_code=0, **common)
    return StepOutcome(outcome="ok", exit_code=0, detail=recovered, **common)


_ENGINE_INVALID = re.compile(r"the submission is invalid: ([^;]*)|(the script wrote nothing into \$\w+)")


def _engine_reason(node: NodeView) -> str | None:
    """A scaffold node whose step has no validation event (parallel workers, or nothing was written): the reason
    the scaffold engine put in its bug reason, in the harness's own words (the model's review is never used)."""
    match = _ENGINE_INVALID.search(node.bug_reason)
    return None if match is None else (match.group(1) or match.group(2)).strip()


def _end(run: RunRecord, events: list[object]) -> str:
    status = run.status
    if status.cluster_stop:
        return f"cluster:{status.cluster_stop}"
    if status.state in ("pending", "running"):
        if any(isinstance(e, ClusterEvent) for e in events):
            return "cluster:stopped"
        return "not_ended"
    if status.limit:
        return f"limit:{status.limit}"
    if status.state == "failed":
        return "agent_error" if any(isinstance(e, AgentError) for e in events) else "failed"
    if status.state == "timed_out":
        return "limit:time"
    return status.state  # finished, cancelled


def run_failures(run: RunRecord, path: Trajectory | None = None) -> RunFailures:
    """The failure analysis of one run, from its journal, status and grade."""
    path = path or trajectory(run)
    events = run.journal().events
    reasons = _validator_reasons(events)
    outcomes = [_outcome(n, reasons) for n in path.nodes if n.code.strip() or n.executions]
    error_types: dict[str, int] = {}
    for outcome in outcomes:
        if outcome.error_type:
            error_types[outcome.error_type] = error_types.get(outcome.error_type, 0) + 1
    exec_s = sum(e.wall_s for e in events if isinstance(e, ExecFinished))
    model_s = sum(e.duration_s for e in events if isinstance(e, ModelCall))
    finished = next((e for e in reversed(events) if isinstance(e, RunFinished)), None)
    time_s = max(run.status.elapsed_s, finished.seconds if finished else 0.0)
    if run.grade is not None:
        final_valid, source = bool(run.grade.valid_submission), "grade"
    elif path.final_snapshot is not None:
        snap = next((e for e in events if isinstance(e, SnapshotEvent) and e.snapshot == path.final_snapshot), None)
        final_valid, source = (None, "none") if snap is None else (snap.valid, "snapshot")
    else:
        final_valid, source = (False, "none") if run.status.state not in ("pending", "running") else (None, "none")
    return RunFailures(
        end=_end(run, events), state=run.status.state, limit=run.status.limit, reason=run.status.reason,
        steps=len(outcomes), executed=sum(o.outcome != "no_code" for o in outcomes),
        crashed=sum(o.outcome == "crashed" for o in outcomes),
        invalid=sum(o.outcome == "invalid_submission" for o in outcomes), error_types=error_types,
        outcomes=outcomes, time_s=time_s, exec_s=exec_s, model_s=model_s,
        idle_s=max(0.0, time_s - exec_s - model_s), retry_s=run.status.model_retry_s or 0.0,
        final_valid=final_valid, final_source=source,  # type: ignore[arg-type]
    )
