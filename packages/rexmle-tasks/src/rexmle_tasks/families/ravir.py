"""RAVIR 2022: segmentation of retinal arteries and veins in infrared reflectance (SLO) images.

Download (Google Drive, placed by hand as ``raw/downloads/ravir.zip``; metrics/dentex_us_ldct.md §5)::

    RAVIR Dataset/train/training_images/IR_Case_NNN.png    768x768 8-bit infrared images (23 labelled)
    RAVIR Dataset/train/training_masks/IR_Case_NNN.png     0 background, 128 artery, 255 vein
    RAVIR Dataset/test/IR_Case_NNN.png                     19 official test images, masks not public

The official test masks are not public, so the 23 labelled images are re-split; the 19 unlabelled official test
images are offered as extra unlabelled training images. Archives downloaded before 16 Aug 2022 hold a duplicate
``IR_Case_002``, which is left out wherever it appears. Case id = file stem.

Synthetic mirrors: ``easy`` (128 x 128, vessels told apart by their darkness) and ``realistic`` (384 x 384, the real
images' confounders; section "the realistic mirror").
"""

from __future__ import annotations

import logging
from itertools import pairwise
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

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
    synthetic_difficulties: ClassVar[tuple[str, ...]] = ("easy", "realistic")

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
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int, difficulty: str = "easy") -> None:
        """``cases`` labelled images (named like the real labelled ones) and two unlabelled official test images;
        ``difficulty=realistic`` draws them with :func:`realistic_fundus` (the section "the realistic mirror")."""
        rng = np.random.default_rng(seed)
        make = realistic_fundus if difficulty == "realistic" else synthetic_fundus
        names = list(LABELLED_CASES[:cases]) + [f"IR_Case_{n:03d}" for n in range(61, 61 + cases - len(LABELLED_CASES))]
        members = []
        for name in names:
            image, mask = make(rng)
            members.append((f"{TOP_FOLDER}/train/training_images/{name}.png", encode_image(image, ".png")))
            members.append((f"{TOP_FOLDER}/train/training_masks/{name}.png", encode_image(mask, ".png")))
        for name in ("IR_Case_006", "IR_Case_060"):
            members.append((f"{TOP_FOLDER}/test/{name}.png", encode_image(make(rng)[0], ".png")))
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


# ---- the realistic mirror ----------------------------------------------------------------------------------------
# What makes real RAVIR hard for a threshold (metrics/dentex_us_ldct.md §5: 768x768 8-bit infrared SLO, 815 nm,
# Heidelberg Spectralis, 30 degree field, 12.5 um a pixel; masks 0 / 128 artery / 255 vein):
#
# - arteries and veins have the same kind of dark profile: veins are darker and wider, but every vessel tapers from
#   the disc outwards and each image has its own contrast, so a distal vein is as thin and as dark as a proximal
#   artery of another image; what tells them apart locally is the central light reflex of the wider arteries
#   (a bright stripe along the middle of the vessel) and the vessel it branches from;
# - arteries and veins of one arcade leave the optic disc side by side and cross each other;
# - thin vessels (25-50 um) are at the resolution limit: faint, spread over a pixel or two, and their
#   faded ends are left out of the masks (annotators stop where the vessel stops being sure);
# - the optic disc is a bright oval (vessels on it are labelled) with a darker peripapillary crescent, the macula is
#   darker, the choroidal vessels show through as a faint network of soft dark bands (stronger in lightly pigmented
#   eyes), illumination falls off towards an off-centre vignette and along a gradient, the raster scan leaves
#   line-to-line gain changes, focus and noise (the number of averaged frames) differ from image to image.
#
# Anatomy is drawn in the coordinates of the real 768 x 768 grid and rendered on a 384 x 384 grid (25 um a pixel, the
# real image halved), so that a small network trains on it in CPU minutes; major veins are then 6-8 pixels wide,
# major arteries 4-6, the thinnest labelled vessels one pixel. The default 10 cases give 8 training and 2 test
# images; the ladder is measured on 12 (9 and 3).
REALISTIC_SIZE = 384
REAL_SIZE = 768
_RADIUS_BINS = (0.0, 1.8, 3.0, 4.5, np.inf)  # centre lines grouped by radius (real pixels), one distance map each
_MARGIN = 40.0  # centre lines may run this far outside the field before they end


