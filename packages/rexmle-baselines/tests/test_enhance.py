"""The USenhance baselines: ``diffusion-enhance`` (diffusers conditional DDPM) and ``unet-enhance`` (MONAI BasicUNet,
L1), quick runs on a synthetic task that must validate, grade and beat the flat-grey sample; a NaN loss stops
training with the epoch and the last finite loss."""

from __future__ import annotations

from pathlib import Path

import pytest

from rexmle_baselines.api import run_baseline
from rexmle_baselines.base import TrainingDivergedError

TASK = "usenhance"


def test_diffusion_enhance_quick_beats_the_flat_sample_on_lncc_ssim_and_psnr(prepared, tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    public = prepared.public(TASK, cases=10)
    run = run_baseline("diffusion-enhance", TASK, public_dir=public, out=tmp_path / "sub", work_dir=tmp_path / "w")
    assert run.valid, run.problems
    metrics = prepared.beats_sample(TASK, run.submission_dir)
    assert metrics["psnr"] > 17.0  # the flat grey sample scores about 15 dB on the synthetic mirror


@pytest.mark.slow
def test_unet_enhance_quick_beats_the_flat_sample(prepared, tmp_path: Path) -> None:
    pytest.importorskip("monai")
    public = prepared.public(TASK, cases=10)
    run = run_baseline("unet-enhance", TASK, public_dir=public, out=tmp_path / "sub", work_dir=tmp_path / "w")
    assert run.valid, run.problems
    prepared.beats_sample(TASK, run.submission_dir)


def test_a_nan_loss_stops_with_the_epoch_and_last_finite_loss(prepared, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("monai")
    import torch

    l1_loss = torch.nn.functional.l1_loss
    calls = []

    def l1_then_nan(*args, **kwargs):  # finite through epoch 1, NaN from epoch 2
        calls.append(1)
        loss = l1_loss(*args, **kwargs)
        return loss if len(calls) <= 2 else loss * float("nan")

    monkeypatch.setattr(torch.nn.functional, "l1_loss", l1_then_nan)
    public = prepared.public(TASK, cases=10)
    with pytest.raises(TrainingDivergedError, match=r"at epoch 2; the last finite loss was \d") as caught:
        run_baseline("unet-enhance", TASK, public_dir=public, work_dir=tmp_path / "w",
                     overrides={"epochs": 3, "steps_per_epoch": 2, "batch_size": 2})
    assert caught.value.epoch == 2 and caught.value.last_finite is not None


def test_a_crop_that_the_network_cannot_halve_is_refused(prepared, tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    from rexmle_grade.errors import UserInputError

    public = prepared.public(TASK, cases=10)
    with pytest.raises(UserInputError, match="multiple of 4"):
        run_baseline("diffusion-enhance", TASK, public_dir=public, work_dir=tmp_path / "w",
                     overrides={"crop_size": 30})


def test_the_sampler_keeps_residuals_beyond_one_since_they_span_minus_two_to_two() -> None:
    pytest.importorskip("diffusers")
    import torch
    from diffusers import DDIMScheduler

    from rexmle_baselines.enhance import DiffusionEnhance

    _, scheduler = DiffusionEnhance().build(DiffusionEnhance.configs["quick"])
    sampler = DDIMScheduler.from_config(scheduler.config)
    assert scheduler.config.clip_sample_range == sampler.config.clip_sample_range == 2.0
    sampler.set_timesteps(10)
    strong = torch.full((1, 1, 4, 4), 1.6)  # dark speckle made bright: high - low = 1.6
    step = sampler.step(strong, sampler.timesteps[-1], torch.zeros_like(strong), eta=0.0)
    assert torch.allclose(step.pred_original_sample, strong)  # clipped to [-1, 1] it would come out as 1.0
    assert float(sampler.step(torch.full_like(strong, 3.0), sampler.timesteps[-1], strong).pred_original_sample.max()) \
        == 2.0
