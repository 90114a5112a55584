"""What SLURM says about a run's jobs, and where rexmle keeps it: ``cluster.json`` in the run folder.

The queue (``squeue``) and the controller (``scontrol show job``) know a job while it exists (``scontrol`` until
``MinJobAge`` after its end); the accounting database (``sacct``) knows it for good, where the cluster keeps one.
Every observation is recorded into the run's ``cluster.json`` (:class:`~rexmle_agents.results.records.ClusterRecord`)
by whoever makes it: the submission, the job itself, the waiting ``rexmle run``, ``rexmle runs status``. So a
report written after the jobs are forgotten still says how each job ended, and a cluster without accounting
storage still has a record (``cluster.json`` says which source each record came from).

When a job ends before its run concluded (cancelled, preempted and not requeued, a failed node, a killed harness),
:func:`mark_stopped` writes the run's ``status.json`` as the cluster left it (``cluster_stop`` names SLURM's state)
and journals a ``cluster`` event: the user sees that the cluster, not the agent, ended the run, and running the
group again resumes it (:func:`reopen`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.paths import RunPaths
from rexmle_agents.harness.runner import TERMINAL_STATES, flock_within, read_status, write_json_atomic
from rexmle_agents.results.records import ClusterRecord, RunStatus, SlurmJobRecord
from rexmle_grade.errors import ConfigurationError

CLUSTER_FILE = "cluster.json"
COMMAND_TIMEOUT_S = 60.0
# states of a job that is still (or again) in the queue
LIVE_STATES = frozenset({"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
                         "COMPLETING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"})
# pending reasons that never resolve by waiting: the job asks for more than its partition, account or QOS allows,
# or depends on a job that failed (a down node or a reservation may come back, so those are only shown; and a job
# being submitted may show PartitionConfig for a moment)
NEVER_STARTS = frozenset({"PartitionTimeLimit", "PartitionNodeLimit", "BadConstraints",
                          "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied", "AccountNotAllowed",
                          "QOSMaxWallDurationPerJobLimit", "AssocMaxWallDurationPerJobLimit",
                          "QOSMaxCpuPerJobLimit", "QOSMaxGRESPerJob", "QOSMaxMemoryPerJob", "AssocMaxCpuPerJobLimit"})
# how a job that ended before its run concluded leaves the run: (run state, what happened)
ENDED_BY_CLUSTER: dict[str, tuple[str, str]] = {
    "CANCELLED": ("cancelled", "was cancelled (scancel, or preempted without requeue)"),
    "PREEMPTED": ("cancelled", "was preempted and not requeued"),
    "DEADLINE": ("cancelled", "reached its deadline"),
    "TIMEOUT": ("timed_out", "reached SLURM's time limit and was not requeued"),
    "NODE_FAIL": ("failed", "lost its node (NODE_FAIL)"),
    "BOOT_FAIL": ("failed", "could not boot its node (BOOT_FAIL)"),
    "OUT_OF_MEMORY": ("failed", "ran out of its memory (OUT_OF_MEMORY)"),
    "FAILED": ("failed", "failed (its job script ended with an error)"),
    "COMPLETED": ("failed", "ended without the run concluding"),
    "UNKNOWN": ("failed", "ended, and SLURM no longer knows how (no accounting storage, and it ended more than "
                          "MinJobAge ago)"),
}
RESUME_HINT = "run the group again to resume it"
# how the job's `after` step marks a pending run whose job SLURM requeued (preemption, scontrol requeue, its time limit)
REQUEUED_STOPS = frozenset({"REQUEUED", "TIMEOUT"})


class SlurmCommandError(ConfigurationError):
    """A SLURM command failed or is missing."""


# ---------------------------------------------------------------------------------------------------------------
# running SLURM's commands


def slurm_available() -> bool:
    return all(shutil.which(name) for name in ("sbatch", "squeue", "scontrol"))


def command_env() -> dict[str, str]:
    """This environment for SLURM's commands: times in one format, and no ``SLURM_*`` variables of a job this
    process may run in (a job submitted from inside another job would inherit them) except where the cluster is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k in ("SLURM_CONF", "SLURM_CLUSTERS")}
    env["SLURM_TIME_FORMAT"] = "standard"
    return env


