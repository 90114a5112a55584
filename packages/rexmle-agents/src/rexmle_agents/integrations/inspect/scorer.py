"""The ``rexmle/score`` scorer: the task's own rexmle grader, run outside the sandbox, ranked on its leaderboard.

At the end of a sample the submission is copied out of the workspace on the harness side
(:meth:`Workspace.collect_submission`: ``submission.csv`` and the regular files it names, never a link) and kept in
the sample's store as a compressed archive (at most :data:`MAX_STORED_BYTES`), with the selection split's secret when
the sample had one. It is graded exactly as ``rexmle run`` grades a run (:func:`grade_run`). Re-scoring a finished
log (``inspect score LOG``) grades the stored archive again, without any sandbox.

The score's value is the percentile on the task's human leaderboard (0 for an invalid or missing submission); its
metadata holds ``valid``, ``medal``, ``position`` (the mean position among the human rows), the raw metrics and
the whole grade (``grade``: rexmle's grade.json), which ``rexmle import inspect`` writes back.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import anyio
from inspect_ai.scorer import Metric, SampleScore, Score, Scorer, Target, mean, metric, scorer, stderr
from inspect_ai.solver import TaskState

from rexmle_agents.harness.paths import RunPaths
from rexmle_agents.harness.spec import RunSpec
from rexmle_agents.integrations.inspect._names import published, qualified
from rexmle_agents.sandbox.base import SUBMISSION_DIRNAME
from rexmle_grade.errors import RexmleError, SandboxError
from rexmle_grade.report import ReportEntry

SPEC_KEY = "rexmle_spec"  # sample metadata: the sample's run spec (JSON)
SUBMISSION_KEY = "rexmle_submission"  # sample store: the collected submission
MAX_STORED_BYTES = 32 * 1024**2  # compressed; a larger submission is graded but not kept for re-scoring
ARCHIVE_FORMAT = "tar.gz+base64"


def sample_spec_of(state: TaskState) -> RunSpec:
    """The run spec of the sample, with its seed (the epoch, from 0) and the model that ran it."""
    raw = (state.metadata or {}).get(SPEC_KEY)
    if not isinstance(raw, dict):
        raise RexmleError(f"sample {state.sample_id!r} is not a rexmle sample (no {SPEC_KEY!r} in its metadata)",
                          hint="score rexmle tasks (inspect eval rexmle/<task>) with this scorer")
    spec = RunSpec.model_validate(raw)
    return spec.model_copy(update={"seed": max(0, int(state.epoch) - 1), "models": {"default": str(state.model)}})


def collect_archive(environment: Any) -> dict[str, Any]:
    """The sample's submission, copied out of its workspace on the harness side, as a store entry."""
    from rexmle_agents.safe_workspace import Workspace
    from rexmle_tasks.registry import get_task
    from rexmle_tasks.selection import SELECTION_SECRET_FILE

    spec: RunSpec = environment.spec
    grader = get_task(spec.task_id).grader
    with tempfile.TemporaryDirectory(prefix="rexmle-inspect-score-") as scratch:
        dest = Path(scratch) / SUBMISSION_DIRNAME
        collected = Workspace(environment.paths.workspace).collect_submission(
            SUBMISSION_DIRNAME, dest, file_columns=[c.name for c in grader.schema.file_columns])
        entry: dict[str, Any] = {"format": ARCHIVE_FORMAT, "files": collected.files, "bytes": collected.bytes,
                                 "refused": list(collected.refused)}
        if collected.folder is not None:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
                archive.add(collected.folder, arcname=SUBMISSION_DIRNAME)
            data = buffer.getvalue()
            entry["sha256"] = hashlib.sha256(data).hexdigest()
            if len(data) <= MAX_STORED_BYTES:
                entry["data"] = base64.b64encode(data).decode("ascii")
            else:
                entry["omitted"] = (f"the compressed submission is {len(data)} bytes, over the {MAX_STORED_BYTES} "
                                    "bytes kept in the log; it was graded but cannot be re-scored from the log")
                entry["graded_from"] = base64.b64encode(data).decode("ascii")  # dropped before storing
    if spec.selection_cases:
        secret = (environment.paths.run_dir / SELECTION_SECRET_FILE).read_bytes()
        entry["selection_secret"] = base64.b64encode(secret).decode("ascii")
    return entry


