"""Inside a SLURM array task: ``python -m rexmle_agents.executors.slurm_job run|after MANIFEST [EXIT_STATUS]``.

The job script (:func:`rexmle_agents.executors.slurm.job_script`) starts ``run``, which runs (or resumes) the run
on line ``$SLURM_ARRAY_TASK_ID`` of the manifest with exactly what SLURM granted the job: its GPUs
(``SLURM_JOB_GPUS``), and its memory (the harness's default memory limit is the job's, see
:mod:`rexmle_agents.harness.limits`). A run concluded by the harness (finished, failed, timed out: graded) exits 0.

SLURM stops a job with SIGTERM (``scancel``, ``scontrol requeue``, preemption, its time limit, a node going down),
then SIGKILL after ``KillWait``. ``run`` does not conclude the run then: it exits at once, as if killed, so the run
stays resumable from its journal. The job script, which outlives it, calls ``after`` with its exit status, and
``after`` asks SLURM what happened and records it into the run folder (``status.json``, a ``cluster`` journal
event, ``cluster.json``):

* the job was requeued (preemption, ``scontrol requeue``): the run is pending and resumes when the job restarts;
* SLURM's time limit: the job is requeued, and the run resumes with what is left of its own time budget (a run
  whose budget is spent is concluded ``timed_out`` at once, its best submission collected and graded);
* otherwise (``scancel``, preemption without requeue): the run is ``cancelled``, with SLURM's reason; running the
  group again resumes it;
* the harness died by itself (a signal, a crash): ``failed``, with the exit status and the job's log.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_CONCLUDED = 0
EXIT_LOCKED = 3  # another harness runs the run: nothing to do here
EXIT_DISK_FULL = 4  # the run stops where it is and resumes once there is space
EXIT_NOT_STARTED = 5  # the run could not start or continue on this node (recorded by `run` itself)
EXIT_STOPPED = 128 + signal.SIGTERM  # stopped by SLURM
# a run stopped by SLURM's time limit is requeued at most this often (a run that cannot conclude within one job's
# time limit is not requeued forever)
MAX_TIME_REQUEUES = 20


@dataclass(frozen=True)
class Task:
    """One line of the manifest: the run of one array task."""

    run_id: str
    run_dir: Path
    runs_dir: Path
    spec_json: str


def load_task(manifest: Path, index: int) -> Task:
    data = json.loads(manifest.read_text(encoding="utf-8"))
    entry = data["tasks"][index]
    return Task(run_id=entry["run_id"], run_dir=Path(entry["run_dir"]), runs_dir=Path(data["runs_dir"]),
                spec_json=json.dumps(entry["spec"]))


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def job_record(state: str, **fields: Any) -> Any:
    """This job as its environment describes it."""
    from rexmle_agents.executors.slurm_accounting import _now_iso
    from rexmle_agents.harness.limits import slurm_job_memory_bytes
    from rexmle_agents.harness.runner import slurm_job
    from rexmle_agents.results.records import SlurmJobRecord

    ref = slurm_job() or {"job_id": "?", "array_job_id": None, "array_task_id": None, "requeues": 0, "node": None}
    gpus = [g for g in os.environ.get("SLURM_JOB_GPUS", "").split(",") if g]
    memory = slurm_job_memory_bytes()
    values: dict[str, Any] = dict(job_id=ref["job_id"], array_job_id=ref["array_job_id"],
                                  array_task_id=ref["array_task_id"], requeues=ref["requeues"], node=ref["node"],
                                  state=state, partition=os.environ.get("SLURM_JOB_PARTITION"),
                                  cpus=_env_int("SLURM_CPUS_ON_NODE"), memory_mb=memory // 1024**2 or None,
                                  gpus=len(gpus), source="job", observed_at=_now_iso())
    values.update(fields)
    return SlurmJobRecord(**values)


def granted_gpus(wanted: int) -> tuple[str, ...]:
    """The GPUs SLURM granted the job (``SLURM_JOB_GPUS``, else ``CUDA_VISIBLE_DEVICES``), as many as the run asks
    for: never more, and an error when SLURM granted fewer."""
    from rexmle_agents.harness.hardware import gpu_ids
    from rexmle_grade.errors import UserInputError

    if not wanted:
        return ()
    granted = tuple(g for g in os.environ.get("SLURM_JOB_GPUS", "").split(",") if g) or gpu_ids()
    if len(granted) < wanted:
        raise UserInputError(f"the run needs {wanted} GPU(s), but SLURM granted the job {len(granted)}",
                             hint="the cluster's gres configuration does not match the request: ask its admins")
    return granted[:wanted]


def _stop_now(signum: int, _frame: Any) -> None:
    # no clean-up, no journal line: exactly what a kill leaves, which a resumed attempt knows how to continue
    os._exit(EXIT_STOPPED)


def run(task: Task) -> int:
    """Run (or resume) the task's run; the harness in a thread, so SIGTERM is this function's (see the module)."""
    signal.signal(signal.SIGTERM, _stop_now)
    from rexmle_agents.executors.common import run_one_job
    from rexmle_agents.executors.slurm_accounting import RESUME_HINT, mark_stopped, record_jobs
    from rexmle_agents.harness.paths import RunPaths
    from rexmle_agents.harness.runner import TERMINAL_STATES, DiskFullError, RunLockedError, read_status
    from rexmle_agents.harness.spec import RunSpec
    from rexmle_grade.errors import RexmleError

    record_jobs(task.run_dir, [job_record("RUNNING")])
    spec = RunSpec.model_validate_json(task.spec_json)
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["outcome"] = run_one_job(task.spec_json, str(task.runs_dir), granted_gpus(spec.resources.gpus),
                                            str(task.run_dir))
        except BaseException as exc:  # handed to the main thread, which decides the exit status
            result["error"] = exc

    worker = threading.Thread(target=target, name=f"harness-{task.run_id}", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(1.0)
    error = result.get("error")
    if isinstance(error, RunLockedError):
        print(f"rexmle: {error.message}: this job leaves it to that process", flush=True)
        return EXIT_LOCKED
    if isinstance(error, DiskFullError):
        print(f"rexmle: {error.message} ({error.hint})", flush=True)
        return EXIT_DISK_FULL
    if isinstance(error, RexmleError):  # granted_gpus
        outcome_reason = error.message
    elif error is not None:
        traceback.print_exception(error)
        return 1
    else:
        outcome = result["outcome"]
        if read_status(RunPaths(task.run_dir)).get("state") in TERMINAL_STATES:
            print(f"rexmle: run {task.run_id}: {outcome.state}: {outcome.reason}", flush=True)
            return EXIT_CONCLUDED
        outcome_reason = outcome.reason
    job = job_record("FAILED")
    reason = f"SLURM job {job.job_id} could not run it on {job.node}: {outcome_reason}; {RESUME_HINT}"
    print(f"rexmle: run {task.run_id}: {reason}", flush=True)
    mark_stopped(task.run_dir, job, state="failed", reason=reason, event="not_started", cluster_stop="FAILED")
    return EXIT_NOT_STARTED


def after(task: Task, code: int) -> int:
    """Record how the job ended when ``run`` did not conclude the run (see the module)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # SLURM's SIGTERM may reach this process too: finish first
    if code in (EXIT_CONCLUDED, EXIT_LOCKED, EXIT_DISK_FULL, EXIT_NOT_STARTED):
        return code
    from rexmle_agents.executors.slurm_accounting import (
        RESUME_HINT,
        SlurmCommandError,
        mark_stopped,
        parse_scontrol,
        record_jobs,
        slurm,
    )

    own = job_record("RUNNING")
    try:  # the numeric id names this array task alone
        seen = parse_scontrol(slurm("scontrol", "show", "job", "-o", os.environ.get("SLURM_JOB_ID", "")))
    except SlurmCommandError as exc:
        print(f"rexmle: cannot ask SLURM about this job: {exc.message}", flush=True)
        seen = []
    job = seen[0] if seen else own
    limit = "" if job.time_limit_s is None else f" of {job.time_limit_s / 60:g} min"
    if job.requeues > own.requeues:
        state, event, stop = "pending", "requeued", "REQUEUED"
        reason = (f"SLURM requeued job {job.job_id} (requeue {job.requeues}: preemption, or scontrol requeue); the "
                  "run resumes from its journal when the job starts again")
    elif job.reason == "TimeLimit":
        stop, event = "TIMEOUT", "time_limit"
        requeued, why = False, f"it was requeued {own.requeues} times already"
        if own.requeues < MAX_TIME_REQUEUES:
            try:
                slurm("scontrol", "requeue", os.environ.get("SLURM_JOB_ID", ""))
                requeued = True
            except SlurmCommandError as exc:
                why = exc.message
        if requeued:
            state = "pending"
            reason = (f"SLURM's time limit{limit} stopped job {job.job_id} before the run concluded; the job was "
                      "requeued: the run resumes with what is left of its own time budget (--time-limit), and ends "
                      "timed_out, its best submission graded, when that is spent")
        else:
            state = "timed_out"
            reason = (f"SLURM's time limit{limit} stopped job {job.job_id} before the run concluded, and it was not "
                      f"requeued ({why}); {RESUME_HINT}")
    elif code == EXIT_STOPPED:
        state, event, stop = "cancelled", "stopped", "CANCELLED"
        said = f"reason {job.reason}: " if job.reason else ""
        reason = (f"SLURM stopped job {job.job_id} ({said}scancel, or preemption without requeue) before the run "
                  f"concluded; {RESUME_HINT}")
    else:
        state, event, stop = "failed", "killed", "FAILED"
        how = f"killed by signal {code - 128}" if code > 128 else f"ended with exit status {code}"
        memory = f"; the job has {own.memory_mb} MB: out of memory?" if code == 128 + signal.SIGKILL and \
            own.memory_mb else ""
        reason = (f"the harness of SLURM job {job.job_id} was {how} before the run concluded{memory} (its log: "
                  f"{job.log or 'the job output'}); {RESUME_HINT}")
    print(f"rexmle: run {task.run_id}: {reason}", flush=True)
    record_jobs(task.run_dir, [job])
    mark_stopped(task.run_dir, job, state=state, reason=reason, event=event, cluster_stop=stop,
                 limit="time" if state == "timed_out" else None)
    return code


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] not in ("run", "after") or (args[0] == "after" and len(args) < 3):
        print("usage: python -m rexmle_agents.executors.slurm_job run MANIFEST | after MANIFEST EXIT_STATUS",
              file=sys.stderr)
        return 2
    index = _env_int("SLURM_ARRAY_TASK_ID")
    if index is None:
        print("rexmle: SLURM_ARRAY_TASK_ID is not set: this runs inside an array job made by "
              "`rexmle run --executor slurm`", file=sys.stderr)
        return 2
    task = load_task(Path(args[1]), index)
    return run(task) if args[0] == "run" else after(task, int(args[2]))


if __name__ == "__main__":
    sys.exit(main())
