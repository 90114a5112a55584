"""NeurIPS 2022 Cell Segmentation: instance segmentation of cells in multi-modality microscopy.

Download (Zenodo 10719375; DATA_LAYOUTS.md §8): five zips. The task pools the labelled pairs of two of them::

    Training-labeled.zip -> Training-labeled/images/<name>.<ext>   Training-labeled/labels/<name>_label.tiff
    Tuning.zip           -> Tuning/images/<name>.<ext>             Tuning/labels/<name>_label.tiff

(``ext`` varies: bmp, png, tif, tiff, jpg; grey or RGB.) ``Testing.zip`` and the two unlabelled archives
(``train-unlabeled-part1.zip`` unpacks to ``release-part1/``, ``train-unlabeled-part2.zip`` to
``train-unlabeled-part2/``) are downloaded with the record but not used. Case id = image file stem; whether Tuning
names repeat Training-labeled names is not known, so a Tuning case whose stem is already taken gets the id
``Tuning_<stem>`` instead of silently replacing the other (the release's flat merge did that).
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

LABELLED_FOLDERS = ("Training-labeled", "Tuning")
IMAGE_SUFFIXES = (".bmp", ".png", ".tif", ".tiff", ".jpg", ".jpeg")
LABEL_SUFFIXES = ("_label.tiff", "_label.tif")


@dataclass(frozen=True)
class CellCase:
    case_id: str
    image: Path
    label: Path


def find_cases(raw: Path) -> dict[str, CellCase]:
    """{case id: image and instance label} of the labelled pairs of Training-labeled and Tuning."""
    cases: dict[str, CellCase] = {}
    for folder_name in LABELLED_FOLDERS:
        folders = [p for p in find_in_raw(raw, folder_name) if (p / "images").is_dir() and (p / "labels").is_dir()]
        if len(folders) != 1:
            raise TaskDataMissingError(
                f"expected one folder {folder_name}/ with images/ and labels/ under {raw}, found {len(folders)}",
                hint=f"{folder_name}.zip unpacks to {folder_name}/; re-run with --force to extract it again",
            )
        labels = {p.name: p for p in files_with_suffix(folders[0] / "labels", (".tif", ".tiff"))}
        unlabelled, stems = [], set()
        for image in files_with_suffix(folders[0] / "images", IMAGE_SUFFIXES):
            label = next((labels[image.stem + s] for s in LABEL_SUFFIXES if image.stem + s in labels), None)
            if label is None:
                unlabelled.append(image.name)
                continue
            if image.stem in stems:
                raise TaskDataMissingError(f"two images with the stem {image.stem!r} in {folders[0] / 'images'}",
                                           hint="remove the duplicate file and prepare again with --force")
            stems.add(image.stem)
            case_id = image.stem if image.stem not in cases else f"{folder_name}_{image.stem}"
            cases[case_id] = CellCase(case_id=case_id, image=image, label=label)
        if unlabelled:
            log.warning("%d image(s) in %s have no <name>_label.tiff and are left out: %s", len(unlabelled),
                        folders[0], ", ".join(unlabelled[:5]))
    return cases


@register_family
class CellSegFamily(TaskFamily):
    name: ClassVar[str] = "cellseg"
    synthetic_difficulties: ClassVar[tuple[str, ...]] = ("easy", "realistic")

    def case_ids(self, raw: Path) -> list[str]:
        return sorted(find_cases(raw))

    def prepare(self, ctx: PrepareContext) -> TestManifest:
        cases = find_cases(ctx.raw)
        for case_id in ctx.split.train:
            case = cases[case_id]
            copy_file(case.image, ctx.public / "train" / "images" / f"{case_id}{case.image.suffix}")
            copy_file(case.label, ctx.public / "train" / "labels" / f"{case_id}_label.tiff")
        geometry = {}
        for case_id in ctx.split.test:
            case = cases[case_id]
            size, label_size = image_size(case.image), image_size(case.label)
            if size != label_size:
                raise TaskDataMissingError(
                    f"{case.label} is {label_size[0]}x{label_size[1]} but its image {case.image.name} is "
                    f"{size[0]}x{size[1]} (width x height)", hint="the download looks damaged; fetch it again")
            copy_file(case.image, ctx.public / "test" / "images" / f"{case_id}{case.image.suffix}")
            copy_file(case.label, ctx.private / "labels" / f"{case_id}_label.tiff")
            geometry[case_id] = Geometry(size=size)
        write_csv(ctx.private / "answers.csv", ["image_id", "label_path"],
                      [(case_id, f"labels/{case_id}_label.tiff") for case_id in ctx.split.test])
        return TestManifest(ids=tuple(ctx.split.test), geometry=geometry)

    # ---- synthetic mirror --------------------------------------------------------------------------------------
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int, difficulty: str = "easy") -> None:
        if difficulty == "realistic":
            write_realistic_download(downloads, cases=cases, seed=seed)
            return
        rng = np.random.default_rng(seed)
        n_tuning = max(2, cases // 4)
        number = 0
        for folder, count in (("Training-labeled", cases - n_tuning), ("Tuning", n_tuning)):
            members = []
            for _ in range(count):
                number += 1
                stem = f"cell_{number:05d}"
                suffix = SYNTHETIC_SUFFIXES[number % len(SYNTHETIC_SUFFIXES)]
                image, label = synthetic_cells(rng, modality=number % 3)
                members.append((f"{folder}/images/{stem}{suffix}", encode_image(image, suffix)))
                members.append((f"{folder}/labels/{stem}_label.tiff", encode_image(label, ".tiff")))
            write_zip(downloads / f"{folder}.zip", members)
        image, label = synthetic_cells(rng, modality=0, size=(48, 48))
        write_zip(downloads / "Testing.zip", [("Testing/Public/images/cell_00001.tif", encode_image(image, ".tif")),
                                              ("Testing/Public/labels/cell_00001_label.tiff",
                                               encode_image(label, ".tiff"))])
        for archive, folder in (("train-unlabeled-part1.zip", "release-part1"),
                                ("train-unlabeled-part2.zip", "train-unlabeled-part2")):
            images = [synthetic_cells(rng, modality=m, size=(48, 48))[0] for m in (1, 2)]
            write_zip(downloads / archive, [(f"{folder}/unlabeled_cell_{i:05d}.png", encode_image(img, ".png"))
                                            for i, img in enumerate(images, start=1)])


# ---- synthetic microscopy ------------------------------------------------------------------------------------------
SYNTHETIC_SUFFIXES = (".png", ".bmp", ".tif", ".tiff")


def synthetic_cells(rng: np.random.Generator, *, modality: int,
                    size: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(image, uint16 instance map) of non-touching elliptical cells. ``modality`` 0: grey fluorescence (bright
    cells on a dark background), 1: RGB bright-field (dark cells on a light background), 2: RGB fluorescence
    (green cells on black)."""
    shape = size or (int(rng.integers(96, 161)), int(rng.integers(96, 161)))
    label = np.zeros(shape, dtype=np.uint16)
    placed: list[tuple[float, float, float]] = []  # (row, col, largest radius): circles keep cells 2 px apart
    for _ in range(300):
        radii = (rng.uniform(4, 9), rng.uniform(4, 9))
        centre = (rng.uniform(-2, shape[0] + 2), rng.uniform(-2, shape[1] + 2))
        reach = max(radii)
        if any(np.hypot(centre[0] - r, centre[1] - c) < reach + other + 2 for r, c, other in placed):
            continue
        cell = ellipse_mask(shape, centre, radii, rng.uniform(0, np.pi))
        if not cell.any():
            continue
        placed.append((centre[0], centre[1], reach))
        label[cell] = len(placed)
    instance = len(placed)
    # every cell gets its own brightness so that instances differ, plus smooth shading inside
    brightness = np.concatenate([[0.0], rng.uniform(0.55, 1.0, instance)])[label]
    signal = brightness * (1 + 0.15 * smooth_noise(rng, shape, 2)) * (label > 0)
    background = 0.08 + 0.04 * smooth_noise(rng, shape, 15)
    grey = ndimage.gaussian_filter(signal, 0.8) + background + rng.normal(0, 0.03, shape)
    if modality == 0:
        return to_uint8(grey * 230), label
    if modality == 1:
        rgb = 235 - np.stack([grey * 150, grey * 190, grey * 110], axis=-1)
        return to_uint8(rgb), label
    rgb = np.stack([grey * 40, grey * 230, grey * 50], axis=-1)
    return to_uint8(rgb), label


