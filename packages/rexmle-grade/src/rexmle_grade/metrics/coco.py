"""COCO box-detection metrics (AP, AP50, AP75, AR@100) for one label set, computed by pycocotools.

Used by DENTEX (metrics page ``dentex_us_ldct.md`` §1), whose official evaluator runs a default
``COCOeval(gt, dt, 'bbox')`` per label set and reports ``stats[0]`` (AP over IoU 0.50:0.95), ``stats[1]`` (AP50),
``stats[2]`` (AP75) and ``stats[8]`` (AR, 100 detections per image and category, all areas). Boxes are
``[x, y, w, h]`` in pixels. A category with no ground truth is left out of every average; if no category has
ground truth every value is -1 (pycocotools' marker).

The one departure: the official evaluator crashes on an empty detection set (``COCO.loadRes`` indexes the first
result). Here the detection set is built directly (as ``loadRes`` builds it for boxes), so an empty set is scored
like any other: AP = AR = 0 for every category with ground truth.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class GroundTruthBox:
    image_id: int
    bbox: Box  # x, y, w, h
    category_id: int
    area: float | None = None  # only used by the small/medium/large ranges, which none of the scores use
    iscrowd: int = 0


@dataclass(frozen=True)
class DetectedBox:
    image_id: int
    bbox: Box  # x, y, w, h
    category_id: int
    score: float


@dataclass(frozen=True)
class CocoBoxScores:
    ap: float
    ap50: float
    ap75: float
    ar100: float


def _coco(dataset: dict[str, Any]) -> COCO:
    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        coco.createIndex()
    return coco


def coco_box_scores(image_ids: Sequence[int], category_ids: Sequence[int], ground_truth: Sequence[GroundTruthBox],
                    detections: Sequence[DetectedBox]) -> CocoBoxScores:
    """Default ``COCOeval`` box metrics pooled over ``image_ids`` for the categories ``category_ids``.

    Detections whose category is not in ``category_ids`` are ignored (as pycocotools ignores them); detections on
    images outside ``image_ids`` are a caller error.
    """
    known_images = set(image_ids)
    stray = {d.image_id for d in detections} - known_images
    if stray:
        raise ValueError(f"detections on images that are not in the ground truth: {sorted(stray)[:10]}")
    images = [{"id": i} for i in image_ids]
    categories = [{"id": c} for c in category_ids]
    gt_annotations = [
        {"id": n, "image_id": g.image_id, "bbox": list(g.bbox), "category_id": g.category_id,
         "area": g.bbox[2] * g.bbox[3] if g.area is None else g.area, "iscrowd": g.iscrowd}
        for n, g in enumerate(ground_truth, start=1)
    ]
    dt_annotations = [
        {"id": n, "image_id": d.image_id, "bbox": list(d.bbox), "category_id": d.category_id, "score": d.score,
         "area": d.bbox[2] * d.bbox[3], "iscrowd": 0}
        for n, d in enumerate(detections, start=1)
    ]
    gt = _coco({"images": images, "categories": categories, "annotations": gt_annotations})
    dt = _coco({"images": images, "categories": categories, "annotations": dt_annotations})
    evaluation = COCOeval(gt, dt, "bbox")
    with contextlib.redirect_stdout(io.StringIO()):
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    stats = evaluation.stats
    return CocoBoxScores(ap=float(stats[0]), ap50=float(stats[1]), ap75=float(stats[2]), ar100=float(stats[8]))
