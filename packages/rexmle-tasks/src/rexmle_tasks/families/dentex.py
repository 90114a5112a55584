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

Synthetic mirrors write that archive: ``easy`` (fixed 256 x 128 X-rays, all 32 teeth in place) and ``realistic``
(varying sizes, exposure, missing and overlapping teeth, restorations, rare findings, label noise: see "the
realistic mirror" below).
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
    synthetic_difficulties: ClassVar[tuple[str, ...]] = ("easy", "realistic")

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
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int, difficulty: str = "easy") -> None:
        rng = np.random.default_rng(seed)
        make = realistic_xray if difficulty == "realistic" else synthetic_xray
        members: list[tuple[str, bytes]] = []
        subsets = (("quadrant", "train_quadrant.json", 2), ("quadrant_enumeration",
                   "train_quadrant_enumeration.json", 2), (SUBSET, "train_quadrant_enumeration_disease.json", cases))
        for folder, json_name, count in subsets:
            images, annotations = [], []
            number = 0
            for image_id in range(1, count + 1):
                number += int(rng.integers(1, 4))  # real names have gaps (train_0, train_2, train_10, ...)
                file_name = f"train_{number}.png"
                pixels, teeth = make(rng)
                members.append((f"training_data/{folder}/xrays/{file_name}", encode_image(pixels, ".png")))
                images.append({"id": image_id, "file_name": file_name, "width": int(pixels.shape[1]),
                               "height": int(pixels.shape[0])})
                annotations += _annotations(folder, teeth, image_id, start=len(annotations) + 1)
            members.append((f"training_data/{folder}/{json_name}",
                            json.dumps({"images": images, "annotations": annotations, **_categories(folder)},
                                       indent=1).encode()))
        for number in (3, 8):
            pixels, _ = make(rng)
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
            if not len(boxes):  # a fully edentulous quadrant (the realistic mirror's missing teeth)
                continue
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


# ---- the realistic mirror ----------------------------------------------------------------------------------------
# What the real panoramic X-rays add to the easy mirror, each one something that placing boxes where abnormal teeth
# usually are (or thresholding dark spots) gets wrong and a detector trained on the images learns to handle:
# - size: the release's X-rays are 1976-3076 px wide and 976-1536 px high (DATA_LAYOUTS.md §7), about 2:1; the
#   mirror draws them at about a tenth (232-320 px wide, height 0.47-0.53 of the width), and the dentition fills a
#   patient-dependent part of the field of view;
# - positioning: the occlusal plane curves up towards the molars (the "smile" of a panoramic view), the head is
#   tilted a little and the midline sits off the image centre, so a tooth's place in the image varies;
# - missing teeth: third molars are often absent and other teeth (first molars most) are extracted, more of them in
#   some patients; the neighbours drift into the gap, so a tooth's number cannot be read from its position, and
#   implants (bright screws, no label) stand in some gaps;
# - overlap: neighbouring teeth overlap in the projection (brighter where they do), an impacted third molar is tilted,
#   sunk into the bone and leans against the second molar;
# - restorations: fillings, crowns and root-canal fillings are saturated bright patches on healthy and diseased teeth;
# - anatomy: the pulp is a dark canal inside every tooth (as dark as a cavity to a threshold), the maxillary sinuses
#   and the palatoglossal air space are dark areas above the upper roots, the rami bright at both sides, and the
#   cervical spine sometimes leaves a ghost in the middle;
# - exposure: every X-ray has its own window and gamma, an illumination gradient, its own noise level, and the
#   anterior teeth lie outside the narrow focal trough (blurred);
# - class imbalance and small lesions: caries is by far the commonest finding and periapical lesions the rarest
#   (the reference documents give no counts; the mirror's rates give about 55 % caries, 20 % deep caries, 15 %
#   impacted, 10 % periapical lesions); a caries spot is 4-8 px across, larger and darker than a tenth of a real one
#   (1-3 px, lost in the blur), so that a lesion is as conspicuous to a detector as it is to a reader of the
#   release's full-resolution X-ray;
# - label noise: box edges drawn by hand (about a pixel off each), now and then a tooth number off by one, and a few
#   abnormal teeth left without a box.
# The ladder is measured on 96 cases (76 training and 20 test X-rays; the task's realistic_cases): over five secrets
# the atlas heuristic scores 0.007-0.022 ap_mean there, the quick detector (eight epochs) 0.044-0.077.
REALISTIC_WIDTH = (232, 320)
REALISTIC_ASPECT = (0.47, 0.53)
TOOTH_LENGTHS = (1.0, 0.97, 1.12, 0.96, 0.95, 0.92, 0.88, 0.84)  # relative root+crown length, canine longest
MISSING_RATES = (0.03, 0.03, 0.02, 0.05, 0.05, 0.10, 0.06, 0.35)  # per tooth 1-8 of an average patient
IMPACTED_RATE = 0.22  # of the third molars present
DISEASE_RATES = ((1, 0.07), (3, 0.025), (2, 0.012))  # caries, deep caries, periapical lesion per other tooth
RESTORATION_RATE, CROWN_RATE, ROOT_CANAL_RATE, IMPLANT_RATE = 0.14, 0.03, 0.04, 0.3
TOOTH_NUMBER_NOISE, MISSED_LABEL_RATE = 0.04, 0.04
CARIES_RADIUS = (2.2, 3.2)  # px at the mirror's scale: a lesion as conspicuous as a reader sees it in the release
ABSENT = -1  # a missing tooth in a patient's plan


