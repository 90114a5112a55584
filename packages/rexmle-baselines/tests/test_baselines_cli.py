"""``rexmle baselines list`` / ``run`` and ``python -m rexmle_baselines``: output and one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rexmle_baselines.base import baseline_names, get_baseline
from rexmle_grade.cli import main


def test_list_shows_each_baseline_with_install_status_and_tasks(capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["baselines", "list"]) == 0
    out = capsys.readouterr().out
    assert "nnunet" in baseline_names()
    for name in baseline_names():
        assert name in out
    nnunet = get_baseline("nnunet")
    assert ("yes" in out) if nnunet.installed() else ("rexmle-baselines[nnunet]" in out)
    assert "18: isles22" in out  # nnunet covers the 18 segmentation-type tasks


def test_run_refuses_a_task_the_baseline_does_not_cover(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["baselines", "run", "nnunet", "--task", "ldct-iqa"]) == 2
    err = capsys.readouterr().err
    assert "does not cover task 'ldct-iqa'" in err and "timm-regress" in err


def test_run_refuses_an_unprepared_task(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--data-dir", str(tmp_path), "baselines", "run", "nnunet", "--task", "ravir"]) == 2
    err = capsys.readouterr().err
    assert "not prepared" in err and "rexmle prepare ravir" in err


def test_run_refuses_a_malformed_set(capsys: pytest.CaptureFixture[str], prepared) -> None:
    public = prepared.public("ravir", cases=4)
    assert main(["baselines", "run", "nnunet", "--task", "ravir", "--public-dir", str(public), "--set", "epochs"]) == 2
    assert "--set expects key=value" in capsys.readouterr().err


def test_module_entry_point_runs_the_same_cli() -> None:
    result = subprocess.run([sys.executable, "-m", "rexmle_baselines", "run", "no-such-baseline", "--task", "ravir"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "unknown baseline 'no-such-baseline'" in result.stderr


def test_listing_and_the_api_import_neither_torch_nor_nnunet() -> None:
    code = ("import sys; from rexmle_baselines.base import baseline_names, baselines_for; baseline_names(); "
            "baselines_for('ravir'); import rexmle_baselines.api, rexmle_baselines.cli, rexmle_baselines.calibration; "
            "print(sorted(m for m in ('torch', 'nnunetv2', 'monai') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
