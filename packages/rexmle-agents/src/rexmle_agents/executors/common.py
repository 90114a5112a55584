"""Running many specs: skip finished runs, dispatch the rest to an executor, collect one outcome per spec."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rexmle_agents.harness.paths import RunPaths
from rexmle_agents.harness.runner import (
    TERMINAL_STATES,
    DiskFullError,
    RunLockedError,
    RunOutcome,
    execute_run,
    read_status,
    run_paths,
)
from rexmle_agents.harness.spec import RunSpec
from rexmle_grade.errors import RexmleError, UnknownNameError
from rexmle_grade.report import ReportEntry

EXECUTORS = ("local", "slurm", "submitit-local")


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    timeout_min: int | None = None  # default: the run's time limit plus an hour for set-up and grading
    mem_gb: float | None = None  # default: each run's --memory-gb (else the cluster's default memory per job)
    cpus_per_task: int | None = None  # default: each run's --cpus (else the cluster's default)
    array_parallelism: int | None = 64  # at most this many tasks of an array run at once (sbatch --array=...%N)
    account: str | None = None
    extra: dict[str, str] | None = None  # any other sbatch option: {"qos": "long", "constraint": "a100"}
    wait: bool = True
    poll_s: float = 10.0  # longest pause between two looks at the queue while waiting


Progress = Callable[[RunOutcome], None]


def run_specs(specs: Sequence[RunSpec], runs_dir: Path, *, executor: str = "local", workers: int = 1,
              progress: Progress | None = None, slurm: SlurmOptions | None = None,
              run_dirs: Mapping[str, Path] | None = None) -> list[RunOutcome]:
    """Run every spec (finished runs are only re-read; unfinished ones resume), in the order given. ``run_dirs``:
    run id -> its folder, for runs given by path (``--resume PATH``) rather than found under ``runs_dir``.

    A run another process is running (its lock is held) is refused before anything starts (RunLockedError), except
    under ``slurm`` a run whose own SLURM job holds it: that job is waited for (never submitted twice)."""
    if executor not in EXECUTORS:
        raise UnknownNameError("executor", executor, EXECUTORS)
    run_dirs = dict(run_dirs or {})
    outcomes: dict[str, RunOutcome] = {}
    todo: list[RunSpec] = []
    for spec in specs:
        folder = run_dirs.get(spec.run_id) or run_paths(spec, runs_dir).run_dir
        try:
            check_not_locked(RunPaths(folder))
        except RunLockedError:
            from rexmle_agents.executors.slurm_accounting import held_by_live_job

            if executor != "slurm" or not held_by_live_job(folder):
                raise
        done = finished_outcome(spec, runs_dir, run_dir=folder)
        if done is None:
            todo.append(spec)
        else:
            outcomes[spec.run_id] = done
            if progress:
                progress(done)
    if todo:
        from rexmle_agents.executors.slurm_accounting import reopen

        for spec in todo:  # a run the cluster stopped resumes like any unfinished run
            reopen(run_dirs.get(spec.run_id) or run_paths(spec, runs_dir).run_dir)
        if executor == "local":
            from rexmle_agents.executors.local import run_local

            results = run_local(todo, runs_dir, workers=workers, progress=progress, run_dirs=run_dirs)
        elif executor == "slurm":
            from rexmle_agents.executors.slurm import run_slurm

            results = run_slurm(todo, runs_dir, options=slurm or SlurmOptions(), progress=progress,
                                run_dirs=run_dirs)
        else:
            from rexmle_agents.executors.slurm import run_submitit_local

            results = run_submitit_local(todo, runs_dir, options=slurm or SlurmOptions(), progress=progress,
                                         run_dirs=run_dirs)
        outcomes.update({o.run_id: o for o in results})
    return [outcomes[s.run_id] for s in specs if s.run_id in outcomes]


def check_not_locked(paths: RunPaths) -> None:
    """Refuse a run folder whose lock another process holds (a second `rexmle run` of the same group)."""
    if not paths.lock.is_file():
        return
    with paths.lock.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunLockedError(f"run {paths.run_dir} is being run by another process",
                                 hint="wait for it, or stop it first (see `rexmle runs status`)") from None
        fcntl.flock(handle, fcntl.LOCK_UN)


def finished_outcome(spec: RunSpec, runs_dir: Path, *, run_dir: Path | None = None) -> RunOutcome | None:
    """The outcome of a run that already ended and was graded (None when it must still run)."""
    paths = RunPaths(run_dir) if run_dir is not None else run_paths(spec, runs_dir)
    status = read_status(paths)
    if status.get("state") not in TERMINAL_STATES or not paths.grade.is_file():
        return None
    entry = ReportEntry.model_validate_json(paths.grade.read_text())
    return RunOutcome(run_id=spec.run_id, run_dir=paths.run_dir, state=status["state"], reason=status.get("reason", ""),
                      limit=status.get("limit"), steps=int(status.get("steps", 0)),
                      seconds=float(status.get("elapsed_s", 0.0)), grade=entry)


def run_one_job(spec_json: str, runs_dir: str, gpus: Sequence[str] = (), run_dir: str | None = None,
                concurrent_runs: int = 1) -> RunOutcome:
    """One run in an executor's worker: a rexmle error becomes a failed outcome, never a lost group; except what
    the operator must act on (the run is locked by another process, the disk is full), which stops the command."""
    spec = RunSpec.model_validate(json.loads(spec_json))
    folder = Path(run_dir) if run_dir else None
    try:
        return execute_run(spec, Path(runs_dir), gpus=tuple(gpus), run_dir=folder, concurrent_runs=concurrent_runs)
    except (RunLockedError, DiskFullError):
        raise
    except RexmleError as exc:
        paths = RunPaths(folder) if folder else run_paths(spec, Path(runs_dir))
        return RunOutcome(run_id=spec.run_id, run_dir=paths.run_dir, state="failed",
                          reason=f"{exc.message}" + (f" (hint: {exc.hint})" if exc.hint else ""), limit=None,
                          steps=0, seconds=0.0, grade=None)
