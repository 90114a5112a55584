"""RAVIR 2022: segmentation of retinal arteries and veins in infrared reflectance (SLO) images.

Download (Google Drive, placed by hand as ``raw/downloads/ravir.zip``; metrics/dentex_us_ldct.md §5)::

    RAVIR Dataset/train/training_images/IR_Case_NNN.png    768x768 8-bit infrared images (23 labelled)
    RAVIR Dataset/train/training_masks/IR_Case_NNN.png     0 background, 128 artery, 255 vein
    RAVIR Dataset/test/IR_Case_NNN.png                     19 official test images, masks not public

The official test masks are not public, so the 23 labelled images are re-split; the 19 unlabelled official test
images are offered as extra unlabelled training images. Archives downloaded before 16 Aug 2022 hold a duplicate
``IR_Case_002``, which is left out wherever it appears. Case id = file stem.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import ClassVar

import numpy as np
from PIL import Image
from scipy import ndimage

from rexmle_grade.errors import TaskDataMissingError
from rexmle_grade.grader import TestManifest
from rexmle_grade.io import Geometry
from rexmle_tasks.base import PrepareContext, TaskFamily, register_family
from rexmle_tasks.families.synth2d import (
    copy_file,
    ellipse_mask,
    encode_image,
    files_with_suffix,
    find_in_raw,
    image_size,
    smooth_noise,
    to_uint8,
    write_csv,
    write_zip,
)

log = logging.getLogger(__name__)

ARCHIVE = "ravir.zip"
TOP_FOLDER = "RAVIR Dataset"
DUPLICATE_CASE = "IR_Case_002"
BACKGROUND, ARTERY, VEIN = 0, 128, 255
#: the labelled training images of the real release
LABELLED_CASES = tuple(f"IR_Case_{n:03d}" for n in (11, 17, 19, 20, 21, 22, 23, 26, 34, 35, 36, 38, 40, 41, 43, 44,
                                                     49, 51, 52, 53, 55, 56, 58))


def find_dataset(raw: Path) -> Path:
    """The ``train`` folder holding ``training_images/`` and ``training_masks/``."""
    found = [p.parent for p in find_in_raw(raw, "training_images")
             if p.is_dir() and (p.parent / "training_masks").is_dir()]
    if len(found) != 1:
        raise TaskDataMissingError(
            f"expected one folder with training_images/ and training_masks/ under {raw}, found {len(found)}",
            hint=f"{ARCHIVE} unpacks to '{TOP_FOLDER}/train/'; re-run with --force to extract it again",
        )
    return found[0]


def labelled_pairs(train: Path) -> dict[str, tuple[Path, Path]]:
    """{case id: (image, mask)} without the duplicate IR_Case_002."""
    pairs = {}
    for image in files_with_suffix(train / "training_images", (".png",)):
        mask = train / "training_masks" / image.name
        if image.stem == DUPLICATE_CASE:
            continue
        if not mask.is_file():
            log.warning("%s has no mask in %s and is left out", image.name, train / "training_masks")
            continue
        pairs[image.stem] = (image, mask)
    return pairs


def check_mask(path: Path) -> None:
    """Masks are graded as they are: they must be single-channel 8-bit with values 0, 128 and 255 only."""
    with Image.open(path) as img:
        mode = img.mode
        values = set(np.unique(np.asarray(img)).tolist()) if mode == "L" else set()
    if mode != "L" or not values <= {BACKGROUND, ARTERY, VEIN}:
        raise TaskDataMissingError(
            f"mask {path} has PIL mode {mode!r} and values {sorted(values)[:10]}; expected an 8-bit single-channel "
            "mask with values 0, 128 and 255", hint="the download is not the RAVIR release described in the task",
        )


@register_family
class RavirFamily(TaskFamily):
    name: ClassVar[str] = "ravir"

    def case_ids(self, raw: Path) -> list[str]:
        return sorted(labelled_pairs(find_dataset(raw)))

    def prepare(self, ctx: PrepareContext) -> TestManifest:
        train = find_dataset(ctx.raw)
        pairs = labelled_pairs(train)
        for case_id in ctx.split.train:
            image, mask = pairs[case_id]
            copy_file(image, ctx.public / "train" / "images" / image.name)
            copy_file(mask, ctx.public / "train" / "labels" / mask.name)
        official_test = train.parent / "test"
        extra = files_with_suffix(official_test, (".png",)) if official_test.is_dir() else []
        for image in extra:
            if image.stem != DUPLICATE_CASE and image.stem not in pairs:
                copy_file(image, ctx.public / "unlabelled" / "images" / image.name)
        geometry = {}
        for case_id in ctx.split.test:
            image, mask = pairs[case_id]
            check_mask(mask)
            copy_file(image, ctx.public / "test" / "images" / image.name)
            copy_file(mask, ctx.private / "labels" / mask.name)
            geometry[case_id] = Geometry(size=image_size(image))
        write_csv(ctx.private / "answers.csv", ["image_id", "label_path"],
                  [(case_id, f"labels/{pairs[case_id][1].name}") for case_id in ctx.split.test])
        return TestManifest(ids=tuple(ctx.split.test), geometry=geometry)

    # ---- synthetic mirror --------------------------------------------------------------------------------------
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int) -> None:
        """``cases`` labelled images (named like the real labelled ones) and two unlabelled official test images."""
        rng = np.random.default_rng(seed)
        names = list(LABELLED_CASES[:cases]) + [f"IR_Case_{n:03d}" for n in range(61, 61 + cases - len(LABELLED_CASES))]
        members = []
        for name in names:
            image, mask = synthetic_fundus(rng)
            members.append((f"{TOP_FOLDER}/train/training_images/{name}.png", encode_image(image, ".png")))
            members.append((f"{TOP_FOLDER}/train/training_masks/{name}.png", encode_image(mask, ".png")))
        for name in ("IR_Case_006", "IR_Case_060"):
            members.append((f"{TOP_FOLDER}/test/{name}.png", encode_image(synthetic_fundus(rng)[0], ".png")))
        write_zip(downloads / ARCHIVE, members)


# ---- synthetic infrared fundus images -------------------------------------------------------------------------------
IMAGE_SIZE = 128


def _vessel_path(rng: np.random.Generator, start: tuple[float, float], heading: float,
                 shape: tuple[int, int]) -> np.ndarray:
    """Boolean centre line of a gently curving vessel from ``start`` (row, col) until it leaves the image."""
    line = np.zeros(shape, dtype=bool)
    row, col = start
    turn = rng.uniform(-0.008, 0.008)
    for _ in range(4 * max(shape)):
        heading += turn + rng.normal(0, 0.01)
        row, col = row + 0.5 * np.sin(heading), col + 0.5 * np.cos(heading)
        if not (0 <= row < shape[0] and 0 <= col < shape[1]):
            break
        line[int(row), int(col)] = True
    return line


def synthetic_fundus(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(8-bit infrared image, 0/128/255 mask): arteries and veins leave a bright optic disc; veins are wider and
    darker than arteries, both darker than the fundus, so the class follows from the local contrast."""
    shape = (IMAGE_SIZE, IMAGE_SIZE)
    side = rng.choice([-1, 1])
    disc = (IMAGE_SIZE / 2 + rng.uniform(-8, 8), IMAGE_SIZE / 2 + side * IMAGE_SIZE * 0.3)
    rows, cols = np.mgrid[: shape[0], : shape[1]]
    radius = np.hypot(rows - IMAGE_SIZE / 2, cols - IMAGE_SIZE / 2) / IMAGE_SIZE
    image = 140 - 90 * radius**2 + 6 * smooth_noise(rng, shape, 8)
    image[ellipse_mask(shape, disc, (11, 9))] += 60
    mask = np.zeros(shape, dtype=np.uint8)
    for value, count, width, contrast in ((VEIN, 4, (1.8, 2.4), 48), (ARTERY, 4, (1.1, 1.6), 26)):
        for k in range(count):
            heading = (np.pi if side > 0 else 0.0) + (k - (count - 1) / 2) * 0.55 + rng.uniform(-0.15, 0.15)
            line = _vessel_path(rng, disc, heading, shape)
            vessel = ndimage.distance_transform_edt(~line) <= rng.uniform(*width)
            mask[vessel] = value
            image[vessel] = image[vessel] - contrast
    image = ndimage.gaussian_filter(image, 0.6) + rng.normal(0, 4, shape)
    return to_uint8(image), mask
