"""The ``detector`` baseline (torchvision Faster R-CNN per DENTEX label level): a quick run on the synthetic task
must validate, grade and beat the empty sample; a NaN loss stops training with the epoch and the last finite loss;
a backbone torchvision's FPN cannot wrap is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from rexmle_baselines.api import run_baseline
from rexmle_baselines.base import TrainingDivergedError
from rexmle_grade.errors import UserInputError

pytest.importorskip("torchvision")
pytest.importorskip("timm")
TASK = "dentex"


def test_detector_quick_finds_abnormal_teeth_the_empty_sample_misses(prepared, tmp_path: Path) -> None:
    public = prepared.public(TASK, cases=10)
    run = run_baseline("detector", TASK, public_dir=public, out=tmp_path / "sub", work_dir=tmp_path / "w")
    assert run.valid, run.problems
    metrics = prepared.beats_sample(TASK, run.submission_dir)
    assert metrics["ap50_mean"] > 0


def test_a_nan_loss_stops_with_the_epoch_and_last_finite_loss(prepared, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision.models.detection import roi_heads

    fastrcnn_loss = roi_heads.fastrcnn_loss
    calls = []

    def finite_then_nan(*args, **kwargs):  # epoch 1 (all 8 training X-rays in one batch) stays finite
        calls.append(1)
        classification, regression = fastrcnn_loss(*args, **kwargs)
        return (classification, regression) if len(calls) <= 1 else (classification * float("nan"), regression)

    monkeypatch.setattr(roi_heads, "fastrcnn_loss", finite_then_nan)
    public = prepared.public(TASK, cases=10)
    with pytest.raises(TrainingDivergedError, match=r"at epoch 2; the last finite loss was \d") as caught:
        run_baseline("detector", TASK, public_dir=public, work_dir=tmp_path / "w",
                     overrides={"epochs": 3, "batch_size": 8})
    assert caught.value.epoch == 2


def test_a_backbone_that_is_not_a_resnet_is_refused(prepared, tmp_path: Path) -> None:
    public = prepared.public(TASK, cases=10)
    with pytest.raises(UserInputError, match="not a timm ResNet"):
        run_baseline("detector", TASK, public_dir=public, work_dir=tmp_path / "w",
                     overrides={"model": "test_efficientnet"})
