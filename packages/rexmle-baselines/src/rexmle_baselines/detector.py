"""``detector``: torchvision Faster R-CNN for DENTEX's hierarchical labels (quadrant, tooth number, diagnosis).

One torchvision Faster R-CNN per label level is trained on the abnormal-tooth boxes of the public training JSON;
its backbone is a timm ResNet under torchvision's FPN, built from configs (``pretrained=False``; a ``pretrained``
parameter names a local weights file, never a hub id). The diagnosis detector decides which teeth are abnormal
and where; each of its boxes takes its quadrant and tooth number from the best-overlapping box of the quadrant and
enumeration detectors (the closest box when none overlaps, the training set's most frequent id when that detector
found nothing). The X-rays are grey: the channel is repeated three times for the ResNet stem. Images are never
flipped, since a left-right flip changes the quadrant.
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
    end_epoch,
    isolate_caches,
    register_baseline,
    resolve_device,
    seed_everything,
)
from rexmle_baselines.timm_models import create_backbone
from rexmle_grade.errors import TaskDataMissingError, UserInputError, require_module
from rexmle_grade.grader import TestManifest, get_grader
from rexmle_grade.graders._images2d import write_file_submission
from rexmle_grade.graders.dentex import LABEL_SETS, LabelSet
from rexmle_grade.io import read_image_2d, read_json

if TYPE_CHECKING:
    import torch

DENTEX_GRADER = "dentex"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class Detection:
    box: tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels
    label: int  # 0-based id of the detector's label set
    score: float


@dataclass(frozen=True)
class TrainingImage:
    pixels: np.ndarray  # (3, h, w) float32 in [0, 1]
    boxes: np.ndarray  # (n, 4) x0, y0, x1, y1
    ids: dict[str, np.ndarray]  # label-set key -> (n,) 0-based ids


def _torch() -> Any:
    return require_module("torch", extra="torch", package="rexmle-baselines")


def _torchvision() -> Any:
    return require_module("torchvision", extra="torch", package="rexmle-baselines")


def read_xray(path: Path) -> np.ndarray:
    pixels = read_image_2d(path, what="X-ray", allow_channels=True)
    if pixels.ndim == 3:  # a colour-saved X-ray: its channels are equal, keep one
        pixels = pixels[..., 0]
    scale = 65535.0 if pixels.dtype == np.uint16 else 255.0
    return np.repeat((pixels.astype(np.float32) / scale)[None], 3, axis=0)


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


def build_detector(params: Any, num_classes: int) -> torch.nn.Module:
    """A torchvision Faster R-CNN on a timm ResNet + torchvision FPN backbone, nothing loaded from a hub (a
    ``pretrained`` local file goes to the ResNet)."""
    timm = require_module("timm", extra="timm", package="rexmle-baselines")
    detection = _torchvision().models.detection
    resnet = create_backbone(params, in_chans=3, num_classes=0)
    if not isinstance(resnet, timm.models.resnet.ResNet):
        raise UserInputError(f"backbone {params['model']!r} is not a timm ResNet",
                             hint="use a timm ResNet (resnet10t, resnet18, resnet34, resnet50, ...)")
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
    return detection.FasterRCNN(
        backbone, rpn_anchor_generator=anchors, min_size=int(params["min_size"]), max_size=int(params["max_size"]),
        image_mean=[0.5] * 3, image_std=[0.25] * 3, box_detections_per_img=100,
        box_score_thresh=float(params["score_threshold"]),
        rpn_pre_nms_top_n_train=2 * proposals, rpn_post_nms_top_n_train=proposals,
        rpn_pre_nms_top_n_test=proposals, rpn_post_nms_top_n_test=proposals // 2,
        box_batch_size_per_image=int(params["rois_per_image"]),
        box_head=detection.faster_rcnn.TwoMLPHead(pooled, representation),
        box_predictor=detection.faster_rcnn.FastRCNNPredictor(representation, num_classes + 1),
    )


def train_detector(images: list[TrainingImage], label_set: LabelSet, ctx: BaselineContext) -> torch.nn.Module:
    """Faster R-CNN for one label set (class = id + 1; 0 is the background), SGD with momentum and a one-cycle
    schedule; the mean epoch loss is checked for divergence."""
    torch = _torch()
    params = ctx.params
    model = build_detector(params, label_set.n_ids).to(ctx.device)
    epochs, batch_size = int(params["epochs"]), int(params["batch_size"])
    optimiser = torch.optim.SGD(model.parameters(), lr=float(params["lr"]), momentum=0.9,
                                weight_decay=float(params["weight_decay"]))
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=float(params["lr"]), total_steps=epochs *
                                                   -(-len(images) // batch_size), pct_start=0.1)
    generator = torch.Generator().manual_seed(ctx.seed)
    model.train()
    last_finite: float | None = None
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(images), generator=generator).tolist()
        total, batches = 0.0, 0
        for start in range(0, len(order), batch_size):
            batch = [images[k] for k in order[start:start + batch_size]]
            inputs = [torch.from_numpy(im.pixels).to(ctx.device) for im in batch]
            targets = [{"boxes": torch.from_numpy(im.boxes).to(ctx.device),
                        "labels": torch.from_numpy(im.ids[label_set.key] + 1).to(ctx.device)} for im in batch]
            loss = sum(model(inputs, targets).values())
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            optimiser.step()
            schedule.step()
            total += float(loss.detach())
            batches += 1
        last_finite = end_epoch(ctx, epoch, epochs, total / batches, last_finite, what=f"{label_set.name} detector, ")
    return model.eval()


def detect(model: torch.nn.Module, pixels: np.ndarray, device: str) -> list[Detection]:
    torch = _torch()
    with torch.no_grad():
        (output,) = model([torch.from_numpy(pixels).to(device)])
    return [Detection(tuple(float(v) for v in box), int(label) - 1, float(score))
            for box, label, score in zip(output["boxes"].cpu().numpy(), output["labels"].cpu().numpy(),
                                         output["scores"].cpu().numpy(), strict=True)]


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


@register_baseline
class DentexDetector(Baseline):
    name: ClassVar[str] = "detector"
    extra: ClassVar[str] = "timm"  # the backbones are timm ResNets
    requires: ClassVar[tuple[str, ...]] = ("torch", "torchvision", "timm")
    description: ClassVar[str] = ("torchvision Faster R-CNN (timm ResNet + FPN), one per DENTEX label level (quadrant, "
                                  "tooth, diagnosis), boxes merged by overlap")
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        # CPU minutes on small X-rays (the synthetic mirror's are 256 x 128, its teeth 9-12 px wide and 35-50 px
        # tall): they are enlarged 1.5 times so that a tooth spans about two cells of the finest (stride 8) FPN level
        # (at their own size the boxes came out too loose for IoU 0.5), the smallest anchors (30 px at ratios 1, 2,
        # 4: 30 x 30 to 15 x 60) fit the enlarged teeth, and one X-ray per step gives 8 SGD steps per epoch on the
        # 8 training X-rays of a quick run instead of 4
        "quick": {"model": "resnet10t", "pretrained": None, "min_size": 192, "max_size": 384,
                  "returned_layers": (2, 3, 4), "fpn_channels": 64,
                  "anchor_sizes": (30, 60, 120, 240), "aspect_ratios": (1.0, 2.0, 4.0), "epochs": 12,
                  "batch_size": 1, "lr": 0.02, "proposals_per_image": 300, "rois_per_image": 64,
                  "representation_size": 128, "weight_decay": 1e-4, "score_threshold": 0.01},
        # the torchvision/Detectron2 recipe's SGD 0.02 is for 16 images per step: 0.005 at 4 (linear scaling)
        "full": {"model": "resnet50", "pretrained": None, "min_size": 1024, "max_size": 2048,
                 "returned_layers": (1, 2, 3, 4), "fpn_channels": 256,
                 "anchor_sizes": (32, 64, 128, 256, 512), "aspect_ratios": (0.5, 1.0, 2.0, 3.0), "epochs": 60,
                 "batch_size": 4, "lr": 0.005, "proposals_per_image": 2000, "rois_per_image": 512,
                 "representation_size": 1024, "weight_decay": 1e-4, "score_threshold": 0.01},
    }

    def supports(self, task_id: str, grader_id: str) -> bool:
        return grader_id == DENTEX_GRADER

    def run(self, ctx: BaselineContext) -> None:
        isolate_caches(ctx.work_dir)
        resolve_device(ctx.device)
        seed_everything(ctx.seed)
        images = read_training_set(ctx.public_dir)
        n_boxes = sum(len(im.boxes) for im in images)
        if n_boxes == 0:
            raise TaskDataMissingError("the training annotations hold no boxes", hint="re-run `rexmle prepare dentex`")
        ctx.log(f"{len(images)} training X-rays, {n_boxes} abnormal-tooth boxes")
        models = {s.key: train_detector(images, s, ctx) for s in LABEL_SETS}
        most_frequent = {s.key: Counter(int(v) for im in images for v in im.ids[s.key]).most_common(1)[0][0]
                         for s in LABEL_SETS}
        diagnosis, *others = LABEL_SETS[::-1]
        grader = get_grader(ctx.grader_id)
        (column,) = grader.schema.file_columns
        manifest = TestManifest.read(ctx.public_dir)

        def write(case_id: str, path: Path) -> None:
            pixels = read_xray(find_test_image(ctx.public_dir, case_id))
            found = {s.key: detect(models[s.key], pixels, ctx.device) for s in LABEL_SETS}
            boxes = []
            for det in found[diagnosis.key]:
                x0, y0, x1, y1 = det.box
                boxes.append({"bbox": [x0, y0, x1 - x0, y1 - y0],
                              **{s.key: id_from(det.box, found[s.key], most_frequent[s.key]) for s in others},
                              diagnosis.key: det.label, "score": det.score})
            path.write_text(json.dumps(boxes))

        write_file_submission(ctx.out_dir, grader.schema, column, manifest.ids, write)
        ctx.log(f"wrote detections for {len(manifest.ids)} test X-rays")
