"""Calibration runs a baseline, grades and ranks it with the task's grader, and stores what was measured."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import ClassVar

import pytest

from rexmle_baselines import base
from rexmle_baselines.base import Baseline, BaselineContext
from rexmle_baselines.calibration import CalibrationResult, calibrate, load_results, record_key
from rexmle_grade.cli import main


class _CopiesTheSample(Baseline):
    """A baseline without dependencies: it submits the task's sample submission (what the pipeline stores is
    under test, not the model)."""

    name: ClassVar[str] = "copies-sample"
    extra: ClassVar[str] = "none"
    requires: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = "test double"
    configs: ClassVar[dict] = {"quick": {"k": 1}, "budget": {"k": 3}, "full": {"k": 2}, "smoke": {"k": 4}}

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
    for config in ("quick", "quick", "full"):  # an identical rerun replaces its record
        calibrate(["ravir"], into=folder, data_root=root, baselines=[copies_sample], config=config, seeds=[3],
                  allow_cpu=True)
    records = load_results(folder, "ravir")
    assert [(r.baseline, r.config) for r in records] == [(copies_sample, "full"), (copies_sample, "quick")]
    quick = records[1]
    assert quick.valid and quick.synthetic and quick.seed == 3 and quick.params == {"k": 1}
    assert quick.metrics["dice"] == 0.0 and quick.seconds >= 0 and quick.hardware["cpu"]
    assert "rexmle-grade" in quick.versions and quick.device == "cpu" and quick.gpu_hours == 0.0
    raw = json.loads((folder / "ravir.json").read_text())
    assert CalibrationResult.model_validate(raw[1]) == quick


def test_records_that_differ_in_seed_or_parameters_are_all_kept(copies_sample: str, prepared,
                                                                tmp_path: Path) -> None:
    prepared.public("ravir", cases=4)
    root = prepared.roots["ravir"]
    folder = tmp_path / "calibration"
    calibrate(["ravir"], into=folder, data_root=root, baselines=[copies_sample], seeds=[0, 1, 2])
    calibrate(["ravir"], into=folder, data_root=root, baselines=[copies_sample], seeds=[0], overrides={"k": "5"})
    calibrate(["ravir"], into=folder, data_root=root, baselines=[copies_sample], seeds=[1])  # same key: replaced
    records = load_results(folder, "ravir")
    assert sorted((r.seed, r.params["k"]) for r in records) == [(0, 1), (0, 5), (1, 1), (2, 1)]
    assert len({record_key(r) for r in records}) == 4


def test_an_old_record_without_the_new_fields_still_loads(tmp_path: Path) -> None:
    old = {"task_id": "ravir", "task_version": "1", "baseline": "nnunet", "config": "quick", "params": {}, "seed": 0,
           "device": "cpu", "versions": {}, "hardware": {}, "seconds": 1.0, "valid": True, "metrics": {},
           "percentile": None, "synthetic": True, "recorded_at": "2026-01-01T00:00:00+00:00"}
    (tmp_path / "ravir.json").write_text(json.dumps([old]))
    (record,) = load_results(tmp_path, "ravir")
    assert record.gpu_hours == 0.0 and record.measurements == {} and record.time_budget_s is None


def test_calibrate_command_writes_into_the_data_folder(copies_sample: str, prepared,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    prepared.public("ravir", cases=4)
    root = prepared.roots["ravir"]
    assert main(["--data-dir", str(root), "baselines", "calibrate", "--tasks", "ravir",
                 "--baseline", copies_sample]) == 0
    assert load_results(root / "calibration", "ravir")[0].baseline == copies_sample
    assert "ravir" in capsys.readouterr().out
