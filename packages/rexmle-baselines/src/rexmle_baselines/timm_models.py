"""timm image-level baselines: ``timm-regress`` (LDCT-IQA quality score) and ``timm-cls`` (TopCoW task-3 variants).

Both build a timm backbone from its config and train it on the public training images. ``pretrained`` names
ImageNet weights of the local weights cache (``resnet50.tv2_in1k``, fetched beforehand with `rexmle baselines
fetch-weights`; the default of ``budget`` and ``full``) or a local file; nothing is downloaded during a run. With
``folds`` > 1 one model is trained per cross-validation fold (each leaving a fold out) and their predictions are
averaged, as the LDCT-IQA winner ensembled five folds.

- ``timm-regress`` regresses the radiologists' score of a CT slice from the slice itself (one channel, no
  resizing, since resampling would smear the noise the score is about). The released slices are already windowed
  to [0, 1] (see :mod:`rexmle_tasks.families.ldct`); only a data set in Hounsfield units is put through the
  soft-tissue window (:func:`ct_to_unit`), never both; the choice is made once for the whole data set
  (:func:`ct_scale`), so every slice, train and test, gets the same mapping.
- ``timm-cls`` answers TopCoW task 3 (which of the 4 anterior and 4 posterior Circle-of-Willis segments exist) as a
  plain multi-label image classifier on three maximum-intensity projections of the volume (axial, coronal,
  sagittal MIPs stacked as channels). Images are never flipped: left and right segments are different labels.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Mapping, Sequence
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
from rexmle_baselines.convert import first_channel_file
from rexmle_grade.errors import InvalidSubmissionError, TaskDataMissingError, require_module
from rexmle_grade.grader import TestManifest, get_grader, write_submission_csv
from rexmle_grade.graders.topcow import EDGE_KEYS, parse_edges, read_edge_document
from rexmle_grade.io import read_image_2d

if TYPE_CHECKING:
    import torch

LDCT_GRADER = "ldct-iqa"
TOPCOW_EDGE_GRADERS = ("topcow-track1-task3", "topcow-track2-task3")
# HU window for slices given in Hounsfield units: abdominal soft tissue (level 40, width 400), where the rated noise
# and streaks show
HU_WINDOW = (-160.0, 240.0)
# a data set whose values all lie in [0, 1] give or take this overshoot is windowed already, as released (a
# resampled or denoised slice may overshoot a little); HU slices span hundreds (air -1000, soft tissue 40)
UNIT_RANGE_OVERSHOOT = 0.5
UNIT, HOUNSFIELD = "unit", "hu"
# inputs in [0, 1] are centred like ImageNet's grey level, which the pretrained first convolution expects
GREY_MEAN, GREY_STD = 0.449, 0.226


def _torch_and_timm() -> tuple[Any, Any]:
    torch = require_module("torch", extra="timm", package="rexmle-baselines")
    timm = require_module("timm", extra="timm", package="rexmle-baselines")
    return torch, timm


def create_backbone(params: Mapping[str, Any], *, in_chans: int, num_classes: int,
                    ctx: BaselineContext | None = None) -> torch.nn.Module:
    """A timm model built from its config; ``params['pretrained']`` may name weights of the local cache or a local
    file (timm adapts the first convolution to ``in_chans`` and drops a classifier of another size). The weights
    used are recorded in ``ctx.measurements['weights']``."""
    _, timm = _torch_and_timm()
    from rexmle_baselines.weights import resolve_weights

    value = params.get("pretrained")
    if not value:
        return timm.create_model(str(params["model"]), pretrained=False, in_chans=in_chans, num_classes=num_classes)
    weights = resolve_weights(value, ctx.weights_dir if ctx else None, architecture=str(params["model"]))
    if ctx is not None:
        ctx.measurements.setdefault("weights", {})[weights.name] = weights.sha256
        ctx.log(f"{params['model']} starts from the weights {weights.name} (sha256 {weights.sha256[:16]}...)")
    return timm.create_model(str(params["model"]), pretrained=True, in_chans=in_chans, num_classes=num_classes,
                             pretrained_cfg_overlay={"file": str(weights.path)})


def fit(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], ctx: BaselineContext,
        augment: Callable[[torch.Tensor], torch.Tensor] | None = None, *, phases: int = 1, what: str = "") -> None:
    """AdamW with a cosine schedule over ``epochs`` (fitted to the time budget where the config is time-aware);
    the mean epoch loss is checked for divergence."""
    torch, _ = _torch_and_timm()
    params = ctx.params
    epochs, batch_size = int(params["epochs"]), int(params["batch_size"])
    optimiser, schedule = adamw_cosine(model, params, epochs)
    plan = EpochPlan(ctx, epochs, phases=phases, what=what)
    generator = torch.Generator().manual_seed(ctx.seed)
    model.to(ctx.device).train()
    last_finite: float | None = None
    epoch, clock = 0, StepClock()
    while epoch < plan.total:
        epoch += 1
        order = torch.randperm(len(inputs), generator=generator)
        total = 0.0
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            x = inputs[batch].to(ctx.device).float()
            x = augment(x) if augment is not None else x
            with autocast(ctx):
                output = model((x - GREY_MEAN) / GREY_STD)
            loss = loss_fn(output.float(), targets[batch].to(ctx.device))
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            clock.tick()
            total += float(loss.detach()) * len(batch)
        last_finite = end_epoch(ctx, epoch, plan.total, total / len(inputs), last_finite, what=what)
        schedule.resize(plan.after_epoch())
        schedule.step()
    record_speed(ctx, clock=clock, what=what.strip(" ,") or "model")


def predict(model: torch.nn.Module, inputs: torch.Tensor, ctx: BaselineContext) -> np.ndarray:
    torch, _ = _torch_and_timm()
    model.eval()
    outputs = []
    size = int(ctx.params["batch_size"])
    with torch.no_grad(), autocast(ctx):
        for start in range(0, len(inputs), size):
            batch = inputs[start:start + size].to(ctx.device).float()
            outputs.append(model((batch - GREY_MEAN) / GREY_STD).float().cpu())
    return torch.cat(outputs).numpy()


def fold_indices(n: int, folds: int, seed: int) -> list[np.ndarray]:
    """Training indices of each of ``folds`` cross-validation folds (one fold: every case)."""
    if folds <= 1:
        return [np.arange(n)]
    order = np.random.default_rng(seed).permutation(n)
    return [np.setdiff1d(order, part) for part in np.array_split(order, folds)]


def ensemble(ctx: BaselineContext, train: Callable[[np.ndarray, int, str], torch.nn.Module],
             test_inputs: torch.Tensor, n_train: int) -> np.ndarray:
    """One model per fold (``train(indices, phases_left, label)``), their test predictions averaged."""
    folds = max(1, int(ctx.params["folds"]))
    outputs = []
    for k, indices in enumerate(fold_indices(n_train, folds, ctx.seed)):
        label = f"fold {k}, " if folds > 1 else ""
        outputs.append(predict(train(indices, folds - k, label), test_inputs, ctx))
    ctx.measurements["models_in_ensemble"] = len(outputs)
    return np.mean(outputs, axis=0)


def ensemble_steps(params: Mapping[str, Any], n_train: int) -> int:
    folds = max(1, int(params["folds"]))
    per_model = n_train * (folds - 1) // folds if folds > 1 else n_train
    return folds * int(params["epochs"]) * -(-per_model // int(params["batch_size"]))


# ---- timm-regress: LDCT-IQA ---------------------------------------------------------------------------------------
def ct_scale(slices: Sequence[np.ndarray]) -> str:
    """How a data set's slices are stored, decided once from all of them: :data:`UNIT` when every value lies in
    [0, 1] give or take :data:`UNIT_RANGE_OVERSHOOT` (the release's windowed slices), else :data:`HOUNSFIELD`. Deciding
    per slice would window the one windowed slice that overshoots [0, 1] slightly, squeezing it into a few
    thousandths of the range."""
    low = min((float(np.min(s)) for s in slices if np.size(s)), default=0.0)
    high = max((float(np.max(s)) for s in slices if np.size(s)), default=1.0)
    return UNIT if low >= -UNIT_RANGE_OVERSHOOT and high <= 1 + UNIT_RANGE_OVERSHOOT else HOUNSFIELD


def ct_to_unit(values: np.ndarray, scale: str) -> np.ndarray:
    """A CT slice as [0, 1] float32 in the data set's ``scale`` (:func:`ct_scale`): windowed slices are clipped,
    never windowed again (that would leave about a dozen grey levels under TF32); HU slices go through the
    soft-tissue window."""
    values = np.asarray(values, dtype=np.float32)
    if scale == UNIT:
        return np.clip(values, 0.0, 1.0)
    low, high = HU_WINDOW
    return (np.clip(values, low, high) - low) / (high - low)


def read_ldct_slices(paths: Sequence[Path]) -> np.ndarray:
    """The slices (N, H, W) in [0, 1], one mapping for all of them."""
    raw = [read_image_2d(path, what="CT slice") for path in paths]
    scale = ct_scale(raw)
    return np.stack([ct_to_unit(values, scale) for values in raw])


def read_training_scores(public_dir: Path) -> dict[str, float]:
    path = public_dir / "train" / "labels.csv"
    if not path.is_file():
        raise TaskDataMissingError(f"{path} is missing", hint="run `rexmle prepare ldct-iqa` first")
    with path.open(newline="") as fh:
        return {row["image_id"]: float(row["quality_score"]) for row in csv.DictReader(fh)}


def random_flips(x: torch.Tensor) -> torch.Tensor:
    """Flip each image left-right and up-down at random: the quality of a slice does not depend on its side."""
    torch, _ = _torch_and_timm()
    flip_w = torch.rand(len(x), device=x.device) < 0.5
    flip_h = torch.rand(len(x), device=x.device) < 0.5
    x = torch.where(flip_w[:, None, None, None], x.flip(-1), x)
    return torch.where(flip_h[:, None, None, None], x.flip(-2), x)


@register_baseline
class TimmRegress(Baseline):
    name: ClassVar[str] = "timm-regress"
    extra: ClassVar[str] = "timm"
    requires: ClassVar[tuple[str, ...]] = ("torch", "timm")
    description: ClassVar[str] = "timm CNN regressing LDCT-IQA's radiologist quality score from the slice (MSE)"
    _full: ClassVar[dict[str, Any]] = {"model": "resnet50", "pretrained": "resnet50.tv2_in1k", "folds": 5,
                                       "epochs": 100, "batch_size": 16, "lr": 3e-4, "weight_decay": 1e-4,
                                       "amp": True, "deterministic": False, "time_aware": False, "reserve_s": 300.0}
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {**_full, "model": "resnet10t", "pretrained": None, "folds": 1, "epochs": 25, "batch_size": 8,
                  "lr": 1e-3, "amp": False, "deterministic": True, "reserve_s": 0.0},
        "budget": {**_full, "time_aware": True},
        "full": _full,
        "smoke": {**_full, "pretrained": None, "folds": 2, "epochs": 1, "reserve_s": 0.0},
    }

    def supports(self, task_id: str, grader_id: str) -> bool:
        return grader_id == LDCT_GRADER

    def estimated_steps(self, params: Mapping[str, Any], n_train: int) -> int | None:
        return ensemble_steps(params, n_train)

    def run(self, ctx: BaselineContext) -> None:
        torch, _ = _torch_and_timm()
        prepare_run(ctx)
        scores = read_training_scores(ctx.public_dir)
        ids = sorted(scores)
        test_ids = TestManifest.read(ctx.public_dir).ids
        # one intensity mapping for the whole data set (train and test), decided from all of it
        paths = [ctx.public_dir / "train" / "images" / f"{i}.tif" for i in ids]
        paths += [ctx.public_dir / "test" / "images" / f"{i}.tif" for i in test_ids]
        every = torch.from_numpy(read_ldct_slices(paths))[:, None]
        images, test = every[:len(ids)], every[len(ids):]
        values = np.array([scores[i] for i in ids], dtype=np.float32)
        mean, std = float(values.mean()), float(values.std()) or 1.0
        targets = torch.from_numpy((values - mean) / std)[:, None]
        ctx.log(f"{len(ids)} training slices {tuple(images.shape[-2:])}, score {mean:.2f} +- {std:.2f}")

        def train(indices: np.ndarray, phases: int, label: str) -> torch.nn.Module:
            model = create_backbone(ctx.params, in_chans=1, num_classes=1, ctx=ctx)
            chosen = torch.from_numpy(indices)
            fit(model, images[chosen], targets[chosen], torch.nn.functional.mse_loss, ctx, augment=random_flips,
                phases=phases, what=label)
            return model

        predicted = ensemble(ctx, train, test, len(ids))[:, 0] * std + mean
        grader = get_grader(ctx.grader_id)
        (column,) = grader.schema.value_columns
        write_submission_csv(ctx.out_dir, grader.schema, [{grader.schema.id_column: i, column.name: repr(float(v))}
                                                          for i, v in zip(test_ids, predicted, strict=True)])


# ---- timm-cls: TopCoW task 3 --------------------------------------------------------------------------------------
def read_edges(path: Path) -> list[int]:
    """The 8 edge flags of a training edge list (anterior then posterior, in the grader's key order)."""
    try:
        edges = parse_edges(read_edge_document(path, path.name), path.name)
    except InvalidSubmissionError as exc:
        raise TaskDataMissingError("; ".join(exc.problems), hint="re-run `rexmle prepare TASK --force`") from None
    return [flag for region in EDGE_KEYS for flag in edges[region]]


def projections(path: Path, size: int) -> np.ndarray:
    """Axial, coronal and sagittal maximum-intensity projections of a volume, each robustly scaled to [0, 1] and
    resized to ``size`` x ``size``: (3, size, size) float32."""
    sitk = require_module("SimpleITK", extra="timm", package="rexmle-baselines")
    torch, _ = _torch_and_timm()
    volume = sitk.GetArrayFromImage(sitk.ReadImage(str(path))).astype(np.float32)  # (z, y, x)
    low, high = np.percentile(volume, [0.5, 99.9])
    volume = np.clip((volume - low) / max(float(high - low), 1e-6), 0.0, 1.0).astype(np.float32)
    planes = [volume.max(axis=axis) for axis in (0, 1, 2)]
    resized = [torch.nn.functional.interpolate(torch.from_numpy(np.ascontiguousarray(p))[None, None],
                                               size=(size, size), mode="bilinear", align_corners=False)[0, 0]
               for p in planes]
    return torch.stack(resized).numpy().astype(np.float32)


def write_edge_submission(ctx: BaselineContext, case_ids: Sequence[str], flags: np.ndarray) -> None:
    grader = get_grader(ctx.grader_id)
    (column,) = grader.schema.file_columns
    modality = str(grader.modality)  # type: ignore[attr-defined]
    rows = []
    for case_id, row in zip(case_ids, flags, strict=True):
        relative = column.path_for(case_id)
        path = ctx.out_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        values = iter(int(v) for v in row)
        document = {region: {key: next(values) for key in keys} for region, keys in EDGE_KEYS.items()}
        path.write_text(json.dumps(document) + "\n")
        rows.append({grader.schema.id_column: case_id, "modality": modality, column.name: relative})
    write_submission_csv(ctx.out_dir, grader.schema, rows)


@register_baseline
class TimmClassifier(Baseline):
    name: ClassVar[str] = "timm-cls"
    extra: ClassVar[str] = "timm"
    requires: ClassVar[tuple[str, ...]] = ("torch", "timm", "SimpleITK")
    description: ClassVar[str] = ("timm multi-label classifier of image-level labels (TopCoW task-3 Circle-of-Willis "
                                  "edges) from axial/coronal/sagittal MIPs")
    _full: ClassVar[dict[str, Any]] = {"model": "resnet50", "pretrained": "resnet50.tv2_in1k", "image_size": 256,
                                       "folds": 5, "epochs": 200, "batch_size": 16, "lr": 3e-4, "weight_decay": 1e-4,
                                       "amp": True, "deterministic": False, "time_aware": False, "reserve_s": 300.0}
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {**_full, "model": "resnet10t", "pretrained": None, "image_size": 64, "folds": 1, "epochs": 30,
                  "batch_size": 8, "lr": 1e-3, "amp": False, "deterministic": True, "reserve_s": 0.0},
        "budget": {**_full, "time_aware": True},
        "full": _full,
        "smoke": {**_full, "pretrained": None, "folds": 2, "epochs": 1, "reserve_s": 0.0},
    }

    def supports(self, task_id: str, grader_id: str) -> bool:
        return grader_id in TOPCOW_EDGE_GRADERS

    def estimated_steps(self, params: Mapping[str, Any], n_train: int) -> int | None:
        return ensemble_steps(params, n_train)

    def run(self, ctx: BaselineContext) -> None:
        torch, _ = _torch_and_timm()
        prepare_run(ctx)
        size = int(ctx.params["image_size"])
        edge_files = sorted((ctx.public_dir / "train" / "edges").glob("*.yml"))
        if not edge_files:
            raise TaskDataMissingError(f"no training edge lists in {ctx.public_dir / 'train' / 'edges'}",
                                       hint="run `rexmle prepare TASK` first")
        train_ids = [p.stem for p in edge_files]
        train_images = ctx.public_dir / "train" / "images"
        images = torch.from_numpy(np.stack([projections(first_channel_file(train_images, i), size)
                                            for i in train_ids]))
        targets = torch.tensor([read_edges(p) for p in edge_files], dtype=torch.float32)
        ctx.log(f"{len(train_ids)} training volumes -> 3 MIPs of {size}x{size}; edge prevalence "
                f"{[round(float(v), 2) for v in targets.mean(0)]}")
        test_ids = TestManifest.read(ctx.public_dir).ids
        test = torch.from_numpy(np.stack([projections(first_channel_file(ctx.public_dir / "test" / "images", i), size)
                                          for i in test_ids]))

        def train(indices: np.ndarray, phases: int, label: str) -> torch.nn.Module:
            model = create_backbone(ctx.params, in_chans=3, num_classes=targets.shape[1], ctx=ctx)
            chosen = torch.from_numpy(indices)
            fit(model, images[chosen], targets[chosen], torch.nn.functional.binary_cross_entropy_with_logits, ctx,
                phases=phases, what=label)
            return model

        write_edge_submission(ctx, test_ids, ensemble(ctx, train, test, len(train_ids)) > 0.0)
