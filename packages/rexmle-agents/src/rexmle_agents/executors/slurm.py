"""The SLURM executor: a group's runs as one job array (one per resource shape, split where the cluster's
``MaxArraySize`` asks), one run per array task, submitted with ``sbatch`` from a script a cluster admin can read.

Each submission lives in ``runs/<group>/.slurm/<time>/``: ``job.sh`` (its ``#SBATCH`` lines are the request: time
limit, CPUs, memory, GPUs, partition, account, throttle ``%N``), ``manifest.json`` (the specs, one per array task)
and one log per task. Every run folder gets its ``spec.json`` and a ``cluster.json`` naming its job at once, so
``rexmle runs status`` shows pending runs with their job ids. What happens inside a job is
:mod:`rexmle_agents.executors.slurm_job`; what SLURM says about the jobs is
:mod:`rexmle_agents.executors.slurm_accounting`.

Waiting (the default), the command polls the queue: a finished task's outcome is read from its run folder; a job
that left the queue before its run concluded is recorded with how it ended; a job SLURM will never start (it asks
for more than the partition allows) is cancelled and reported with SLURM's reason. Running the same command again
(after ``--no-wait``, an interrupted wait, or a cluster outage) submits nothing for runs whose jobs are still queued
or running (it waits for them), skips concluded runs and resumes the others.

``submitit-local`` runs the runs as local processes through submitit (tests and debugging without a cluster).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rexmle_agents.executors.common import Progress, SlurmOptions, run_one_job
from rexmle_agents.executors.slurm_accounting import (
    LIVE_STATES,
    NEVER_STARTS,
    SlurmCommandError,
    accounting,
    ended_jobs,
    ended_run,
    max_array_size,
    never_starts,
    queued_jobs,
    read_cluster,
    record_jobs,
    slurm,
)
from rexmle_agents.harness.hardware import gpu_ids
from rexmle_agents.harness.limits import GIB, MEMORY_RESERVE_FRACTION, MIN_RESERVE_BYTES
from rexmle_agents.harness.paths import RunPaths
from rexmle_agents.harness.runner import (
    TERMINAL_STATES,
    RunOutcome,
    read_status,
    run_paths,
    write_json_atomic,
)
from rexmle_agents.harness.spec import RunSpec
from rexmle_agents.results.records import SlurmJobRecord
from rexmle_grade.errors import ConfigurationError, UserInputError
from rexmle_grade.report import ReportEntry

try:
    import submitit
except ImportError:  # pragma: no cover - submitit is a dependency; guard for trimmed installs
    submitit = None

SETUP_MARGIN_MIN = 60  # the job's default time limit: the run's own, plus this for set-up, finalising and grading
FIRST_POLL_S = 0.5
UNANSWERED_S = 600.0
logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------
# the request


def _timeout_min(specs: Sequence[RunSpec], options: SlurmOptions) -> int:
    if options.timeout_min is not None:
        return options.timeout_min
    return math.ceil(max(s.limits.time_limit_s for s in specs) / 60) + SETUP_MARGIN_MIN


def slurm_parameters(specs: Sequence[RunSpec], options: SlurmOptions) -> dict[str, Any]:
    """What a job of these runs asks for (the largest run's needs): ``mem_gb`` is the runs' own memory limit (the
    job asks for it plus the harness's reserve, see :func:`sbatch_directives`)."""
    gpus = max(s.resources.gpus for s in specs)
    cpus = options.cpus_per_task or max((s.resources.cpus or 0) for s in specs) or None
    mem = options.mem_gb or max((s.resources.memory_gb or 0) for s in specs) or None
    params: dict[str, Any] = {
        "timeout_min": _timeout_min(specs, options),
        "slurm_array_parallelism": options.array_parallelism,
        "name": f"rexmle-{specs[0].group}",
        "tasks_per_node": 1,
        "nodes": 1,
    }
    if gpus:
        params["gpus_per_node"] = gpus
    if cpus:
        params["cpus_per_task"] = cpus
    if mem:
        params["mem_gb"] = mem
    if options.partition:
        params["slurm_partition"] = options.partition
    if options.account:
        params["slurm_account"] = options.account
    if options.extra:
        params["slurm_additional_parameters"] = dict(options.extra)
    return params


def job_memory_mb(run_memory_gb: float) -> int:
    """The job's memory for runs limited to ``run_memory_gb``: that plus the reserve the harness keeps for itself
    (the rule of :mod:`rexmle_agents.harness.limits`), so agent code gets all of its limit inside the job's."""
    run_bytes = run_memory_gb * GIB
    reserve = max(MIN_RESERVE_BYTES, MEMORY_RESERVE_FRACTION * run_bytes)
    return math.ceil((run_bytes + reserve) / 1024**2)


def sbatch_directives(params: Mapping[str, Any], tasks: int) -> list[str]:
    throttle = params.get("slurm_array_parallelism")
    lines = [f"--job-name={params['name']}", f"--array=0-{tasks - 1}" + (f"%{throttle}" if throttle else ""),
             f"--time={params['timeout_min']}", f"--nodes={params['nodes']}",
             f"--ntasks-per-node={params['tasks_per_node']}", "--requeue", "--open-mode=append"]
    if params.get("cpus_per_task"):
        lines.append(f"--cpus-per-task={params['cpus_per_task']}")
    if params.get("mem_gb"):
        lines.append(f"--mem={job_memory_mb(params['mem_gb'])}M")
    if params.get("gpus_per_node"):
        lines.append(f"--gres=gpu:{params['gpus_per_node']}")
    if params.get("slurm_partition"):
        lines.append(f"--partition={params['slurm_partition']}")
    if params.get("slurm_account"):
        lines.append(f"--account={params['slurm_account']}")
    for key, value in (params.get("slurm_additional_parameters") or {}).items():
        option = key.replace("_", "-").lstrip("-")
        lines.append(f"--{option}" + (f"={value}" if value not in ("", None) else ""))
    return lines


def job_script(directives: Sequence[str], manifest: Path, log_pattern: Path) -> str:
    python, module = shlex.quote(sys.executable), "rexmle_agents.executors.slurm_job"
    sbatch = "\n".join(f"#SBATCH {d}" for d in [*directives, f"--output={log_pattern}"])
    return f"""#!/bin/bash
{sbatch}
# Written by `rexmle run --executor slurm`. Array task N runs (or resumes) the run on line N of manifest.json.
# SLURM stops a job with SIGTERM (scancel, requeue, preemption, time limit): the harness then exits at once, as if
# killed, leaving its run resumable from the journal, and the `after` step records what SLURM did into the run
# folder (and requeues the job when SLURM's time limit stopped a run that has budget left).
trap 'stopping=1' TERM
{python} -m {module} run {shlex.quote(str(manifest))} &
harness=$!
wait "$harness"; code=$?
while kill -0 "$harness" 2>/dev/null; do wait "$harness"; code=$?; done
[ "$code" -eq 0 ] || exec {python} -m {module} after {shlex.quote(str(manifest))} "$code"
"""


# ---------------------------------------------------------------------------------------------------------------
# submission


@dataclass
class Tracked:
    spec: RunSpec
    run_dir: Path
    job_id: str
    seen: tuple[str | None, str | None, str | None] = (None, None, None)  # state, reason, node last recorded


def _shape(spec: RunSpec) -> tuple[Any, ...]:
    return (spec.resources.gpus, spec.resources.cpus, spec.resources.memory_gb, spec.limits.time_limit_s)


def submit(specs: Sequence[RunSpec], folders: Mapping[str, Path], runs_dir: Path,
           options: SlurmOptions) -> dict[str, str]:
    """Submit the runs as job arrays (one per resource shape, each at most ``MaxArraySize`` tasks); run id ->
    SLURM job id (``ARRAY_TASK``). Refused submissions raise :class:`UserInputError` with SLURM's message."""
    jobs: dict[str, str] = {}
    shapes: dict[tuple[Any, ...], list[RunSpec]] = {}
    for spec in specs:
        shapes.setdefault(_shape(spec), []).append(spec)
    size = max(1, max_array_size() - 1)
    note = accounting()
    for same in shapes.values():
        for start in range(0, len(same), size):
            jobs.update(_submit_array(same[start:start + size], folders, runs_dir, options, note))
    return jobs


def _submit_array(specs: Sequence[RunSpec], folders: Mapping[str, Path], runs_dir: Path, options: SlurmOptions,
                  note: str) -> dict[str, str]:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    folder = Path(runs_dir).resolve() / specs[0].group / ".slurm" / stamp
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({"runs_dir": str(Path(runs_dir).resolve()), "tasks": [
        {"run_id": s.run_id, "run_dir": str(folders[s.run_id].resolve()), "spec": s.model_dump(mode="json")}
        for s in specs]}) + "\n")
    params = slurm_parameters(specs, options)
    script = folder / "job.sh"
    script.write_text(job_script(sbatch_directives(params, len(specs)), manifest, folder / "%A_%a.log"))
    try:
        array = slurm("sbatch", "--parsable", str(script)).strip().split(";")[0]
    except SlurmCommandError as exc:
        said = exc.message.split(": ", 1)[-1]
        raise UserInputError(
            f"SLURM refused the job array of {len(specs)} run(s) ({' '.join(sbatch_directives(params, len(specs)))}):"
            f" {said}",
            hint="a run asks for more than the partition's nodes have or allow: change --cpus, --memory-gb, "
                 "--gpus-per-run, --slurm-timeout-min or --partition (sinfo -o '%P %c %m %G %l' lists them)",
        ) from None
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    jobs = {}
    for index, spec in enumerate(specs):
        run_dir = folders[spec.run_id]
        run_dir.mkdir(parents=True, exist_ok=True)
        paths = RunPaths(run_dir)
        if not paths.spec.is_file():  # what the harness writes first; now, so the pending run is listed
            write_json_atomic(paths.spec, spec.model_dump(mode="json"))
        job_id = f"{array}_{index}"
        record_jobs(run_dir, [SlurmJobRecord(
            job_id=job_id, array_job_id=array, array_task_id=index, state="PENDING", partition=options.partition,
            submit_time=now, time_limit_s=params["timeout_min"] * 60.0, cpus=params.get("cpus_per_task"),
            memory_mb=job_memory_mb(params["mem_gb"]) if params.get("mem_gb") else None,
            gpus=params.get("gpus_per_node", 0), log=str(folder / f"{array}_{index}.log"), source="sbatch",
            observed_at=now)], accounting_note=note)
        jobs[spec.run_id] = job_id
    return jobs


# ---------------------------------------------------------------------------------------------------------------
# running and waiting


def run_slurm(specs: Sequence[RunSpec], runs_dir: Path, *, options: SlurmOptions, progress: Progress | None = None,
              run_dirs: Mapping[str, Path] | None = None) -> list[RunOutcome]:
    """Submit the runs that have no live job (runs whose job is still queued or running are waited for, never
    submitted twice) and, with ``options.wait``, wait for every one of them; their outcomes in the order given."""
    folders = {s.run_id: Path((run_dirs or {}).get(s.run_id) or run_paths(s, runs_dir).run_dir) for s in specs}
    recorded = {s.run_id: r.last for s in specs if (r := read_cluster(folders[s.run_id])) is not None and r.last}
    live = queued_jobs(j.job_id for j in recorded.values() if j.state in LIVE_STATES or j.state is None)
    adopted = {run_id: job.job_id for run_id, job in recorded.items() if job.job_id in live}
    fresh = [s for s in specs if s.run_id not in adopted]
    jobs = {**adopted, **(submit(fresh, folders, runs_dir, options) if fresh else {})}
    if not options.wait:
        return []
    tracked = {s.run_id: Tracked(spec=s, run_dir=folders[s.run_id], job_id=jobs[s.run_id]) for s in specs}
    outcomes = wait_for(tracked, poll_s=options.poll_s, progress=progress)
    return [outcomes[s.run_id] for s in specs]


def wait_for(tracked: Mapping[str, Tracked], *, poll_s: float, progress: Progress | None) -> dict[str, RunOutcome]:
    """Poll the queue until every tracked run has an outcome (see the module). SLURM not answering for a while
    (a busy or restarting controller) is waited out for :data:`UNANSWERED_S`."""
    outcomes: dict[str, RunOutcome] = {}
    waiting = dict(tracked)
    note = accounting()
    interval = FIRST_POLL_S
    unanswered_since: float | None = None
    while waiting:
        try:
            queue = queued_jobs(t.job_id for t in waiting.values())
            left = [t for t in waiting.values() if t.job_id not in queue]
            final = ended_jobs(t.job_id for t in left) if left else {}
        except SlurmCommandError as exc:
            unanswered_since = unanswered_since or time.monotonic()
            if time.monotonic() - unanswered_since > UNANSWERED_S:
                raise SlurmCommandError(f"{exc.message} (for {UNANSWERED_S / 60:g} minutes)",
                                        hint="the jobs go on without this command: run it again later to wait "
                                             "for them and write the report") from None
            logger.warning("SLURM did not answer (%s); asking again", exc.message)
            time.sleep(interval)
            interval = min(poll_s, interval * 1.5)
            continue
        unanswered_since = None
        for run_id, item in list(waiting.items()):
            job = queue.get(item.job_id)
            if job is not None:
                # seen twice, as the scheduler settles a new job's reason
                if job.state == "PENDING" and job.reason in NEVER_STARTS and item.seen[:2] == ("PENDING", job.reason):
                    with contextlib.suppress(SlurmCommandError):  # it may have ended meanwhile
                        slurm("scancel", item.job_id)
                    record_jobs(item.run_dir, [job], accounting_note=note)
                    never_starts(item.run_dir, job)
                elif (job.state, job.reason, job.node) != item.seen:
                    record_jobs(item.run_dir, [job], accounting_note=note)
                    item.seen = (job.state, job.reason, job.node)
                    continue
                else:
                    continue
            else:
                ended = final.get(item.job_id)
                if ended is not None:
                    record_jobs(item.run_dir, [ended], accounting_note=note)
                    if ended.state in LIVE_STATES:  # requeued: squeue missed it in passing
                        continue
                if read_status(RunPaths(item.run_dir)).get("state") not in TERMINAL_STATES:
                    ended_run(item.run_dir, ended or SlurmJobRecord(
                        job_id=item.job_id, state="UNKNOWN", source="squeue",
                        observed_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")))
            outcome = outcome_of(item)
            outcomes[run_id] = outcome
            del waiting[run_id]
            if progress:
                progress(outcome)
        if waiting:
            time.sleep(interval)
            interval = min(poll_s, interval * 1.5)
    return outcomes


def outcome_of(item: Tracked) -> RunOutcome:
    """The outcome a run folder holds (its grade when graded)."""
    paths = RunPaths(item.run_dir)
    status = read_status(paths)
    grade = ReportEntry.model_validate_json(paths.grade.read_text()) if paths.grade.is_file() else None
    return RunOutcome(run_id=item.spec.run_id, run_dir=paths.run_dir, state=status.get("state", "pending"),
                      reason=status.get("reason", ""), limit=status.get("limit"), steps=int(status.get("steps", 0)),
                      seconds=float(status.get("elapsed_s", 0.0)), grade=grade)


# ---------------------------------------------------------------------------------------------------------------
# submitit-local: the runs as local processes, for tests and debugging without a cluster


class RunJob:
    """A run as a submitit job."""

    def __call__(self, spec_json: str, runs_dir: str, run_dir: str = "") -> RunOutcome:
        spec = RunSpec.model_validate_json(spec_json)
        return run_one_job(spec_json, runs_dir, gpu_ids()[: spec.resources.gpus], run_dir or None)


def run_submitit_local(specs: Sequence[RunSpec], runs_dir: Path, *, options: SlurmOptions,
                       progress: Progress | None = None, run_dirs: Mapping[str, Path] | None = None
                       ) -> list[RunOutcome]:
    if submitit is None:
        raise ConfigurationError("the submitit-local executor needs submitit", hint="pip install submitit")
    executor = submitit.LocalExecutor(folder=Path(runs_dir) / specs[0].group / ".submitit")
    executor.update_parameters(timeout_min=_timeout_min(specs, options))
    folders = [str((run_dirs or {}).get(s.run_id, "")) for s in specs]
    jobs = executor.map_array(RunJob(), [s.model_dump_json() for s in specs], [str(runs_dir)] * len(specs), folders)
    outcomes = []
    for job in jobs:
        outcome = job.result()
        outcomes.append(outcome)
        if progress:
            progress(outcome)
    return outcomes
