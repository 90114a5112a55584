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
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int) -> None:
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