# ---- the realistic mirror ----------------------------------------------------------------------------------------
# What the real images hold (DATA_LAYOUTS.md §8, EXPERT_REPORTS.md §8): one labelled set pooling more than 50
# experiments of four modalities (bright-field, fluorescence, phase contrast, DIC), stored as bmp, png, tif/tiff or
# jpg, grey or RGB, 8- or 16-bit, of every size; cells of very different sizes and shapes (round nuclei, large
# irregular cells, rod-shaped bacteria), often touching in clusters. What this mirror draws for each image:
#
# - the modality (fluorescence 40 %, bright-field 25 %, phase contrast 20 %, DIC 15 %: DIC is the rare one) and with
#   it the polarity: bright cells on black (fluorescence), dark stained cells on a light field (bright-field), dark
#   cells in a bright halo whose centres shade off towards the background's grey (phase contrast: the dark rim is
#   what a threshold finds), or relief with one bright and one dark flank and the cell's mean equal to the
#   background's (DIC: no threshold finds it);
# - the file: 12-bit values in a 16-bit grey TIFF, 8-bit grey, RGB with the signal in one channel, grey replicated
#   into RGB, lossy JPEG for bright-field (MODALITY_FILES);
# - the cells: per-image mean radius (4.5-9 px nuclei to 7-13 px cells), log-normal size and brightness spread (dim
#   cells beside bright ones: a global threshold keeps one and loses the other; thickness, which sets the phase and
#   DIC contrast, varies less than stain uptake or expression: fluorescence spreads the cells' brightness to the
#   power 1.5: its 90th-percentile cell is 5 to 20 times its 10th), stained cells with a dark nucleus in a pale
#   cytoplasm holding a tenth to a fifth of the nucleus's stain (a threshold finds the nucleus, not the cell),
#   irregular outlines, rods 5-7 px wide and 14-28 px long in half of the phase-contrast images, and clusters in
#   which neighbours overlap (each pixel goes to the cell whose outline it lies deepest in, so touching cells share a
#   border, as in the annotations);
# - the optics: blur, vignetting and a tilted illumination, photon (Poisson) noise in fluorescence, unlabelled debris
#   and out-of-focus blobs.
#
# Sizes: 128-224 px a side (the real images are 500 px to whole slides: scaled to what a CPU trains on in minutes).
# Case count: the mirror writes ``cases`` labelled images (10 % of them in Tuning/, at least 2); the ladder and the
# tests use 40, so that 8 test images are scored (task.yaml's default of 10 leaves 2).
REALISTIC_SIDE = (128, 224)
MODALITIES = ("fluorescence", "brightfield", "phase", "dic")
MODALITY_SHARE = (0.4, 0.25, 0.2, 0.15)
# per modality, the files it is stored as: (suffix, layout); layouts: grey8, grey16 (12-bit values), rgb (colour),
# one-channel (RGB with the signal in one channel), grey-rgb (grey replicated into three channels)
MODALITY_FILES = {
    "fluorescence": ((".tif", "grey16"), (".png", "grey8"), (".tiff", "one-channel")),
    "brightfield": ((".jpg", "rgb"), (".png", "rgb"), (".bmp", "rgb")),
    "phase": ((".png", "grey8"), (".tif", "grey16"), (".bmp", "grey-rgb")),
    "dic": ((".png", "grey8"), (".tif", "grey8")),
}