def grade_archive(spec: RunSpec, entry: dict[str, Any]) -> ReportEntry:
    """Grade a stored submission as ``rexmle run`` grades a run's final submission."""
    from rexmle_agents.harness.runner import grade_run
    from rexmle_tasks.selection import SELECTION_SECRET_FILE

    data = entry.get("data") or entry.get("graded_from")
    if data is None and "omitted" in entry:
        raise RexmleError(f"this sample's submission was not kept in the log: {entry['omitted']}",
                          hint="re-run the sample to grade it again")
    with tempfile.TemporaryDirectory(prefix="rexmle-inspect-grade-") as scratch:
        paths = RunPaths(Path(scratch))
        paths.final.mkdir()
        if data is not None:
            with tarfile.open(fileobj=io.BytesIO(base64.b64decode(data)), mode="r:gz") as archive:
                archive.extractall(paths.final, filter="data")  # regular files and folders only, inside final/
        if spec.selection_cases:
            (paths.run_dir / SELECTION_SECRET_FILE).write_bytes(base64.b64decode(entry["selection_secret"]))
        try:
            return grade_run(spec, paths)
        finally:
            shutil.rmtree(paths.run_dir / "final_test_view", ignore_errors=True)


def _medal(grade: ReportEntry) -> str | None:
    return next((name for name in ("gold", "silver", "bronze") if getattr(grade, f"{name}_medal")), None)


def score_of(grade: ReportEntry, entry: dict[str, Any]) -> Score:
    percentile = grade.percentile if grade.valid_submission and grade.percentile is not None else 0.0
    explanation = f"{grade.status}: percentile {grade.percentile}, metrics {grade.metrics}"
    if grade.problems:
        explanation += "; problems: " + "; ".join(grade.problems[:5])
    return Score(value=float(percentile), answer=f"submission.csv and {entry.get('files', 0)} file(s) it names",
                 explanation=explanation,
                 metadata={"valid": grade.valid_submission, "status": grade.status, "medal": _medal(grade),
                           "any_medal": grade.any_medal, "above_median": grade.above_median,
                           "position": grade.score, "percentile": grade.percentile, "metrics": grade.metrics,
                           "synthetic": grade.synthetic, "refused": entry.get("refused", []),
                           "grade": grade.model_dump(mode="json")})


def _valid_rate() -> Metric:
    def compute(scores: list[SampleScore]) -> float:
        return _rate(scores, "valid")

    return compute


def _medal_rate() -> Metric:
    def compute(scores: list[SampleScore]) -> float:
        return _rate(scores, "any_medal")

    return compute


def _rate(scores: list[SampleScore], key: str) -> float:
    flags = [bool((s.score.metadata or {}).get(key)) for s in scores]
    return sum(flags) / len(flags) if flags else 0.0


valid_rate = metric(name=qualified("valid_rate"))(published(_valid_rate, "valid_rate"))
medal_rate = metric(name=qualified("medal_rate"))(published(_medal_rate, "medal_rate"))


def _rexmle_scorer() -> Scorer:
    async def score(state: TaskState, target: Target) -> Score:
        spec = sample_spec_of(state)
        entry = state.store.get(SUBMISSION_KEY)
        if entry is None:  # the live sample: copy the submission out of its workspace and keep it
            from inspect_ai.util import sandbox

            from rexmle_agents.integrations.inspect.sandbox import RexmleSandboxEnvironment

            try:
                environment = sandbox().as_type(RexmleSandboxEnvironment)
            except TypeError as exc:
                raise SandboxError(f"the rexmle scorer reads the submission from the rexmle sandbox: {exc}",
                                   hint="run rexmle tasks with their own sandbox (the default)") from None
            entry = await anyio.to_thread.run_sync(functools.partial(collect_archive, environment))
        grade = await anyio.to_thread.run_sync(functools.partial(grade_archive, spec, entry))
        entry.pop("graded_from", None)
        state.store.set(SUBMISSION_KEY, entry)
        return score_of(grade, entry)

    return score


rexmle_scorer = scorer(metrics=[mean(), stderr(), valid_rate(), medal_rate()], name=qualified("score"))(
    published(_rexmle_scorer, "score"))
