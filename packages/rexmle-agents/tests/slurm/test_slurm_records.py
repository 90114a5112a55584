"""What SLURM prints, read into job records (from the output of SLURM 22.05 on a one-node cluster), how records
of one job merge, how a stopped run is marked and reopened, and the request a job array makes; no cluster needed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rexmle_agents.executors.common import SlurmOptions
from rexmle_agents.executors.slurm import job_memory_mb, job_script, sbatch_directives, slurm_parameters
from rexmle_agents.executors.slurm_accounting import (
    duration_s,
    ended_run,
    mark_stopped,
    parse_sacct_json,
    parse_scontrol,
    parse_squeue,
    read_cluster,
    record_jobs,
    reopen,
)
from rexmle_agents.executors.slurm_job import granted_gpus
from rexmle_agents.harness.limits import slurm_job_memory_bytes
from rexmle_agents.results.records import ClusterRecord, RunStatus, SlurmJobRecord
from rexmle_agents.results.schemas import load_schema
from rexmle_grade.errors import UserInputError

SCONTROL = (
    "JobId=18 ArrayJobId=18 ArrayTaskId=2-5%2 ArrayTaskThrottle=2 JobName=wrap UserId=root(0) JobState=PENDING "
    "Reason=JobArrayTaskLimit Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED "
    "SubmitTime=2026-11-26T11:44:21 EligibleTime=Unknown StartTime=Unknown EndTime=Unknown Partition=rexmle "
    "NodeList= NumNodes=1 NumCPUs=1 TRES=cpu=1,mem=10868M,node=1,billing=1 Socks/Node=* StdOut=/dev/null Power= \n"
    "JobId=20 ArrayJobId=18 ArrayTaskId=1 JobName=wrap JobState=TIMEOUT Reason=TimeLimit Requeue=1 Restarts=2 "
    "ExitCode=0:15 RunTime=01:01:30 TimeLimit=01:00:00 SubmitTime=2026-11-26T11:44:21 "
    "EligibleTime=2026-11-26T11:46:21 StartTime=2026-11-26T11:46:51 EndTime=2026-11-26T12:48:21 Partition=rexmle "
    "NodeList=vm BatchHost=vm NumCPUs=4 TRES=cpu=4,mem=3G,node=1,billing=4,gres/gpu=1 WorkDir=/work dir "
    "StdOut=/runs/g/.slurm/x/18_1.log Power= \n"
)
SQUEUE = ("18_2|PENDING|JobArrayTaskLimit||rexmle|2026-11-26T11:44:21|N/A|0:00|UNLIMITED|1\n"
          "18_0|RUNNING|None|vm|rexmle|2026-11-26T11:44:21|2026-11-26T11:44:21|1-02:00:01|2-00:00:00|1\n")
# sacct --json -X --duplicates (fields trimmed): an array task, a job requeued then cancelled, a cancelled one
SACCT = {"jobs": [
    {"job_id": 3, "array": {"job_id": 2, "task_id": 0}, "state": {"current": "COMPLETED", "reason": "None"},
     "exit_code": {"status": "SUCCESS", "return_code": 0},
     "time": {"elapsed": 1, "eligible": 1795692917, "end": 1795692918, "start": 1795692917,
              "submission": 1795692917, "limit": 60},
     "nodes": "vm", "partition": "rexmle", "tres": {"allocated": [{"type": "cpu", "name": None, "count": 1},
                                                                 {"type": "mem", "name": None, "count": 10868}]},
     "kill_request_user": None},
    {"job_id": 4, "array": {"job_id": 0, "task_id": None}, "state": {"current": "REQUEUED", "reason": "None"},
     "exit_code": {"status": "SUCCESS", "return_code": 0},
     "time": {"elapsed": 2, "eligible": 1795692926, "end": 1795692928, "start": 1795692926,
              "submission": 1795692926, "limit": None}, "nodes": "vm", "partition": "rexmle", "tres": {},
     "kill_request_user": None},
    {"job_id": 4, "array": {"job_id": 0, "task_id": None}, "state": {"current": "CANCELLED", "reason": "BeginTime"},
     "exit_code": {"status": "SIGNALED", "return_code": 0, "signal": {"signal_id": 9, "name": "KILL"}},
     "time": {"elapsed": 4, "eligible": 1795692935, "end": 1795692939, "start": 1795692935,
              "submission": 1795692928, "limit": None}, "nodes": "vm", "partition": "rexmle", "tres": {},
     "kill_request_user": "root"},
    {"job_id": 6, "array": {"job_id": 0, "task_id": None}, "state": {"current": ["PENDING"], "reason": "None"},
     "exit_code": {"return_code": {"set": False, "number": 0}},
     "time": {"elapsed": 0, "start": {"set": True, "number": 0}, "submission": {"set": True, "number": 1795692940},
              "limit": {"set": True, "infinite": False, "number": 120}}, "nodes": "None assigned", "tres": {}},
]}


def test_scontrol_records_expand_pending_array_tasks_and_read_times_resources_and_requeues() -> None:
    records = {r.job_id: r for r in parse_scontrol(SCONTROL)}
    assert sorted(records) == ["18_1", "18_2", "18_3", "18_4", "18_5"]
    pending = records["18_4"]
    assert pending.state == "PENDING" and pending.reason == "JobArrayTaskLimit" and pending.array_task_id == 4
    assert pending.start_time is None and pending.elapsed_s is None and pending.node is None
    ended = records["18_1"]
    assert ended.state == "TIMEOUT" and ended.reason == "TimeLimit" and ended.requeues == 2
    assert ended.exit_code == "0:15" and ended.node == "vm" and ended.cpus == 4 and ended.memory_mb == 3072
    assert ended.gpus == 1 and ended.elapsed_s == 3690 and ended.time_limit_s == 3600
    assert ended.queue_wait_s == 30  # from the requeue (its eligible time), not from the first submission
    assert ended.end_time is not None and ended.log == "/runs/g/.slurm/x/18_1.log" and ended.source == "scontrol"


def test_squeue_records_and_durations() -> None:
    pending, running = parse_squeue(SQUEUE)
    assert (pending.job_id, pending.state, pending.reason, pending.node, pending.start_time) == (
        "18_2", "PENDING", "JobArrayTaskLimit", None, None)
    assert running.state == "RUNNING" and running.reason is None and running.node == "vm"
    assert running.elapsed_s == 93601 and running.time_limit_s == 2 * 86400
    assert duration_s("5") == 300 and duration_s("02:03") == 123 and duration_s("UNLIMITED") is None


def test_sacct_records_count_requeues_and_read_both_json_layouts() -> None:
    records = {r.job_id: r for r in parse_sacct_json(json.dumps(SACCT))}
    assert sorted(records) == ["2_0", "4", "6"]
    task = records["2_0"]
    assert task.array_job_id == "2" and task.array_task_id == 0 and task.state == "COMPLETED"
    assert task.exit_code == "0:0" and task.cpus == 1 and task.memory_mb == 10868 and task.time_limit_s == 3600
    requeued = records["4"]  # its latest start stands for it; the earlier one was a requeue
    assert requeued.state == "CANCELLED" and requeued.requeues == 1 and requeued.exit_code == "0:9"
    assert requeued.reason == "cancelled by root (BeginTime)" and requeued.elapsed_s == 4
    assert requeued.queue_wait_s == 0 and requeued.source == "sacct"
    newer = records["6"]  # SLURM 23.02 and later: lists of states, numbers as {"set", "number"}
    assert newer.state == "PENDING" and newer.node is None and newer.start_time is None
    assert newer.time_limit_s == 7200


def test_records_of_one_job_merge_and_sacct_is_not_replaced_by_a_lesser_source(tmp_path: Path) -> None:
    def job(**fields: object) -> SlurmJobRecord:
        return SlurmJobRecord(**{"job_id": "7_0", "observed_at": "2026-11-26T00:00:00+00:00", **fields})

    record_jobs(tmp_path, [job(state="PENDING", source="sbatch", log="/x.log", time_limit_s=60.0)],
                accounting_note="sacct")
    record_jobs(tmp_path, [job(state="COMPLETED", source="scontrol", end_time="2026-11-26T00:01:00+00:00",
                               requeues=1)])
    record_jobs(tmp_path, [job(state="COMPLETED", source="sacct", exit_code="0:0")])
    record_jobs(tmp_path, [job(state="COMPLETED", source="squeue", exit_code="1:0")])
    merged = read_cluster(tmp_path)
    assert merged is not None and len(merged.jobs) == 1 and merged.accounting == "sacct"
    final = merged.jobs[0]
    assert (final.source, final.exit_code, final.log, final.requeues) == ("sacct", "0:0", "/x.log", 1)
    record_jobs(tmp_path, [job(job_id="8_0", state="PENDING", source="sbatch")])
    assert [j.job_id for j in read_cluster(tmp_path).jobs] == ["7_0", "8_0"]
    # a requeued job running again: the end of its earlier start is not this start's
    record_jobs(tmp_path, [job(state="RUNNING", source="squeue")])
    assert read_cluster(tmp_path).jobs[0].end_time is None
    schema = load_schema("cluster")
    import jsonschema

    jsonschema.validate(json.loads((tmp_path / "cluster.json").read_text()), schema)


def _run_folder(tmp_path: Path, status: dict[str, object]) -> Path:
    run = tmp_path / "g" / "run"
    run.mkdir(parents=True)
    (run / "spec.json").write_text("{}")
    (run / "status.json").write_text(json.dumps(status))
    return run


def test_a_run_the_cluster_stopped_is_marked_and_reopened_but_a_concluded_run_never(tmp_path: Path) -> None:
    job = SlurmJobRecord(job_id="9_1", state="CANCELLED", source="scontrol", observed_at="2026-11-26T00:00:00Z")
    run = _run_folder(tmp_path, {"state": "running", "attempts": 1, "steps": 3})
    assert mark_stopped(run, job, state="cancelled", reason="stopped by SLURM", event="stopped",
                        cluster_stop="CANCELLED")
    status = RunStatus.model_validate_json((run / "status.json").read_text())
    assert (status.state, status.cluster_stop, status.steps) == ("cancelled", "CANCELLED", 3)
    event = json.loads((run / "journal.jsonl").read_text())
    assert event["kind"] == "cluster" and event["job_id"] == "9_1" and event["message"] == "stopped by SLURM"
    assert reopen(run)
    assert json.loads((run / "status.json").read_text())["state"] == "pending"
    concluded = _run_folder(tmp_path / "other", {"state": "cancelled", "reason": "stopped by signal SIGINT"})
    assert not mark_stopped(concluded, job, state="cancelled", reason="x", event="stopped", cluster_stop="CANCELLED")
    assert not reopen(concluded) and json.loads((concluded / "status.json").read_text())["state"] == "cancelled"


def test_a_job_that_failed_before_its_script_ran_is_told_apart_from_a_harness_that_failed(tmp_path: Path) -> None:
    # what scontrol showed after slurmd refused a requeued job restarted within the second its previous start ended
    refused = SlurmJobRecord(job_id="1_0", state="FAILED", reason="NonZeroExitCode", exit_code="1:0", node="vm",
                             requeues=1, log="/runs/g/.slurm/x/1_0.log", source="scontrol",
                             observed_at="2026-11-26T16:30:16Z")
    requeued = _run_folder(tmp_path / "a", {"state": "pending", "attempts": 1, "steps": 14, "cluster_stop": "TIMEOUT",
                                            "reason": "SLURM's time limit of 1 min stopped job 1_0"})
    assert ended_run(requeued, refused)
    status = RunStatus.model_validate_json((requeued / "status.json").read_text())
    assert (status.state, status.cluster_stop, status.steps, status.attempts) == ("failed", "FAILED", 14, 1)
    assert status.reason == (
        "SLURM job 1_0 failed after it was requeued before its job script ran (SLURM's reason: NonZeroExitCode, "
        "exit code 1:0): the node vm did not start it, and the slurmd log there says why (slurmd refuses a requeued "
        "job started again within the second its previous start ended: 'Job credential revoked'); its log: "
        "/runs/g/.slurm/x/1_0.log; run the group again to resume it")
    # a run never started (no status yet), its first job refused: not "after it was requeued", no node named
    fresh = tmp_path / "b" / "run"
    fresh.mkdir(parents=True)
    (fresh / "spec.json").write_text("{}")
    assert ended_run(fresh, refused.model_copy(update={"node": None, "requeues": 0, "log": None}))
    reason = json.loads((fresh / "status.json").read_text())["reason"]
    assert reason.startswith("SLURM job 1_0 failed before its job script ran") and "the node did not" in reason
    # the harness ran (the run is running) and its job failed: that is the harness's failure, with its log
    ran = _run_folder(tmp_path / "c", {"state": "running", "attempts": 2, "steps": 3})
    assert ended_run(ran, refused)
    assert json.loads((ran / "status.json").read_text())["reason"] == (
        "SLURM job 1_0 failed (its job script ended with an error) with exit code 1:0 before the run concluded; its "
        "log: /runs/g/.slurm/x/1_0.log; run the group again to resume it")


def test_the_array_asks_for_each_runs_resources_plus_the_harnesss_memory(tmp_path: Path) -> None:
    from rexmle_agents.harness.spec import Limits, Resources, RunSpec

    spec = RunSpec(task_id="t", task_version="1", split_digest="x", agent="sample", agent_version="1",
                   limits=Limits(time_limit_s=3 * 3600), resources=Resources(gpus=2, cpus=8, memory_gb=32),
                   group="grid")
    params = slurm_parameters([spec], SlurmOptions(partition="gpu", account="lab", array_parallelism=10,
                                                   extra={"qos": "long", "exclusive": ""}))
    directives = sbatch_directives(params, 40)
    assert directives[:3] == ["--job-name=rexmle-grid", "--array=0-39%10", "--time=240"]
    assert {"--cpus-per-task=8", f"--mem={job_memory_mb(32)}M", "--gres=gpu:2", "--partition=gpu", "--account=lab",
            "--qos=long", "--exclusive", "--requeue"} <= set(directives)
    assert job_memory_mb(32) == round(32 * 1.1 * 1024) and job_memory_mb(2) == 3 * 1024  # reserve: 10%, >= 1 GiB
    script = tmp_path / "job.sh"
    script.write_text(job_script(directives, tmp_path / "manifest.json", tmp_path / "%A_%a.log"))
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_sbatch_options_from_the_command_line() -> None:
    from rexmle_agents.cli import parse_sbatch_options

    assert parse_sbatch_options(["qos=long", "--constraint=a100", "exclusive"]) == {
        "qos": "long", "constraint": "a100", "exclusive": ""}
    with pytest.raises(UserInputError, match="rexmle sets --array itself"):
        parse_sbatch_options(["array=0-3"])


def test_the_job_uses_the_gpus_and_memory_slurm_granted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_GPUS", "2,3")
    assert granted_gpus(1) == ("2",) and granted_gpus(2) == ("2", "3") and granted_gpus(0) == ()
    with pytest.raises(UserInputError, match="SLURM granted the job 2"):
        granted_gpus(3)
    monkeypatch.setenv("SLURM_MEM_PER_CPU", "1000")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "4")
    assert slurm_job_memory_bytes() == 4000 * 1024**2
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "3072")
    assert slurm_job_memory_bytes() == 3072 * 1024**2
    assert ClusterRecord(accounting="none").last is None
