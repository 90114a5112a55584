"""LDCT-IQA (LDCTIQAC 2023): no-reference quality scores of low-dose abdominal CT slices.

Training download (Zenodo 7833096; DATA_LAYOUTS.md §9), found wherever it lies under ``raw/``::

    LDCTIQAG2023_train/train.json       {"0000.tif": 3.4, ...}   file name -> mean radiologist score (0-4)
    LDCTIQAG2023_train/image/NNNN.tif   single-slice float CT images, already windowed to [0, 1] (see below)

The official labelled test set is a manual Google-Drive download (``test_dataset.zip`` in ``raw/downloads/``)
whose layout is unresolved (the release expects ``LDCTIQAC_test/{images/*.tiff, test.json}``, a participant's
script ``LDCTIQAC2023_test/{*.tif, test-ground-truth.json}``), so it is searched for: any other JSON mapping image
names to scores, with the images below the JSON's folder.

Pixel values: the released slices are float images already windowed and scaled to [0, 1], not Hounsfield units.
Two independent public sources agree on that: a third-party analysis of the training set maps the [0, 1] values
back to HU and finds air, lung and bone saturated at 0 or 1 (a soft-tissue window; it quotes W350/L40 from the
challenge page and W400/L50 from a later paper), and the ldct-benchmark package, which redistributes the winning
model, windows HU to [0, 1] before scoring "as was done for the training data" (with yet another window). The
exact window is therefore unknown; the mirror writes [0, 1] floats through a W350/L40 window (saturating air and
bone as reported), and pipelines must accept both [0, 1] slices and HU slices (DATA_LAYOUTS.md leaves dtype and
size unverified).

Split (our decision): when the official test set is present it is the test set and the official training set is
the training set (:meth:`LdctFamily.fixed_split`); when it is absent the official training set is re-split by the
hashed split of task.yaml. Case id = image file stem (``0333``); if official test stems repeat training stems,
every official test id becomes ``test_<stem>``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
from scipy import ndimage

from rexmle_grade.errors import TaskDataMissingError
from rexmle_grade.grader import TestManifest
from rexmle_tasks.base import PrepareContext, TaskFamily, register_family
from rexmle_tasks.families.synth2d import (
    TIFF_SUFFIXES,
    copy_file,
    ellipse_mask,
    encode_image,
    find_in_raw,
    smooth_noise,
    write_csv,
    write_zip,
)
from rexmle_tasks.splits import Split

log = logging.getLogger(__name__)

TRAIN_JSON = "train.json"
TRAIN_FOLDER = "LDCTIQAG2023_train"
TEST_ARCHIVE = "test_dataset.zip"
TEST_ID_PREFIX = "test_"


@dataclass(frozen=True)
class ScoredImage:
    case_id: str
    image: Path
    score: float


def _read_scores(path: Path) -> dict[str, float] | None:
    """A flat {image name: score} JSON object, or None when the file is something else."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict) or not doc:
        return None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in doc.values()):
        return None
    return {str(k): float(v) for k, v in doc.items()}


def _pair(scores: dict[str, float], images_root: Path, source: Path) -> dict[str, tuple[Path, float]]:
    """{image stem: (path, score)} for the entries of ``scores`` whose image exists below ``images_root``."""
    images = {p.stem: p for p in find_in_raw(images_root, "*") if p.suffix.lower() in TIFF_SUFFIXES and p.is_file()}
    paired, absent = {}, []
    for name, score in scores.items():
        stem = Path(name).stem
        if stem in images:
            paired[stem] = (images[stem], score)
        else:
            absent.append(name)
    if absent:
        log.warning("%d image(s) scored in %s are missing and left out: %s", len(absent), source,
                    ", ".join(absent[:5]))
    return paired