def slurm(*argv: str, timeout_s: float = COMMAND_TIMEOUT_S, input_text: str | None = None) -> str:
    """Run a SLURM command; its stdout, or :class:`SlurmCommandError` quoting what it printed."""
    if shutil.which(argv[0]) is None:
        raise SlurmCommandError(f"{argv[0]} is not installed: this machine is not a SLURM submit host",
                                hint="run where sbatch works (a login node), or use --executor local")
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, env=command_env(),
                              input=input_text)
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(f"{' '.join(argv[:2])} did not answer within {timeout_s:g} s",
                                hint="is slurmctld up? (scontrol ping)") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().replace("\n", "; ")
        raise SlurmCommandError(f"{' '.join(argv[:2])} failed (exit {done.returncode}): {said}")
    return done.stdout


@functools.cache
def cluster_config() -> dict[str, str]:
    """``scontrol show config`` as a mapping (read once per process)."""
    config = {}
    for line in slurm("scontrol", "show", "config").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip()
    return config


def accounting() -> str:
    """``sacct`` where the cluster keeps accounting storage, else why it does not (said in reports)."""
    storage = cluster_config().get("AccountingStorageType", "")
    if storage and not storage.endswith("/none") and shutil.which("sacct"):
        return "sacct"
    return ("none: this cluster keeps no accounting storage (AccountingStorageType=accounting_storage/none), so job "
            "records come from squeue and scontrol while each job existed")


def max_array_size() -> int:
    value = cluster_config().get("MaxArraySize", "1001")
    return int(value) if value.isdigit() else 1001


# ---------------------------------------------------------------------------------------------------------------
# parsing what the commands print


def _now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _time(value: str | None) -> dt.datetime | None:
    """A time as SLURM prints it (local time, standard format); None for Unknown, None, N/A."""
    if not value or not value[:1].isdigit():
        return None
    try:
        return dt.datetime.fromisoformat(value).astimezone(dt.timezone.utc)
    except ValueError:
        return None


def _iso(moment: dt.datetime | None) -> str | None:
    return None if moment is None else moment.isoformat(timespec="seconds")


def duration_s(value: str | None) -> float | None:
    """Seconds of ``[D-]HH:MM:SS``, ``MM:SS`` or minutes; None for UNLIMITED, INVALID, N/A."""
    if not value or not value[:1].isdigit():
        return None
    days, _, rest = value.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    if len(parts) == 1:  # minutes
        parts = [0.0, parts[0], 0.0]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return (float(days) if days else 0.0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def _memory_mb(value: str | None) -> int | None:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", value or "")
    if match is None:
        return None
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2}[match.group(2)]
    return int(float(match.group(1)) * scale)


def _tres(value: str | None) -> dict[str, str]:
    return dict(part.split("=", 1) for part in (value or "").split(",") if "=" in part)


def _gpus(tres: Mapping[str, str]) -> int | None:
    count = [int(v) for k, v in tres.items() if (k == "gres/gpu" or k.startswith("gres/gpu:")) and v.isdigit()]
    return max(count) if count else None


_FIELD = re.compile(r"(\S+?)=(.*?)(?= \S+?=|$)")


def parse_scontrol(text: str) -> list[SlurmJobRecord]:
    """Records of ``scontrol show job -o`` (one line per job; a pending array's unsplit tasks in one line)."""
    records = []
    now = _now_iso()
    for line in text.splitlines():
        fields = dict(_FIELD.findall(line.strip()))
        if "JobId" not in fields:
            continue
        array, tasks = fields.get("ArrayJobId"), fields.get("ArrayTaskId", "")
        submit, eligible, start = (_time(fields.get(k)) for k in ("SubmitTime", "EligibleTime", "StartTime"))
        state = fields.get("JobState")
        started = state not in ("PENDING", "REQUEUED", None) and start is not None
        final = state not in LIVE_STATES
        tres = _tres(fields.get("AllocTRES") or fields.get("TRES") or fields.get("ReqTRES"))
        base = dict(
            array_job_id=array, state=state, reason=None if fields.get("Reason") in (None, "None") else
            fields["Reason"], exit_code=fields.get("ExitCode"), node=fields.get("NodeList") or None,
            partition=fields.get("Partition"), submit_time=_iso(submit), start_time=_iso(start) if started else None,
            end_time=_iso(_time(fields.get("EndTime"))) if final and started else None,
            elapsed_s=duration_s(fields.get("RunTime")) if started else None,
            queue_wait_s=max(0.0, (start - (eligible or submit)).total_seconds()) if started and (eligible or submit)
            else None,
            time_limit_s=duration_s(fields.get("TimeLimit")), requeues=int(fields.get("Restarts") or 0),
            cpus=int(fields["NumCPUs"]) if fields.get("NumCPUs", "").isdigit() else None,
            memory_mb=_memory_mb(tres.get("mem")), gpus=_gpus(tres), log=fields.get("StdOut"), source="scontrol",
            observed_at=now)
        for task in _task_ids(tasks) if array else [None]:
            job_id = f"{array}_{task}" if task is not None else fields["JobId"]
            records.append(SlurmJobRecord(job_id=job_id, array_task_id=task, **base))
    return records


