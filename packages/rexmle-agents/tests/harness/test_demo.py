"""`rexmle demo`, the main job: synthetic data -> agents in the sandbox -> graded, ranked report."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rexmle_grade.cli import main

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"),
                                reason="bubblewrap is not installed (apt-get install -y bubblewrap)")


def test_main_job_with_the_sample_agent(tmp_path: Path, capsys) -> None:
    code = main(["--data-dir", str(tmp_path), "demo", "--agents", "sample", "--tasks", "ldct-iqa,isles22",
                 "--cases", "8"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads((tmp_path / "demo-runs" / "demo" / "report.json").read_text())
    assert {e["task_id"] for e in report["entries"]} == {"ldct-iqa", "isles22"}
    assert all(e["valid_submission"] and e["percentile"] is not None for e in report["entries"])
    assert "percentile" in out and "main job: 2 run(s)" in out


def test_main_job_graders_only_mode(tmp_path: Path, capsys) -> None:
    assert main(["--data-dir", str(tmp_path), "demo", "--graders-only", "--tasks", "ldct-iqa"]) == 0
    report = json.loads((tmp_path / "demo_report.json").read_text())
    assert [e["labels"]["submission"] for e in report["entries"]] == ["sample", "gold"]


def test_main_job_rejects_an_unknown_task(tmp_path: Path, capsys) -> None:
    assert main(["--data-dir", str(tmp_path), "demo", "--tasks", "isles"]) == 2
    assert "unknown task" in capsys.readouterr().err


@pytest.mark.slow
def test_main_job_with_the_baseline_agent(tmp_path: Path, capsys) -> None:
    """README command 1: on the realistic mirrors of a 3-D segmentation task and a 2-D regression task, in the
    sandbox, the trained baseline (quick) scores above the task's heuristic, and the heuristic above the sample."""
    assert main(["--data-dir", str(tmp_path), "demo"]) == 0, capsys.readouterr().out
    group = tmp_path / "demo-runs" / "demo"
    report = json.loads((group / "report.json").read_text())
    by = {}
    for entry in report["entries"]:
        spec = json.loads((group / entry["labels"]["run_id"] / "spec.json").read_text())
        assert spec["data_variant"] == "synthetic-realistic"
        by[(entry["task_id"], spec["agent_config"].get("baseline") or spec["agent"])] = entry
    for task, metric in (("isles22", "dice"), ("ldct-iqa", "score")):
        sample, heuristic, trained = (by[(task, name)] for name in ("sample", "heuristic", "baseline"))
        assert sample["valid_submission"] and heuristic["valid_submission"] and trained["valid_submission"]
        assert sample["metrics"][metric] < heuristic["metrics"][metric] < trained["metrics"][metric], task
