"""The ``heuristic`` baseline (each task's simple heuristic, no training, no torch) and the difficulty ladder that
places it between the sample submission and a trained baseline (issue 36)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rexmle_baselines.api import run_baseline
from rexmle_baselines.base import baselines_for, get_baseline, preferred_baselines
from rexmle_baselines.heuristics import heuristics
from rexmle_baselines.ladder import Ladder, Rung, measure_ladder
from rexmle_tasks.registry import all_tasks


def test_every_task_has_a_heuristic_with_a_summary() -> None:
    assert sorted(heuristics()) == sorted(all_tasks())
    for task_id, heuristic in heuristics().items():
        assert len(heuristic.summary) > 20, task_id
        assert "heuristic" in baselines_for(task_id)
        # a trained baseline stands for the task first: the heuristic is a floor, not a reference
        assert preferred_baselines(task_id, "quick")[-1] == "heuristic" or task_id.startswith(("ldct", "usenhance"))


def test_it_needs_nothing_beyond_the_package_and_runs_every_config_on_a_cpu() -> None:
    baseline = get_baseline("heuristic")
    assert baseline.installed() and baseline.requires == () and not baseline.trains
    assert len({repr(c) for c in baseline.configs.values()}) == 1


def test_it_writes_a_valid_submission_without_importing_torch(prepared, tmp_path: Path) -> None:
    public = prepared.public("ldct-iqa", cases=16)
    code = ("import sys; from pathlib import Path; from rexmle_baselines.api import run_baseline; "
            f"run = run_baseline('heuristic', 'ldct-iqa', public_dir=Path({str(public)!r}), "
            f"out=Path({str(tmp_path / 'out')!r}), "
            "config='full'); "  # a GPU config: nothing to size, so no --allow-cpu needed
            "print(run.valid, run.measurements['heuristic'][:20], 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "a", "robust", "noise", "level", "False"]
    prepared.beats_sample("ldct-iqa", tmp_path / "out")


def test_a_rung_turns_lower_better_metrics_and_invalid_submissions_into_scores() -> None:
    rung = Rung(name="heuristic", metric="hd95", value=12.5, higher_better=False, valid=True, percentile=None,
                seconds=1.0)
    assert rung.score == -12.5
    assert Rung(**{**rung.__dict__, "valid": False}).score == float("-inf")
    assert Rung(**{**rung.__dict__, "value": float("nan")}).score == float("-inf")
    ladder = Ladder("t", "realistic", 4, {"sample": Rung(**{**rung.__dict__, "name": "sample", "value": 40.0}),
                                          "heuristic": rung,
                                          "monai-seg": Rung(**{**rung.__dict__, "name": "monai-seg", "value": 5.0})})
    assert ladder.ordered(margin=7.0) and not ladder.ordered(margin=8.0)  # 40 -> 12.5 -> 5 (lower is better)


def test_the_ladder_of_the_realistic_ldct_mirror_puts_the_heuristic_above_the_sample(tmp_path: Path) -> None:
    ladder = measure_ladder("ldct-iqa", tmp_path, cases=80, secret="v0", rungs=("sample", "heuristic"))
    assert set(ladder.rungs) == {"sample", "heuristic"} and ladder.rungs["heuristic"].metric == "score"
    assert ladder.ordered(margin=0.2), ladder.rungs  # 0.80 vs 0; with other secrets 0.3-1.2


def test_the_command_line_runs_it(prepared, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rexmle_grade.cli import main

    public = prepared.public("isles22", cases=6)
    assert main(["baselines", "run", "heuristic", "--task", "isles22", "--public-dir", str(public),
                 "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "submission.csv").is_file()
    run = run_baseline("heuristic", "isles22", public_dir=public, out=tmp_path / "again")
    assert run.valid and "DWI" in run.measurements["heuristic"]