def _task_ids(text: str) -> list[int | None]:
    """``3``, ``3-9``, ``3-9%2``, ``1,4,6-8``: the array task ids a line stands for."""
    ids: list[int | None] = []
    for part in text.split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            ids += list(range(int(low), int(high or low) + 1))
    return ids or [None]


SQUEUE_FORMAT = "%i|%T|%r|%N|%P|%V|%S|%M|%l|%C"


def parse_squeue(text: str) -> list[SlurmJobRecord]:
    """Records of ``squeue -h -r -o SQUEUE_FORMAT``."""
    records = []
    now = _now_iso()
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 10:
            continue
        job_id, state, reason, node, partition, submit, start, used, limit, cpus = parts
        array, _, task = job_id.partition("_")
        running = state not in ("PENDING", "REQUEUED")
        records.append(SlurmJobRecord(
            job_id=job_id, array_job_id=array if task else None, array_task_id=int(task) if task.isdigit() else None,
            state=state, reason=None if reason in ("None", "") else reason, node=node or None,
            partition=partition or None, submit_time=_iso(_time(submit)),
            start_time=_iso(_time(start)) if running else None, elapsed_s=duration_s(used) if running else None,
            time_limit_s=duration_s(limit), cpus=int(cpus) if cpus.isdigit() else None, source="squeue",
            observed_at=now))
    return records


def parse_sacct_json(text: str) -> list[SlurmJobRecord]:
    """Records of ``sacct --json -X --duplicates``: every start of a job is one record there, so a requeued job's
    latest record stands for it and counts its requeues (field names of SLURM 21.08 to 24.x)."""
    data = json.loads(text)
    now = _now_iso()
    latest: dict[str, tuple[float, SlurmJobRecord]] = {}
    seen: dict[str, int] = {}
    for job in data.get("jobs", []):
        array = job.get("array") or {}
        array_id = _number(array.get("job_id"))
        task = _number(array.get("task_id"))
        job_id = f"{array_id}_{task}" if array_id and task is not None else str(job.get("job_id"))
        times = job.get("time") or {}
        state = job.get("state") or {}
        current = state.get("current")
        current = current[0] if isinstance(current, list) and current else current
        submit, start, end = (_epoch(_number(times.get(k))) for k in ("submission", "start", "end"))
        eligible = _epoch(_number(times.get("eligible")))
        limit = _number(times.get("limit"))
        exit_code = job.get("exit_code") or {}
        code = _number(exit_code.get("return_code"))
        signal = exit_code.get("signal")
        sig = _number(signal.get("signal_id", signal.get("id")) if isinstance(signal, dict) else signal)
        reason = None if state.get("reason") in (None, "None") else state.get("reason")
        if current == "CANCELLED" and job.get("kill_request_user"):
            reason = f"cancelled by {job['kill_request_user']}" + (f" ({reason})" if reason else "")
        tres = {t.get("type", "") + (f"/{t['name']}" if t.get("name") else ""): str(t.get("count"))
                for t in ((job.get("tres") or {}).get("allocated") or [])}
        record = SlurmJobRecord(
            job_id=job_id, array_job_id=str(array_id) if array_id else None, array_task_id=task, state=current,
            reason=reason, exit_code=None if code is None else f"{code}:{sig or 0}",
            node=None if job.get("nodes") in (None, "", "None assigned") else job["nodes"],
            partition=job.get("partition") or None, submit_time=_iso(submit), start_time=_iso(start),
            end_time=_iso(end), elapsed_s=_number(times.get("elapsed")),
            queue_wait_s=max(0.0, (start - (eligible or submit)).total_seconds()) if start and (eligible or submit)
            else None, time_limit_s=None if limit is None else limit * 60.0,
            cpus=_int(tres.get("cpu")), memory_mb=_int(tres.get("mem")), gpus=_int(tres.get("gres/gpu")),
            source="sacct", observed_at=now)
        seen[job_id] = seen.get(job_id, -1) + 1
        order = start.timestamp() if start else 0.0
        if job_id not in latest or order >= latest[job_id][0]:
            latest[job_id] = (order, record)
    return [record.model_copy(update={"requeues": seen[job_id]}) for job_id, (_, record) in latest.items()]


