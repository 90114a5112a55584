"""Calibration runs a baseline, grades and ranks it with the task's grader, and stores what was measured."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import ClassVar

import pytest

from rexmle_baselines import base
from rexmle_baselines.base import Baseline, BaselineContext
from rexmle_baselines.calibration import CalibrationResult, calibrate, load_results
from rexmle_grade.cli import main


class _CopiesTheSample(Baseline):
    """A baseline without dependencies: it submits the task's sample submission (what the pipeline stores is
    under test, not the model)."""

    name: ClassVar[str] = "copies-sample"
    extra: ClassVar[str] = "none"
    requires: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = "test double"
    configs: ClassVar[dict] = {"quick": {"k": 1}, "full": {"k": 2}}

    def supports(self, task_id: str, grader_id: str) -> bool:
        return task_id == "ravir"

    def run(self, ctx: BaselineContext) -> None:
        shutil.copytree(ctx.public_dir / "sample_submission", ctx.out_dir, dirs_exist_ok=True)


@pytest.fixture
def copies_sample(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(base._REGISTRY, _CopiesTheSample.name, _CopiesTheSample)
    return _CopiesTheSample.name


def test_calibrate_stores_one_graded_record_per_baseline_and_config(copies_sample: str, prepared,
                                                                      tmp_path: Path) -> None:
    prepared.public("ravir", cases=4)
    root = prepared.roots["ravir"]
    folder = tmp_path / "calibration"
    for config in ("quick", "quick", "full"):  # a rerun replaces its entry
        calibrate(["ravir"], into=folder, data_root=root, baselines=[copies_sample], config=config, seed=3)
    records = load_results(folder, "ravir")
    assert [(r.baseline, r.config) for r in records] == [(copies_sample, "full"), (copies_sample, "quick")]
    quick = records[1]
    assert quick.valid and quick.synthetic and quick.seed == 3 and quick.params == {"k": 1}
    assert quick.metrics["dice"] == 0.0 and quick.seconds >= 0 and quick.hardware["cpu"]
    assert "rexmle-grade" in quick.versions and quick.device == "cpu"
    raw = json.loads((folder / "ravir.json").read_text())
    assert CalibrationResult.model_validate(raw[1]) == quick


def test_calibrate_command_writes_into_the_data_folder(copies_sample: str, prepared,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    prepared.public("ravir", cases=4)
    root = prepared.roots["ravir"]
    assert main(["--data-dir", str(root), "baselines", "calibrate", "--tasks", "ravir",
                 "--baseline", copies_sample]) == 0
    assert load_results(root / "calibration", "ravir")[0].baseline == copies_sample
    assert "ravir" in capsys.readouterr().out
