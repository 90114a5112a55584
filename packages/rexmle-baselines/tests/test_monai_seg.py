"""The ``monai-seg`` baseline: quick runs of a MONAI UNet with sliding-window inference on synthetic segmentation
tasks (2-D and 3-D, through the shared converters) that must validate, grade and beat the sample submission; a
NaN loss stops training with the epoch and the last finite loss; bad patch sizes are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from rexmle_baselines.api import run_baseline
from rexmle_baselines.base import TrainingDivergedError
from rexmle_baselines.convert import segmentation_grader_ids
from rexmle_grade.errors import UserInputError

pytest.importorskip("monai")


def run_quick(task_id: str, prepared, tmp_path: Path, cases: int, **overrides: object) -> dict[str, float]:
    public = prepared.public(task_id, cases=cases)
    run = run_baseline("monai-seg", task_id, public_dir=public, out=tmp_path / "sub", work_dir=tmp_path / "w",
                       overrides=overrides)
    assert run.valid, run.problems
    return prepared.beats_sample(task_id, run.submission_dir)


def test_monai_seg_quick_segments_ravir_vessels_better_than_the_empty_sample(prepared, tmp_path: Path) -> None:
    metrics = run_quick("ravir", prepared, tmp_path, cases=10, epochs=15)  # 2-D vessels learn in fewer epochs
    assert metrics["dice"] > 0.2


@pytest.mark.slow
@pytest.mark.parametrize("task_id", [t for t in segmentation_grader_ids() if t != "ravir"])
def test_monai_seg_quick_beats_the_sample(task_id: str, prepared, tmp_path: Path) -> None:
    run_quick(task_id, prepared, tmp_path, cases=10)


def test_a_nan_loss_stops_with_the_epoch_and_last_finite_loss(prepared, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from monai.losses import DiceCELoss

    forward = DiceCELoss.forward
    calls = []

    def finite_then_nan(self, *args, **kwargs):  # epoch 1 (8 training cases, 4 per batch: 2 batches) stays finite
        calls.append(1)
        loss = forward(self, *args, **kwargs)
        return loss if len(calls) <= 2 else loss * float("nan")

    monkeypatch.setattr(DiceCELoss, "forward", finite_then_nan)
    public = prepared.public("ravir", cases=10)
    with pytest.raises(TrainingDivergedError, match=r"at epoch 2; the last finite loss was \d") as caught:
        run_baseline("monai-seg", "ravir", public_dir=public, work_dir=tmp_path / "w", overrides={"epochs": 3})
    assert caught.value.epoch == 2


def test_a_patch_size_the_network_cannot_halve_is_refused(prepared, tmp_path: Path) -> None:
    public = prepared.public("ravir", cases=10)
    with pytest.raises(UserInputError, match="multiple of the network's stride 4"):
        run_baseline("monai-seg", "ravir", public_dir=public, work_dir=tmp_path / "w",
                     overrides={"patch_size_2d": (30, 64)})
