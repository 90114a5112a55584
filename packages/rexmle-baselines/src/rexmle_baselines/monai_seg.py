"""``monai-seg``: a MONAI UNet / SegResNet pipeline for every 2-D and 3-D segmentation task.

Cases are read and the submission written through :func:`rexmle_baselines.convert.segmentation_io`, so the same
pipeline serves semantic masks, cell instances, nuclei centroids and the TopCoW ROI-box and edge-list answers. The
recipe is MONAI's usual one: per-case intensity normalisation (each channel clipped to its 0.5-99.5 percentiles,
then z-scored), a ``CacheDataset`` of whole cases, random patches centred on foreground or background
(``RandCropByPosNegLabeld``) with light intensity augmentation, ``DiceCELoss``, AdamW with a cosine schedule, and
Gaussian-weighted ``sliding_window_inference`` on the whole test image. Nothing is flipped, since many tasks have
left and right labels. Images are used on their own voxel grid (no resampling), so predictions land on the test
image grid directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rexmle_baselines.base import (
    Baseline,
    BaselineContext,
    adamw_cosine,
    end_epoch,
    isolate_caches,
    register_baseline,
    resolve_device,
    seed_everything,
)
from rexmle_baselines.convert import SegCase, SegmentationIO, segmentation_grader_ids, segmentation_io
from rexmle_grade.errors import UserInputError, require_module

if TYPE_CHECKING:
    import torch

NETWORKS = ("unet", "segresnet")


def normalise(image: np.ndarray) -> np.ndarray:
    """Each channel clipped to its 0.5-99.5 percentiles and z-scored (float32)."""
    out = np.empty_like(image, dtype=np.float32)
    for c, channel in enumerate(image):
        low, high = np.percentile(channel, [0.5, 99.5])
        clipped = np.clip(channel, low, high)
        out[c] = (clipped - clipped.mean()) / max(float(clipped.std()), 1e-6)
    return out


class LoadCase:
    """Deterministic first step of the training transforms (so ``CacheDataset`` caches its output): a case's
    normalised image and its training label map with a channel axis."""

    def __init__(self, io: SegmentationIO) -> None:
        self.io = io

    def __call__(self, item: Mapping[str, Any]) -> dict[str, np.ndarray]:
        case: SegCase = item["case"]
        image, _ = self.io.read_image(case)
        return {"image": normalise(image), "label": self.io.read_label(case)[None].astype(np.int64)}


def patch_size(params: Mapping[str, Any], dim: int) -> tuple[int, ...]:
    size = tuple(int(v) for v in params[f"patch_size_{dim}d"])
    if len(size) != dim:
        raise UserInputError(f"patch_size_{dim}d must have {dim} values, got {list(size)}",
                             hint=f"--set patch_size_{dim}d=... with {dim} integers")
    return size


def build_network(params: Mapping[str, Any], dim: int, in_channels: int, out_channels: int) -> torch.nn.Module:
    nets = require_module("monai.networks.nets", extra="monai", package="rexmle-baselines")
    network = str(params["network"])
    if network == "unet":
        return nets.UNet(spatial_dims=dim, in_channels=in_channels, out_channels=out_channels,
                         channels=tuple(int(c) for c in params["channels"]),
                         strides=tuple(int(s) for s in params["strides"]),
                         num_res_units=int(params["num_res_units"]), norm="instance")
    if network == "segresnet":
        return nets.SegResNet(spatial_dims=dim, in_channels=in_channels, out_channels=out_channels,
                              init_filters=int(params["init_filters"]),
                              blocks_down=tuple(int(b) for b in params["blocks_down"]),
                              blocks_up=(1,) * (len(params["blocks_down"]) - 1), norm="instance")
    raise UserInputError(f"unknown network {network!r}", hint=f"--set network={' or '.join(NETWORKS)}")


def network_stride(params: Mapping[str, Any]) -> int:
    if str(params["network"]) == "segresnet":
        return 2 ** (len(params["blocks_down"]) - 1)
    return int(np.prod([int(s) for s in params["strides"]]))


# the vessel tasks: each label is one connected segment of the arterial tree, so stray islands are noise (and cost
# Betti-0 errors and loose ROI boxes); lesions, tumours and cells come in any number
ONE_COMPONENT_PER_LABEL = ("topcow-", "topbrain-")


def keeps_largest_component(params: Mapping[str, Any], grader_id: str, n_labels: int) -> Any:
    """MONAI's ``KeepLargestConnectedComponent`` over every foreground label when ``keep_largest`` is true, or
    ``auto`` on a task whose labels are single structures; None otherwise."""
    value = str(params["keep_largest"]).lower()
    if value not in ("auto", "true", "false"):
        raise UserInputError(f"keep_largest must be auto, true or false, got {params['keep_largest']!r}",
                             hint="--set keep_largest=auto")
    if value == "false" or (value == "auto" and not grader_id.startswith(ONE_COMPONENT_PER_LABEL)):
        return None
    transforms = require_module("monai.transforms", extra="monai", package="rexmle-baselines")
    return transforms.KeepLargestConnectedComponent(applied_labels=list(range(1, n_labels)), independent=True)


def training_loader(io: SegmentationIO, cases: Sequence[SegCase], patch: tuple[int, ...], ctx: BaselineContext) -> Any:
    monai = require_module("monai", extra="monai", package="rexmle-baselines")
    torch = require_module("torch", extra="monai", package="rexmle-baselines")
    t = monai.transforms
    params = ctx.params
    keys = ["image", "label"]
    transforms = t.Compose([
        LoadCase(io),
        t.SpatialPadd(keys=keys, spatial_size=patch),
        t.RandCropByPosNegLabeld(keys=keys, label_key="label", spatial_size=patch, pos=float(params["pos_ratio"]),
                                 neg=1.0, num_samples=int(params["samples_per_case"])),
        t.RandScaleIntensityd(keys="image", factors=0.1, prob=0.5),
        t.RandShiftIntensityd(keys="image", offsets=0.1, prob=0.5),
    ]).set_random_state(seed=ctx.seed)
    dataset = monai.data.CacheDataset([{"case": c} for c in cases], transform=transforms,
                                      cache_rate=float(params["cache_rate"]), num_workers=0, progress=False)
    return monai.data.DataLoader(dataset, batch_size=int(params["batch_size"]), shuffle=True,
                                 num_workers=int(params["workers"]), collate_fn=monai.data.list_data_collate,
                                 generator=torch.Generator().manual_seed(ctx.seed))


@register_baseline
class MonaiSegmentation(Baseline):
    name: ClassVar[str] = "monai-seg"
    extra: ClassVar[str] = "monai"
    requires: ClassVar[tuple[str, ...]] = ("torch", "monai", "SimpleITK")
    description: ClassVar[str] = ("MONAI UNet/SegResNet, DiceCE on foreground-weighted patches, sliding-window "
                                  "inference; 2-D and 3-D segmentation through the shared converters")
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {"network": "unet", "channels": (8, 16, 32), "strides": (2, 2), "num_res_units": 1,
                  "init_filters": 8, "blocks_down": (1, 2, 2), "patch_size_2d": (64, 64),
                  "patch_size_3d": (32, 32, 32), "samples_per_case": 2, "pos_ratio": 2.0, "batch_size": 4,
                  "epochs": 40, "lr": 3e-3, "weight_decay": 1e-5, "overlap": 0.25, "sw_batch_size": 4,
                  "cache_rate": 1.0, "workers": 0, "keep_largest": "auto"},
        "full": {"network": "segresnet", "channels": (32, 64, 128, 256, 320), "strides": (2, 2, 2, 2),
                 "num_res_units": 2, "init_filters": 32, "blocks_down": (1, 2, 2, 4), "patch_size_2d": (512, 512),
                 "patch_size_3d": (128, 128, 128), "samples_per_case": 2, "pos_ratio": 1.0, "batch_size": 2,
                 "epochs": 300, "lr": 2e-4, "weight_decay": 1e-5, "overlap": 0.5, "sw_batch_size": 2,
                 "cache_rate": 1.0, "workers": 4, "keep_largest": "auto"},
    }

    def supports(self, task_id: str, grader_id: str) -> bool:
        return grader_id in segmentation_grader_ids()

    def run(self, ctx: BaselineContext) -> None:
        torch = require_module("torch", extra=self.extra, package="rexmle-baselines")
        losses = require_module("monai.losses", extra=self.extra, package="rexmle-baselines")
        inferers = require_module("monai.inferers", extra=self.extra, package="rexmle-baselines")
        isolate_caches(ctx.work_dir)
        resolve_device(ctx.device)
        seed_everything(ctx.seed)
        params = ctx.params
        io = segmentation_io(ctx.task_id, ctx.grader_id, ctx.public_dir)
        patch = patch_size(params, io.dim)
        stride = network_stride(params)
        if any(p % stride for p in patch):
            raise UserInputError(f"patch size {list(patch)} is not a multiple of the network's stride {stride}",
                                 hint=f"--set patch_size_{io.dim}d=... with multiples of {stride}")
        cases = io.training_cases()
        in_channels = len(io.read_image(cases[0])[0])
        model = build_network(params, io.dim, in_channels, len(io.labels)).to(ctx.device)
        ctx.log(f"{len(cases)} training cases, {io.dim}-D, {in_channels} channel(s), {len(io.labels)} labels; "
                f"{params['network']} with {sum(p.numel() for p in model.parameters()):,} parameters, "
                f"patch {list(patch)}")
        loader = training_loader(io, cases, patch, ctx)
        loss_fn = losses.DiceCELoss(to_onehot_y=True, softmax=True)
        epochs = int(params["epochs"])
        optimiser, schedule = adamw_cosine(model, params, epochs)
        last_finite: float | None = None
        for epoch in range(1, epochs + 1):
            model.train()
            total, batches = 0.0, 0
            for batch in loader:
                loss = loss_fn(model(batch["image"].to(ctx.device)), batch["label"].to(ctx.device))
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                total += float(loss.detach())
                batches += 1
            last_finite = end_epoch(ctx, epoch, epochs, total / max(1, batches), last_finite)
            schedule.step()
        model.eval()
        keep_largest = keeps_largest_component(params, ctx.grader_id, len(io.labels))
        predictions: dict[str, np.ndarray] = {}
        for case in io.test_cases():
            image, _ = io.read_image(case)
            inputs = torch.from_numpy(normalise(image))[None].to(ctx.device)
            with torch.no_grad():
                logits = inferers.sliding_window_inference(inputs, roi_size=patch,
                                                           sw_batch_size=int(params["sw_batch_size"]),
                                                           predictor=model, overlap=float(params["overlap"]),
                                                           mode="gaussian")
            labels = logits.argmax(dim=1)
            if keep_largest is not None:
                labels = keep_largest(labels)
            predictions[case.case_id] = labels[0].cpu().numpy().astype(np.uint8)
        io.write_submission(predictions, ctx.out_dir)
        ctx.log(f"wrote predictions for {len(predictions)} test cases")
