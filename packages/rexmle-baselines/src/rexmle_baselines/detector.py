"""``detector``: torchvision Faster R-CNN for DENTEX's hierarchical labels (quadrant, tooth number, diagnosis).

Three torchvision Faster R-CNNs are trained on the abnormal-tooth boxes of the public training JSON, one per level
of the label hierarchy: quadrant (4 classes), enumeration (the 32 FDI teeth, quadrant x tooth, so that a tooth's
number is never read apart from its quadrant) and diagnosis (4 classes). Predictions are merged top-down as the
winners' pipelines did: the diagnosis detector says which teeth are abnormal and where; each of its boxes takes
its quadrant from the best-overlapping quadrant box, then its tooth number from the best-overlapping enumeration box
*of that quadrant* (the closest box when none overlaps, the training set's most frequent id when a detector found
nothing).

The backbone is a timm ResNet under torchvision's FPN. ``pretrained`` names ImageNet weights of the local weights
cache (``resnet50.tv2_in1k``, the default of ``budget`` and ``full``; fetched beforehand with `rexmle baselines
fetch-weights`) or a local file; a pretrained backbone keeps its BatchNorm statistics frozen (batches of a few
large X-rays cannot estimate them) and its stem and first stage fixed (``trainable_layers``), as torchvision's
detection recipe does. X-rays are held as one-channel uint8 (an eighth of three float32 channels) and expanded on
the device. A horizontal flip (``hflip``) mirrors the patient's left and right, so it swaps the quadrants
(1 <-> 2, 3 <-> 4; the task declares lateralised labels); tooth numbers and diagnoses are unchanged.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rexmle_baselines.base import (
    Baseline,
    BaselineContext,
    EpochPlan,
    StepClock,
    autocast,
    end_epoch,
    prepare_run,
    record_speed,
    register_baseline,
)
from rexmle_baselines.timm_models import create_backbone
from rexmle_grade.errors import TaskDataMissingError, UserInputError, require_module
from rexmle_grade.grader import TestManifest, get_grader
from rexmle_grade.graders._images2d import write_file_submission
from rexmle_grade.graders.dentex import LABEL_SETS
from rexmle_grade.io import read_image_2d, read_json

if TYPE_CHECKING:
    import torch

DENTEX_GRADER = "dentex"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
QUADRANT, TOOTH, DIAGNOSIS = (s.key for s in LABEL_SETS)
TEETH_PER_QUADRANT = 8
# 0-based quadrant ids (FDI 1-4: upper right, upper left, lower left, lower right of the patient) after a
# left-right flip of the image
MIRRORED_QUADRANT = np.array([1, 0, 3, 2], dtype=np.int64)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Level:
    """One detector of the hierarchy: what it is called, how many classes, and its class of an annotation."""

    name: str
    n_classes: int

    def classes(self, ids: dict[str, np.ndarray]) -> np.ndarray:
        if self.name == "enumeration":  # FDI tooth: quadrant x 8 + tooth
            return ids[QUADRANT] * TEETH_PER_QUADRANT + ids[TOOTH]
        return ids[{"quadrant": QUADRANT, "diagnosis": DIAGNOSIS}[self.name]]


LEVELS = (Level("quadrant", 4), Level("enumeration", 4 * TEETH_PER_QUADRANT), Level("diagnosis", 4))


@dataclass(frozen=True)
class Detection:
    box: tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels
    label: int  # 0-based class of the detector's level
    score: float


@dataclass(frozen=True)
class TrainingImage:
    pixels: np.ndarray  # (h, w) uint8: one grey channel, expanded to the backbone's three on the device
    boxes: np.ndarray  # (n, 4) x0, y0, x1, y1
    ids: dict[str, np.ndarray]  # label-set key -> (n,) 0-based ids


def _torch() -> Any:
    return require_module("torch", extra="torch", package="rexmle-baselines")


def _torchvision() -> Any:
    return require_module("torchvision", extra="torch", package="rexmle-baselines")


def read_xray(path: Path) -> np.ndarray:
    """A panoramic X-ray as (h, w) uint8 (a colour-saved one keeps its first channel; 16 bits keep the high 8)."""
    pixels = read_image_2d(path, what="X-ray", allow_channels=True)
    if pixels.ndim == 3:  # a colour-saved X-ray: its channels are equal, keep one
        pixels = pixels[..., 0]
    if pixels.dtype == np.uint16:
        return (pixels >> 8).astype(np.uint8)
    if pixels.dtype != np.uint8:
        scale = float(pixels.max()) or 1.0
        return np.clip(pixels.astype(np.float32) / scale * 255.0, 0, 255).astype(np.uint8)
    return np.array(pixels, dtype=np.uint8)  # an own, writable copy (torch refuses read-only arrays)


def to_input(pixels: np.ndarray, device: str) -> torch.Tensor:
    """(h, w) uint8 -> (3, h, w) float32 in [0, 1] on ``device`` (moved as uint8, expanded there)."""
    torch = _torch()
    grey = torch.from_numpy(pixels).to(device).float().div_(255.0)
    return grey.expand(3, *grey.shape)


def hflip(image: TrainingImage) -> TrainingImage:
    """The image mirrored left-right: boxes mirrored, quadrants swapped (the patient's sides trade places)."""
    width = image.pixels.shape[1]
    boxes = image.boxes.copy()
    boxes[:, [0, 2]] = width - image.boxes[:, [2, 0]]
    ids = dict(image.ids)
    ids[QUADRANT] = MIRRORED_QUADRANT[image.ids[QUADRANT]]
    return TrainingImage(np.ascontiguousarray(image.pixels[:, ::-1]), boxes, ids)


def read_training_set(public_dir: Path) -> list[TrainingImage]:
    path = public_dir / "train" / "annotations.json"
    if not path.is_file():
        raise TaskDataMissingError(f"{path} is missing", hint="run `rexmle prepare dentex` first")
    doc = read_json(path, what="training annotations", limit=1 << 30)
    by_image: dict[int, list[dict[str, Any]]] = {}
    for ann in doc["annotations"]:
        by_image.setdefault(int(ann["image_id"]), []).append(ann)
    images = []
    for info in doc["images"]:
        anns = [a for a in by_image.get(int(info["id"]), []) if a["bbox"][2] > 1 and a["bbox"][3] > 1]
        boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)],
                         dtype=np.float32).reshape(-1, 4)
        ids = {s.key: np.array([int(a[s.key]) for a in anns], dtype=np.int64) for s in LABEL_SETS}
        images.append(TrainingImage(read_xray(public_dir / "train" / "images" / Path(info["file_name"]).name),
                                    boxes, ids))
    return images


