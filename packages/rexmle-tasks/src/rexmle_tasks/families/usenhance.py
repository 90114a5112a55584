"""USenhance 2023: enhancing low-quality (handheld) ultrasound images to the high-quality device's look.

Download (Google Drive, placed by hand as ``raw/downloads/train_dataset.zip``; DATA_LAYOUTS.md §10)::

    train_datasets/<organ>/low_quality/<name>.png     organs: breast, carotid, kidney, liver, thyroid
    train_datasets/<organ>/high_quality/<name>.png    paired with the low-quality image of the same file name

The pairs are found wherever a ``low_quality`` folder has a ``high_quality`` sibling (the release also fell back
to any ``*train*`` folder). Case id = ``<organ>_<file stem>``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

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
    files_with_suffix,
    find_in_raw,
    image_size,
    smooth_noise,
    to_uint8,
    write_csv,
    write_zip,
)

log = logging.getLogger(__name__)

ARCHIVE = "train_dataset.zip"
TOP_FOLDER = "train_datasets"
ORGANS = ("breast", "carotid", "kidney", "liver", "thyroid")


@dataclass(frozen=True)
class ImagePair:
    case_id: str
    low: Path
    high: Path


def find_pairs(raw: Path) -> dict[str, ImagePair]:
    """{``<organ>_<stem>``: pair} for every PNG with the same name in ``<organ>/low_quality`` and
    ``<organ>/high_quality``."""
    pairs: dict[str, ImagePair] = {}
    for low_folder in find_in_raw(raw, "low_quality"):
        high_folder = low_folder.parent / "high_quality"
        if not low_folder.is_dir() or not high_folder.is_dir():
            continue
        organ = low_folder.parent.name
        unpaired = []
        for low in files_with_suffix(low_folder, (".png",)):
            high = high_folder / low.name
            if not high.is_file():
                unpaired.append(low.name)
                continue
            case_id = f"{organ}_{low.stem}"
            if case_id in pairs:
                raise TaskDataMissingError(f"two image pairs with the id {case_id!r}: {pairs[case_id].low} and {low}",
                                           hint="the archive was probably extracted twice; delete one copy")
            pairs[case_id] = ImagePair(case_id, low, high)
        if unpaired:
            log.warning("%d low-quality image(s) in %s have no high-quality partner and are left out: %s",
                        len(unpaired), low_folder, ", ".join(unpaired[:5]))
    return pairs


@register_family
class UsenhanceFamily(TaskFamily):
    name: ClassVar[str] = "usenhance"

    def case_ids(self, raw: Path) -> list[str]:
        return sorted(find_pairs(raw))

    def prepare(self, ctx: PrepareContext) -> TestManifest:
        pairs = find_pairs(ctx.raw)
        for case_id in ctx.split.train:
            copy_file(pairs[case_id].low, ctx.public / "train" / "low_quality" / f"{case_id}.png")
            copy_file(pairs[case_id].high, ctx.public / "train" / "high_quality" / f"{case_id}.png")
        geometry = {}
        for case_id in ctx.split.test:
            pair = pairs[case_id]
            copy_file(pair.low, ctx.public / "test" / "low_quality" / f"{case_id}.png")
            copy_file(pair.high, ctx.private / "high_quality" / f"{case_id}.png")
            # the enhanced image is compared with the high-quality one pixel for pixel, so that size is the target
            size = image_size(pair.high)
            if image_size(pair.low) != size:
                log.warning("%s: the low-quality image is %s but the high-quality one %s (width x height)",
                            case_id, image_size(pair.low), size)
            geometry[case_id] = Geometry(size=size)
        write_csv(ctx.private / "answers.csv", ["image_id", "high_quality_path"],
                  [(case_id, f"high_quality/{case_id}.png") for case_id in ctx.split.test])
        return TestManifest(ids=tuple(ctx.split.test), geometry=geometry)

    # ---- synthetic mirror --------------------------------------------------------------------------------------
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int) -> None:
        """``cases`` pairs spread over the five organs."""
        rng = np.random.default_rng(seed)
        members = []
        for number in range(cases):
            organ = ORGANS[number % len(ORGANS)]
            high, low = synthetic_pair(rng, organ)
            name = f"{number // len(ORGANS) + 1}.png"
            members.append((f"{TOP_FOLDER}/{organ}/high_quality/{name}", encode_image(high, ".png")))
            members.append((f"{TOP_FOLDER}/{organ}/low_quality/{name}", encode_image(low, ".png")))
        write_zip(downloads / ARCHIVE, members)


# ---- synthetic ultrasound ------------------------------------------------------------------------------------------
IMAGE_SIZE = 128


def _echogenicity(rng: np.random.Generator, organ: str, shape: tuple[int, int]) -> np.ndarray:
    """Mean brightness of the tissue (0-1): a parenchyma with a few organ-specific structures."""
    h, w = shape
    tissue = 0.45 + 0.08 * smooth_noise(rng, shape, 10)
    rows = np.arange(h)[:, None]
    tissue += 0.25 * np.exp(-(((rows - 8) / 5.0) ** 2))  # bright skin/fascia line near the probe
    jitter = rng.uniform(-8, 8, 2)
    centre = (h * 0.55 + jitter[0], w * 0.5 + jitter[1])
    if organ == "carotid":
        lumen = ellipse_mask(shape, centre, (16, 16))
        tissue[ellipse_mask(shape, centre, (20, 20))] = 0.85  # vessel wall
        tissue[lumen] = 0.05
    elif organ == "thyroid":
        for side in (-1, 1):
            tissue[ellipse_mask(shape, (centre[0], centre[1] + side * 30), (18, 24))] = 0.62
        tissue[ellipse_mask(shape, (centre[0] - 6, centre[1]), (10, 10))] = 0.1  # trachea shadow
    elif organ == "kidney":
        tissue[ellipse_mask(shape, centre, (26, 44), 0.2)] = 0.35  # cortex
        tissue[ellipse_mask(shape, centre, (10, 26), 0.2)] = 0.8  # bright renal sinus
    elif organ == "liver":
        for _ in range(4):
            spot = (rng.uniform(25, h - 10), rng.uniform(10, w - 10))
            tissue[ellipse_mask(shape, spot, (5, 7))] = 0.08  # vessels
    else:  # breast: layers and a dark lesion
        tissue += 0.1 * np.sin(rows / 6.0)
        tissue[ellipse_mask(shape, centre, (12, 18), rng.uniform(0, 1))] = 0.12
    return tissue


def synthetic_pair(rng: np.random.Generator, organ: str) -> tuple[np.ndarray, np.ndarray]:
    """(high-quality, low-quality) 8-bit images of one view. The low-quality image is the high-quality one
    blurred, with less contrast, extra speckle of its own and noise, so the high-quality image is largely
    predictable from it."""
    shape = (IMAGE_SIZE, IMAGE_SIZE)
    tissue = _echogenicity(rng, organ, shape)
    depth = np.linspace(1.0, 0.75, IMAGE_SIZE)[:, None]
    high = tissue * depth * (1 + 0.2 * smooth_noise(rng, shape, 1.0))  # the tissue's own speckle
    low = ndimage.gaussian_filter(high, 1.2)
    low = 0.3 + 0.65 * (low - 0.3)  # compressed contrast of the handheld probe
    low = low * (1 + 0.15 * smooth_noise(rng, shape, 1.5)) + rng.normal(0, 0.025, shape)
    return to_uint8(high * 255), to_uint8(low * 255)