def find_train(raw: Path) -> tuple[Path, dict[str, tuple[Path, float]]]:
    """The training JSON and {stem: (image, score)} of the official training set."""
    found = [p for p in find_in_raw(raw, TRAIN_JSON) if (p.parent / "image").is_dir()]
    if len(found) != 1:
        raise TaskDataMissingError(
            f"expected one {TRAIN_JSON} next to an image/ folder under {raw}, found {[str(p) for p in found]}",
            hint=f"the Zenodo archive unpacks to {TRAIN_FOLDER}/{{{TRAIN_JSON}, image/}}; re-run with --force",
        )
    scores = _read_scores(found[0])
    if scores is None:
        raise TaskDataMissingError(f"{found[0]} is not a JSON object mapping image names to scores")
    return found[0], _pair(scores, found[0].parent / "image", found[0])


def find_official_test(raw: Path, train_json: Path) -> dict[str, tuple[Path, float]]:
    """{stem: (image, score)} of the official test set, or {} when no scored test set is found."""
    candidates = {}
    for path in find_in_raw(raw, "*.json"):
        if path.is_relative_to(train_json.parent):
            continue
        scores = _read_scores(path)
        if scores is not None:
            paired = {stem: (image, score) for stem, (image, score) in _pair(scores, path.parent, path).items()
                      if not image.is_relative_to(train_json.parent)}
            if paired:
                candidates[path] = paired
    if len(candidates) > 1:
        raise TaskDataMissingError(
            f"several score files could be the official test set: {sorted(map(str, candidates))}",
            hint=f"keep only the one from {TEST_ARCHIVE} and prepare again with --force",
        )
    return next(iter(candidates.values()), {})


def find_cases(raw: Path) -> tuple[dict[str, ScoredImage], dict[str, ScoredImage]]:
    """(official training cases, official test cases) by case id; the second is empty without the test set."""
    train_json, train = find_train(raw)
    test = find_official_test(raw, train_json)
    prefix = TEST_ID_PREFIX if set(test) & set(train) else ""
    return ({stem: ScoredImage(stem, path, score) for stem, (path, score) in train.items()},
            {prefix + stem: ScoredImage(prefix + stem, path, score) for stem, (path, score) in test.items()})