def find_test_image(public_dir: Path, case_id: str) -> Path:
    matches = [p for p in (public_dir / "test" / "images").glob(f"{case_id}.*") if p.suffix.lower() in IMAGE_SUFFIXES]
    if len(matches) != 1:
        raise TaskDataMissingError(f"expected one test image {case_id}.png/.jpg in {public_dir / 'test' / 'images'}, "
                                   f"found {len(matches)}", hint="run `rexmle prepare dentex` first")
    return matches[0]


def frozen_bn(params: Any) -> bool:
    value = str(params["frozen_bn"]).lower()
    if value not in ("auto", "true", "false"):
        raise UserInputError(f"frozen_bn must be auto, true or false, got {params['frozen_bn']!r}",
                             hint="--set frozen_bn=auto (frozen with pretrained weights)")
    return value == "true" or (value == "auto" and bool(params.get("pretrained")))


def build_detector(params: Any, num_classes: int, ctx: BaselineContext | None = None) -> torch.nn.Module:
    """A torchvision Faster R-CNN on a timm ResNet + torchvision FPN backbone, nothing loaded from a hub
    (``pretrained`` weights of the local cache or file go to the ResNet)."""
    timm = require_module("timm", extra="timm", package="rexmle-baselines")
    detection = _torchvision().models.detection
    resnet = create_backbone(params, in_chans=3, num_classes=0, ctx=ctx)
    if not isinstance(resnet, timm.models.resnet.ResNet):
        raise UserInputError(f"backbone {params['model']!r} is not a timm ResNet",
                             hint="use a timm ResNet (resnet10t, resnet18, resnet34, resnet50, ...)")
    if frozen_bn(params):
        resnet = timm.layers.freeze_batch_norm_2d(resnet)
    trainable = int(params["trainable_layers"])
    if not 0 <= trainable <= 5:
        raise UserInputError(f"trainable_layers must be 0-5, got {trainable}", hint="torchvision's default is 3")
    frozen_stages = ["conv1", "layer1", "layer2", "layer3", "layer4"][: 5 - trainable]
    for name, parameter in resnet.named_parameters():
        if name.split(".")[0] in frozen_stages or (name.startswith("bn1") and "conv1" in frozen_stages):
            parameter.requires_grad_(False)
    layers = [int(k) for k in params["returned_layers"]]
    # timm ResNets run their children in order, as torchvision's IntermediateLayerGetter requires
    widths = {info["module"]: int(info["num_chs"]) for info in resnet.feature_info}
    backbone = detection.backbone_utils.BackboneWithFPN(
        resnet, return_layers={f"layer{k}": str(n) for n, k in enumerate(layers)},
        in_channels_list=[widths[f"layer{k}"] for k in layers], out_channels=int(params["fpn_channels"]))
    sizes = tuple((int(s),) for s in params["anchor_sizes"])
    if len(sizes) != len(layers) + 1:  # one anchor size per FPN level, plus the extra max-pooled level
        raise UserInputError(f"anchor_sizes needs {len(layers) + 1} sizes for returned_layers {layers}, got "
                             f"{len(sizes)}", hint="give one anchor size per returned layer plus one")
    ratios = (tuple(float(r) for r in params["aspect_ratios"]),) * len(sizes)
    anchors = detection.anchor_utils.AnchorGenerator(sizes=sizes, aspect_ratios=ratios)
    pooled = backbone.out_channels * 7 * 7  # times the RoI-align output size of torchvision's default box head
    representation = int(params["representation_size"])
    proposals = int(params["proposals_per_image"])
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if params.get("pretrained") else ((0.5,) * 3, (0.25,) * 3)
    return detection.FasterRCNN(
        backbone, rpn_anchor_generator=anchors, min_size=int(params["min_size"]), max_size=int(params["max_size"]),
        image_mean=list(mean), image_std=list(std), box_detections_per_img=100,
        box_score_thresh=float(params["score_threshold"]),
        rpn_pre_nms_top_n_train=2 * proposals, rpn_post_nms_top_n_train=proposals,
        rpn_pre_nms_top_n_test=proposals, rpn_post_nms_top_n_test=proposals // 2,
        box_batch_size_per_image=int(params["rois_per_image"]),
        box_head=detection.faster_rcnn.TwoMLPHead(pooled, representation),
        box_predictor=detection.faster_rcnn.FastRCNNPredictor(representation, num_classes + 1),
    )


