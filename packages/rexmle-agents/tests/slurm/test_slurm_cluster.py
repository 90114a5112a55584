"""The SLURM executor on a real one-node SLURM cluster: one job array per group, each run's job recorded and shown,
preemption (requeue) resumed from the journal, scancel and SLURM's time limit, requests that can never start, the
job's resources, and SLURM's accounting where the cluster keeps one."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rexmle_grade.cli import main

pytestmark = pytest.mark.slurm
TASKS = ("ldct-iqa", "usenhance")  # as conftest.py prepares them
REVOKED_CREDENTIAL_S = 2.0  # see release_requeue_hold


def rexmle(*args: str) -> int:
    return main(list(args))


def run_args(data: Path, runs: Path, group: str, *extra: str) -> list[str]:
    return ["--data-dir", str(data), "run", "--executor", "slurm", "--runs-dir", str(runs), "--group", group,
            *extra]


def in_background(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """``call()`` in a thread (the command waits for its jobs while the test acts on them as an operator would)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = call()
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def joined(thread: threading.Thread, result: dict[str, Any], timeout_s: float) -> Any:
    thread.join(timeout_s)
    assert not thread.is_alive(), f"the command did not return within {timeout_s:g} s"
    if "error" in result:
        raise result["error"]
    return result["value"]


def lock_held(run_dir: Path) -> bool:
    """Whether a process holds the run's lock right now, read from /proc/locks: taking the lock to find out would
    make a job that starts at that instant fail to take it."""
    from rexmle_agents.harness.paths import RunPaths

    lock = RunPaths(run_dir).lock
    if not lock.is_file():
        return False
    inode = lock.stat().st_ino
    return any(line.split()[5].endswith(f":{inode}") for line in Path("/proc/locks").read_text().splitlines()
               if "FLOCK" in line and len(line.split()) > 5)


def only_run(group_dir: Path) -> Path:
    folders = [p.parent for p in group_dir.glob("*/spec.json")]
    assert len(folders) == 1, folders
    return folders[0]


def status_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "status.json").read_text())


def job_logs(group: Path) -> str:
    """The ends of a group's SLURM job logs (for an assertion's message: the runs folder is removed afterwards)."""
    return "\n".join(f"== {log.name}\n{log.read_text(errors='replace')[-4000:]}"
                     for log in sorted(group.glob(".slurm/*/*.log")))


def finished_indices(run_dir: Path) -> list[int]:
    """The agent's step indices (slurm-test-steps) of every finished step, in order."""
    started = {e["step"]: e.get("info", {}).get("index") for e in events(run_dir) if e["kind"] == "step_started"}
    return [started[e["step"]] for e in events(run_dir) if e["kind"] == "step_finished"]


def test_a_group_is_one_job_array_with_its_report_and_each_runs_job_in_runs_status(
        slurm_cluster: Any, slurm_data: Path, runs_dir: Path, capsys) -> None:
    from rexmle_agents.results.cli import status_tables

    args = run_args(slurm_data, runs_dir, "grid", "--agent", "sample", "--tasks", ",".join(TASKS), "--seeds", "2",
                    "--time-limit", "10m")
    assert rexmle(*args) == 0, capsys.readouterr().out
    group = runs_dir / "grid"
    folders = sorted(p.parent for p in group.glob("*/spec.json"))
    assert len(folders) == 4
    scripts = list(group.glob(".slurm/*/job.sh"))
    assert len(scripts) == 1 and "#SBATCH --array=0-3%64" in scripts[0].read_text()
    jobs = [last_job(f) for f in folders]
    assert len({j["array_job_id"] for j in jobs}) == 1 and sorted(j["array_task_id"] for j in jobs) == [0, 1, 2, 3]
    assert all(j["state"] == "COMPLETED" and j["exit_code"] == "0:0" and j["node"] for j in jobs), jobs
    for folder, job in zip(folders, jobs, strict=True):
        status = status_of(folder)
        assert status["state"] == "finished" and status["slurm"]["job_id"] == job["job_id"]
        assert json.loads((folder / "grade.json").read_text())["status"] == "valid"
    report = json.loads((group / "report.json").read_text())
    assert sorted(r["job_id"] for r in report["runs"]) == sorted(j["job_id"] for j in jobs)
    assert {r["job_state"] for r in report["runs"]} == {"COMPLETED"} and not any(r["ended_by_cluster"]
                                                                                 for r in report["runs"])
    capsys.readouterr()
    assert rexmle("runs", "status", "--runs-dir", str(runs_dir)) == 0
    out = capsys.readouterr().out
    assert "SLURM job" in out and "no accounting storage" in " ".join(out.split())
    table = status_tables(runs_dir, "grid")[0][0]
    column = next(c for c in table.columns if c.header == "SLURM job")
    assert sorted(str(cell) for cell in column._cells) == sorted(f"{j['job_id']} COMPLETED 0:0" for j in jobs)
    # the same command again submits nothing: every run is concluded, and the report is rebuilt
    assert rexmle(*args) == 0
    assert len(list(group.glob(".slurm/*/job.sh"))) == 1


