"""DENTEX 2023: hierarchical detection of abnormal teeth (quadrant, tooth number, diagnosis) on panoramic X-rays.

Download (Zenodo 7812323, ``training_data.zip``; DATA_LAYOUTS.md §7)::

    training_data/quadrant/                      xrays/*.png + train_quadrant.json
    training_data/quadrant_enumeration/          xrays/*.png + train_quadrant_enumeration.json
    training_data/quadrant-enumeration-disease/  xrays/*.png + train_quadrant_enumeration_disease.json   (used)
    training_data/unlabelled/                    xrays/*.png

The task uses the fully labelled subset only: a COCO-like JSON whose annotations carry three 0-based label ids,
``category_id_1`` (quadrant 0-3 = FDI 1-4), ``category_id_2`` (tooth 0-7 = 1-8) and ``category_id_3`` (0 Impacted,
1 Caries, 2 Periapical Lesion, 3 Deep Caries), with ``categories_1/2/3`` lists. As in the release, the JSON is
found by searching the subset folder and images are matched on ``file_name``. Case id = image file stem
(``train_7``). The test ground truth is one COCO JSON (images, annotations, the three category lists).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from scipy import ndimage

from rexmle_grade.errors import TaskDataMissingError
from rexmle_grade.grader import TestManifest
from rexmle_grade.io import Geometry
from rexmle_tasks.base import PrepareContext, TaskFamily, register_family
from rexmle_tasks.families.synth2d import (
    copy_file,
    ellipse_mask,
    encode_image,
    find_in_raw,
    image_size,
    smooth_noise,
    to_uint8,
    write_csv,
    write_zip,
)

log = logging.getLogger(__name__)

ARCHIVE = "training_data.zip"
SUBSET = "quadrant-enumeration-disease"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
DIAGNOSES = ("Impacted", "Caries", "Periapical Lesion", "Deep Caries")
GT_JSON = "test_annotations.json"


def find_subset(raw: Path) -> tuple[Path, dict[str, Path]]:
    """The disease subset's annotation JSON and {file name: image path} of its images."""
    folders = [p for p in find_in_raw(raw, SUBSET) if p.is_dir()]
    if len(folders) != 1:
        raise TaskDataMissingError(
            f"expected one folder named {SUBSET!r} under {raw}, found {len(folders)}: {[str(f) for f in folders]}",
            hint=f"{ARCHIVE} unpacks to training_data/{SUBSET}/; re-run with --force to extract it again",
        )
    jsons = find_in_raw(folders[0], "*.json")
    if len(jsons) != 1:
        raise TaskDataMissingError(f"expected one annotation JSON in {folders[0]}, found {[p.name for p in jsons]}")
    images: dict[str, Path] = {}
    for path in find_in_raw(folders[0], "*"):
        if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
            if path.name in images:
                raise TaskDataMissingError(f"two images named {path.name!r}: {images[path.name]} and {path}")
            images[path.name] = path
    return jsons[0], images


