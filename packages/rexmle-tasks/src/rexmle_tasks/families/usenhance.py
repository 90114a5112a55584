"""USenhance 2023: enhancing low-quality (handheld) ultrasound images to the high-quality device's look.

Download (Google Drive, placed by hand as ``raw/downloads/train_dataset.zip``; DATA_LAYOUTS.md §10)::

    train_datasets/<organ>/low_quality/<name>.png     organs: breast, carotid, kidney, liver, thyroid
    train_datasets/<organ>/high_quality/<name>.png    paired with the low-quality image of the same file name

The pairs are found wherever a ``low_quality`` folder has a ``high_quality`` sibling (the release also fell back
to any ``*train*`` folder). Case id = ``<organ>_<file stem>``.

Synthetic mirrors: ``easy`` (:func:`synthetic_pair`: aligned 128 x 128 pairs, blur and noise) and ``realistic``
(:func:`realistic_pair`: the confounders listed in the section "the realistic mirror" below).
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
    synthetic_difficulties: ClassVar[tuple[str, ...]] = ("easy", "realistic")

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
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int, difficulty: str = "easy") -> None:
        """``cases`` pairs spread over the five organs."""
        rng = np.random.default_rng(seed)
        make = realistic_pair if difficulty == "realistic" else synthetic_pair
        members = []
        for number in range(cases):
            organ = ORGANS[number % len(ORGANS)]
            high, low = make(rng, organ)
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


# ---- the realistic mirror ----------------------------------------------------------------------------------------
# What real USenhance pairs hold (EXPERT_REPORTS.md §10, DATA_LAYOUTS.md §10): 1,500 8-bit greyscale PNG pairs of
# five organs from 109 patients, the low-quality image from a handheld probe and the high-quality one from a
# cart-based device, and pairs that may not be pixel-aligned (the winner trained an unaligned CycleGAN). Image sizes
# are not documented; two devices and five organs make one size for all unlikely, so the mirror varies them (the
# two images of a pair share one size, which the grader requires). The realistic mirror draws each view's
# echogenicity map with organ-specific anatomy (linear-probe thyroid, carotid and breast; convex-probe liver and
# kidney with their black-bordered fan) and images it twice:
#
# * high quality: the tissue's micro-structure resolved, gain well compensated with depth;
# * low quality: the same tissue seen through another lens and standoff (the anatomy sits HANDHELD_DELAY_PX deeper
#   in every pair) from a slightly different probe position (each pair's own shift of up to a pixel and lateral
#   stretch of up to 1.5 %), through another log-compression curve, with an axial blur and a lateral blur that
#   grows away from the fixed focal depth, its own fully developed speckle (Rayleigh envelope, so additive after
#   log compression), ghost copies of the skin line and a haze in the near field (reverberation), attenuation that
#   the handheld TGC only partly undoes, a per-device gain and black level, and electronic noise amplified at depth.
#
# LNCC, the validation metric, ignores gain and smooth shading, so what separates methods is what a filter cannot
# do: undo the systematic offset (the expert report's first advice is to check the pairs' alignment), remove
# speckle without blurring the thin interfaces (skin, fascia, vessel walls, Cooper's ligaments, capsule,
# diaphragm) and small structures (vessels, nodules, calcifications, pyramids), and ignore the reverberation. A
# despeckling filter fitted on the training pairs gains a little over the raw image; a small UNet trained for CPU
# minutes on about 30 pairs learns the mapping. The ladder's case count is 40 pairs (32 training, 8 test;
# ``tests/realistic/test_usenhance.py``); images are 96-144 x 132-172 px (rows x columns), sizes varying by organ
# and from image to image.
REALISTIC_PROBES: dict[str, tuple[str, tuple[int, int]]] = {
    "breast": ("linear", (120, 144)),
    "carotid": ("linear", (104, 152)),
    "kidney": ("convex", (128, 160)),
    "liver": ("convex", (136, 160)),
    "thyroid": ("linear", (112, 144)),
}


#: the handheld probe's anatomy sits this many pixels deeper than the cart device's (another lens and standoff
#: delay): a systematic offset between the images of a pair, on top of each pair's own misregistration
HANDHELD_DELAY_PX = 2.5


def _rows_cols(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = np.mgrid[: shape[0], : shape[1]]
    return rows.astype(float), cols.astype(float)


def _curve(rng: np.random.Generator, shape: tuple[int, int], depth: float, *, width: float, tilt: float = 0.0,
           wave: float = 2.0) -> np.ndarray:
    """Soft mask (0-1) of a thin interface running across the image at about ``depth`` rows: fascia, a ligament,
    a vessel wall, the diaphragm. ``width`` is its half-thickness in pixels."""
    rows, cols = _rows_cols(shape)
    phase, period = rng.uniform(0, 2 * np.pi), rng.uniform(40, 120)
    centre = depth + tilt * (cols - shape[1] / 2) + wave * np.sin(cols * 2 * np.pi / period + phase)
    return np.exp(-(((rows - centre) / width) ** 2))


def _shadow(shape: tuple[int, int], top: float, col: float, half_width: float, depth_scale: float) -> np.ndarray:
    """Multiplicative acoustic shadow below a strong reflector (calcification, bone, gas): a soft-edged column
    that darkens the tissue deeper than ``top``."""
    rows, cols = _rows_cols(shape)
    lateral = 1 / (1 + np.exp((np.abs(cols - col) - half_width) / 1.5))
    below = 1 / (1 + np.exp(-(rows - top) / 2.0))
    return 1 - depth_scale * lateral * below


def _realistic_tissue(rng: np.random.Generator, organ: str, shape: tuple[int, int]) -> np.ndarray:
    """The echogenicity map (0-1) of one view: organ-specific anatomy with many edges, thin interfaces and small
    structures, and the shadows behind strong reflectors. Both devices see this tissue."""
    h, w = shape
    tissue = 0.42 + 0.06 * smooth_noise(rng, shape, 12)
    tissue = tissue + 0.45 * _curve(rng, shape, rng.uniform(2.5, 4.5), width=1.3, wave=0.5)  # skin
    if organ == "thyroid":
        strap_top, strap = rng.uniform(10, 16), rng.uniform(10, 16)
        rows, _ = _rows_cols(shape)
        muscle = (rows > strap_top) & (rows < strap_top + strap)
        tissue[muscle] = 0.28 + 0.03 * smooth_noise(rng, shape, 4)[muscle]
        for k in range(3):  # fibrillar muscle pattern
            tissue += 0.18 * _curve(rng, shape, strap_top + (k + 0.7) * strap / 3.5, width=0.7, wave=1.0)
        lobe_centre = (h * rng.uniform(0.5, 0.6), w * rng.uniform(0.35, 0.65))
        lobe = ellipse_mask(shape, lobe_centre, (h * 0.22, w * 0.3), rng.uniform(-0.15, 0.15))
        tissue[lobe] = 0.62 + 0.05 * smooth_noise(rng, shape, 3)[lobe]
        tissue += 0.3 * _curve(rng, shape, lobe_centre[0] - h * 0.22, width=0.8, wave=1.5) * lobe  # capsule
        vessel_col = lobe_centre[1] + rng.choice([-1, 1]) * w * 0.36
        carotid = ellipse_mask(shape, (lobe_centre[0], vessel_col), (10, 10))
        tissue[ellipse_mask(shape, (lobe_centre[0], vessel_col), (12, 12))] = 0.8
        tissue[carotid] = 0.04
        for _ in range(int(rng.integers(0, 3))):  # nodules: hypoechoic with a halo, some with calcifications
            spot = (lobe_centre[0] + rng.uniform(-8, 8), lobe_centre[1] + rng.uniform(-20, 20))
            radii = (rng.uniform(4, 9), rng.uniform(5, 11))
            tissue[ellipse_mask(shape, spot, (radii[0] + 1.5, radii[1] + 1.5))] = 0.15
            tissue[ellipse_mask(shape, spot, radii)] = rng.uniform(0.3, 0.5)
            if rng.uniform() < 0.5:
                tissue[ellipse_mask(shape, spot, (1.2, 1.2))] = 1.0
                tissue *= _shadow(shape, spot[0] + 2, spot[1], 2.0, 0.6)
    elif organ == "carotid":  # longitudinal view: the lumen runs across the image with its double-line walls
        jugular = ellipse_mask(shape, (h * rng.uniform(0.22, 0.3), w * rng.uniform(0.3, 0.7)),
                               (rng.uniform(4, 7), rng.uniform(20, 40)))
        tissue[jugular] = 0.06
        tissue += 0.2 * _curve(rng, shape, h * 0.2, width=0.8, wave=2.5)  # muscle fascia
        top, lumen = h * rng.uniform(0.42, 0.5), rng.uniform(14, 22)
        tilt = rng.uniform(-0.08, 0.08)
        rows, cols = _rows_cols(shape)
        centre_line = top + tilt * (cols - w / 2)
        inside = (rows > centre_line) & (rows < centre_line + lumen)
        tissue[inside] = 0.04
        for edge, sign in ((centre_line, -1), (centre_line + lumen, 1)):  # intima (thin) and adventitia (bright)
            tissue += 0.35 * np.exp(-(((rows - edge) / 0.7) ** 2))
            tissue += 0.55 * np.exp(-(((rows - edge - sign * 3) / 1.2) ** 2))
        if rng.uniform() < 0.5:  # a calcified plaque on the far wall with its shadow
            col = rng.uniform(0.25, 0.75) * w
            row = float(top + tilt * (col - w / 2) + lumen)
            plaque = ellipse_mask(shape, (row - 2, col), (rng.uniform(2, 4), rng.uniform(6, 12)))
            tissue[plaque] = 0.9
            tissue *= _shadow(shape, row + 2, col, 5.0, 0.55)
    elif organ == "liver":
        tissue = 0.5 + 0.05 * smooth_noise(rng, shape, 8)
        for _ in range(int(rng.integers(4, 9))):  # portal veins (bright walls) and hepatic veins (none)
            spot = (rng.uniform(0.15, 0.85) * h, rng.uniform(0.1, 0.9) * w)
            radii = (rng.uniform(2, 7), rng.uniform(2, 10))
            angle = rng.uniform(0, np.pi)
            if rng.uniform() < 0.5:
                tissue[ellipse_mask(shape, spot, (radii[0] + 1.5, radii[1] + 1.5), angle)] = 0.85
            tissue[ellipse_mask(shape, spot, radii, angle)] = 0.05
        tissue += 0.5 * _curve(rng, shape, h * rng.uniform(0.78, 0.9), width=2.0, tilt=rng.uniform(-0.2, 0.2),
                               wave=4.0)  # diaphragm
    elif organ == "kidney":
        tissue = 0.5 + 0.05 * smooth_noise(rng, shape, 8)  # the liver as acoustic window
        centre = (h * rng.uniform(0.55, 0.65), w * rng.uniform(0.4, 0.6))
        angle = rng.uniform(-0.4, 0.4)
        radii = (h * rng.uniform(0.24, 0.3), w * rng.uniform(0.33, 0.4))
        tissue[ellipse_mask(shape, centre, (radii[0] + 2, radii[1] + 2), angle)] = 0.85  # capsule, perirenal fat
        kidney = ellipse_mask(shape, centre, radii, angle)
        tissue[kidney] = 0.32  # cortex
        for k in range(7):  # medullary pyramids around the sinus
            theta = 2 * np.pi * k / 7 + rng.uniform(-0.2, 0.2)
            spot = (centre[0] + 0.6 * radii[0] * np.sin(theta), centre[1] + 0.6 * radii[1] * np.cos(theta))
            tissue[ellipse_mask(shape, spot, (rng.uniform(3, 5), rng.uniform(3, 6)), theta) & kidney] = 0.12
        sinus = ellipse_mask(shape, centre, (radii[0] * 0.35, radii[1] * 0.5), angle)
        tissue[sinus] = 0.8 + 0.1 * smooth_noise(rng, shape, 2)[sinus]
    else:  # breast: fat lobules, Cooper's ligaments, glandular layer, a lesion, pectoral muscle
        rows, cols = _rows_cols(shape)
        gland_top = h * rng.uniform(0.3, 0.4)
        gland = rows > gland_top + 3 * np.sin(cols / rng.uniform(10, 20))
        tissue = np.where(gland, 0.62, 0.3) + 0.05 * smooth_noise(rng, shape, 3)
        for _ in range(int(rng.integers(4, 8))):  # fat lobules
            spot = (rng.uniform(8, gland_top), rng.uniform(0, w))
            tissue[ellipse_mask(shape, spot, (rng.uniform(3, 6), rng.uniform(6, 14)))] = 0.2
        for _ in range(int(rng.integers(3, 6))):  # Cooper's ligaments: thin bright oblique lines
            tissue += 0.4 * _curve(rng, shape, rng.uniform(8, gland_top + 10), width=0.7,
                                   tilt=rng.uniform(-0.4, 0.4), wave=4.0) * (rows < gland_top + 15)
        muscle_top = h * rng.uniform(0.75, 0.85)
        tissue[rows > muscle_top] = 0.3
        for k in range(3):
            tissue += 0.2 * _curve(rng, shape, muscle_top + 3 + 5 * k, width=0.7, tilt=0.05, wave=1.0)
        lesion = (h * rng.uniform(0.45, 0.6), w * rng.uniform(0.3, 0.7))
        radii = (rng.uniform(6, 12), rng.uniform(8, 18))
        tissue[ellipse_mask(shape, lesion, radii, rng.uniform(-0.3, 0.3))] = 0.1
        if rng.uniform() < 0.5:  # malignant-looking: posterior shadow; else posterior enhancement (a cyst)
            tissue *= _shadow(shape, lesion[0] + radii[0], lesion[1], radii[1] * 0.8, 0.4)
        else:
            tissue *= 2 - _shadow(shape, lesion[0] + radii[0], lesion[1], radii[1] * 0.8, 0.25)
    return np.clip(tissue, 0.0, 1.0)


def _fan(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(inside, depth) of a convex probe's sector: the apex sits above the image, the beams spread out over
    about 60 degrees; ``depth`` is the distance along the beam, 0 at the probe face and 1 at the bottom."""
    h, w = shape
    rows, cols = _rows_cols(shape)
    apex = 0.9 * h
    radius = np.hypot(rows + apex, cols - w / 2)
    angle = np.arctan2(cols - w / 2, rows + apex)
    inside = (radius >= apex + 1) & (radius <= apex + h) & (np.abs(angle) <= 0.52)
    return inside, np.clip((radius - apex) / h, 0.0, 1.0)


