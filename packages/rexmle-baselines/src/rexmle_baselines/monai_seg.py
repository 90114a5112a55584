"""``monai-seg``: a MONAI UNet / SegResNet pipeline for every 2-D and 3-D segmentation task.

Cases are read and the submission written through :func:`rexmle_baselines.convert.segmentation_io`, so the same
pipeline serves semantic masks, cell instances, nuclei centroids and the TopCoW ROI-box and edge-list answers. The
recipe is MONAI's usual one (Auto3DSeg's SegResNet in ``full``):

- 3-D volumes resampled to the training set's median spacing (``resample=median``; each class's probability goes
  back to the test image's own grid by linear interpolation before the argmax, as nnU-Net exports), 2-D images used
  as they are;
- per-case intensity normalisation (each channel clipped to its 0.5-99.5 percentiles, then z-scored), or for CT
  nnU-Net's dataset rule (``intensity=dataset``: the training foreground's percentiles and moments, so a value means
  the same in every scan);
- a bounded ``CacheDataset``: normalised images cached as float16 and labels as uint8 (3 bytes a voxel with one
  channel instead of 12 with float32 and int64), and only as many cases as ``cache_gb`` holds (the others are read
  again each epoch);
- patches centred on foreground/background (``crop=pos_neg``) or on every class equally often (``crop=classes``,
  so rare vessels are seen), random rotation and scaling, intensity scaling and shifting, and flips on every axis
  unless the task's labels tell left from right (``flips=auto``); ``intensity_aug=strong`` adds nnU-Net's kind of
  intensity augmentation (noise, wider scaling and shifting, gamma) for test scans whose contrast the few training
  scans barely cover;
- ``DiceCELoss``, AdamW with a cosine schedule, bfloat16 mixed precision on a GPU (``amp``);
- Gaussian-weighted ``sliding_window_inference``; on the vessel tasks (``keep_largest=auto``) MONAI's
  ``KeepLargestConnectedComponent`` per label.

``epochs=auto`` follows the dataset's size (a fixed number of optimiser steps, so a small dataset gets more epochs,
as Auto3DSeg and nnU-Net do); the ``budget`` config fits that into the time budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from rexmle_baselines.convert import SegCase, SegmentationIO, segmentation_grader_ids, segmentation_io
from rexmle_grade.errors import UserInputError, require_module
from rexmle_grade.io import read_volume_geometry

if TYPE_CHECKING:
    import torch

NETWORKS = ("unet", "segresnet")
CROPS = ("pos_neg", "classes")
INTENSITY_AUGS = ("light", "strong")


def normalise(image: np.ndarray) -> np.ndarray:
    """Each channel clipped to its 0.5-99.5 percentiles and z-scored (float32)."""
    out = np.empty_like(image, dtype=np.float32)
    for c, channel in enumerate(image):
        low, high = np.percentile(channel, [0.5, 99.5])
        clipped = np.clip(channel, low, high)
        out[c] = (clipped - clipped.mean()) / max(float(clipped.std()), 1e-6)
    return out


INTENSITY_MODES = ("case", "dataset")
FOREGROUND_SAMPLE = 100_000  # foreground voxels kept per training case for the dataset statistics


@dataclass(frozen=True)
class Normaliser:
    """How images are scaled before the network. ``case``: :func:`normalise`, each image on its own (right for MR,
    whose scale is arbitrary). ``dataset``: nnU-Net's rule for CT, whose values are calibrated (Hounsfield units):
    every image clipped to the 0.5-99.5 percentiles of the training set's foreground voxels and z-scored with their
    mean and standard deviation, so a vessel is as bright in every scan as its value says, whatever else the scan
    holds (bone, a wider field of view)."""

    mode: str = "case"
    # per channel: (low, high, mean, std) of the training foreground; empty in ``case`` mode
    stats: tuple[tuple[float, float, float, float], ...] = ()

    @classmethod
    def fit(cls, mode: str, io: SegmentationIO, cases: Sequence[SegCase], seed: int) -> Normaliser:
        if mode not in INTENSITY_MODES:
            raise UserInputError(f"intensity must be one of {', '.join(INTENSITY_MODES)}, got {mode!r}",
                                 hint="--set intensity=dataset for CT (calibrated values), case otherwise")
        if mode == "case":
            return cls()
        rng = np.random.default_rng(seed)
        pooled: list[list[np.ndarray]] = []
        for case in cases:
            image, _ = io.read_image(case)
            foreground = io.read_label(case) > 0
            pooled += [[] for _ in range(len(image) - len(pooled))]
            for c, channel in enumerate(image):
                values = channel[foreground]
                if len(values) > FOREGROUND_SAMPLE:
                    values = rng.choice(values, FOREGROUND_SAMPLE, replace=False)
                pooled[c].append(values.astype(np.float64))
        stats = []
        for c, parts in enumerate(pooled):
            values = np.concatenate(parts) if parts else np.zeros(0)
            if values.size < 2:
                raise UserInputError(f"intensity=dataset needs foreground voxels in the training labels; channel {c} "
                                     f"has {values.size}", hint="--set intensity=case")
            low, high = np.percentile(values, [0.5, 99.5])
            clipped = np.clip(values, low, high)
            stats.append((float(low), float(high), float(clipped.mean()), max(float(clipped.std()), 1e-6)))
        return cls(mode, tuple(stats))

    def __call__(self, image: np.ndarray) -> np.ndarray:
        if self.mode == "case":
            return normalise(image)
        out = np.empty_like(image, dtype=np.float32)
        for c, channel in enumerate(image):
            low, high, mean, std = self.stats[c]
            out[c] = (np.clip(channel, low, high) - mean) / std
        return out

    def describe(self) -> str:
        if self.mode == "case":
            return "each image clipped to its 0.5-99.5 percentiles and z-scored"
        parts = [f"[{low:.4g}, {high:.4g}] then (x - {mean:.4g}) / {std:.4g}" for low, high, mean, std in self.stats]
        return "the training foreground's percentiles and moments (CT): " + "; ".join(parts)


# ---- geometry: the median spacing ------------------------------------------------------------------------------
def numpy_spacing(io: SegmentationIO, case: SegCase) -> tuple[float, ...] | None:
    """Voxel spacing in numpy axis order (z, y, x) of a 3-D case; None for 2-D images."""
    if io.dim != 3:
        return None
    geometry = read_volume_geometry(case.channels[0], what="image")[0]
    return tuple(float(v) for v in reversed(geometry.spacing))


def median_spacing(io: SegmentationIO, cases: Sequence[SegCase]) -> tuple[float, ...] | None:
    spacings = [numpy_spacing(io, case) for case in cases]
    if not spacings or spacings[0] is None:
        return None
    return tuple(float(v) for v in np.median(np.asarray(spacings), axis=0))


def resample(array: np.ndarray, factors: Sequence[float], *, order: int) -> np.ndarray:
    """Zoom the spatial axes (all but the first) of a channels-first array by ``factors``."""
    from scipy import ndimage

    if all(abs(f - 1.0) < 1e-3 for f in factors):
        return array
    return np.stack([ndimage.zoom(channel, factors, order=order, mode="nearest", grid_mode=False)
                     for channel in array])


def labels_on_grid(scores: Any, shape: Sequence[int]) -> np.ndarray:
    """The label map on a grid of exactly ``shape`` from class scores ``(classes, *spatial)`` on the network's grid
    (a numpy array or a torch tensor, on the device that predicted it): each class's probability interpolated
    linearly (corner voxel centres aligned, the inverse of :func:`resample`), then the most probable class, as
    nnU-Net exports. One class at a time with torch's interpolation on the scores' device, so memory is two volumes
    of ``shape`` beyond the scores. (Taking the network's labels back by nearest neighbour shifts a structure by up
    to half a voxel: a perfect prediction of 2-3-voxel-wide vessels scored 0.54-0.83 Dice after that round trip.)"""
    torch = require_module("torch", extra="monai", package="rexmle-baselines")
    functional = require_module("torch.nn.functional", extra="monai", package="rexmle-baselines")
    shape = tuple(int(n) for n in shape)
    scores = torch.as_tensor(scores)
    with torch.no_grad():
        if tuple(scores.shape[1:]) == shape:
            return scores.argmax(dim=0).cpu().numpy().astype(np.uint8)
        mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[len(shape)]
        best = torch.full(shape, -math.inf, dtype=torch.float32, device=scores.device)
        labels = torch.zeros(shape, dtype=torch.uint8, device=scores.device)
        for value in range(scores.shape[0]):
            up = functional.interpolate(scores[value][None, None].float(), size=shape, mode=mode,
                                        align_corners=True)[0, 0]
            better = up > best
            labels[better] = value
            torch.maximum(best, up, out=best)
        return labels.cpu().numpy()


@dataclass(frozen=True)
class Grid:
    """Where the network works: the target spacing (None: each image's own grid)."""

    target: tuple[float, ...] | None

    def factors(self, io: SegmentationIO, case: SegCase) -> tuple[float, ...] | None:
        spacing = numpy_spacing(io, case)
        if self.target is None or spacing is None:
            return None
        return tuple(s / t for s, t in zip(spacing, self.target, strict=True))


# ---- the cache ------------------------------------------------------------------------------------------------------
class LoadCase:
    """Deterministic first step of the training transforms (so ``CacheDataset`` caches its output): a case's
    normalised image as float16 and its training label map as uint8, both with a channel axis, on the network's
    grid."""

    def __init__(self, io: SegmentationIO, grid: Grid, normaliser: Normaliser | None = None) -> None:
        self.io = io
        self.grid = grid
        self.normaliser = normaliser or Normaliser()

    def __call__(self, item: Mapping[str, Any]) -> dict[str, np.ndarray]:
        case: SegCase = item["case"]
        image, _ = self.io.read_image(case)
        label = self.io.read_label(case)[None]
        factors = self.grid.factors(self.io, case)
        image = self.normaliser(image)
        if factors is not None:
            image = resample(image, factors, order=1)
            label = resample(label, factors, order=0)
        return {"image": image.astype(np.float16), "label": label.astype(np.uint8)}


# Patch centres drawn per class: enough to sample from, few enough to cache (a 256x512x512 label's background alone
# would be 67 M int64 indices, 537 MB per case).
MAX_CENTRES_PER_CLASS = 200_000
CLASS_INDICES = "label_cls_indices"
FG_INDICES, BG_INDICES = "label_fg_indices", "label_bg_indices"


class CropCentres:
    """Deterministic step after padding (so ``CacheDataset`` caches it with the case): each class's voxel indices
    (at most :data:`MAX_CENTRES_PER_CLASS`, evenly subsampled by MONAI), from which the random cropper draws its
    centres. Without it the cropper scans the whole label for every crop of every epoch (about 20 s a call on a
    256x512x512 label)."""

    def __init__(self, n_classes: int, *, pos_neg: bool) -> None:
        self.n_classes = n_classes
        self.pos_neg = pos_neg

    def __call__(self, item: Mapping[str, Any]) -> dict[str, Any]:
        utils = require_module("monai.transforms.utils", extra="monai", package="rexmle-baselines")
        indices = utils.map_classes_to_indices(item["label"], num_classes=self.n_classes,
                                               max_samples_per_class=MAX_CENTRES_PER_CLASS)
        out = dict(item)
        if self.pos_neg:
            foreground = [np.asarray(i) for i in indices[1:] if len(i)]
            out[FG_INDICES] = np.concatenate(foreground) if foreground else np.zeros(0, dtype=np.int64)
            out[BG_INDICES] = np.asarray(indices[0])
        else:
            out[CLASS_INDICES] = [np.asarray(i) for i in indices]
        return out


def case_voxels(io: SegmentationIO, case: SegCase, grid: Grid) -> int:
    """Voxels of a case on the network's grid, from its header (3-D) or its pixels (2-D)."""
    if io.dim == 3:
        size = read_volume_geometry(case.channels[0], what="image")[0].size
        factors = grid.factors(io, case) or (1.0,) * len(size)
        return int(np.prod([n * f for n, f in zip(reversed(size), factors, strict=True)]))
    image, _ = io.read_image(case)
    return int(np.prod(image.shape[1:]))


def cache_rate(voxels: Sequence[int], channels: int, cache_gb: float) -> float:
    """The fraction of cases ``CacheDataset`` may keep: each cached voxel costs 2 bytes per channel (float16) and
    1 for its label (uint8)."""
    total = sum(voxels) * (2 * channels + 1)
    if total <= 0:
        return 1.0
    return float(min(1.0, max(0.0, cache_gb * 2**30 / total)))


# ---- the network --------------------------------------------------------------------------------------------------
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


def uses_flips(params: Mapping[str, Any], *, lateralised: bool) -> bool:
    """``flips``: auto (on unless the labels are lateralised), true (refused on a lateralised task) or false."""
    value = str(params["flips"]).lower()
    if value not in ("auto", "true", "false"):
        raise UserInputError(f"flips must be auto, true or false, got {params['flips']!r}", hint="--set flips=auto")
    if value == "true" and lateralised:
        raise UserInputError("flips=true on a task whose labels tell left from right (lateralised_labels): a flipped "
                             "image would swap them", hint="--set flips=auto (off on such tasks)")
    return value == "true" or (value == "auto" and not lateralised)


def planned_epochs(params: Mapping[str, Any], n_cases: int) -> int:
    """``epochs``, or with ``auto`` the epochs that give about ``target_steps`` optimiser steps on this many cases
    (within ``epochs_range``): the smaller the dataset, the more epochs."""
    value = str(params["epochs"]).lower()
    if value != "auto":
        try:
            return max(1, int(value))
        except ValueError:
            raise UserInputError(f"epochs must be a number or auto, got {params['epochs']!r}") from None
    steps_per_epoch = math.ceil(n_cases * int(params["samples_per_case"]) / int(params["batch_size"]))
    low, high = (int(v) for v in params["epochs_range"])
    return int(np.clip(round(int(params["target_steps"]) / max(1, steps_per_epoch)), low, high))


def training_transforms(io: SegmentationIO, patch: tuple[int, ...], grid: Grid, ctx: BaselineContext,
                        normaliser: Normaliser | None = None) -> Any:
    monai = require_module("monai", extra="monai", package="rexmle-baselines")
    t = monai.transforms
    # CacheDataset caches the output of the leading steps that are MONAI transforms and not random: ours must say
    # they are (virtual subclasses of the ABC), or nothing at all is cached and every epoch reloads every case
    for step in (LoadCase, CropCentres):
        t.Transform.register(step)
    params = ctx.params
    keys = ["image", "label"]
    crop = str(params["crop"])
    if crop not in CROPS:
        raise UserInputError(f"crop must be one of {', '.join(CROPS)}, got {crop!r}", hint="--set crop=classes")
    samples = int(params["samples_per_case"])
    if crop == "classes":  # every class (background included) equally often as a patch centre
        cropper = t.RandCropByLabelClassesd(keys=keys, label_key="label", spatial_size=patch,
                                            num_classes=len(io.labels), ratios=[1.0] * len(io.labels),
                                            num_samples=samples, warn=False, indices_key=CLASS_INDICES)
        index_keys = [CLASS_INDICES]
    else:
        cropper = t.RandCropByPosNegLabeld(keys=keys, label_key="label", spatial_size=patch,
                                           pos=float(params["pos_ratio"]), neg=1.0, num_samples=samples,
                                           fg_indices_key=FG_INDICES, bg_indices_key=BG_INDICES)
        index_keys = [FG_INDICES, BG_INDICES]
    # the centres are computed once per case (cached with it) and dropped once the patches are cut
    steps = [LoadCase(io, grid, normaliser), t.SpatialPadd(keys=keys, spatial_size=patch),
             CropCentres(len(io.labels), pos_neg=crop != "classes"), cropper, t.DeleteItemsd(keys=index_keys),
             t.CastToTyped(keys=keys, dtype=(np.float32, np.int64))]
    if params["spatial_aug"]:
        angle = 0.26  # 15 degrees
        steps.append(t.RandAffined(keys=keys, prob=0.2, rotate_range=(angle,) * (1 if io.dim == 2 else 3),
                                   scale_range=(0.15,) * io.dim, mode=("bilinear", "nearest"),
                                   padding_mode="border"))
    if uses_flips(params, lateralised=ctx.lateralised):
        steps += [t.RandFlipd(keys=keys, prob=0.5, spatial_axis=axis) for axis in range(io.dim)]
    strength = str(params["intensity_aug"])
    if strength not in INTENSITY_AUGS:
        raise UserInputError(f"intensity_aug must be one of {', '.join(INTENSITY_AUGS)}, got {strength!r}",
                             hint="--set intensity_aug=strong")
    if strength == "light":
        steps += [t.RandScaleIntensityd(keys="image", factors=0.1, prob=0.5),
                  t.RandShiftIntensityd(keys="image", offsets=0.1, prob=0.5)]
    else:  # nnU-Net's kind of intensity augmentation, for test scans whose contrast the training set barely covers
        steps += [t.RandGaussianNoised(keys="image", prob=0.15, std=0.1),
                  t.RandScaleIntensityd(keys="image", factors=0.25, prob=0.5),
                  t.RandShiftIntensityd(keys="image", offsets=0.25, prob=0.5),
                  t.RandAdjustContrastd(keys="image", prob=0.3, gamma=(0.7, 1.5))]
    return t.Compose(steps).set_random_state(seed=ctx.seed)


def training_loader(io: SegmentationIO, cases: Sequence[SegCase], patch: tuple[int, ...], grid: Grid,
                    in_channels: int, ctx: BaselineContext, normaliser: Normaliser | None = None) -> Any:
    monai = require_module("monai", extra="monai", package="rexmle-baselines")
    torch = require_module("torch", extra="monai", package="rexmle-baselines")
    params = ctx.params
    rate = min(float(params["cache_rate"]),
               cache_rate([case_voxels(io, c, grid) for c in cases], in_channels, float(params["cache_gb"])))
    ctx.measurements["cache_rate"] = round(rate, 4)
    if rate < 1.0:
        ctx.log(f"caching {rate:.0%} of the training cases (cache_gb={params['cache_gb']}); the rest are read each "
                "epoch")
    transforms = training_transforms(io, patch, grid, ctx, normaliser)
    dataset = monai.data.CacheDataset([{"case": c} for c in cases], transform=transforms, cache_rate=rate,
                                      num_workers=0, progress=False)
    return monai.data.DataLoader(dataset, batch_size=int(params["batch_size"]), shuffle=True,
                                 num_workers=int(params["workers"]), collate_fn=monai.data.list_data_collate,
                                 generator=torch.Generator().manual_seed(ctx.seed))


@register_baseline
class MonaiSegmentation(Baseline):
    name: ClassVar[str] = "monai-seg"
    extra: ClassVar[str] = "monai"
    requires: ClassVar[tuple[str, ...]] = ("torch", "monai", "SimpleITK")
    description: ClassVar[str] = ("MONAI UNet/SegResNet, DiceCE on foreground-weighted or class-balanced patches, "
                                  "sliding-window inference; 2-D and 3-D segmentation through the shared converters")
    _full: ClassVar[dict[str, Any]] = {
        "network": "segresnet", "channels": (32, 64, 128, 256, 320), "strides": (2, 2, 2, 2), "num_res_units": 2,
        "init_filters": 32, "blocks_down": (1, 2, 2, 4), "patch_size_2d": (512, 512), "patch_size_3d": (128, 128, 128),
        "samples_per_case": 2, "pos_ratio": 1.0, "crop": "classes", "batch_size": 2, "epochs": "auto",
        "target_steps": 40000, "epochs_range": (100, 1000), "lr": 2e-4, "weight_decay": 1e-5, "overlap": 0.5,
        "sw_batch_size": 2, "cache_rate": 1.0, "cache_gb": 48.0, "workers": 4, "keep_largest": "auto",
        "resample": "median", "spatial_aug": True, "flips": "auto", "amp": True, "deterministic": False,
        "time_aware": False, "reserve_s": 1800.0, "intensity": "case", "intensity_aug": "light"}
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        # CPU minutes: a small UNet on small patches, no spatial augmentation, each image on its own grid
        "quick": {**_full, "network": "unet", "channels": (8, 16, 32), "strides": (2, 2), "num_res_units": 1,
                  "init_filters": 8, "blocks_down": (1, 2, 2), "patch_size_2d": (64, 64), "patch_size_3d": (32, 32, 32),
                  "pos_ratio": 2.0, "crop": "pos_neg", "batch_size": 4, "epochs": 40, "lr": 3e-3, "overlap": 0.25,
                  "sw_batch_size": 4, "cache_gb": 4.0, "workers": 0, "resample": "none", "spatial_aug": False,
                  "flips": "false", "amp": False, "deterministic": True, "reserve_s": 0.0},
        # full's recipe with its epochs fitted into the time budget
        "budget": {**_full, "time_aware": True},
        "full": _full,
        "smoke": {**_full, "epochs": 1, "cache_gb": 8.0, "reserve_s": 0.0},
    }

    def supports(self, task_id: str, grader_id: str) -> bool:
        return grader_id in segmentation_grader_ids()

    def estimated_steps(self, params: Mapping[str, Any], n_train: int) -> int | None:
        per_epoch = math.ceil(n_train * int(params["samples_per_case"]) / int(params["batch_size"]))
        return planned_epochs(params, n_train) * per_epoch

    def run(self, ctx: BaselineContext) -> None:
        require_module("torch", extra=self.extra, package="rexmle-baselines")
        losses = require_module("monai.losses", extra=self.extra, package="rexmle-baselines")
        prepare_run(ctx)
        params = ctx.params
        io = segmentation_io(ctx.task_id, ctx.grader_id, ctx.public_dir)
        patch = patch_size(params, io.dim)
        stride = network_stride(params)
        if any(p % stride for p in patch):
            raise UserInputError(f"patch size {list(patch)} is not a multiple of the network's stride {stride}",
                                 hint=f"--set patch_size_{io.dim}d=... with multiples of {stride}")
        if str(params["resample"]) not in ("median", "none"):
            raise UserInputError(f"resample must be median or none, got {params['resample']!r}")
        uses_flips(params, lateralised=ctx.lateralised)  # refuse a bad setting before any work
        cases = io.training_cases()
        grid = Grid(median_spacing(io, cases) if params["resample"] == "median" else None)
        in_channels = len(io.read_image(cases[0])[0])
        model = build_network(params, io.dim, in_channels, len(io.labels)).to(ctx.device)
        epochs = planned_epochs(params, len(cases))
        ctx.log(f"{len(cases)} training cases, {io.dim}-D, {in_channels} channel(s), {len(io.labels)} labels; "
                f"{params['network']} with {sum(p.numel() for p in model.parameters()):,} parameters, "
                f"patch {list(patch)}, up to {epochs} epochs"
                + ("" if grid.target is None else f", spacing {[round(v, 3) for v in grid.target]} (z, y, x)"))
        normaliser = Normaliser.fit(str(params["intensity"]), io, cases, ctx.seed)
        if normaliser.mode != "case":
            ctx.log(f"intensities: {normaliser.describe()}")
        loader = training_loader(io, cases, patch, grid, in_channels, ctx, normaliser)
        loss_fn = losses.DiceCELoss(to_onehot_y=True, softmax=True)
        optimiser, schedule = adamw_cosine(model, params, epochs)
        plan = EpochPlan(ctx, epochs)
        last_finite: float | None = None
        epoch, clock = 0, StepClock()
        while epoch < plan.total:
            epoch += 1
            model.train()
            total, batches = 0.0, 0
            for batch in loader:
                with autocast(ctx):
                    loss = loss_fn(model(batch["image"].to(ctx.device)), batch["label"].to(ctx.device))
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                clock.tick()
                total += float(loss.detach())
                batches += 1
            last_finite = end_epoch(ctx, epoch, plan.total, total / max(1, batches), last_finite)
            schedule.resize(plan.after_epoch())
            schedule.step()
        record_speed(ctx, clock=clock)
        self.predict(ctx, io, model, patch, grid, normaliser)

    def predict(self, ctx: BaselineContext, io: SegmentationIO, model: Any, patch: tuple[int, ...], grid: Grid,
                normaliser: Normaliser | None = None) -> None:
        torch = require_module("torch", extra=self.extra, package="rexmle-baselines")
        inferers = require_module("monai.inferers", extra=self.extra, package="rexmle-baselines")
        params = ctx.params
        model.eval()
        keep_largest = keeps_largest_component(params, ctx.grader_id, len(io.labels))
        predictions: dict[str, np.ndarray] = {}
        for case in io.test_cases():
            image, _ = io.read_image(case)
            shape = image.shape[1:]
            factors = grid.factors(io, case)
            normalised = (normaliser or Normaliser())(image)
            if factors is not None:
                normalised = resample(normalised, factors, order=1)
            inputs = torch.from_numpy(normalised)[None].to(ctx.device)
            with torch.no_grad(), autocast(ctx):
                logits = inferers.sliding_window_inference(inputs, roi_size=patch,
                                                           sw_batch_size=int(params["sw_batch_size"]),
                                                           predictor=model, overlap=float(params["overlap"]),
                                                           mode="gaussian")
            # probabilities only where they are interpolated: on the image's own grid the logits' argmax is the same
            scores = logits[0] if factors is None else torch.softmax(logits[0].float(), dim=0)
            labels = labels_on_grid(scores, shape)
            if keep_largest is not None:
                labels = keep_largest(torch.from_numpy(labels[None]))[0].cpu().numpy().astype(np.uint8)
            predictions[case.case_id] = labels
        io.write_submission(predictions, ctx.out_dir)
        ctx.log(f"wrote predictions for {len(predictions)} test cases")
        record_speed(ctx)
