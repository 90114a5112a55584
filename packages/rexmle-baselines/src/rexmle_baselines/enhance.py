"""USenhance image-to-image baselines: ``diffusion-enhance`` (conditional diffusion) and ``unet-enhance`` (L1 UNet).

Both learn the high-quality ultrasound image from the low-quality one of the public training pairs and write the
grader's submission (8-bit greyscale PNGs of each test image's size).

- ``diffusion-enhance``: a diffusers ``UNet2DModel`` built from a config (nothing downloaded) denoises the residual
  ``high - low`` with the low-quality image concatenated as a conditioning channel (SR3/Palette-style conditioning,
  residual target as in residual diffusion models), trained with a ``DDPMScheduler`` and sampled with
  deterministic DDIM. The network predicts the clean residual (``prediction_type="sample"``), so even a short run
  stays close to the input instead of returning noise. Both images lie in [-1, 1], so their difference spans
  [-2, 2]: the schedulers clip predicted samples to that range (``clip_sample_range=2``), not to diffusers'
  default [-1, 1], which would cut every strong correction in half.
- ``unet-enhance``: the plain regression variant beside it, a MONAI ``BasicUNet`` trained with L1 on the same
  residual.

Training uses random crops; inference runs on the whole image, reflect-padded to the network's stride.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rexmle_baselines.base import (
    Baseline,
    BaselineContext,
    EpochPlan,
    StepClock,
    adamw_cosine,
    autocast,
    end_epoch,
    prepare_run,
    record_speed,
    register_baseline,
)
from rexmle_grade.errors import TaskDataMissingError, UserInputError, require_module
from rexmle_grade.grader import TestManifest, get_grader
from rexmle_grade.graders._images2d import write_file_submission, write_png
from rexmle_grade.io import read_image_2d

if TYPE_CHECKING:
    import torch

USENHANCE_GRADER = "usenhance"
# high - low of two images in [-1, 1]
RESIDUAL_RANGE = 2.0


def _torch(extra: str) -> Any:
    return require_module("torch", extra=extra, package="rexmle-baselines")


@dataclass(frozen=True)
class Pairs:
    """Training pairs, each image (h, w) scaled to [-1, 1]."""

    low: list[np.ndarray]
    high: list[np.ndarray]


def to_unit(image: np.ndarray) -> np.ndarray:
    return image.astype(np.float32) / 127.5 - 1.0


def to_uint8(image: np.ndarray) -> np.ndarray:
    return np.clip(np.rint((image + 1.0) * 127.5), 0, 255).astype(np.uint8)


def read_pairs(public_dir: Path) -> Pairs:
    low_dir, high_dir = public_dir / "train" / "low_quality", public_dir / "train" / "high_quality"
    names = sorted(p.name for p in high_dir.glob("*.png"))
    if not names:
        raise TaskDataMissingError(f"no training pairs in {high_dir}", hint="run `rexmle prepare usenhance` first")
    low, high = [], []
    for name in names:
        high_image = read_image_2d(high_dir / name, what="high-quality training image")
        low_image = read_image_2d(low_dir / name, what="low-quality training image",
                                  expected_size=high_image.shape[::-1])
        low.append(to_unit(low_image))
        high.append(to_unit(high_image))
    return Pairs(low, high)


def random_crops(pairs: Pairs, size: int, count: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """``count`` random (low, residual) crops of ``size`` x ``size``, with random left-right flips (ultrasound
    views are not left-right specific); images smaller than ``size`` are reflect-padded first."""
    torch = _torch("torch")
    lows, residuals = [], []
    picks = torch.randint(len(pairs.low), (count,), generator=generator).tolist()
    for k in picks:
        stacked = _pad_to(np.stack([pairs.low[k], pairs.high[k] - pairs.low[k]]), size)
        h, w = stacked.shape[-2:]
        top = int(torch.randint(h - size + 1, (1,), generator=generator))
        left = int(torch.randint(w - size + 1, (1,), generator=generator))
        crop = stacked[:, top:top + size, left:left + size]
        if bool(torch.rand(1, generator=generator) < 0.5):
            crop = crop[:, :, ::-1]
        lows.append(crop[0])
        residuals.append(crop[1])
    return (torch.from_numpy(np.ascontiguousarray(np.stack(lows)))[:, None],
            torch.from_numpy(np.ascontiguousarray(np.stack(residuals)))[:, None])


def _pad_to(stack: np.ndarray, size: int) -> np.ndarray:
    h, w = stack.shape[-2:]
    pad_h, pad_w = max(0, size - h), max(0, size - w)
    if pad_h or pad_w:
        stack = np.pad(stack, ((0, 0), (0, pad_h), (0, pad_w)), mode="reflect")
    return stack


def pad_to_multiple(image: np.ndarray, multiple: int) -> np.ndarray:
    h, w = image.shape
    return np.pad(image, ((0, -h % multiple), (0, -w % multiple)), mode="reflect")


def train(step_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], model: torch.nn.Module, pairs: Pairs,
          ctx: BaselineContext) -> None:
    """AdamW over ``epochs`` epochs of ``steps_per_epoch`` batches of random crops; the mean loss of each epoch is
    checked for divergence."""
    torch = _torch("torch")
    params = ctx.params
    epochs, steps = int(params["epochs"]), int(params["steps_per_epoch"])
    optimiser, schedule = adamw_cosine(model, params, epochs * steps)
    plan = EpochPlan(ctx, epochs)
    generator = torch.Generator().manual_seed(ctx.seed)
    model.to(ctx.device).train()
    last_finite: float | None = None
    epoch, clock = 0, StepClock()
    while epoch < plan.total:
        epoch += 1
        total = 0.0
        for _ in range(steps):
            low, residual = random_crops(pairs, int(params["crop_size"]), int(params["batch_size"]), generator)
            with autocast(ctx):
                loss = step_loss(low.to(ctx.device), residual.to(ctx.device))
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            clock.tick()
            schedule.step()
            total += float(loss.detach())
        last_finite = end_epoch(ctx, epoch, plan.total, total / steps, last_finite)
        schedule.resize(plan.after_epoch() * steps)
    record_speed(ctx, clock=clock)


def write_enhanced(ctx: BaselineContext, enhance: Callable[[np.ndarray], np.ndarray]) -> None:
    """Enhance every test image (``enhance`` maps a [-1, 1] image to its predicted residual) and write the PNGs."""
    grader = get_grader(ctx.grader_id)
    (column,) = grader.schema.file_columns
    manifest = TestManifest.read(ctx.public_dir)

    def write(case_id: str, path: Path) -> None:
        width, height = (int(v) for v in manifest.geometry_of(case_id).size[:2])
        low = to_unit(read_image_2d(ctx.public_dir / "test" / "low_quality" / f"{case_id}.png",
                                    what="low-quality test image", expected_size=(width, height)))
        write_png(path, to_uint8(low + enhance(low)))

    write_file_submission(ctx.out_dir, grader.schema, column, manifest.ids, write)
    ctx.log(f"wrote {len(manifest.ids)} enhanced images")


def _check_crop(ctx: BaselineContext, multiple: int) -> None:
    if int(ctx.params["crop_size"]) % multiple:
        raise UserInputError(f"crop_size must be a multiple of {multiple} (the network's total stride), got "
                             f"{ctx.params['crop_size']}", hint=f"--set crop_size={multiple * 4}")


# ---- diffusion ----------------------------------------------------------------------------------------------------
@register_baseline
class DiffusionEnhance(Baseline):
    name: ClassVar[str] = "diffusion-enhance"
    extra: ClassVar[str] = "diffusers"
    requires: ClassVar[tuple[str, ...]] = ("torch", "diffusers")
    description: ClassVar[str] = ("diffusers conditional DDPM (UNet2DModel, low-quality image as conditioning "
                                  "channel, residual target, DDIM sampling) for USenhance")
    _full: ClassVar[dict[str, Any]] = {
        "block_out_channels": (64, 128, 256, 512), "layers_per_block": 2, "attention": True, "train_timesteps": 1000,
        "inference_steps": 50, "crop_size": 256, "batch_size": 16, "epochs": 500, "steps_per_epoch": 100,
        "lr": 1e-4, "weight_decay": 0.0, "amp": True, "deterministic": False, "time_aware": False,
        "reserve_s": 1200.0}
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {**_full, "block_out_channels": (16, 32, 32), "layers_per_block": 1, "attention": False,
                  "inference_steps": 10, "crop_size": 64, "batch_size": 8, "epochs": 12, "steps_per_epoch": 8,
                  "lr": 2e-3, "amp": False, "deterministic": True, "reserve_s": 0.0},
        "budget": {**_full, "time_aware": True},
        "full": _full,
        "smoke": {**_full, "epochs": 1, "steps_per_epoch": 10, "reserve_s": 0.0},
    }

    def supports(self, task_id: str, grader_id: str) -> bool:
        return grader_id == USENHANCE_GRADER

    def estimated_steps(self, params: Any, n_train: int) -> int | None:
        return int(params["epochs"]) * int(params["steps_per_epoch"])

    def build(self, params: Any) -> tuple[Any, Any]:
        diffusers = require_module("diffusers", extra="diffusers", package="rexmle-baselines")
        channels = tuple(int(c) for c in params["block_out_channels"])
        down = ["DownBlock2D"] * len(channels)
        up = ["UpBlock2D"] * len(channels)
        if params["attention"]:  # self-attention at the coarsest resolution, as in the DDPM UNet
            down[-1], up[0] = "AttnDownBlock2D", "AttnUpBlock2D"
        model = diffusers.UNet2DModel(
            sample_size=int(params["crop_size"]), in_channels=2, out_channels=1, block_out_channels=channels,
            layers_per_block=int(params["layers_per_block"]), down_block_types=tuple(down), up_block_types=tuple(up),
            norm_num_groups=min(32, channels[0]),
        )
        scheduler = diffusers.DDPMScheduler(num_train_timesteps=int(params["train_timesteps"]),
                                            prediction_type="sample", clip_sample=True,
                                            clip_sample_range=RESIDUAL_RANGE)
        return model, scheduler

    def run(self, ctx: BaselineContext) -> None:
        torch = _torch(self.extra)
        diffusers = require_module("diffusers", extra=self.extra, package="rexmle-baselines")
        prepare_run(ctx)
        model, scheduler = self.build(ctx.params)
        multiple = 2 ** (len(ctx.params["block_out_channels"]) - 1)
        _check_crop(ctx, multiple)
        pairs = read_pairs(ctx.public_dir)
        ctx.log(f"{len(pairs.low)} training pairs; UNet2DModel with {sum(p.numel() for p in model.parameters()):,} "
                "parameters")
        noise_generator = torch.Generator(device=ctx.device).manual_seed(ctx.seed)

        def denoising_loss(low: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
            noise = torch.randn(residual.shape, generator=noise_generator, device=ctx.device)
            steps = torch.randint(scheduler.config.num_train_timesteps, (len(low),), generator=noise_generator,
                                  device=ctx.device)
            noisy = scheduler.add_noise(residual, noise, steps)
            predicted = model(torch.cat([noisy, low], dim=1), steps).sample
            return torch.nn.functional.mse_loss(predicted, residual)

        train(denoising_loss, model, pairs, ctx)
        sampler = diffusers.DDIMScheduler.from_config(scheduler.config)
        sampler.set_timesteps(int(ctx.params["inference_steps"]))
        model.eval()

        def enhance(low: np.ndarray) -> np.ndarray:
            h, w = low.shape
            condition = torch.from_numpy(pad_to_multiple(low, multiple))[None, None].to(ctx.device)
            sample = torch.randn(condition.shape, generator=noise_generator, device=ctx.device)
            with torch.no_grad():
                for t in sampler.timesteps:
                    with autocast(ctx):
                        predicted = model(torch.cat([sample, condition], dim=1), t.to(ctx.device)).sample
                    sample = sampler.step(predicted.float(), t, sample, eta=0.0).prev_sample
            return sample[0, 0, :h, :w].float().cpu().numpy()

        write_enhanced(ctx, enhance)


# ---- plain UNet regression ----------------------------------------------------------------------------------------
@register_baseline
class UNetEnhance(Baseline):
    name: ClassVar[str] = "unet-enhance"
    extra: ClassVar[str] = "monai"
    requires: ClassVar[tuple[str, ...]] = ("torch", "monai")
    description: ClassVar[str] = "MONAI BasicUNet regressing the high-quality image from the low-quality one (L1)"
    _full: ClassVar[dict[str, Any]] = {
        "features": (32, 64, 128, 256, 512, 32), "crop_size": 256, "batch_size": 16, "epochs": 300,
        "steps_per_epoch": 100, "lr": 2e-4, "weight_decay": 1e-5, "amp": True, "deterministic": False,
        "time_aware": False, "reserve_s": 600.0}
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {**_full, "features": (8, 16, 32, 64, 64, 8), "crop_size": 64, "batch_size": 8, "epochs": 15,
                  "steps_per_epoch": 10, "lr": 2e-3, "weight_decay": 0.0, "amp": False, "deterministic": True,
                  "reserve_s": 0.0},
        "budget": {**_full, "time_aware": True},
        "full": _full,
        "smoke": {**_full, "epochs": 1, "steps_per_epoch": 10, "reserve_s": 0.0},
    }

    def supports(self, task_id: str, grader_id: str) -> bool:
        return grader_id == USENHANCE_GRADER

    def estimated_steps(self, params: Any, n_train: int) -> int | None:
        return int(params["epochs"]) * int(params["steps_per_epoch"])

    def run(self, ctx: BaselineContext) -> None:
        torch = _torch(self.extra)
        networks = require_module("monai.networks.nets", extra=self.extra, package="rexmle-baselines")
        prepare_run(ctx)
        _check_crop(ctx, 16)  # BasicUNet pools four times
        model = networks.BasicUNet(spatial_dims=2, in_channels=1, out_channels=1,
                                   features=tuple(int(f) for f in ctx.params["features"]))
        pairs = read_pairs(ctx.public_dir)
        ctx.log(f"{len(pairs.low)} training pairs; BasicUNet with {sum(p.numel() for p in model.parameters()):,} "
                "parameters")

        def l1_loss(low: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.l1_loss(model(low), residual)

        train(l1_loss, model, pairs, ctx)
        model.eval()

        def enhance(low: np.ndarray) -> np.ndarray:
            h, w = low.shape
            with torch.no_grad(), autocast(ctx):
                x = torch.from_numpy(pad_to_multiple(low, 16))[None, None].to(ctx.device)
                return model(x)[0, 0, :h, :w].float().cpu().numpy()

        write_enhanced(ctx, enhance)