def _walk(rng: np.random.Generator, start: np.ndarray, heading: float, length: float,
          bend: float) -> tuple[np.ndarray, np.ndarray]:
    """(points (n, 2), headings (n,)) of a gently curving centre line, one real pixel a step, cut where it leaves
    the field (plus a margin)."""
    n = max(int(length), 2)
    headings = heading + np.cumsum(bend + ndimage.gaussian_filter1d(rng.normal(0, 0.04, n), 8))
    points = start + np.cumsum(np.stack([np.sin(headings), np.cos(headings)], axis=1), axis=0)
    outside = np.flatnonzero(((points < -_MARGIN) | (points > REAL_SIZE + _MARGIN)).any(axis=1))
    stop = int(outside[0]) if outside.size else n
    return points[:stop], headings[:stop]


class _Vessel(NamedTuple):
    points: np.ndarray  # (n, 2) centre line, real pixels (row, col)
    radii: np.ndarray  # (n,) real pixels
    artery: bool
    traced: int  # the annotator traced the first ``traced`` points


def _vessel_tree(rng: np.random.Generator, start: np.ndarray, heading: float, radius: float, length: float,
                 bend: float, artery: bool, depth: int = 0) -> list[_Vessel]:
    """One vessel and its branches: radii taper along the vessel and drop after each branch; a thin vessel's faded
    end is not traced by the annotator."""
    points, headings = _walk(rng, start, heading, length, bend)
    if len(points) < 2:
        return []
    radii = radius * np.linspace(1.0, rng.uniform(0.55, 0.75), len(points))
    out = []
    if depth < 3:
        position = int(rng.uniform(40, 140))
        while position < len(points) - 30:
            child = radii[position] * rng.uniform(0.5, 0.8)
            if child >= 1.0:
                turn = rng.choice([-1.0, 1.0]) * rng.uniform(0.45, 1.2)
                out += _vessel_tree(rng, points[position], float(headings[position] + turn), child,
                                    rng.uniform(25, 70) * child, rng.normal(0, 0.002), artery, depth + 1)
                radii[position:] *= rng.uniform(0.88, 0.97)
            position += int(rng.uniform(60, 180))
    radii = np.maximum(radii, 0.9)
    traced = len(points) if radius >= 2.2 else int(len(points) * rng.uniform(0.6, 1.0))
    return [_Vessel(points, radii, artery, traced), *out]


def _fundus_anatomy(rng: np.random.Generator) -> tuple[list[_Vessel], dict[str, Any]]:
    """The vessel trees of one eye and where its optic disc and fovea lie (real pixels)."""
    side = rng.choice([-1.0, 1.0])  # the disc's side: left or right eye
    disc = np.array([REAL_SIZE / 2 + rng.uniform(-70, 70), REAL_SIZE / 2 + side * rng.uniform(130, 330)])
    disc_radius = rng.uniform(58, 78)  # a 1.5-1.9 mm disc
    temporal = 0.0 if side < 0 else np.pi  # the direction from the disc towards the macula
    fovea = disc + 2.6 * 2 * disc_radius * np.array([np.sin(temporal), np.cos(temporal)]) + rng.normal(0, 20, 2)
    vessels = []
    # two temporal arcades arching around the macula and two or three nasal pairs, each an artery beside a vein
    arcades = [(temporal + s * rng.uniform(0.8, 1.2), -s * rng.uniform(0.0007, 0.0013), rng.uniform(650, 900))
               for s in (-1.0, 1.0)]
    arcades += [(temporal + np.pi + rng.uniform(-1.3, 1.3), rng.normal(0, 0.001), rng.uniform(300, 500))
                for _ in range(int(rng.integers(2, 4)))]
    for k, (heading, bend, length) in enumerate(arcades):
        scale = 1.0 if k < 2 else rng.uniform(0.6, 0.8)  # the temporal arcades carry the widest vessels
        for artery in (False, True):
            offset = rng.uniform(0.1, 0.3) * rng.choice([-1.0, 1.0])
            start = disc + rng.normal(0, 0.2 * disc_radius, 2)
            radius = scale * (rng.uniform(4.5, 5.5) if artery else rng.uniform(6.0, 7.5))  # 110-190 um wide
            vessels += _vessel_tree(rng, start, heading + offset, radius, length, bend + rng.normal(0, 4e-4), artery)
    return vessels, {"side": side, "disc": disc, "disc_radius": disc_radius, "fovea": fovea}