def _number(value: Any) -> Any:
    """A number of sacct's JSON: plain, or ``{"set": true, "number": N}`` (SLURM 23.02 and later)."""
    if isinstance(value, dict):
        return value.get("number") if value.get("set", True) and not value.get("infinite") else None
    return value


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _epoch(value: Any) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(value, dt.timezone.utc) if isinstance(value, (int, float)) and value > 0 else None


# ---------------------------------------------------------------------------------------------------------------
# querying jobs


def queued_jobs(job_ids: Iterable[str]) -> dict[str, SlurmJobRecord]:
    """The jobs among ``job_ids`` (``12_3`` or ``15``) that are still queued, running or completing."""
    arrays = sorted({job.split("_")[0] for job in job_ids})
    if not arrays:
        return {}
    found: dict[str, SlurmJobRecord] = {}
    for chunk in _chunks(arrays, 500):
        try:
            text = slurm("squeue", "-h", "-r", "-j", ",".join(chunk), "-o", SQUEUE_FORMAT)
        except SlurmCommandError as exc:
            if "Invalid job id" not in exc.message:  # every job of the chunk has left the controller
                raise
            continue
        found.update({r.job_id: r for r in parse_squeue(text)})
    return found


def held_by_live_job(run_dir: Path) -> bool:
    """Whether the run's last recorded SLURM job is still queued or running (so that job, not another `rexmle run`,
    holds the run's lock)."""
    record = read_cluster(Path(run_dir))
    if record is None or record.last is None or record.last.state not in (*LIVE_STATES, None):
        return False
    try:
        return record.last.job_id in queued_jobs([record.last.job_id])
    except SlurmCommandError:
        return False