def _rayleigh_speckle(rng: np.random.Generator, shape: tuple[int, int], grain: tuple[float, float]) -> np.ndarray:
    """Fully developed speckle: the envelope of a band-limited complex Gaussian field (Rayleigh distributed),
    normalised to mean 1; ``grain`` is the (axial, lateral) correlation length of the probe's PSF."""
    real = ndimage.gaussian_filter(rng.standard_normal(shape), grain)
    imaginary = ndimage.gaussian_filter(rng.standard_normal(shape), grain)
    envelope = np.hypot(real, imaginary)
    return envelope / envelope.mean()


def realistic_pair(rng: np.random.Generator, organ: str) -> tuple[np.ndarray, np.ndarray]:
    """(high-quality, low-quality) 8-bit images of one view of the realistic mirror (see the module section)."""
    probe, (base_h, base_w) = REALISTIC_PROBES[organ]
    shape = (base_h + 4 * int(rng.integers(-2, 3)), base_w + 4 * int(rng.integers(-3, 4)))
    h, w = shape
    tissue = _realistic_tissue(rng, organ, shape)
    tissue = tissue * np.clip(1 + 0.3 * smooth_noise(rng, shape, (1.1, 1.5)), 0.0, None)  # the tissue's micro-structure
    if probe == "convex":
        inside, depth = _fan(shape)
    else:
        inside, depth = np.ones(shape, bool), np.broadcast_to(np.linspace(0.0, 1.0, h)[:, None], shape)
    # high quality: the cart-based device resolves the micro-structure, its gain is well compensated with depth
    high = tissue * (1 + 0.08 * rng.uniform(-1, 1) * (depth - 0.5)) * (1 + 0.05 * smooth_noise(rng, shape, 0.7))
    high = np.where(inside, high, 0.0)
    # low quality: the handheld probe sees the same tissue from a slightly different position
    rows, cols = _rows_cols(shape)
    axial = HANDHELD_DELAY_PX + rng.uniform(-0.5, 0.5)
    lateral, stretch = rng.uniform(-1.0, 1.0), 1 + rng.uniform(-0.015, 0.015)
    seen = ndimage.map_coordinates(tissue, [rows - axial, (cols - w / 2) * stretch + w / 2 + lateral],
                                   order=1, mode="nearest")
    seen = seen ** rng.uniform(0.75, 1.35)  # another log-compression curve
    # resolution: axial blur everywhere, lateral blur growing away from the fixed focal depth
    focus = rng.uniform(0.3, 0.5)
    blurred = ndimage.gaussian_filter1d(seen, 1.0, axis=0)
    near, far = ndimage.gaussian_filter1d(blurred, 1.4, axis=1), ndimage.gaussian_filter1d(blurred, 2.8, axis=1)
    defocus = np.clip(np.abs(depth - focus) / 0.5, 0.0, 1.0)
    low = (1 - defocus) * near + defocus * far
    # the display is log-compressed, so the envelope's multiplicative Rayleigh speckle adds in display units
    # (fully developed speckle's 5.6 dB is 5-10 % of a 60-100 dB display range)
    speckle = np.log(_rayleigh_speckle(rng, shape, (0.8, 1.8)))
    low = low + rng.uniform(0.05, 0.08) * (speckle - speckle.mean()) / speckle.std()
    # near-field reverberation: ghost copies of the skin line and a haze under the probe
    skin = rng.uniform(3, 5)
    for k in (2, 3, 4):
        low = low + 0.25 / k * np.exp(-(((depth * h - k * skin) / 1.0) ** 2))
    low = low + 0.12 * np.exp(-depth * h / 6)
    # attenuation that the handheld device's time-gain compensation only partly undoes, and its gain
    knots = rng.uniform(0.8, 1.25, 4)
    tgc = np.interp(depth, np.linspace(0, 1, 4), knots)
    low = low * np.exp(-rng.uniform(0.3, 1.2) * depth) * tgc * rng.uniform(0.75, 1.15)
    # electronic noise, amplified with the gain at depth
    low = low + rng.normal(0, 1, shape) * rng.uniform(0.02, 0.05) * (0.3 + depth)
    low = np.where(inside, np.clip(low, 0.0, None) + rng.uniform(0, 0.04), 0.0)
    return to_uint8(high * 255), to_uint8(low * 255)