@register_family
class LdctFamily(TaskFamily):
    name: ClassVar[str] = "ldct"
    synthetic_difficulties: ClassVar[tuple[str, ...]] = ("easy", "realistic")

    def case_ids(self, raw: Path) -> list[str]:
        train, test = find_cases(raw)
        return sorted([*train, *test])

    def fixed_split(self, raw: Path) -> Split | None:
        train, test = find_cases(raw)
        if not test:
            log.info("no official LDCT-IQA test set found (%s); re-splitting the official training set", TEST_ARCHIVE)
            return None
        return Split(train=tuple(sorted(train)), test=tuple(sorted(test)))

    def prepare(self, ctx: PrepareContext) -> TestManifest:
        train, test = find_cases(ctx.raw)
        cases = {**train, **test}
        rows = []
        for case_id in ctx.split.train:
            copy_file(cases[case_id].image, ctx.public / "train" / "images" / f"{case_id}.tif")
            rows.append((case_id, repr(cases[case_id].score)))
        write_csv(ctx.public / "train" / "labels.csv", ["image_id", "quality_score"], rows)
        for case_id in ctx.split.test:
            copy_file(cases[case_id].image, ctx.public / "test" / "images" / f"{case_id}.tif")
        write_csv(ctx.private / "answers.csv", ["image_id", "quality_score"],
                      [(case_id, repr(cases[case_id].score)) for case_id in ctx.split.test])
        return TestManifest(ids=tuple(ctx.split.test))

    # ---- synthetic mirror --------------------------------------------------------------------------------------
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int, difficulty: str = "easy") -> None:
        """``cases`` training slices, plus an official test set of a third as many (at least 4)."""
        rng = np.random.default_rng(seed)
        make = realistic_slice if difficulty == "realistic" else synthetic_slice
        train_scores: dict[str, float] = {}
        members = []
        for number in range(cases):
            slice_, score = make(rng)
            train_scores[f"{number:04d}.tif"] = score
            members.append((f"{TRAIN_FOLDER}/image/{number:04d}.tif", encode_image(slice_, ".tif")))
        members.insert(0, (f"{TRAIN_FOLDER}/{TRAIN_JSON}", json.dumps(train_scores, indent=1).encode()))
        write_zip(downloads / f"{TRAIN_FOLDER}.zip", members)
        test_scores: dict[str, float] = {}
        members = []
        for number in range(cases, cases + max(4, cases // 3)):
            slice_, score = make(rng)
            test_scores[f"{number:04d}.tiff"] = score
            members.append((f"LDCTIQAC_test/images/{number:04d}.tiff", encode_image(slice_, ".tiff")))
        members.append(("LDCTIQAC_test/test.json", json.dumps(test_scores, indent=1).encode()))
        write_zip(downloads / TEST_ARCHIVE, members)


# ---- synthetic CT slices -----------------------------------------------------------------------------------------
SLICE_SIZE = 96
# the soft-tissue window the release is reported to have applied before scaling to [0, 1] (level, width in HU)
RELEASE_WINDOW = (40.0, 350.0)


def to_release_values(hu: np.ndarray) -> np.ndarray:
    """HU -> what the release stores: the soft-tissue window scaled to [0, 1], float32 (saturated outside)."""
    level, width = RELEASE_WINDOW
    return np.clip((hu - (level - width / 2)) / width, 0.0, 1.0).astype(np.float32)


def synthetic_slice(rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """A float32 abdominal-CT-like slice as the release stores it (HU through the soft-tissue window, scaled to
    [0, 1]) and its quality score: noise and streaks grow as the score falls. The score is the mean of five
    simulated readers' 0-4 ratings, so it lies on the 0.2 grid."""
    shape = (SLICE_SIZE, SLICE_SIZE)
    centre = (SLICE_SIZE / 2 + rng.uniform(-3, 3), SLICE_SIZE / 2 + rng.uniform(-3, 3))
    image = np.full(shape, -1000.0)
    body = ellipse_mask(shape, centre, (rng.uniform(34, 40), rng.uniform(40, 45)))
    image[body] = -90.0  # subcutaneous fat
    image[ellipse_mask(shape, centre, (30, 36))] = 40.0  # soft tissue
    image[ellipse_mask(shape, (centre[0] - 6, centre[1] - 14), (14, 16))] = 60.0  # liver
    image[ellipse_mask(shape, (centre[0] + 12, centre[1]), (5, 5))] = 700.0  # vertebra
    for side in (-1, 1):
        image[ellipse_mask(shape, (centre[0] + 8, centre[1] + side * 16), (6, 4))] = 150.0  # enhancing kidneys
    image += 8 * smooth_noise(rng, shape, 3) * body
    quality = float(rng.uniform(0, 4))
    ratings = np.clip(np.rint(quality + rng.normal(0, 0.5, 5)), 0, 4)
    score = round(float(ratings.mean()), 1)
    sigma = 12 + (4 - quality) * 22
    noise = rng.normal(0, sigma, shape)
    angles = np.linspace(0, np.pi, 6, endpoint=False) + rng.uniform(0, np.pi)
    rows, cols = np.mgrid[: shape[0], : shape[1]]
    streaks = sum(np.cos(0.9 * ((rows - centre[0]) * np.cos(a) + (cols - centre[1]) * np.sin(a))) for a in angles)
    image += (noise + (4 - quality) * 6 * streaks) * body
    return to_release_values(ndimage.gaussian_filter(image, 0.5)), score



# ---- the realistic mirror ----------------------------------------------------------------------------------------
# Scanners differ in reconstruction kernel (smooth kernels hide noise but blur detail, sharp kernels show every
# photon), in calibration (an HU offset) and in streak pattern; readers judge what they see (noise, blur, streaks)
# and disagree. A single image statistic (the standard deviation, a noise estimate) is then confounded by the kernel
# and by anatomy (lungs and bowel gas, contrast phase, metal), while a model that separates noise from sharpness and
# measures noise in homogeneous tissue recovers most of the ranking.
SCANNERS = (  # (kernel sigma in pixels, HU offset, relative streak strength)
    (0.35, 0.0, 1.0), (0.8, -15.0, 0.7), (1.4, 12.0, 0.5), (0.55, 25.0, 1.3),
)
READER_SD = 0.7  # one reader's rating around the perceived quality (the easy mirror: 0.5)


def realistic_slice(rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """A slice of the realistic mirror and its score (mean of five readers, on the 0.2 grid); see above."""
    shape = (SLICE_SIZE, SLICE_SIZE)
    kernel, offset, streakiness = SCANNERS[int(rng.integers(len(SCANNERS)))]
    centre = (SLICE_SIZE / 2 + rng.uniform(-5, 5), SLICE_SIZE / 2 + rng.uniform(-5, 5))
    radii = (rng.uniform(28, 42), rng.uniform(34, 46))
    body = ellipse_mask(shape, centre, radii)
    image = np.full(shape, -1000.0)
    image[body] = rng.uniform(-110, -70)  # subcutaneous fat, thickness varies
    inner = ellipse_mask(shape, centre, (radii[0] - rng.uniform(3, 8), radii[1] - rng.uniform(3, 8)))
    contrast = rng.uniform(0.0, 60.0)  # contrast phase: organs enhance by this much
    image[inner] = 40.0 + 0.3 * contrast
    level = rng.uniform()  # which part of the abdomen: lung bases high up, pelvis low down
    if level > 0.65:  # lung bases: air-filled lobes inside the body
        for side in (-1, 1):
            image[ellipse_mask(shape, (centre[0] - 8, centre[1] + side * 17), (rng.uniform(8, 14), 9))] = -850.0
    liver = ellipse_mask(shape, (centre[0] - 4, centre[1] - 14), (rng.uniform(10, 16), rng.uniform(12, 18)))
    image[liver] = 55.0 + contrast
    image[ellipse_mask(shape, (centre[0] + 12, centre[1]), (5, 5))] = rng.uniform(500, 900)  # vertebra
    for side in (-1, 1):
        image[ellipse_mask(shape, (centre[0] + 8, centre[1] + side * 16), (6, 4))] = 40.0 + 2.5 * contrast
    for _ in range(int(rng.integers(0, 5))):  # bowel gas pockets
        spot = (centre[0] + rng.uniform(-15, 15), centre[1] + rng.uniform(-20, 20))
        image[ellipse_mask(shape, spot, (rng.uniform(1.5, 4), rng.uniform(1.5, 4))) & inner] = -900.0
    metal = rng.uniform() < 0.15  # spine screws or a hip prosthesis: streaks that do not come from the dose
    if metal:
        spot = (centre[0] + 12, centre[1] + rng.choice([-6.0, 6.0]))
        image[ellipse_mask(shape, spot, (1.5, 1.5))] = 3000.0
    image += 10 * smooth_noise(rng, shape, 2.5) * body  # tissue texture
    dose = float(rng.uniform(0, 1))  # 0: the lowest dose, 1: full dose
    sigma = 14 + (1 - dose) ** 1.3 * 95
    noise = ndimage.gaussian_filter(rng.normal(0, sigma, shape), kernel)
    noise_seen = float(np.std(noise))
    rows, cols = np.mgrid[: shape[0], : shape[1]]
    angles = np.linspace(0, np.pi, 6, endpoint=False) + rng.uniform(0, np.pi)
    streaks = sum(np.cos(rng.uniform(0.6, 1.2) * ((rows - centre[0]) * np.cos(a) + (cols - centre[1]) * np.sin(a)))
                  for a in angles)
    streak_amount = streakiness * (1 - dose) * 8
    image = image + (noise + streak_amount * streaks) * body
    if metal:
        spoke = np.cos(6 * np.arctan2(rows - centre[0] - 12, cols - centre[1])) * 60
        image += spoke * body * np.exp(-np.hypot(rows - centre[0] - 12, cols - centre[1]) / 25)
    image = ndimage.gaussian_filter(image, 0.3 + 0.5 * kernel) + offset  # the kernel blurs anatomy too
    # what readers see: noise (log scale), blur, streaks; metal costs a little; then reader disagreement
    perceived = 4.4 - 1.35 * np.log2(noise_seen / 10) - 1.1 * max(0.0, kernel - 0.5) - 0.06 * streak_amount
    perceived -= 0.3 * metal
    ratings = np.clip(np.rint(perceived + rng.normal(0, 0.3) + rng.normal(0, READER_SD, 5)), 0, 4)
    return to_release_values(image), round(float(ratings.mean()), 1)