def train_detector(images: list[TrainingImage], level: Level, ctx: BaselineContext, *,
                   phases: int = 1) -> torch.nn.Module:
    """Faster R-CNN for one level (class = id + 1; 0 is the background), SGD with momentum and a one-cycle
    schedule (its length fitted to the time budget in a time-aware config); with ``hflip`` each X-ray is mirrored
    (quadrants swapped) half of the time. The mean epoch loss is checked for divergence."""
    torch = _torch()
    params = ctx.params
    model = build_detector(params, level.n_classes, ctx).to(ctx.device)
    epochs, batch_size = int(params["epochs"]), int(params["batch_size"])
    steps_per_epoch = -(-len(images) // batch_size)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.SGD(trainable, lr=float(params["lr"]), momentum=0.9,
                                weight_decay=float(params["weight_decay"]))
    plan = EpochPlan(ctx, epochs, phases=phases, what=f"{level.name} detector, ")
    warmup = max(1, min(steps_per_epoch * epochs // 10, 1000))
    generator = torch.Generator().manual_seed(ctx.seed)
    model.train()
    last_finite: float | None = None
    epoch, step, clock = 0, 0, StepClock()
    while epoch < plan.total:
        epoch += 1
        order = torch.randperm(len(images), generator=generator).tolist()
        flips = (torch.rand(len(images), generator=generator) < 0.5).tolist()
        total, batches = 0.0, 0
        for start in range(0, len(order), batch_size):
            batch = [hflip(images[k]) if params["hflip"] and flips[k] else images[k]
                     for k in order[start:start + batch_size]]
            inputs = [to_input(im.pixels, ctx.device) for im in batch]
            targets = [{"boxes": torch.from_numpy(im.boxes).to(ctx.device),
                        "labels": torch.from_numpy(level.classes(im.ids) + 1).to(ctx.device)} for im in batch]
            # linear warm-up, then cosine decay over the (possibly re-planned) schedule
            total_steps = max(warmup + 1, plan.total * steps_per_epoch)
            if step < warmup:
                factor = (step + 1) / warmup
            else:
                factor = 0.5 * (1 + np.cos(np.pi * (step - warmup) / (total_steps - warmup)))
            for group in optimiser.param_groups:
                group["lr"] = float(params["lr"]) * factor
            with autocast(ctx):
                loss = sum(model(inputs, targets).values())
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 10.0)
            optimiser.step()
            clock.tick()
            total += float(loss.detach())
            batches += 1
            step += 1
        last_finite = end_epoch(ctx, epoch, plan.total, total / batches, last_finite,
                                what=f"{level.name} detector, ")
        plan.after_epoch()
    record_speed(ctx, clock=clock, what=level.name)
    return model.eval()


def detect(model: torch.nn.Module, pixels: np.ndarray, ctx: BaselineContext) -> list[Detection]:
    torch = _torch()
    with torch.no_grad(), autocast(ctx):
        (output,) = model([to_input(pixels, ctx.device)])
    return [Detection(tuple(float(v) for v in box), int(label) - 1, float(score))
            for box, label, score in zip(output["boxes"].float().cpu().numpy(), output["labels"].cpu().numpy(),
                                         output["scores"].float().cpu().numpy(), strict=True)]


def _iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union if union > 0 else 0.0


def _centre_distance(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return float(np.hypot((a[0] + a[2] - b[0] - b[2]) / 2, (a[1] + a[3] - b[1] - b[3]) / 2))


def id_from(box: tuple[float, ...], candidates: list[Detection], fallback: int) -> int:
    """The id of the best-overlapping candidate (highest IoU, then score), else of the closest one."""
    if not candidates:
        return fallback
    best = max(candidates, key=lambda c: (_iou(box, c.box), c.score))
    if _iou(box, best.box) > 0:
        return best.label
    return min(candidates, key=lambda c: _centre_distance(box, c.box)).label


def assign_hierarchically(box: tuple[float, ...], quadrants: list[Detection], teeth: list[Detection],
                          fallback: dict[str, int]) -> tuple[int, int]:
    """(quadrant, tooth) of a diagnosis box: the quadrant from the quadrant detector (or, without one, from the
    enumeration detector's FDI tooth), then the tooth from the enumeration boxes of that quadrant only (any
    quadrant's when it has none)."""
    fdi_fallback = fallback[QUADRANT] * TEETH_PER_QUADRANT + fallback[TOOTH]
    quadrant = id_from(box, quadrants, id_from(box, teeth, fdi_fallback) // TEETH_PER_QUADRANT)
    same_quadrant = [t for t in teeth if t.label // TEETH_PER_QUADRANT == quadrant]
    fdi = id_from(box, same_quadrant or teeth, quadrant * TEETH_PER_QUADRANT + fallback[TOOTH])
    return quadrant, fdi % TEETH_PER_QUADRANT


@register_baseline
class DentexDetector(Baseline):
    name: ClassVar[str] = "detector"
    extra: ClassVar[str] = "timm"  # the backbones are timm ResNets
    requires: ClassVar[tuple[str, ...]] = ("torch", "torchvision", "timm")
    description: ClassVar[str] = ("torchvision Faster R-CNN (timm ResNet + FPN) per DENTEX label level (quadrant, "
                                  "FDI tooth, diagnosis), merged top-down; flips swap quadrants")
    # the torchvision/Detectron2 recipe's SGD 0.02 is for 16 images per step: 0.005 at 4 (linear scaling)
    _full: ClassVar[dict[str, Any]] = {
        "model": "resnet50", "pretrained": "resnet50.tv2_in1k", "frozen_bn": "auto", "trainable_layers": 3,
        "min_size": 1024, "max_size": 2048, "returned_layers": (1, 2, 3, 4), "fpn_channels": 256,
        "anchor_sizes": (32, 64, 128, 256, 512), "aspect_ratios": (0.5, 1.0, 2.0, 3.0), "epochs": 60,
        "batch_size": 4, "lr": 0.005, "proposals_per_image": 2000, "rois_per_image": 512, "representation_size": 1024,
        "weight_decay": 1e-4, "score_threshold": 0.01, "hflip": True, "amp": True, "deterministic": False,
        "time_aware": False, "reserve_s": 600.0}
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        # CPU minutes on small X-rays (the synthetic mirror's are 256 x 128, its teeth 9-12 px wide and 35-50 px
        # tall): they are enlarged 1.5 times so that a tooth spans about two cells of the finest (stride 8) FPN level
        # (at their own size the boxes came out too loose for IoU 0.5), the smallest anchors (30 px at ratios 1, 2,
        # 4: 30 x 30 to 15 x 60) fit the enlarged teeth, and one X-ray per step gives 8 SGD steps per epoch on the
        # 8 training X-rays of a quick run instead of 4; trained from scratch, so every layer and BatchNorm learns
        "quick": {**_full, "model": "resnet10t", "pretrained": None, "trainable_layers": 5, "min_size": 192,
                  "max_size": 384, "returned_layers": (2, 3, 4), "fpn_channels": 64,
                  "anchor_sizes": (30, 60, 120, 240), "aspect_ratios": (1.0, 2.0, 4.0), "epochs": 12,
                  "batch_size": 1, "lr": 0.02, "proposals_per_image": 300, "rois_per_image": 64,
                  "representation_size": 128, "hflip": False, "amp": False, "deterministic": True, "reserve_s": 0.0},
        "budget": {**_full, "time_aware": True},
        "full": _full,
        "smoke": {**_full, "pretrained": None, "trainable_layers": 5, "epochs": 1, "reserve_s": 0.0},
    }

    def supports(self, task_id: str, grader_id: str) -> bool:
        return grader_id == DENTEX_GRADER

    def estimated_steps(self, params: Any, n_train: int) -> int | None:
        return len(LEVELS) * int(params["epochs"]) * -(-n_train // int(params["batch_size"]))

    def run(self, ctx: BaselineContext) -> None:
        prepare_run(ctx)
        frozen_bn(ctx.params)  # refuse a bad setting before any work
        images = read_training_set(ctx.public_dir)
        n_boxes = sum(len(im.boxes) for im in images)
        if n_boxes == 0:
            raise TaskDataMissingError("the training annotations hold no boxes", hint="re-run `rexmle prepare dentex`")
        ctx.log(f"{len(images)} training X-rays ({sum(im.pixels.nbytes for im in images) / 2**20:.0f} MiB as uint8), "
                f"{n_boxes} abnormal-tooth boxes")
        models = {level.name: train_detector(images, level, ctx, phases=len(LEVELS) - k)
                  for k, level in enumerate(LEVELS)}
        fallback = {s.key: Counter(int(v) for im in images for v in im.ids[s.key]).most_common(1)[0][0]
                    for s in LABEL_SETS}
        grader = get_grader(ctx.grader_id)
        (column,) = grader.schema.file_columns
        manifest = TestManifest.read(ctx.public_dir)

        def write(case_id: str, path: Path) -> None:
            pixels = read_xray(find_test_image(ctx.public_dir, case_id))
            found = {level.name: detect(models[level.name], pixels, ctx) for level in LEVELS}
            boxes = []
            for det in found["diagnosis"]:
                x0, y0, x1, y1 = det.box
                quadrant, tooth = assign_hierarchically(det.box, found["quadrant"], found["enumeration"], fallback)
                boxes.append({"bbox": [x0, y0, x1 - x0, y1 - y0], QUADRANT: quadrant, TOOTH: tooth,
                              DIAGNOSIS: det.label, "score": det.score})
            path.write_text(json.dumps(boxes))

        write_file_submission(ctx.out_dir, grader.schema, column, manifest.ids, write)
        ctx.log(f"wrote detections for {len(manifest.ids)} test X-rays")