def test_no_wait_submits_and_the_same_command_later_waits_for_the_jobs_without_submitting_twice(
        slurm_cluster: Any, plugin_agents: Path, slurm_data: Path, runs_dir: Path, capsys) -> None:
    args = run_args(slurm_data, runs_dir, "later", "--agent", "slurm-test-steps", "--task", TASKS[0], "--seeds", "2",
                    "--agent-config", '{"steps": 2, "seconds": 2}', "--time-limit", "5m")
    assert rexmle(*args, "--no-wait") == 0
    assert "jobs submitted" in capsys.readouterr().out
    group = runs_dir / "later"
    assert {last_job(p.parent)["state"] for p in group.glob("*/spec.json")} <= {"PENDING", "RUNNING"}
    assert rexmle("runs", "status", "--runs-dir", str(runs_dir), "--group", "later") == 0
    assert "SLURM job" in capsys.readouterr().out
    # a job that is running holds its run's lock: the command must wait for that job, not refuse the run as "being
    # run by another process" (it did whenever the second command came while a job ran)
    deadline = time.monotonic() + 60
    while not any(lock_held(p.parent) for p in group.glob("*/spec.json")):
        assert time.monotonic() < deadline, "no job started running within 60 s"
        time.sleep(0.05)
    assert rexmle(*args) == 0  # waits for the jobs already queued or running
    assert len(list(group.glob(".slurm/*/job.sh"))) == 1
    for folder in (p.parent for p in group.glob("*/spec.json")):
        assert status_of(folder)["state"] == "finished" and status_of(folder)["attempts"] == 1
        assert last_job(folder)["state"] == "COMPLETED"


