"""`rexmle run`, `rexmle agents list`, `rexmle runs status`, `rexmle sandbox exec`, and the executors (local pool,
submitit's local executor standing in for SLURM), with real processes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rexmle_agents.cli import parse_agent_config, parse_models, select_tasks
from rexmle_agents.executors import run_specs
from rexmle_agents.executors.common import SlurmOptions
from rexmle_agents.executors.slurm import slurm_parameters
from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.runner import build_spec
from rexmle_agents.harness.spec import Limits, Resources
from rexmle_grade.cli import main
from rexmle_grade.errors import UnknownNameError, UserInputError

TASK = "ldct-iqa"
# CI's set-up installs bubblewrap: there a missing bwrap must fail these tests, not skip them silently
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"),
                                reason="bubblewrap is not installed (apt-get install -y bubblewrap)")


def rexmle(*args: str) -> int:
    return main(list(args))


def stderr(capsys) -> str:
    """What the command printed on stderr, with rich's line wrapping undone."""
    return " ".join(capsys.readouterr().err.split())


def test_run_command_runs_grades_and_writes_the_group_report(data_root: Path, tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    code = rexmle("--data-dir", str(data_root), "run", "--agent", "sample", "--task", TASK, "--seeds", "2",
                  "--runs-dir", str(runs), "--group", "demo", "--time-limit", "10m")
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads((runs / "demo" / "report.json").read_text())
    assert len(report["entries"]) == 2 and sum(r["valid"] for r in report["runs"]) == 2
    assert {e["labels"]["seed"] for e in report["entries"]} == {"0", "1"}
    assert "finished" in out and "percentile" in out
    # again: both runs are skipped (nothing new in the journals) and the report is rebuilt
    journals = sorted(runs.glob("demo/*/journal.jsonl"))
    sizes = [p.stat().st_size for p in journals]
    assert rexmle("--data-dir", str(data_root), "run", "--agent", "sample", "--task", TASK, "--seeds", "2",
                  "--runs-dir", str(runs), "--group", "demo", "--time-limit", "10m") == 0
    assert [p.stat().st_size for p in journals] == sizes
    assert rexmle("runs", "status", "--runs-dir", str(runs)) == 0
    assert "finished" in capsys.readouterr().out


def test_sandbox_exec_runs_in_the_runs_sandbox(data_root: Path, tmp_path: Path, capfd) -> None:
    runs = tmp_path / "runs"
    assert rexmle("--data-dir", str(data_root), "run", "--agent", "sample", "--task", TASK,
                  "--runs-dir", str(runs)) == 0
    run_dir = next(runs.glob("default/*/"))
    capfd.readouterr()
    code = rexmle("sandbox", "exec", str(run_dir), "--", "sh", "-c",
                  "pwd; ls /workspace/data; ls /workspace/submission; echo $OPENAI_API_KEY; touch /workspace/data/x")
    out, err = capfd.readouterr()
    assert code != 0  # the data view is read-only
    assert "/workspace/working" in out and "train" in out and "submission.csv" in out
    assert "Read-only file system" in err


def test_cli_bad_input_is_one_line_and_exit_code_2(data_root: Path, tmp_path: Path, capsys) -> None:
    base = ["--data-dir", str(data_root), "run", "--runs-dir", str(tmp_path)]
    assert rexmle(*base, "--agent", "sampel", "--task", TASK) == 2
    assert "did you mean 'sample'" in stderr(capsys)
    assert rexmle(*base, "--agent", "sample", "--tasks", "segmentaton") == 2
    assert "unknown task or task group" in stderr(capsys)
    assert rexmle(*base, "--agent", "sample") == 2
    assert rexmle(*base, "--agent", "sample", "--task", "isles22") == 2
    assert "rexmle prepare isles22" in stderr(capsys)
    assert rexmle(*base, "--agent", "sample", "--task", TASK, "--gpus-per-run", "4") == 2
    assert rexmle(*base, "--agent", "sample", "--task", TASK, "--sandbox", "none") == 2
    assert "--allow-unsandboxed" in stderr(capsys)
    assert rexmle(*base, "--agent", "sample", "--task", TASK, "--model", "=x") == 2
    assert not list(tmp_path.glob("*/*/spec.json"))  # nothing half-written
    assert rexmle("run", "--resume", str(tmp_path)) == 2
    assert "not a run folder" in stderr(capsys)


def test_agents_list_shows_the_built_in_agents(capsys) -> None:
    assert rexmle("agents", "list") == 0
    out = capsys.readouterr().out
    assert "sample" in out and "baseline" in out


def test_task_selection_models_and_agent_config_parsing(tmp_path: Path) -> None:
    assert select_tasks("ldct-iqa,isles22") == ["ldct-iqa", "isles22"]
    assert set(select_tasks("3d")) >= {"isles22", "seg_a"} and "ldct-iqa" not in select_tasks("3d")
    assert "dentex" in select_tasks("detection") and len(select_tasks("all")) == 21
    with pytest.raises(UnknownNameError):
        select_tasks("3D")
    assert parse_models(["openai/gpt-5", "feedback=anthropic/claude-sonnet-4-5"]) == {
        "default": "openai/gpt-5", "feedback": "anthropic/claude-sonnet-4-5"}
    with pytest.raises(UserInputError, match="twice"):
        parse_models(["code=a/b", "code=c/d"])
    config_file = tmp_path / "c.yaml"
    config_file.write_text("num_drafts: 3\n")
    assert parse_agent_config(['{"debug_prob": 0.5}', f"@{config_file}", "policy=greedy"]) == {
        "debug_prob": 0.5, "num_drafts": 3, "policy": "greedy"}


def test_local_pool_with_two_workers_and_resume_of_the_group(data_root: Path, tmp_path: Path) -> None:
    specs = [build_spec(TASK, agent="sample", data_root=data_root, seed=s, group="pool") for s in range(4)]
    outcomes = run_specs(specs, tmp_path, executor="local", workers=2)
    assert [o.run_id for o in outcomes] == [s.run_id for s in specs]
    assert all(o.state == "finished" and o.grade is not None and o.grade.status == "valid" for o in outcomes)
    pids = {Journal(o.run_dir / "journal.jsonl").events()[0]["pid"] for o in outcomes}
    assert len(pids) == 2  # two worker processes shared the four runs
    again = run_specs(specs, tmp_path, executor="local", workers=2)
    assert [o.grade.metrics for o in again] == [o.grade.metrics for o in outcomes]


def test_gpu_runs_are_refused_by_the_local_executor_where_there_are_none(data_root: Path, tmp_path: Path, capsys,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from rexmle_agents.executors.local import run_local

    # the spec is built without counting this machine's GPUs: a SLURM submit host has none of its own
    spec = build_spec(TASK, agent="sample", data_root=data_root, resources=Resources(gpus=1))
    assert spec.resources.gpus == 1
    with pytest.raises(UserInputError, match=r"needs 1 GPU\(s\) \(--gpus-per-run\), but this machine has 0"):
        run_local([spec], tmp_path, workers=1, gpus=())
    assert not (tmp_path / spec.group).exists()  # refused before anything was written
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, on any machine
    assert main(["--data-dir", str(data_root), "run", "--agent", "sample", "--task", TASK, "--runs-dir",
                 str(tmp_path), "--gpus-per-run", "1"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "but this machine has 0" in said and "--executor slurm asks the cluster for them" in said


def test_submitit_job_path_runs_and_resumes(data_root: Path, tmp_path: Path) -> None:
    specs = [build_spec(TASK, agent="sample", data_root=data_root, seed=s, group="slurm",
                        limits=Limits(time_limit_s=300)) for s in range(2)]
    outcomes = run_specs(specs, tmp_path, executor="submitit-local")
    assert all(o.state == "finished" and o.grade is not None and o.grade.status == "valid" for o in outcomes)
    assert (tmp_path / "slurm" / ".submitit").is_dir()


def test_slurm_parameters_follow_the_runs_needs(data_root: Path) -> None:
    spec = build_spec(TASK, agent="sample", data_root=data_root, limits=Limits(time_limit_s=12 * 3600))
    big = spec.model_copy(update={"resources": Resources(gpus=2, cpus=16, memory_gb=120)})
    params = slurm_parameters([spec, big], SlurmOptions(partition="gpu", extra={"qos": "long"}))
    assert params["timeout_min"] == 12 * 60 + 60 and params["gpus_per_node"] == 2
    assert params["cpus_per_task"] == 16 and params["mem_gb"] == 120 and params["slurm_partition"] == "gpu"
    assert params["slurm_additional_parameters"] == {"qos": "long"}


def test_group_report_shows_calibrated_baselines_beside_the_agent(data_root: Path, tmp_path: Path, capsys) -> None:
    from rexmle_baselines.calibration import CalibrationResult, store_result

    record = CalibrationResult(task_id=TASK, task_version="1", baseline="timm-regress", config="quick", params={},
                               seed=0, device="cpu", versions={}, hardware={"cpu": "test-cpu"}, seconds=12.0,
                               valid=True, metrics={"score": 2.5}, percentile=0.625, synthetic=True,
                               recorded_at="2026-11-25T00:00:00Z")
    store_result(data_root / "calibration", record)
    try:
        assert rexmle("--data-dir", str(data_root), "run", "--agent", "sample", "--task", TASK,
                      "--runs-dir", str(tmp_path)) == 0
    finally:
        (data_root / "calibration" / f"{TASK}.json").unlink()
    out = " ".join(capsys.readouterr().out.split())
    assert "calibrated expert baselines" in out and "baseline:timm-regress" in out and "62.5%" in out