def ended_jobs(job_ids: Iterable[str]) -> dict[str, SlurmJobRecord]:
    """The final records of jobs that left the queue: accounting where kept, else the controller's while it still
    knows them (``MinJobAge`` after their end); a job neither knows is missing from the result."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    found: dict[str, SlurmJobRecord] = {}
    if accounting() == "sacct":
        try:
            for chunk in _chunks(sorted({job.split("_")[0] for job in ids}), 200):
                text = slurm("sacct", "--json", "-X", "--duplicates", "-j", ",".join(chunk))
                found.update({r.job_id: r for r in parse_sacct_json(text) if r.state not in LIVE_STATES})
        except (SlurmCommandError, ValueError):  # a SLURM before 21.08 (no --json), or a database down
            pass
    # the controller for what accounting does not have yet (it is written a moment after the job's end)
    missing = [job for job in ids if job not in found]
    found.update(controller_jobs(missing) if missing else {})
    return {job: found[job] for job in ids if job in found}


def controller_jobs(job_ids: Iterable[str]) -> dict[str, SlurmJobRecord]:
    """``scontrol show job`` of the jobs (and arrays) the controller still knows."""
    wanted = set(job_ids)
    found: dict[str, SlurmJobRecord] = {}
    for array in sorted({job.split("_")[0] for job in wanted}):
        try:
            text = slurm("scontrol", "show", "job", "-o", array)
        except SlurmCommandError as exc:
            if "Invalid job id" in exc.message:  # forgotten: ended more than MinJobAge ago
                continue
            raise
        found.update({r.job_id: r for r in parse_scontrol(text) if r.job_id in wanted})
    return found


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


# ---------------------------------------------------------------------------------------------------------------
# cluster.json


def cluster_path(run_dir: Path) -> Path:
    return Path(run_dir) / CLUSTER_FILE


def read_cluster(run_dir: Path) -> ClusterRecord | None:
    path = cluster_path(run_dir)
    if not path.is_file():
        return None
    try:
        return ClusterRecord.model_validate_json(path.read_bytes())
    except ValueError:
        return None


@contextlib.contextmanager
def _cluster_lock(run_dir: Path) -> Iterator[None]:
    """cluster.json is written by the submission, the job and any observer: one at a time."""
    with (Path(run_dir) / f".{CLUSTER_FILE}.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def record_jobs(run_dir: Path, observed: Sequence[SlurmJobRecord], *,
                accounting_note: str | None = None) -> ClusterRecord:
    """Merge what was just observed into ``cluster.json`` (a job's record is updated field by field: a later
    observation without a value keeps the earlier one; how sacct says a job ended is not replaced by another
    source's word on its end, only by the job being queued or running again)."""
    with _cluster_lock(run_dir):
        current = read_cluster(run_dir) or ClusterRecord(accounting=accounting_note or "unknown")
        jobs = {job.job_id: job for job in current.jobs}
        order = [job.job_id for job in current.jobs]
        for job in observed:
            old = jobs.get(job.job_id)
            if old is None:
                order.append(job.job_id)
                jobs[job.job_id] = job
            elif not (old.source == "sacct" and old.state not in LIVE_STATES and job.source != "sacct"
                      and job.state not in LIVE_STATES):
                update = {k: v for k, v in job.model_dump().items() if v is not None}
                update["requeues"] = max(old.requeues, job.requeues)
                if job.state in LIVE_STATES:  # queued or running (again): an earlier start's end is not this one's
                    update["end_time"] = None
                jobs[job.job_id] = old.model_copy(update=update)
        record = ClusterRecord(accounting=accounting_note or current.accounting, jobs=[jobs[j] for j in order])
        write_json_atomic(cluster_path(run_dir), record.model_dump(mode="json"))
        return record


# ---------------------------------------------------------------------------------------------------------------
# a run the cluster stopped


@contextlib.contextmanager
def run_lock_or_none(paths: RunPaths, wait_s: float = 5.0) -> Iterator[bool]:
    """The run's lock if no harness holds it (waiting up to ``wait_s`` for a dying one to let go); False while a
    live harness runs the run, and then nothing of the run may be written but ``cluster.json``."""
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    with paths.lock.open("a+") as handle:
        if not flock_within(handle, wait_s, pause_s=0.1):
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def mark_stopped(run_dir: Path, job: SlurmJobRecord, *, state: str, reason: str, event: str,
                 cluster_stop: str, limit: str | None = None) -> bool:
    """Write how the cluster left a run that did not conclude: ``status.json`` (``state``, ``reason``,
    ``cluster_stop``) and a ``cluster`` journal event. Nothing is written over a concluded run, nor while a harness
    holds the run (it will write its own status); returns whether the run was marked."""
    paths = RunPaths(Path(run_dir))
    if not paths.spec.is_file():
        return False
    with run_lock_or_none(paths) as locked:
        if not locked:
            return False
        status = read_status(paths)
        if status.get("state") in TERMINAL_STATES and not status.get("cluster_stop"):
            return False  # the harness concluded it: nothing the cluster did afterwards changes that
        fields = {**status, "state": state, "reason": reason, "limit": limit, "cluster_stop": cluster_stop,
                  "updated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")}
        fields.setdefault("attempts", 0)
        fields.setdefault("run_id", paths.run_dir.name)
        write_json_atomic(paths.status, RunStatus.model_validate(fields).model_dump(mode="json"))
        journal = Journal(paths.journal)
        journal.repair()  # a harness killed mid-write leaves a torn line: the event starts on a fresh one
        journal.append("cluster", event=event, job_id=job.job_id, job_state=job.state, reason=job.reason,
                       message=reason)
    return True


def ended_run(run_dir: Path, job: SlurmJobRecord) -> bool:
    """A run whose job ``job`` left the queue without the run concluding: marked as the cluster left it."""
    state, what = ENDED_BY_CLUSTER.get(job.state or "", ("failed", f"ended ({job.state})"))
    log = f"; its log: {job.log}" if job.log and state == "failed" else ""
    status = read_status(RunPaths(Path(run_dir)))
    if job.state == "FAILED" and status.get("state") == "pending":
        # neither the harness (running) nor the job's `after` step (how it stopped) wrote a word: the job failed
        # before its script ran, which only SLURM's daemons can explain
        again = " after it was requeued" if status.get("cluster_stop") in REQUEUED_STOPS else ""
        node = f"node {job.node}" if job.node else "node"
        reason = (f"SLURM job {job.job_id} failed{again} before its job script ran (SLURM's reason: "
                  f"{job.reason or 'none given'}, exit code {job.exit_code or 'unknown'}): the {node} did not start "
                  "it, and the slurmd log there says why (slurmd refuses a requeued job started again within the "
                  f"second its previous start ended: 'Job credential revoked'){log}; {RESUME_HINT}")
    else:
        detail = f" with exit code {job.exit_code}" if job.exit_code and job.state in ("FAILED", "COMPLETED") else ""
        reason = f"SLURM job {job.job_id} {what}{detail} before the run concluded{log}; {RESUME_HINT}"
    return mark_stopped(run_dir, job, state=state, reason=reason, event="stopped", cluster_stop=job.state or "UNKNOWN",
                        limit="time" if job.state == "TIMEOUT" else None)