def test_a_requeued_scaffold_run_resumes_from_its_journal_without_losing_a_step(
        slurm_cluster: Any, slurm_data: Path, runs_dir: Path) -> None:
    """Preemption: an aide run (a scripted model's calls, recorded here and replayed in the job) is requeued by
    SLURM mid-run; the job restarts and the run resumes with every finished step kept, and builds the same tree."""
    from rexmle_agents.harness.runner import build_spec, execute_run
    from rexmle_agents.harness.spec import Limits, Resources
    from rexmle_agents.models import Model, RecordingBackend, RetryPolicy, ScriptedBackend

    fakes = _load_fakes()
    slow = "import time\ntime.sleep(3)\n"
    fake = fakes.FakeModel([slow + fakes.good(1.0), slow + fakes.good(2.0)])
    config = {"num_drafts": 2, "debug_prob": 0.0, "replayable": True}
    cassette = runs_dir / "cassette.jsonl"
    # the prompts show the run's hardware: a memory limit of its own makes the job's prompts those recorded here
    spec = build_spec(TASKS[0], agent="aide", agent_config=config, models={"code": "scripted/model"},
                      limits=Limits(time_limit_s=300, max_steps=4, exec_timeout_s=60),
                      resources=Resources(memory_gb=2), data_root=slurm_data, group="record")
    recorded = execute_run(spec, runs_dir, models={"code": Model(RecordingBackend(ScriptedBackend(fake), cassette),
                                                                 retry=RetryPolicy(max_attempts=1))})
    assert recorded.state == "finished"
    args = run_args(slurm_data, runs_dir, "preempt", "--agent", "aide", "--task", TASKS[0], "--model",
                    f"code=replay:{cassette}", "--agent-config", json.dumps(config), "--max-steps", "4",
                    "--time-limit", "300s", "--exec-timeout", "60s", "--memory-gb", "2")
    thread, result = in_background(lambda: rexmle(*args))
    group = runs_dir / "preempt"
    run_dir = wait_until(lambda: next((p.parent for p in group.glob("*/journal.jsonl")), None), timeout_s=60,
                         what="the run to start")
    wait_until(lambda: any(e["kind"] == "step_finished" for e in events(run_dir)), timeout_s=60,
               what="a finished step")
    before = [e["step"] for e in events(run_dir) if e["kind"] == "step_finished"]
    job_id = last_job(run_dir)["job_id"]
    slurm_cmd("scontrol", "requeue", job_id)
    release_requeue_hold(job_id)
    assert joined(thread, result, 180) == 0
    journal = events(run_dir)
    story = [(e["kind"], e.get("step"), e.get("event") or e.get("state") or e.get("error", "")[:80])
             for e in journal if e["kind"] not in ("model_call", "exec_started", "exec_finished", "agent_state",
                                                   "code_written", "validation", "log")]
    finished = [e["step"] for e in journal if e["kind"] == "step_finished"]
    assert finished[:len(before)] == before and len(finished) == len(set(finished)) == 4, story
    assert [e["kind"] for e in journal if e["kind"] in ("run_started", "run_resumed")] == ["run_started",
                                                                                            "run_resumed"]
    resumed = next(e for e in journal if e["kind"] == "run_resumed")
    assert resumed["slurm"]["job_id"] == job_id and resumed["slurm"]["requeues"] == 1
    assert any(e["kind"] == "cluster" and e["event"] == "requeued" for e in journal)
    status = status_of(run_dir)
    assert status["state"] == "finished" and status["attempts"] == 2 and status["slurm"]["requeues"] == 1, story
    assert last_job(run_dir)["requeues"] == 1
    assert _nodes(run_dir) == _nodes(recorded.run_dir), story  # the tree of the uninterrupted recording
    assert json.loads((run_dir / "grade.json").read_text())["status"] == "valid"


def test_scancel_ends_the_run_cancelled_with_slurms_reason_and_running_the_group_again_resumes_it(
        slurm_cluster: Any, plugin_agents: Path, slurm_data: Path, runs_dir: Path) -> None:
    from rexmle_agents.results.loader import load_runs
    from rexmle_agents.results.report import build_group_report

    args = run_args(slurm_data, runs_dir, "cancel", "--agent", "slurm-test-steps", "--task", TASKS[0],
                    "--agent-config", '{"steps": 4, "seconds": 2}', "--time-limit", "5m")
    thread, result = in_background(lambda: rexmle(*args))
    group = runs_dir / "cancel"
    run_dir = wait_until(lambda: next((p.parent for p in group.glob("*/journal.jsonl")), None), timeout_s=60,
                         what="the run to start")
    wait_until(lambda: finished_indices(run_dir), timeout_s=60, what="a finished step")
    job_id = last_job(run_dir)["job_id"]
    slurm_cmd("scancel", job_id)
    assert joined(thread, result, 60) == 0
    status = status_of(run_dir)
    assert status["state"] == "cancelled" and status["cluster_stop"] == "CANCELLED"
    assert f"SLURM stopped job {job_id}" in status["reason"] and "scancel" in status["reason"]
    assert "run the group again to resume it" in status["reason"] and not (run_dir / "grade.json").exists()
    done_before = finished_indices(run_dir)
    assert any(e["kind"] == "cluster" and e["event"] == "stopped" and e["job_id"] == job_id
               for e in events(run_dir))
    row = build_group_report(load_runs([group]), replicates=0).runs[0]
    assert row.state == "cancelled" and row.ended_by_cluster and row.job_id == job_id
    assert rexmle(*args) == 0  # resumed in a new job
    status = status_of(run_dir)
    assert status["state"] == "finished" and status["attempts"] == 2 and status["cluster_stop"] is None
    indices = finished_indices(run_dir)
    assert indices[:len(done_before)] == done_before and sorted(indices) == [0, 1, 2, 3]
    jobs = json.loads((run_dir / "cluster.json").read_text())["jobs"]
    assert len(jobs) == 2 and jobs[0]["job_id"] == job_id and jobs[-1]["state"] == "COMPLETED"
    assert json.loads((run_dir / "grade.json").read_text())["status"] == "valid"