@dataclass(frozen=True)
class CellShape:
    centre: tuple[float, float]  # (row, col)
    radii: tuple[float, float]
    angle: float
    harmonics: tuple[tuple[float, float], ...]  # (relative amplitude, phase) of the outline's 2nd, 3rd, 4th harmonic

    def depth(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """0 at the centre, 1 on the outline, above 1 outside."""
        dr, dc = rows - self.centre[0], cols - self.centre[1]
        u = (dr * np.cos(self.angle) + dc * np.sin(self.angle)) / self.radii[0]
        v = (-dr * np.sin(self.angle) + dc * np.cos(self.angle)) / self.radii[1]
        theta = np.arctan2(v, u)
        outline = 1.0 + sum(a * np.cos(h * theta + p) for h, (a, p) in enumerate(self.harmonics, start=2))
        return np.hypot(u, v) / outline


def write_realistic_download(downloads: Path, *, cases: int, seed: int) -> None:
    """The realistic mirror's archives: the easy mirror's names and layout, :func:`realistic_cells` images."""
    rng = np.random.default_rng(seed)
    n_tuning = max(2, cases // 10)
    number = 0
    for folder, count in (("Training-labeled", cases - n_tuning), ("Tuning", n_tuning)):
        members = []
        for _ in range(count):
            number += 1
            image, label, suffix = realistic_cells(rng)
            members.append((f"{folder}/images/cell_{number:05d}{suffix}", encode_image(image, suffix)))
            members.append((f"{folder}/labels/cell_{number:05d}_label.tiff", encode_image(label, ".tiff")))
        write_zip(downloads / f"{folder}.zip", members)
    image, label, suffix = realistic_cells(rng)
    write_zip(downloads / "Testing.zip",
              [(f"Testing/Public/images/cell_00001{suffix}", encode_image(image, suffix)),
               ("Testing/Public/labels/cell_00001_label.tiff", encode_image(label, ".tiff"))])
    for archive, folder in (("train-unlabeled-part1.zip", "release-part1"),
                            ("train-unlabeled-part2.zip", "train-unlabeled-part2")):
        members = []
        for i in (1, 2):
            image, _, suffix = realistic_cells(rng)
            members.append((f"{folder}/unlabeled_cell_{i:05d}{suffix}", encode_image(image, suffix)))
        write_zip(downloads / archive, members)


def realistic_cells(rng: np.random.Generator, modality: str | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """(image as stored, uint16 instance map, file suffix) of one realistic-mirror image; see the notes above."""
    if modality is None:
        modality = MODALITIES[int(rng.choice(len(MODALITIES), p=MODALITY_SHARE))]
    shape = (int(rng.integers(*REALISTIC_SIDE)), int(rng.integers(*REALISTIC_SIDE)))
    label, depth, brightness = _cell_layout(rng, shape, _draw_cells(rng, shape, modality))
    render = {"fluorescence": _fluorescence, "brightfield": _brightfield, "phase": _phase_contrast,
              "dic": _dic}[modality]
    values = render(rng, label, depth, brightness)
    files = MODALITY_FILES[modality]
    suffix, layout = files[int(rng.integers(len(files)))]
    return _stored(rng, values, layout), label, suffix


def _draw_cells(rng: np.random.Generator, shape: tuple[int, int], modality: str) -> list[CellShape]:
    """Cell outlines: clusters of overlapping neighbours plus scattered single cells."""
    rods = modality == "phase" and rng.uniform() < 0.5
    if rods:
        mean_radii, wobble = (rng.uniform(7, 14), rng.uniform(2.5, 3.5)), 0.04
    else:
        low, high, wobble = {"fluorescence": (4.5, 9.0, 0.08), "brightfield": (7.0, 13.0, 0.18),
                             "phase": (6.0, 11.0, 0.12), "dic": (7.0, 12.0, 0.1)}[modality]
        radius = rng.uniform(low, high)
        aspect = rng.uniform(1.0, 1.5)
        mean_radii = (radius * np.sqrt(aspect), radius / np.sqrt(aspect))
    mean_area = np.pi * mean_radii[0] * mean_radii[1]
    wanted = int(np.clip(rng.uniform(0.2, 0.45) * shape[0] * shape[1] / mean_area, 4, 160))
    clusters = rng.uniform((0, 0), shape, size=(int(rng.integers(1, 5)), 2))
    spread = rng.uniform(1.0, 2.0) * np.sqrt(mean_radii[0] * mean_radii[1]) * np.sqrt(wanted / len(clusters)) / 2
    cells: list[CellShape] = []
    sizes: list[float] = []
    for _ in range(40 * wanted):
        if len(cells) == wanted:
            break
        if rng.uniform() < 0.8:
            centre = clusters[int(rng.integers(len(clusters)))] + rng.normal(0, spread, 2)
        else:
            centre = rng.uniform((0, 0), shape)
        scale = float(np.exp(rng.normal(0, 0.2)))
        size = scale * float(np.sqrt(mean_radii[0] * mean_radii[1]))
        # neighbours may overlap by a third of their summed sizes: touching cells, but each keeps its core
        if any(np.hypot(centre[0] - c.centre[0], centre[1] - c.centre[1]) < 0.67 * (size + s)
               for c, s in zip(cells, sizes, strict=True)):
            continue
        harmonics = tuple((float(wobble / h * rng.uniform(-1, 1) * 2), float(rng.uniform(0, 2 * np.pi)))
                          for h in (2, 3, 4))
        cells.append(CellShape((float(centre[0]), float(centre[1])), (mean_radii[0] * scale, mean_radii[1] * scale),
                               float(rng.uniform(0, np.pi)), harmonics))
        sizes.append(size)
    return cells


def _cell_layout(rng: np.random.Generator, shape: tuple[int, int],
                 cells: list[CellShape]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(uint16 instance map, depth map (0 at a cell's centre, 1 on its border and outside), per-pixel brightness of
    its cell, log-normal). A pixel inside several outlines goes to the cell it lies deepest in; a cell squeezed to
    under a third of its outline, or to under 10 px, is left out."""
    owner = np.zeros(shape, dtype=np.int32)
    depth = np.ones(shape)
    for number, cell in enumerate(cells, start=1):
        reach = max(cell.radii) * 1.5 + 1
        r0, r1 = max(0, int(cell.centre[0] - reach)), min(shape[0], int(cell.centre[0] + reach) + 1)
        c0, c1 = max(0, int(cell.centre[1] - reach)), min(shape[1], int(cell.centre[1] + reach) + 1)
        if r0 >= r1 or c0 >= c1:
            continue
        rows, cols = np.mgrid[r0:r1, c0:c1]
        inside = cell.depth(rows.astype(float), cols.astype(float))
        window = depth[r0:r1, c0:c1]
        wins = inside < window
        window[wins] = inside[wins]
        owner[r0:r1, c0:c1][wins] = number
    counts = np.bincount(owner.ravel(), minlength=len(cells) + 1)
    nominal = np.array([0.0] + [np.pi * c.radii[0] * c.radii[1] for c in cells])
    keep = (counts >= 10) & (counts >= nominal / 3)
    keep[0] = False
    renumber = np.zeros(len(cells) + 1, dtype=np.uint16)
    renumber[keep] = np.arange(1, int(keep.sum()) + 1)
    label = renumber[owner]
    # a neighbour reaching across a cell can cut a sliver off it; an annotated cell is one piece, so the sliver
    # becomes background
    for number, box in enumerate(ndimage.find_objects(label), start=1):
        if box is None:
            continue
        pieces, count = ndimage.label(label[box] == number)
        if count > 1:
            largest = 1 + int(np.argmax(np.bincount(pieces.ravel())[1:]))
            label[box][(pieces > 0) & (pieces != largest)] = 0
    depth[label == 0] = 1.0
    spread = rng.uniform(0.4, 0.8)
    brightness = np.concatenate([[0.0], np.exp(rng.normal(0, spread, int(keep.sum())))])
    return label, depth, brightness[label]


def _illumination(rng: np.random.Generator, shape: tuple[int, int], strength: float) -> np.ndarray:
    """Vignetting around an off-centre point times a tilt: 1 at its brightest, down to about 1 - strength."""
    rows, cols = np.mgrid[: shape[0], : shape[1]]
    centre = rng.uniform(0.2, 0.8, 2) * shape
    radius = np.hypot(rows - centre[0], cols - centre[1]) / np.hypot(*shape)
    tilt = np.cos(rng.uniform(0, 2 * np.pi)) * (rows / shape[0] - 0.5) + np.sin(rng.uniform(0, 2 * np.pi)) * (
        cols / shape[1] - 0.5)
    field = 1.0 - strength * (0.6 * radius**2 / 0.25 + 0.4 * (tilt + 0.5))
    return np.clip(field, 1.0 - strength, 1.0)


def _debris(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Unlabelled specks (1-2 px) and a few out-of-focus blobs, as an amplitude map."""
    field = np.zeros(shape)
    for _ in range(int(rng.integers(0, 12))):
        spot = ellipse_mask(shape, tuple(rng.uniform((0, 0), shape)), (rng.uniform(1, 2), rng.uniform(1, 2)))
        field[spot] = rng.uniform(0.5, 1.5)
    for _ in range(int(rng.integers(0, 3))):
        blob = ellipse_mask(shape, tuple(rng.uniform((0, 0), shape)), (rng.uniform(8, 18), rng.uniform(8, 18)))
        field += ndimage.gaussian_filter(blob.astype(float), 5.0) * rng.uniform(0.3, 0.6)
    return field


def _fluorescence(rng: np.random.Generator, label: np.ndarray, depth: np.ndarray,
                  brightness: np.ndarray) -> np.ndarray:
    shape = label.shape
    texture = 1 + 0.15 * smooth_noise(rng, shape, 1.5)
    signal = brightness**1.5 * (1 - 0.5 * depth**2) * texture * (label > 0) + 0.8 * _debris(rng, shape)
    signal = ndimage.gaussian_filter(signal, rng.uniform(0.8, 1.6))
    background = rng.uniform(0.03, 0.12) * (1 + 0.3 * smooth_noise(rng, shape, 20))
    expected = np.maximum((signal + background) * _illumination(rng, shape, rng.uniform(0.2, 0.6)), 0)
    photons = rng.uniform(30, 300)  # per unit of brightness: low counts are visibly grainy
    return rng.poisson(expected * photons) / photons + rng.normal(0, 0.01, shape)


def _brightfield(rng: np.random.Generator, label: np.ndarray, depth: np.ndarray,
                 brightness: np.ndarray) -> np.ndarray:
    shape = label.shape
    stain = np.array([rng.uniform(0.5, 0.8), rng.uniform(0.8, 1.1), rng.uniform(0.3, 0.5)])
    if rng.uniform() < 0.4:  # a brown (DAB-like) stain instead of a purple one
        stain = np.array([rng.uniform(0.3, 0.45), rng.uniform(0.5, 0.7), rng.uniform(0.8, 1.0)])
    # a dark nucleus in a pale cytoplasm: the cell's outline is the faint edge of the cytoplasm
    nucleus = depth < rng.uniform(0.35, 0.55)
    density = brightness * (0.1 + 0.12 * (1 - depth**2) + 0.9 * nucleus) * (label > 0)
    density = density * (1 + 0.2 * smooth_noise(rng, shape, 1.5)) + 0.4 * _debris(rng, shape)
    density = ndimage.gaussian_filter(density, rng.uniform(0.7, 1.4)) + 0.05 * (1 + smooth_noise(rng, shape, 25))
    light = _illumination(rng, shape, rng.uniform(0.2, 0.5)) * rng.uniform(0.8, 1.0)
    rgb = light[..., None] * np.exp(-rng.uniform(0.6, 1.2) * density[..., None] * stain)
    return rgb + rng.normal(0, 0.015, (*shape, 3))


def _phase_contrast(rng: np.random.Generator, label: np.ndarray, depth: np.ndarray,
                    brightness: np.ndarray) -> np.ndarray:
    from skimage.segmentation import find_boundaries

    shape = label.shape
    cells = (label > 0).astype(float)
    halo = np.clip(ndimage.gaussian_filter(cells, 2.0) - cells, 0, None)
    seams = (find_boundaries(label, mode="inner") & ~find_boundaries(label > 0, mode="inner")).astype(float)
    grey = 0.5 - 0.22 * np.clip(brightness, 0.6, 1.6) * (0.2 + 0.8 * depth**2) * cells + 0.9 * halo + 0.15 * seams
    grey = ndimage.gaussian_filter(grey - 0.2 * _debris(rng, shape), rng.uniform(0.6, 1.1))
    grey = grey * _illumination(rng, shape, rng.uniform(0.2, 0.5)) + 0.05 * smooth_noise(rng, shape, 12)
    return grey + rng.normal(0, rng.uniform(0.01, 0.035), shape)


def _dic(rng: np.random.Generator, label: np.ndarray, depth: np.ndarray, brightness: np.ndarray) -> np.ndarray:
    shape = label.shape
    height = np.clip(brightness, 0.6, 1.6) * np.sqrt(np.clip(1 - depth**2, 0, 1)) * (label > 0)
    height = ndimage.gaussian_filter(height + 0.5 * _debris(rng, shape), rng.uniform(1.0, 1.6))
    shear = rng.uniform(0, 2 * np.pi)
    relief = np.cos(shear) * ndimage.sobel(height, 0) + np.sin(shear) * ndimage.sobel(height, 1)
    grey = 0.5 + 0.35 * relief / (np.abs(relief).max() + 1e-9) + 0.03 * height
    grey = grey * _illumination(rng, shape, rng.uniform(0.1, 0.3))
    return grey + rng.normal(0, rng.uniform(0.01, 0.03), shape)


def _stored(rng: np.random.Generator, values: np.ndarray, layout: str) -> np.ndarray:
    """Float intensities -> the array a file of ``layout`` holds (the brightest 0.1 % saturate)."""
    top = float(np.percentile(values, 99.9)) or 1.0
    scaled = np.clip(values / top, 0, 1)
    if layout == "grey16":
        return np.rint(scaled * rng.uniform(0.6, 1.0) * 4095).astype(np.uint16)
    grey8 = to_uint8(scaled * 255)
    if layout in ("grey8", "rgb"):
        return grey8
    if layout == "grey-rgb":
        return np.repeat(grey8[..., None], 3, axis=-1)
    channel = int(rng.choice([1, 2]))  # GFP in green or a nuclear stain in blue, a faint bleed into the others
    rgb = np.zeros((*grey8.shape, 3), dtype=np.uint8)
    rgb[..., channel] = grey8
    rgb[..., 3 - channel] = to_uint8(scaled * 255 * 0.08)
    return rgb