def _ellipse(shape: tuple[int, int], centre: tuple[float, float], radii: tuple[float, float],
             angle: float = 0.0) -> np.ndarray:
    """:func:`ellipse_mask`, evaluated only on the ellipse's bounding square (the same pixels, a fraction of the
    work: the realistic X-ray draws some 150 small ellipses)."""
    mask = np.zeros(shape, dtype=bool)
    reach = max(radii) + 1
    r0, r1 = max(0, int(centre[0] - reach)), min(shape[0], int(centre[0] + reach) + 2)
    c0, c1 = max(0, int(centre[1] - reach)), min(shape[1], int(centre[1] + reach) + 2)
    if r0 < r1 and c0 < c1:
        mask[r0:r1, c0:c1] = ellipse_mask((r1 - r0, c1 - c0), (centre[0] - r0, centre[1] - c0), radii, angle)
    return mask


def _plan_teeth(rng: np.random.Generator) -> list[list[int | None]]:
    """Per quadrant, per tooth 1-8: its diagnosis (None: healthy), or ABSENT where the tooth is missing; at least
    one tooth of the X-ray is abnormal, as in the fully labelled subset."""
    patient = float(rng.choice([0.5, 1.0, 2.5], p=[0.4, 0.4, 0.2]))  # how many teeth this patient has lost
    plan: list[list[int | None]] = []
    for _quadrant in range(4):
        row: list[int | None] = []
        for tooth in range(8):
            if rng.uniform() < min(0.9, MISSING_RATES[tooth] * patient):
                row.append(ABSENT)
                continue
            diagnosis = None
            if tooth == 7:
                diagnosis = 0 if rng.uniform() < IMPACTED_RATE else None
            else:
                draw = rng.uniform()
                for code, rate in DISEASE_RATES:
                    if draw < rate:
                        diagnosis = code
                        break
                    draw -= rate
            row.append(diagnosis)
        plan.append(row)
    if not any(d is not None and d != ABSENT for row in plan for d in row):
        present = [(q, t) for q in range(4) for t in range(7) if plan[q][t] != ABSENT]
        quadrant, tooth = present[int(rng.integers(len(present)))]
        plan[quadrant][tooth] = 1
    return plan


