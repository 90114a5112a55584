"""``rexmle import inspect``: the samples of Inspect logs of rexmle tasks as rexmle run folders.

One run folder per sample and epoch, in the run format (``spec.json``, ``status.json``, ``journal.jsonl``,
``final/``, ``grade.json``) that :mod:`rexmle_agents.results.loader` reads, so ``rexmle report``, ``rexmle view``
and ``rexmle analyse`` show Inspect runs beside rexmle's own:

- the spec is the sample's own run spec (its metadata), agent ``inspect``, seed = epoch - 1, the eval's model, and
  the origin in ``agent_config`` (``origin: inspect``, the solver, the log file, eval and sample ids), which also
  makes the run id of each imported sample its own;
- the journal has one step per model call: ``step_started``, ``model_call`` (usage as Inspect counted it; Inspect
  logs no prices, so cost is unknown), ``agent_turn`` (the turn's text, its tool calls and their outputs, each
  bounded as the relay bounds them) and ``step_finished``; then ``final_collected``, ``run_finished``, ``graded``;
- ``final/submission`` is the submission the scorer kept in the sample's store; ``grade.json`` the grade the
  scorer computed (the score's ``grade`` metadata), else the kept submission graded now.

A sample that is not a rexmle sample (no run spec in its metadata) is skipped with a message; a run folder imported
before is left as it is unless ``force``.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import shutil
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rexmle_agents.harness.paths import RunPaths
from rexmle_agents.harness.runner import DiskWatch, write_json_atomic
from rexmle_agents.harness.spec import RUN_FORMAT_VERSION, RunSpec
from rexmle_agents.integrations.inspect.scorer import SPEC_KEY, SUBMISSION_KEY, grade_archive
from rexmle_agents.models._jsonl import dumps_strict
from rexmle_agents.models.accounting import UsageTotals
from rexmle_agents.models.types import Usage
from rexmle_agents.results.records import RunStatus
from rexmle_grade.errors import RexmleError, UserInputError
from rexmle_grade.report import ReportEntry

ORIGIN = "inspect"
TURN_TEXT = 4000  # characters of a turn's text, of each tool argument and of each tool output kept
TURN_ITEMS = 32  # tool calls and outputs kept per turn
LOG_SUFFIXES = (".eval", ".json")
SCORER_NAME = "rexmle/score"


@dataclass(frozen=True)
class ImportedRun:
    run_dir: Path
    action: str  # imported, replaced, kept (imported before), skipped (not a rexmle sample)
    state: str
    percentile: float | None


def log_files(paths: Iterable[Path]) -> list[Path]:
    """The Inspect log files named, or found (not recursively) in the folders named."""
    found: list[Path] = []
    for path in paths:
        path = Path(path)
        if path.is_dir():
            found += sorted(p for p in path.iterdir() if p.is_file() and p.suffix in LOG_SUFFIXES)
        elif path.is_file():
            found.append(path)
        else:
            raise UserInputError(f"{path} does not exist", hint="pass Inspect log files (.eval, .json) or folders")
    if not found:
        raise UserInputError(f"no Inspect log in {', '.join(map(str, paths))}",
                             hint="Inspect writes its logs to ./logs (or --log-dir)")
    return found


def import_logs(paths: Sequence[Path], runs_dir: Path, *, force: bool = False) -> list[ImportedRun]:
    from inspect_ai.log import read_eval_log

    imported: list[ImportedRun] = []
    for path in log_files(paths):
        try:
            log = read_eval_log(str(path), resolve_attachments=True)
        except (ValueError, OSError, KeyError) as exc:
            raise UserInputError(f"{path} is not an Inspect log Inspect can read: {exc}",
                                 hint="pass the .eval or .json files Inspect wrote") from None
        for sample in log.samples or []:
            imported.append(import_sample(log, sample, path, Path(runs_dir), force=force))
    return imported


def import_sample(log: Any, sample: Any, log_path: Path, runs_dir: Path, *, force: bool = False) -> ImportedRun:
    raw = (sample.metadata or {}).get(SPEC_KEY)
    if not isinstance(raw, dict):
        return ImportedRun(run_dir=log_path, action="skipped", state="-", percentile=None)
    solver = _solver_name(log)
    # one eval is one configuration (its epochs are its seeds); where each sample came from is in its labels
    origin = {"origin": ORIGIN, "solver": solver, "eval_id": log.eval.eval_id}
    spec = RunSpec.model_validate(raw).model_copy(update={
        "seed": max(0, int(sample.epoch) - 1), "models": {"default": str(log.eval.model)},
        "agent_config": origin, "group": runs_dir.name})
    paths = RunPaths(runs_dir / spec.run_id)
    source = {"inspect_log": str(log_path.resolve()), "inspect_task": str(log.eval.task),
              "inspect_sample": str(sample.id), "inspect_epoch": str(sample.epoch)}
    action = "imported"
    if paths.run_dir.exists():
        if not force:
            status = json.loads(paths.status.read_text()) if paths.status.is_file() else {}
            return ImportedRun(paths.run_dir, "kept", status.get("state", "?"), _percentile(paths))
        shutil.rmtree(paths.run_dir)
        action = "replaced"
    partial = paths.run_dir.with_name(paths.run_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        state = _write_run(RunPaths(partial), spec, log, sample, paths.run_dir, source)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    partial.rename(paths.run_dir)
    return ImportedRun(paths.run_dir, action, state, _percentile(paths))


def _percentile(paths: RunPaths) -> float | None:
    if not paths.grade.is_file():
        return None
    return ReportEntry.model_validate_json(paths.grade.read_text()).percentile


def _solver_name(log: Any) -> str:
    plan = getattr(log, "plan", None)
    steps = [getattr(step, "solver", "") for step in (getattr(plan, "steps", None) or [])]
    return ",".join(s for s in steps if s) or "unknown"


def _epoch(moment: Any) -> float:
    if isinstance(moment, str):
        moment = dt.datetime.fromisoformat(moment)
    return moment.timestamp() if isinstance(moment, dt.datetime) else float(moment)


def _iso(moment: float) -> str:
    return dt.datetime.fromtimestamp(moment, dt.timezone.utc).isoformat(timespec="milliseconds")


def _clip(text: Any, limit: int = TURN_TEXT, *, tail: bool = False) -> str:
    text = text if isinstance(text, str) else json.dumps(text, default=str, ensure_ascii=False)
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return f"[{cut} characters cut]" + text[-limit:] if tail else text[:limit] + f"[{cut} characters cut]"


def _arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    return {_clip(str(key), 200): value if isinstance(value, (int, float, bool)) else _clip(value)
            for key, value in list((arguments or {}).items())[:TURN_ITEMS]}


def _tool_output(event: Any) -> str:
    result = event.result
    if isinstance(result, list):  # text and images: the text parts
        result = "\n".join(getattr(part, "text", "") or "" for part in result)
    output = str(result or "")
    if getattr(event, "error", None) is not None:
        output = f"{output}\n[error: {event.error.message}]".strip()
    return _clip(output, tail=True)


def _usage(output: Any) -> tuple[Usage, bool, float | None]:
    """(usage in rexmle's terms, whether the provider reported it, cost in dollars when Inspect priced it)."""
    usage = getattr(output, "usage", None)
    if usage is None:
        return Usage(), False, None
    inputs, outputs = int(usage.input_tokens or 0), int(usage.output_tokens or 0)
    cached, written = int(usage.input_tokens_cache_read or 0), int(usage.input_tokens_cache_write or 0)
    # rexmle's input tokens include the cached ones; providers whose cache counts are apart from input_tokens show
    # it in Inspect's total
    if cached + written and inputs + outputs + cached + written <= int(usage.total_tokens or 0):
        inputs += cached + written
    return (Usage(input_tokens=inputs, output_tokens=outputs, cached_input_tokens=cached,
                  cache_write_input_tokens=written), True, usage.total_cost)


def _turns(sample: Any) -> list[dict[str, Any]]:
    """Each model call of the sample, with the tool calls it made and their outputs (from the tool events)."""
    turns: list[dict[str, Any]] = []
    by_call: dict[str, dict[str, Any]] = {}
    for event in sample.events or []:
        kind = getattr(event, "event", None)
        if kind == "model" and getattr(event, "output", None) is not None:
            output = event.output
            message = output.message if output.choices else None
            calls = list(getattr(message, "tool_calls", None) or [])
            turn = {"event": event, "text": message.text if message is not None else "", "ended": None,
                    "calls": [{"id": _clip(c.id, 200), "name": _clip(c.function, 200),
                               "arguments": _arguments(c.arguments)} for c in calls[:TURN_ITEMS]],
                    "results": []}
            turns.append(turn)
            for call in calls:
                by_call[call.id] = turn
        elif kind == "tool":
            turn = by_call.get(event.id)
            if turn is not None and len(turn["results"]) < TURN_ITEMS:
                turn["results"].append({"id": _clip(event.id, 200), "output": _tool_output(event)})
                turn["ended"] = _epoch(getattr(event, "completed", None) or event.timestamp)
    return turns


def _state(sample: Any) -> tuple[str, str, str | None]:
    disk = next((event.error.message for event in sample.events or [] if getattr(event, "event", None) == "tool"
                 and getattr(event, "error", None) is not None and DiskWatch.PREFIX in event.error.message), None)
    if sample.error is None and disk is not None:  # the rexmle sandbox refused commands past the disk limit
        return "finished", disk.split(": the sandbox runs", 1)[0], "disk"
    if sample.error is not None:
        return "failed", f"Inspect reported an error: {_clip(sample.error.message, 500)}", None
    limit = getattr(sample, "limit", None)
    if limit is not None:
        kind = str(limit.type)
        if kind in ("time", "working"):
            return "timed_out", f"Inspect's {kind} limit of {limit.limit:g} s was reached", "time"
        reason = getattr(limit, "reason", None) or f"Inspect's {kind} limit of {limit.limit:g} was reached"
        name = {"token": "tokens", "message": "steps", "cost": "cost"}.get(kind)
        return "finished", reason, name
    return "finished", "the Inspect solver finished", None


def _write_run(paths: RunPaths, spec: RunSpec, log: Any, sample: Any, run_dir: Path, source: dict[str, str]) -> str:
    """The run folder of one sample in ``paths`` (renamed to ``run_dir`` when complete); returns its state."""
    write_json_atomic(paths.spec, spec.model_dump(mode="json"))
    started = _epoch(sample.started_at) if sample.started_at else _epoch(log.eval.created)
    elapsed = float(sample.total_time or sample.working_time or 0.0)
    model_name = str(log.eval.model)

    def append(kind: str, when: float, **data: Any) -> None:
        # Journal.append stamps the time of writing; an imported event keeps the time Inspect logged it
        with paths.journal.open("a", encoding="utf-8") as handle:
            handle.write(dumps_strict({"kind": kind, "time": when, **data}) + "\n")

    append("run_started", started, attempt=1, pid=0, host=f"inspect:{log.eval.run_id}", consumed_s=0.0,
           steps_done=0, sandbox=(sample.sandbox.type if sample.sandbox is not None else "none"),
           isolating=sample.sandbox is not None and sample.sandbox.type == "rexmle", gpus=[],
           rexmle_versions=spec.rexmle_versions)
    run_totals = UsageTotals()
    turns = _turns(sample)
    for number, turn in enumerate(turns, start=1):
        event = turn["event"]
        begin = _epoch(event.timestamp)
        end = _epoch(event.completed) if getattr(event, "completed", None) else begin
        usage, known, cost = _usage(event.output)
        step_totals = UsageTotals(calls=1, usage=usage, cost_usd=cost or 0.0, uncosted_calls=int(cost is None),
                                  unknown_usage_calls=int(not known))
        run_totals = UsageTotals(calls=run_totals.calls + 1, usage=run_totals.usage + usage,
                                 cost_usd=run_totals.cost_usd + (cost or 0.0),
                                 uncosted_calls=run_totals.uncosted_calls + (cost is None),
                                 unknown_usage_calls=run_totals.unknown_usage_calls + (not known))
        append("step_started", begin, step=number, step_kind="turn", info={"agent": ORIGIN})
        append("model_call", end, step=number, model=_clip(event.model or model_name, 200), response_id=None,
               finish_reason=str(event.output.stop_reason or "unknown"), usage=usage.model_dump(mode="json"),
               usage_known=known, cost_usd=cost, duration_s=round(max(0.0, end - begin), 3),
               retry_time_s=0.0, step_totals=step_totals.model_dump(mode="json"),
               run_totals=run_totals.model_dump(mode="json"))
        append("agent_turn", end, step=number, model=_clip(event.model or model_name, 200),
               text=_clip(turn["text"]), tool_calls=turn["calls"], tool_results=turn["results"])
        last = max(end, turn["ended"] or end)
        append("step_finished", last, step=number, step_kind="turn", status="ok", seconds=round(last - begin, 3),
               result={"tool_calls": [c["name"] for c in turn["calls"]],
                       "finish_reason": str(event.output.stop_reason or "unknown")},
               model_usage=step_totals.model_dump(mode="json"))
    finished = _epoch(sample.completed_at) if sample.completed_at else started + elapsed
    state, reason, limit = _state(sample)
    grade = _final_and_grade(paths, spec, sample, journal_time=finished, append=append,
                             submission=RunPaths(run_dir).final_submission, source=source)
    append("run_finished", finished, state=state, reason=reason, limit=limit, seconds=round(elapsed, 3),
           steps=len(turns), model_calls=run_totals.calls, cost_usd=run_totals.cost_usd, model_retry_s=0.0)
    if grade is not None:
        write_json_atomic(paths.grade, grade.model_dump(mode="json"))
        append("graded", finished, status=grade.status, percentile=grade.percentile, metrics=grade.metrics)
    iso = _iso(finished)
    status = RunStatus(format_version=RUN_FORMAT_VERSION, state=state, reason=reason, limit=limit, attempts=1,
                       steps=len(turns), elapsed_s=round(elapsed, 3), run_id=spec.run_id, task_id=spec.task_id,
                       agent=spec.agent, seed=spec.seed,
                       started_at=_iso(started),
                       updated_at=iso, finished_at=iso, host=f"inspect:{log.eval.run_id}",
                       model_calls=run_totals.calls, tokens=run_totals.usage.total_tokens,
                       input_tokens=run_totals.usage.input_tokens, output_tokens=run_totals.usage.output_tokens,
                       cost_usd=run_totals.cost_usd, uncosted_calls=run_totals.uncosted_calls,
                       unknown_usage_calls=run_totals.unknown_usage_calls, model_retry_s=0.0,
                       final_choice="the submission in the workspace when the Inspect sample was scored")
    write_json_atomic(paths.status, status.model_dump(mode="json"))
    return state


def _final_and_grade(paths: RunPaths, spec: RunSpec, sample: Any, *, journal_time: float, append: Any,
                     submission: Path, source: dict[str, str]) -> ReportEntry | None:
    """``final/`` from the submission the scorer kept, and the grade: the scorer's own, else graded now."""
    entry = (sample.store or {}).get(SUBMISSION_KEY)
    score = next((s for name, s in (sample.scores or {}).items() if name in (SCORER_NAME, "score")
                  or (s.metadata or {}).get("grade") is not None), None)
    paths.final.mkdir()
    snapshot = None
    if isinstance(entry, dict) and entry.get("data"):
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(entry["data"])), mode="r:gz") as archive:
            archive.extractall(paths.final, filter="data")
        snapshot = "inspect-score"
    write_json_atomic(paths.final / "metadata.json", {"snapshot": snapshot, "run_id": spec.run_id,
                                                      "chosen_by": "the Inspect scorer's copy of the submission",
                                                      "refused": (entry or {}).get("refused", [])})
    append("final_collected", journal_time, snapshot=snapshot)
    grade: ReportEntry | None = None
    raw = (score.metadata or {}).get("grade") if score is not None else None
    if isinstance(raw, dict):
        grade = ReportEntry.model_validate(raw)
    elif isinstance(entry, dict):
        try:
            grade = grade_archive(spec, entry)
        except RexmleError as exc:
            append("warning", journal_time, message=f"the kept submission could not be graded: {exc.message}")
    if grade is None:
        return None
    labels = {**grade.labels, "agent": spec.agent, "seed": str(spec.seed), "run_id": spec.run_id,
              "group": spec.group, "origin": ORIGIN, **source,
              "models": ",".join(f"{r}={m}" for r, m in sorted(spec.models.items()))}
    return grade.model_copy(update={"labels": labels, "submission_path": str(submission)})