def load_coco(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TaskDataMissingError(f"cannot read {path}: {exc}", hint="re-extract the archive with --force") from None
    missing = [k for k in ("images", "annotations", "categories_1", "categories_2", "categories_3") if k not in doc]
    if missing:
        raise TaskDataMissingError(f"{path} lacks the keys {missing} of the DENTEX disease annotation file")
    return doc


def subset_coco(doc: dict[str, Any], stems: set[str]) -> dict[str, Any]:
    """The annotation file restricted to the images whose file stem is in ``stems``."""
    images = [img for img in doc["images"] if Path(img["file_name"]).stem in stems]
    ids = {img["id"] for img in images}
    return {"images": images, "annotations": [a for a in doc["annotations"] if a["image_id"] in ids],
            "categories_1": doc["categories_1"], "categories_2": doc["categories_2"],
            "categories_3": doc["categories_3"]}


@register_family
class DentexFamily(TaskFamily):
    name: ClassVar[str] = "dentex"

    def case_ids(self, raw: Path) -> list[str]:
        json_path, images = find_subset(raw)
        listed = [Path(img["file_name"]).name for img in load_coco(json_path)["images"]]
        absent = [name for name in listed if name not in images]
        if absent:
            log.warning("%d image(s) listed in %s are missing and left out: %s", len(absent), json_path.name,
                        ", ".join(absent[:5]))
        stems = [Path(name).stem for name in listed if name in images]
        if len(set(stems)) != len(stems):
            raise TaskDataMissingError(f"{json_path} lists some image file stem more than once")
        return sorted(stems)

    def prepare(self, ctx: PrepareContext) -> TestManifest:
        json_path, images = find_subset(ctx.raw)
        doc = load_coco(json_path)
        by_stem = {Path(img["file_name"]).stem: images[Path(img["file_name"]).name]
                   for img in doc["images"] if Path(img["file_name"]).name in images}
        for split, ids in (("train", ctx.split.train), ("test", ctx.split.test)):
            for case_id in ids:
                copy_file(by_stem[case_id], ctx.public / split / "images" / by_stem[case_id].name)
        train_doc = subset_coco(doc, set(ctx.split.train))
        (ctx.public / "train" / "annotations.json").write_text(json.dumps(train_doc) + "\n")
        (ctx.private / GT_JSON).write_text(json.dumps(subset_coco(doc, set(ctx.split.test))) + "\n")
        write_csv(ctx.private / "answers.csv", ["image_id", "coco_json"],
                  [(case_id, GT_JSON) for case_id in ctx.split.test])
        geometry = {case_id: Geometry(size=image_size(by_stem[case_id])) for case_id in ctx.split.test}
        return TestManifest(ids=tuple(ctx.split.test), geometry=geometry)

    # ---- synthetic mirror --------------------------------------------------------------------------------------
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        members: list[tuple[str, bytes]] = []
        subsets = (("quadrant", "train_quadrant.json", 2), ("quadrant_enumeration",
                   "train_quadrant_enumeration.json", 2), (SUBSET, "train_quadrant_enumeration_disease.json", cases))
        for folder, json_name, count in subsets:
            images, annotations = [], []
            number = 0
            for image_id in range(1, count + 1):
                number += int(rng.integers(1, 4))  # real names have gaps (train_0, train_2, train_10, ...)
                file_name = f"train_{number}.png"
                pixels, teeth = synthetic_xray(rng)
                members.append((f"training_data/{folder}/xrays/{file_name}", encode_image(pixels, ".png")))
                images.append({"id": image_id, "file_name": file_name, "width": XRAY_WIDTH, "height": XRAY_HEIGHT})
                annotations += _annotations(folder, teeth, image_id, start=len(annotations) + 1)
            members.append((f"training_data/{folder}/{json_name}",
                            json.dumps({"images": images, "annotations": annotations, **_categories(folder)},
                                       indent=1).encode()))
        for number in (3, 8):
            pixels, _ = synthetic_xray(rng)
            members.append((f"training_data/unlabelled/xrays/train_{number}.png", encode_image(pixels, ".png")))
        write_zip(downloads / ARCHIVE, members)


# ---- synthetic panoramic X-rays -----------------------------------------------------------------------------------
XRAY_WIDTH, XRAY_HEIGHT = 256, 128
TOOTH_WIDTHS = (9, 9, 10, 10, 11, 12, 12, 12)  # central incisor (tooth 1) to third molar (tooth 8)
TOOTH_GAP = 3


def _categories(folder: str) -> dict[str, list[dict[str, Any]]]:
    quadrants = [{"id": i, "name": str(i + 1), "supercategory": str(i + 1)} for i in range(4)]
    if folder == "quadrant":
        return {"categories": quadrants}
    teeth = [{"id": i, "name": str(i + 1), "supercategory": str(i + 1)} for i in range(8)]
    if folder == "quadrant_enumeration":
        return {"categories_1": quadrants, "categories_2": teeth}
    diagnoses = [{"id": i, "name": n, "supercategory": n} for i, n in enumerate(DIAGNOSES)]
    return {"categories_1": quadrants, "categories_2": teeth, "categories_3": diagnoses}


def _annotations(folder: str, teeth: list[dict[str, Any]], image_id: int, start: int) -> list[dict[str, Any]]:
    """COCO records of one image in the schema of ``folder``: the quadrant subset boxes whole quadrants, the
    enumeration subset every tooth, the disease subset only the abnormal teeth."""
    records: list[dict[str, Any]] = []

    def add(box: list[float], **labels: int) -> None:
        x, y, w, h = box
        records.append({"id": start + len(records), "image_id": image_id, "bbox": [x, y, w, h],
                        "area": round(0.85 * w * h, 1), "iscrowd": 0, **labels})

    if folder == "quadrant":
        for quadrant in range(4):
            boxes = np.array([t["bbox"] for t in teeth if t["quadrant"] == quadrant])
            x0, y0 = boxes[:, 0].min(), boxes[:, 1].min()
            x1, y1 = (boxes[:, 0] + boxes[:, 2]).max(), (boxes[:, 1] + boxes[:, 3]).max()
            add([round(float(x0), 1), round(float(y0), 1), round(float(x1 - x0), 1), round(float(y1 - y0), 1)],
                category_id=quadrant)
    for tooth in teeth:
        if folder == "quadrant_enumeration":
            add(tooth["bbox"], category_id_1=tooth["quadrant"], category_id_2=tooth["tooth"])
        elif folder == SUBSET and tooth["diagnosis"] is not None:
            add(tooth["bbox"], category_id_1=tooth["quadrant"], category_id_2=tooth["tooth"],
                category_id_3=tooth["diagnosis"])
    return records


def synthetic_xray(rng: np.random.Generator) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """A greyscale panoramic-like image: 32 bright teeth around a dark occlusal gap, FDI quadrants laid out as on
    a real panoramic view (quadrant 1 = patient's upper right = image upper left). 1-4 teeth are abnormal: caries
    (small dark crown spot), deep caries (large dark spot reaching the pulp), periapical lesion (dark halo at the
    root tip, inside the box) or an impacted third molar (tilted and sunk into the bone)."""
    shape = (XRAY_HEIGHT, XRAY_WIDTH)
    image = 70 + 12 * smooth_noise(rng, shape, 12)
    rows = np.arange(XRAY_HEIGHT)[:, None]
    image += 25 * np.exp(-(((rows - XRAY_HEIGHT / 2) / 34.0) ** 2))  # the jaw bones around the teeth
    midline = XRAY_WIDTH / 2 + rng.uniform(-4, 4)
    occlusal = XRAY_HEIGHT / 2 + rng.uniform(-3, 3)
    abnormal = set(rng.choice(32, size=int(rng.integers(1, 5)), replace=False).tolist())
    teeth = []
    for quadrant in range(4):
        upper, viewer_left = quadrant in (0, 1), quadrant in (0, 3)
        offset = TOOTH_GAP / 2
        for tooth, width in enumerate(TOOTH_WIDTHS):
            centre_x = midline + (-1 if viewer_left else 1) * (offset + width / 2)
            offset += width + TOOTH_GAP
            length = rng.uniform(38, 46)
            diagnosis = None
            if quadrant * 8 + tooth in abnormal:
                diagnosis = 0 if tooth == 7 else int(rng.integers(1, 4))
            sign = -1 if upper else 1  # roots grow away from the occlusal gap
            top = occlusal + sign * 3
            sink = 8 if diagnosis == 0 else 0
            centre_y = top + sign * (sink + length / 2)
            angle = rng.uniform(0.5, 0.7) * (1 if viewer_left else -1) if diagnosis == 0 else rng.uniform(-0.04, 0.04)
            body = ellipse_mask(shape, (centre_y, centre_x), (length / 2, width / 2), angle)
            image[body] = 185 + rng.normal(0, 4)
            crown = body & ellipse_mask(shape, (top + sign * (sink + 7), centre_x), (7, width / 2 + 1))
            image[crown] += 30  # enamel
            box_mask = body.copy()
            if diagnosis in (1, 3):
                # a small cavity in the enamel, or a large one reaching towards the pulp, inside the crown
                radii = (2.0, 1.4) if diagnosis == 1 else (4.5, 2.0)
                spot = (top + sign * (sink + 9 + radii[0] / 2), centre_x + rng.uniform(-0.5, 0.5))
                image[ellipse_mask(shape, spot, radii)] = 55
            elif diagnosis == 2:
                apex_y = top + sign * length
                lesion = ellipse_mask(shape, (apex_y, centre_x), (5.5, 6.0))
                image[lesion & ~body] = 30
                box_mask |= lesion
            ys, xs = np.nonzero(box_mask)
            bbox = [float(xs.min()), float(ys.min()), float(xs.max() + 1 - xs.min()), float(ys.max() + 1 - ys.min())]
            teeth.append({"quadrant": quadrant, "tooth": tooth, "diagnosis": diagnosis, "bbox": bbox})
    image = ndimage.gaussian_filter(image, 0.7) + rng.normal(0, 5, shape)
    return to_uint8(image), teeth