def realistic_xray(rng: np.random.Generator) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """An X-ray of the realistic mirror and its teeth (quadrant, tooth, diagnosis, hand-drawn box); see above.
    Drawn as attenuation (bone about 0.35, a tooth adds about 0.45, restorations saturate), then exposed."""
    width = int(rng.integers(REALISTIC_WIDTH[0], REALISTIC_WIDTH[1] + 1))
    height = round(width * rng.uniform(*REALISTIC_ASPECT))
    shape = (height, width)
    rows, cols = np.mgrid[:height, :width].astype(np.float64)
    scale = width / XRAY_WIDTH * rng.uniform(0.84, 1.0)  # tooth widths: the dentition in the field of view
    vscale = height / XRAY_HEIGHT * rng.uniform(0.88, 1.04)
    midline = width / 2 + rng.uniform(-0.04, 0.04) * width
    level = height / 2 + rng.uniform(-0.05, 0.05) * height
    curve, tilt = rng.uniform(0.02, 0.09) * height, rng.uniform(-0.04, 0.04)
    half_span = 110 * scale

    def occlusal(x: np.ndarray | float) -> np.ndarray | float:
        u = (x - midline) / half_span
        return level - curve * u * u + tilt * (x - midline)

    plane = occlusal(cols)
    att = 0.12 + 0.04 * smooth_noise(rng, shape, 6 * scale)
    jaw = np.exp(-(((rows - plane) / (0.3 * height)) ** 2))
    att += jaw * (0.22 + 0.035 * smooth_noise(rng, shape, 1.0))  # trabecular bone
    apices_up = plane - 0.36 * height
    airway = np.exp(-(((rows - apices_up) / (0.03 * height)) ** 2)) * np.exp(-(((cols - midline) / (0.3 * width)) ** 2))
    att -= 0.07 * airway
    for side in (-1, 1):
        sinus = _ellipse(shape, (level - 0.36 * height, midline + side * 68 * scale),
                             (0.09 * height, 26 * scale))
        att[sinus] -= rng.uniform(0.05, 0.12)
        ramus = 1 / (1 + np.exp(-(side * (cols - midline) - 124 * scale) / 3))
        att += rng.uniform(0.08, 0.16) * ramus
    if rng.uniform() < 0.5:  # the cervical spine's ghost
        att += rng.uniform(0.03, 0.08) * np.exp(-(((cols - midline) / (0.06 * width)) ** 2))

    plan = _plan_teeth(rng)
    teeth = []
    for quadrant in range(4):
        upper, viewer_left = quadrant in (0, 1), quadrant in (0, 3)
        side, sign = (-1 if viewer_left else 1), (-1 if upper else 1)  # roots grow away from the occlusal plane
        offset = rng.uniform(0.25, 1.0) * scale
        for tooth, base_width in enumerate(TOOTH_WIDTHS):
            tooth_width = base_width * scale * rng.uniform(0.9, 1.1)
            diagnosis = plan[quadrant][tooth]
            if diagnosis == ABSENT:
                gap = offset + tooth_width / 2
                offset += tooth_width * rng.uniform(0.1, 0.7)  # the neighbours drift into the gap
                if tooth < 7 and rng.uniform() < IMPLANT_RATE:
                    x = midline + side * gap
                    top = occlusal(x) + sign * 2 * vscale
                    screw = _ellipse(shape, (top + sign * 16 * vscale, x), (13 * vscale, 0.3 * tooth_width))
                    att[screw] = 1.7
                continue
            centre_x = midline + side * (offset + tooth_width / 2)
            offset += tooth_width + rng.uniform(-1.5, 2.5) * scale  # overlap in the projection
            length = vscale * rng.uniform(36, 44) * TOOTH_LENGTHS[tooth]
            u = (centre_x - midline) / half_span
            angle = -0.15 * u * sign + rng.normal(0, 0.04)
            sink = 0.0
            if diagnosis == 0:
                sink = rng.uniform(5, 12) * vscale
                angle = rng.uniform(0.4, 1.1) * (1 if viewer_left else -1) * -sign
                centre_x -= side * rng.uniform(0, 3) * scale  # leans against the second molar
            top = float(occlusal(centre_x)) + sign * (rng.uniform(1.5, 3.0) * vscale + sink)
            centre_y = top + sign * length / 2
            body = _ellipse(shape, (centre_y, centre_x), (length / 2, tooth_width / 2), angle)
            att[body] += 0.45 + rng.normal(0, 0.03)
            crown_y = top + sign * 0.2 * length
            crown = body & _ellipse(shape, (crown_y, centre_x), (0.2 * length, tooth_width / 2 + 1))
            att[crown] += 0.15
            pulp = body & _ellipse(shape, (centre_y + sign * 0.05 * length, centre_x), (0.33 * length,
                                                                                          0.17 * tooth_width), angle)
            att[pulp] -= 0.12
            if rng.uniform() < ROOT_CANAL_RATE:
                att[pulp] = 1.45
            draw = rng.uniform()
            if draw < CROWN_RATE:
                att[crown] = 1.55
            elif draw < CROWN_RATE + RESTORATION_RATE:
                place = (top + sign * rng.uniform(1.5, 4) * vscale, centre_x + rng.uniform(-1, 1))
                filling = _ellipse(shape, place, (rng.uniform(1.5, 3.5) * vscale,
                                                      rng.uniform(0.3, 0.45) * tooth_width))
                att[filling & body] = 1.6
            box_mask = body.copy()
            if diagnosis == 1:  # a small cavity on the chewing or the contact surface
                if rng.uniform() < 0.5:
                    spot = (top + sign * rng.uniform(1.0, 2.5) * vscale, centre_x + rng.uniform(-1, 1))
                else:
                    spot = (crown_y, centre_x + rng.choice([-1.0, 1.0]) * 0.38 * tooth_width)
                radius = rng.uniform(CARIES_RADIUS[0], CARIES_RADIUS[1]) * scale
                att[_ellipse(shape, spot, (radius, radius)) & body] -= rng.uniform(0.45, 0.6)
            elif diagnosis == 3:  # a large cavity reaching the pulp
                spot = (top + sign * 0.22 * length, centre_x + rng.uniform(-1, 1))
                radii = (rng.uniform(3, 5) * vscale, rng.uniform(0.25, 0.4) * tooth_width)
                att[_ellipse(shape, spot, radii) & body] -= rng.uniform(0.5, 0.65)
            elif diagnosis == 2:  # a dark halo around the root tip, subtle against the bone
                reach = sign * 0.47 * length
                apex = (centre_y + reach * np.cos(angle), centre_x + reach * np.sin(angle))
                radius = rng.uniform(4.0, 6.0) * scale
                lesion = _ellipse(shape, apex, (radius, radius * rng.uniform(0.9, 1.2)))
                att[lesion & ~body] -= rng.uniform(0.15, 0.25)
                box_mask |= lesion
            ys, xs = np.nonzero(box_mask)
            edges = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=np.float64)
            edges += rng.normal(0, 0.8 * scale, 4)  # hand-drawn box edges
            x0, y0 = max(0.0, edges[0]), max(0.0, edges[1])
            x1, y1 = min(float(width), edges[2]), min(float(height), edges[3])
            labelled_tooth = tooth
            if rng.uniform() < TOOTH_NUMBER_NOISE:
                labelled_tooth = int(np.clip(tooth + rng.choice([-1, 1]), 0, 7))
            if diagnosis is not None and rng.uniform() < MISSED_LABEL_RATE:
                diagnosis = None
            teeth.append({"quadrant": quadrant, "tooth": labelled_tooth, "diagnosis": diagnosis,
                          "bbox": [round(x0, 1), round(y0, 1), round(x1 - x0, 1), round(y1 - y0, 1)]})

    low, high = rng.uniform(0.0, 0.12), rng.uniform(0.95, 1.3)
    exposed = np.clip((att - low) / (high - low), 0, 1) ** np.exp(rng.uniform(np.log(0.6), np.log(1.6)))
    sharp = ndimage.gaussian_filter(exposed, 0.6)
    anterior = rng.uniform(0.4, 1.0) * np.exp(-(((cols - midline) / (0.12 * width)) ** 2))
    image = anterior * ndimage.gaussian_filter(exposed, rng.uniform(1.2, 2.2)) + (1 - anterior) * sharp
    image *= 1 + rng.uniform(-0.15, 0.15) * (cols / width - 0.5) + rng.uniform(-0.1, 0.1) * (rows / height - 0.5)
    image = 255 * image + rng.normal(0, rng.uniform(3, 9), shape)
    return to_uint8(image), teeth