def test_slurms_time_limit_ends_the_run_timed_out_with_its_best_submission_graded(
        slurm_cluster: Any, plugin_agents: Path, slurm_data: Path, runs_dir: Path) -> None:
    """SLURM's time limit (1 min, the shortest it has) stops the job before the run's own (100 s) is spent: the job
    is requeued, the run resumes with what is left of its budget and ends timed_out, its submission graded."""
    args = run_args(slurm_data, runs_dir, "timeout", "--agent", "slurm-test-steps", "--task", TASKS[0],
                    "--agent-config", '{"steps": 1000, "seconds": 3}', "--time-limit", "100s",
                    "--slurm-timeout-min", "1")
    thread, result = in_background(lambda: rexmle(*args))
    group = runs_dir / "timeout"
    run_dir = wait_until(lambda: next((p.parent for p in group.glob("*/journal.jsonl")), None), timeout_s=60,
                         what="the run to start")
    job_id = last_job(run_dir)["job_id"]
    release_requeue_hold(job_id, timeout_s=120)
    assert joined(thread, result, 120) == 0
    status = status_of(run_dir)
    assert status["state"] == "timed_out" and status["limit"] == "time" and status["reason"].startswith(
        "time limit of 100 s"), (status["reason"], job_logs(group))
    assert status["slurm"]["requeues"] == 1 and status["attempts"] == 2
    journal = events(run_dir)
    stop = next(e for e in journal if e["kind"] == "cluster")
    assert stop["event"] == "time_limit" and stop["reason"] == "TimeLimit" and "requeued" in stop["message"]
    assert [e["kind"] for e in journal if e["kind"] in ("run_resumed", "final_collected", "graded")] == [
        "run_resumed", "final_collected", "graded"]
    assert json.loads((run_dir / "final" / "metadata.json").read_text())["snapshot"] is not None
    assert json.loads((run_dir / "grade.json").read_text())["status"] == "valid"


def test_a_request_slurm_can_never_satisfy_is_reported_with_slurms_reason(
        slurm_cluster: Any, slurm_data: Path, runs_dir: Path, capsys) -> None:
    base = ["--agent", "sample", "--task", TASKS[0], "--time-limit", "10m"]
    # more memory than the node has: sbatch refuses the array at once
    assert rexmle(*run_args(slurm_data, runs_dir, "huge", *base, "--memory-gb", "100000")) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "SLURM refused the job array" in said and "Requested node configuration is not available" in said
    assert not list((runs_dir / "huge").glob("*/cluster.json"))
    # a GPU from a node without any (this cluster has none): refused by sbatch too, though the submit host (this
    # machine) is never asked for GPUs of its own
    assert rexmle(*run_args(slurm_data, runs_dir, "gpu", *base, "--gpus-per-run", "1")) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "SLURM refused the job array" in said and "--gres=gpu:1" in said
    assert "Invalid generic resource (gres) specification" in said
    # a time limit above the partition's MaxTime (2 h): accepted, but it would wait forever: the run is reported
    # failed (and cancelled), so the command exits 1
    assert rexmle(*run_args(slurm_data, runs_dir, "never", *base, "--slurm-timeout-min", "500")) == 1
    run_dir = only_run(runs_dir / "never")
    status = status_of(run_dir)
    assert status["state"] == "failed" and status["cluster_stop"] == "PENDING"
    assert "will never start" in status["reason"] and "PartitionTimeLimit" in status["reason"]
    job = last_job(run_dir)
    assert job["reason"] == "PartitionTimeLimit"
    assert slurm_cmd("squeue", "-h", "-j", job["job_id"]).strip() == ""  # cancelled, not left pending