def _nearest_centre(vessels: list[_Vessel], artery: bool,
                    shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d / r, r, traced) per pixel of the mirror's grid for one class, ``r`` in the grid's pixels: the relative
    distance to the centre line whose tube reaches deepest (a thin branch never cuts a hole in its parent), that
    line's radius, and whether it is annotated there. Centre points keep their sub-pixel position, so thin vessels
    come out smooth without rendering on a finer grid."""
    best = np.full(shape, np.inf)
    best_radius = np.ones(shape)
    best_traced = np.zeros(shape, dtype=bool)
    chosen = [v for v in vessels if v.artery == artery]
    if not chosen:
        return best, best_radius, best_traced
    scale = shape[0] / REAL_SIZE
    points = np.concatenate([v.points for v in chosen]) * scale
    radii = np.concatenate([v.radii for v in chosen])
    traced = np.concatenate([np.arange(len(v.points)) < v.traced for v in chosen])
    pixels = np.rint(points).astype(int)
    inside = ((pixels >= 0) & (pixels < np.array(shape))).all(axis=1)
    points, pixels, radii, traced = points[inside], pixels[inside], radii[inside], traced[inside]
    rows, cols = np.indices(shape, dtype=float)
    for low, high in pairwise(_RADIUS_BINS):
        pick = np.flatnonzero((radii >= low) & (radii < high))
        if not pick.size:
            continue
        owner = np.full(shape, -1)
        owner[pixels[pick, 0], pixels[pick, 1]] = pick  # one centre point per pixel (the last drawn)
        near = ndimage.distance_transform_edt(owner < 0, return_distances=False, return_indices=True)
        nearest = owner[near[0], near[1]]
        radius = radii[nearest] * scale
        relative = np.hypot(rows - points[nearest, 0], cols - points[nearest, 1]) / radius
        closer = relative < best
        best[closer] = relative[closer]
        best_radius[closer] = radius[closer]
        best_traced[closer] = traced[nearest][closer]
    return best, best_radius, best_traced


def _soft_ellipse(shape: tuple[int, int], centre: np.ndarray, radii: tuple[float, float], edge: float) -> np.ndarray:
    rows, cols = np.ogrid[: shape[0], : shape[1]]
    r = np.hypot((rows - centre[0]) / radii[0], (cols - centre[1]) / radii[1])
    return 1.0 / (1.0 + np.exp((r - 1.0) * min(radii) / edge))


#: the thinnest tube drawn or traced on the mirror's grid (pixels): thinner vessels are spread to this radius with
#: their absorption kept, as the scanner's point spread does, and annotated one pixel wide
_MIN_RADIUS = 0.75


def realistic_fundus(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(8-bit 384 x 384 infrared image, 0/128/255 mask) of the realistic mirror; see the section's comment."""
    shape = (REALISTIC_SIZE, REALISTIC_SIZE)
    scale = REALISTIC_SIZE / REAL_SIZE  # anatomy is drawn in real pixels
    vessels, eye = _fundus_anatomy(rng)
    vein_contrast = rng.uniform(0.22, 0.4)
    transmitted = np.ones(shape)
    relative, traced = {}, {}
    for artery in (False, True):
        u, radius, traced[artery] = _nearest_centre(vessels, artery, shape)
        spread = np.maximum(radius, _MIN_RADIUS)
        relative[artery] = u * radius / spread
        u = relative[artery]
        real_radius = radius / scale
        contrast = vein_contrast * (rng.uniform(0.8, 1.0) if artery else 1.0)
        absorbed = (contrast * np.minimum(1.0, (real_radius / 4.0) ** 0.7) * radius / spread
                    * np.sqrt(np.clip(1.0 - u**2, 0.0, 1.0)))
        reflex = rng.uniform(0.75, 1.0) if artery else rng.uniform(0.0, 0.12)
        absorbed *= 1.0 - reflex * np.exp(-((u / 0.5) ** 2)) * np.clip((real_radius - 1.5) / 2.0, 0.0, 1.0)
        transmitted *= 1.0 - absorbed
    # the fundus behind the vessels
    background = 1.0 + 0.02 * smooth_noise(rng, shape, 1)
    bands = np.exp(-((smooth_noise(rng, shape, 7) / 0.3) ** 2))
    background -= rng.uniform(0.0, 0.12) * ndimage.gaussian_filter(bands, 1.5)
    disc, disc_radius = eye["disc"] * scale, eye["disc_radius"] * scale
    background += rng.uniform(0.3, 0.7) * _soft_ellipse(shape, disc, (1.1 * disc_radius, disc_radius), 3)
    cup = disc + rng.normal(0, 0.15 * disc_radius, 2)
    background += rng.uniform(0.1, 0.3) * _soft_ellipse(shape, cup, (0.5 * disc_radius, 0.45 * disc_radius), 2.5)
    rows, cols = np.indices(shape, dtype=float)
    angle = np.arctan2(rows - disc[0], cols - disc[1])
    crescent = _soft_ellipse(shape, disc, (1.4 * disc_radius, 1.3 * disc_radius), 3) - \
        _soft_ellipse(shape, disc, (1.1 * disc_radius, disc_radius), 2)
    facing = np.cos(angle - (0.0 if eye["side"] < 0 else np.pi))  # the crescent lies on the temporal rim
    background -= rng.uniform(0.05, 0.2) * crescent * np.clip(facing, 0.0, 1.0)
    fovea = eye["fovea"] * scale
    background -= rng.uniform(0.05, 0.15) * np.exp(-((rows - fovea[0]) ** 2 + (cols - fovea[1]) ** 2) / (2 * 35.0**2))
    half = REALISTIC_SIZE / 2
    centre = half + rng.uniform(-75, 75, 2)
    vignette = 1.0 - rng.uniform(0.15, 0.45) * ((rows - centre[0]) ** 2 + (cols - centre[1]) ** 2) / half**2
    direction = rng.normal(size=2)
    direction /= np.linalg.norm(direction)
    gradient = 1.0 + rng.uniform(0.0, 0.2) * ((rows - half) * direction[0] + (cols - half) * direction[1]) / half
    image = background * transmitted * np.clip(vignette, 0.2, None) * gradient
    image = ndimage.gaussian_filter(image, rng.uniform(0.3, 0.8))  # focus
    image *= 1.0 + ndimage.gaussian_filter1d(rng.normal(0, rng.uniform(0.005, 0.02), REALISTIC_SIZE), 0.7)[:, None]
    image *= rng.uniform(70, 140) / np.median(image)
    image += rng.normal(0, rng.uniform(2.0, 7.0), image.shape)
    return to_uint8(image), _realistic_mask(relative, traced)


def _realistic_mask(relative: dict[bool, np.ndarray], traced: dict[bool, np.ndarray]) -> np.ndarray:
    """The annotation: vessel pixels of traced vessels, each taking the class of the vessel nearer its centre line
    there (the upper vessel of a crossing)."""
    artery = (relative[True] <= 1.0) & traced[True]
    vein = (relative[False] <= 1.0) & traced[False]
    mask = np.full(artery.shape, BACKGROUND, dtype=np.uint8)
    mask[vein] = VEIN
    mask[artery & (~vein | (relative[True] < relative[False]))] = ARTERY
    return mask
