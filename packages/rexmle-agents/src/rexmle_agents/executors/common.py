"""Running many specs: skip finished runs, dispatch the rest to an executor, collect one outcome per spec."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rexmle_agents.harness.runner import TERMINAL_STATES, RunOutcome, execute_run, read_status, run_paths
from rexmle_agents.harness.spec import RunSpec
from rexmle_grade.errors import RexmleError, UnknownNameError
from rexmle_grade.report import ReportEntry

EXECUTORS = ("local", "slurm", "submitit-local")


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    timeout_min: int | None = None  # default: the run's time limit plus an hour for set-up and grading
    mem_gb: float | None = None
    cpus_per_task: int | None = None
    array_parallelism: int = 64
    account: str | None = None
    extra: dict[str, str] | None = None  # any other sbatch option (slurm_additional_parameters)
    wait: bool = True


Progress = Callable[[RunOutcome], None]


def run_specs(specs: Sequence[RunSpec], runs_dir: Path, *, executor: str = "local", workers: int = 1,
              progress: Progress | None = None, slurm: SlurmOptions | None = None) -> list[RunOutcome]:
    """Run every spec (finished runs are only re-read; unfinished ones resume), in the order given."""
    if executor not in EXECUTORS:
        raise UnknownNameError("executor", executor, EXECUTORS)
    outcomes: dict[str, RunOutcome] = {}
    todo: list[RunSpec] = []
    for spec in specs:
        done = finished_outcome(spec, runs_dir)
        if done is None:
            todo.append(spec)
        else:
            outcomes[spec.run_id] = done
            if progress:
                progress(done)
    if todo:
        if executor == "local":
            from rexmle_agents.executors.local import run_local

            results = run_local(todo, runs_dir, workers=workers, progress=progress)
        else:
            from rexmle_agents.executors.slurm import run_submitit

            results = run_submitit(todo, runs_dir, options=slurm or SlurmOptions(), local=executor != "slurm",
                                   progress=progress)
        outcomes.update({o.run_id: o for o in results})
    return [outcomes[s.run_id] for s in specs if s.run_id in outcomes]


def finished_outcome(spec: RunSpec, runs_dir: Path) -> RunOutcome | None:
    """The outcome of a run that already ended and was graded (None when it must still run)."""
    paths = run_paths(spec, runs_dir)
    status = read_status(paths)
    if status.get("state") not in TERMINAL_STATES or not paths.grade.is_file():
        return None
    entry = ReportEntry.model_validate_json(paths.grade.read_text())
    return RunOutcome(run_id=spec.run_id, run_dir=paths.run_dir, state=status["state"], reason=status.get("reason", ""),
                      limit=status.get("limit"), steps=int(status.get("steps", 0)),
                      seconds=float(status.get("elapsed_s", 0.0)), grade=entry)


def run_one_job(spec_json: str, runs_dir: str, gpus: Sequence[str] = ()) -> RunOutcome:
    """One run in an executor's worker: any rexmle error becomes a failed outcome, never a lost group."""
    spec = RunSpec.model_validate(json.loads(spec_json))
    try:
        return execute_run(spec, Path(runs_dir), gpus=tuple(gpus))
    except RexmleError as exc:
        paths = run_paths(spec, Path(runs_dir))
        return RunOutcome(run_id=spec.run_id, run_dir=paths.run_dir, state="failed",
                          reason=f"{exc.message}" + (f" (hint: {exc.hint})" if exc.hint else ""), limit=None,
                          steps=0, seconds=0.0, grade=None)