def test_the_job_asks_for_the_runs_resources_and_the_harness_uses_what_slurm_granted(
        slurm_cluster: Any, slurm_data: Path, runs_dir: Path) -> None:
    base = ["--agent", "sample", "--task", TASKS[0], "--time-limit", "10m"]
    assert rexmle(*run_args(slurm_data, runs_dir, "sized", *base, "--memory-gb", "2", "--cpus", "1")) == 0
    script = next((runs_dir / "sized").glob(".slurm/*/job.sh")).read_text()
    assert "#SBATCH --mem=3072M" in script and "#SBATCH --cpus-per-task=1" in script  # 2 GB + the harness's 1
    run_dir = only_run(runs_dir / "sized")
    limits = events(run_dir)[0]["limits"]
    assert limits["memory_bytes"] == 2 * 1024**3 and limits["cpus"] == 1
    assert last_job(run_dir)["memory_mb"] == 3072 and last_job(run_dir)["cpus"] == 1
    # no --memory-gb: the default limit is a share of the job's memory (SLURM's default per CPU), not the machine's
    assert rexmle(*run_args(slurm_data, runs_dir, "default", *base)) == 0
    run_dir = only_run(runs_dir / "default")
    limits = events(run_dir)[0]["limits"]
    granted_mb = last_job(run_dir)["memory_mb"]
    assert f"({granted_mb / 1024:.1f} GiB - " in limits["how"]["memory"]
    assert limits["memory_bytes"] < granted_mb * 1024**2


def test_where_the_cluster_keeps_accounting_jobs_are_recorded_from_sacct(
        accounting_cluster: Any, slurm_data: Path, runs_dir: Path, capsys) -> None:
    args = run_args(slurm_data, runs_dir, "acct", "--agent", "sample", "--task", TASKS[0], "--seeds", "2",
                    "--time-limit", "10m")
    assert rexmle(*args) == 0
    group = runs_dir / "acct"
    for folder in (p.parent for p in group.glob("*/spec.json")):
        record = json.loads((folder / "cluster.json").read_text())
        assert record["accounting"] == "sacct"
        assert wait_until(lambda f=folder: rexmle("runs", "status", "--runs-dir", str(runs_dir)) == 0
                          and last_job(f)["source"] == "sacct", timeout_s=30, what="sacct's record")
        job = last_job(folder)
        assert job["state"] == "COMPLETED" and job["exit_code"] == "0:0" and job["elapsed_s"] is not None
        assert job["queue_wait_s"] is not None and job["node"]
    capsys.readouterr()
    assert rexmle("report", str(group), "--format", "json", "--bootstrap", "0") == 0
    report = json.loads(capsys.readouterr().out)
    assert {r["job_source"] for r in report["runs"]} == {"sacct"}


def _load_fakes() -> Any:
    path = Path(__file__).parents[1] / "scaffolds" / "fakes.py"
    spec = importlib.util.spec_from_file_location("scaffold_fakes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nodes(run_dir: Path) -> list[tuple[Any, ...]]:
    summary = [e for e in events(run_dir) if e["kind"] == "scaffold_summary"][-1]
    return [(n["node"], n.get("stage"), n.get("metric"), n.get("is_buggy")) for n in summary["nodes"]]


def slurm_cmd(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=True).stdout


def wait_until(check: Callable[[], Any], *, timeout_s: float, what: str, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "journal.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def last_job(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "cluster.json"
    if not path.is_file():
        return None
    jobs = json.loads(path.read_text())["jobs"]
    return jobs[-1] if jobs else None


def release_requeue_hold(job_id: str, *, timeout_s: float = 60.0) -> None:
    """SLURM holds a requeued job for two minutes (its begin time); the operator lets it start sooner.

    Not within the second its previous start ended: slurmd revoked that start's credential then, and it refuses
    a credential made in the same second ("Killing non-startable batch JobId=N: Job credential revoked"), which
    ends the job FAILED with exit code 1:0 before anything runs (SLURM 22.05; SLURM's own two-minute begin time
    never meets it). Hence the pause into a later second."""
    wait_until(lambda: "BeginTime" in slurm_cmd("squeue", "-h", "-j", job_id, "-o", "%r"), timeout_s=timeout_s,
               what=f"job {job_id} to be requeued")
    time.sleep(REVOKED_CREDENTIAL_S)
    slurm_cmd("scontrol", "update", f"JobId={job_id}", "StartTime=now")