def never_starts(run_dir: Path, job: SlurmJobRecord) -> bool:
    """A run whose job SLURM will never start (it was cancelled): failed, with SLURM's reason."""
    reason = (f"SLURM will never start job {job.job_id}: {job.reason} ({explain_reason(job.reason)}); it was "
              "cancelled. Change the request (--partition, --slurm-timeout-min, --cpus, --memory-gb, "
              f"--gpus-per-run) and {RESUME_HINT}")
    return mark_stopped(run_dir, job, state="failed", reason=reason, event="never_started", cluster_stop="PENDING")


REASONS = {
    "PartitionTimeLimit": "the job's time limit is above the partition's MaxTime",
    "PartitionNodeLimit": "the job asks for more nodes than the partition allows",
    "BadConstraints": "no node has the features the job asks for",
    "InvalidAccount": "the account is not valid",
    "InvalidQOS": "the QOS is not valid",
    "AccountNotAllowed": "the account may not use the partition",
    "DependencyNeverSatisfied": "a job it depends on failed",
}


def explain_reason(reason: str | None) -> str:
    return REASONS.get(reason or "", "a limit of the partition, account or QOS the job exceeds")


def reopen(run_dir: Path) -> bool:
    """A run the cluster stopped (``cluster_stop``, no conclusion of the harness) made pending again, so the next
    attempt resumes it; False for every other run."""
    paths = RunPaths(Path(run_dir))
    status = read_status(paths)
    if not status.get("cluster_stop") or status.get("state") not in TERMINAL_STATES or paths.grade.is_file():
        return False
    with run_lock_or_none(paths, wait_s=0.0) as locked:
        if not locked:
            return False
        fields = {**status, "state": "pending", "reason": f"to be resumed: {status.get('reason', '')}", "limit": None}
        write_json_atomic(paths.status, RunStatus.model_validate(fields).model_dump(mode="json"))
    return True


# ---------------------------------------------------------------------------------------------------------------
# observers: rexmle runs status, rexmle report


def refresh(run_dirs: Iterable[Path]) -> str | None:
    """Bring the ``cluster.json`` of runs with SLURM jobs up to date where SLURM can be asked (this is a submit
    host): live jobs from the queue, ended ones from the accounting or the controller, and runs whose job ended
    before they concluded marked as such. Returns the cluster's accounting note (None: no SLURM here, or no run
    has a job)."""
    records = {Path(d): read_cluster(Path(d)) for d in run_dirs}
    records = {d: r for d, r in records.items() if r is not None and r.last is not None}
    if not records or not slurm_available():
        return None
    note = accounting()
    unsettled = {d: r.last for d, r in records.items()
                 if r.last is not None and (r.last.state in LIVE_STATES or r.last.state is None
                                            or (note == "sacct" and r.last.source != "sacct"))}
    if not unsettled:
        return note
    queued = queued_jobs(j.job_id for j in unsettled.values() if j is not None)
    gone = [j.job_id for j in unsettled.values() if j is not None and j.job_id not in queued]
    ended = ended_jobs(gone)
    for run_dir, job in unsettled.items():
        if job is None:
            continue
        seen = queued.get(job.job_id) or ended.get(job.job_id)
        if seen is not None:
            record_jobs(run_dir, [seen], accounting_note=note)
        elif job.state in LIVE_STATES or job.state is None:  # gone, and nobody can say how it ended
            seen = job.model_copy(update={"state": "UNKNOWN", "reason": "SLURM no longer knows the job (it ended "
                                          "more than MinJobAge ago, and there is no accounting storage)"})
        else:
            continue
        if seen.job_id not in queued and seen.state not in LIVE_STATES \
                and read_status(RunPaths(run_dir)).get("state") not in TERMINAL_STATES:
            ended_run(run_dir, seen)
    return note
