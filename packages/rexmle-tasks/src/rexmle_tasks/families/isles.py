"""ISLES'22 (Zenodo 7960856): ischemic stroke lesion segmentation from DWI, ADC and FLAIR.

Real download (DATA_LAYOUTS.md §5): ``ISLES-2022.zip`` and ``center_ids.xlsx`` (unused). The zip unpacks into::

    ISLES-2022/sub-strokecaseNNNN/ses-0001/anat/sub-strokecaseNNNN_ses-0001_FLAIR.nii.gz
    ISLES-2022/sub-strokecaseNNNN/ses-0001/dwi/sub-strokecaseNNNN_ses-0001_dwi.nii.gz
    ISLES-2022/sub-strokecaseNNNN/ses-0001/dwi/sub-strokecaseNNNN_ses-0001_adc.nii.gz
    ISLES-2022/derivatives/sub-strokecaseNNNN/ses-0001/sub-strokecaseNNNN_ses-0001_msk.nii.gz

DWI, ADC and the binary mask share one grid; FLAIR has its own (the scans are not co-registered).

Prepared layout: ``public/{train,test}/images/<id>_0000.nii.gz`` (DWI) and ``<id>_0001.nii.gz`` (ADC), the two
channels on one grid as nnU-Net expects them; ``public/{train,test}/flair/<id>_flair.nii.gz`` (own grid, kept apart
so that it is never stacked with DWI/ADC by mistake); ``public/train/labels/<id>.nii.gz``. ``private/labels/`` and
``private/answers.csv`` (``case_id, label_path``). The test manifest carries each DWI image's geometry.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rexmle_grade.grader import TestManifest
from rexmle_grade.io import write_volume
from rexmle_tasks.base import PrepareContext, TaskFamily, register_family
from rexmle_tasks.families.synth2d import copy_file
from rexmle_tasks.families.synth3d import (
    Ellipsoid,
    Grid,
    Pose,
    copy_label_on_image_grid,
    image_geometry,
    lumpy_blob,
    render,
    require_folder,
    to_int16,
    union,
    write_answers,
    write_archive,
)

log = logging.getLogger(__name__)

ARCHIVE = "ISLES-2022.zip"
CENTRE_SHEET = "center_ids.xlsx"
ROOT = "ISLES-2022"
SESSION = "ses-0001"
CASE_PATTERN = re.compile(r"sub-strokecase\d{4}")
ID_COLUMN = "case_id"
CHANNELS = {"dwi": "0000", "adc": "0001"}  # nnU-Net channel numbers of the two co-registered inputs

# synthetic tissue codes and mean intensities per sequence (skull-stripped: outside the brain is exactly 0)
OUTSIDE, BRAIN, CSF, LESION = range(4)
SEQUENCES = {
    "dwi": {OUTSIDE: 0, BRAIN: 110, CSF: 25, LESION: 290},  # restricted diffusion: bright on DWI (b = 1000)
    "adc": {OUTSIDE: 0, BRAIN: 820, CSF: 2600, LESION: 460},  # ... and dark on the ADC map
    "flair": {OUTSIDE: 0, BRAIN: 320, CSF: 90, LESION: 420},  # subtle in the acute phase
}
NOISE_SD = {"dwi": 10.0, "adc": 70.0, "flair": 18.0}


def case_paths(root: Path, case_id: str) -> dict[str, Path]:
    """The four files of one case under the ``ISLES-2022/`` folder (real, case-sensitive names)."""
    stem = f"{case_id}_{SESSION}"
    session = root / case_id / SESSION
    return {
        "flair": session / "anat" / f"{stem}_FLAIR.nii.gz",
        "dwi": session / "dwi" / f"{stem}_dwi.nii.gz",
        "adc": session / "dwi" / f"{stem}_adc.nii.gz",
        "mask": root / "derivatives" / case_id / SESSION / f"{stem}_msk.nii.gz",
    }


@register_family
class IslesFamily(TaskFamily):
    name = "isles"
    synthetic_difficulties = ("easy", "realistic")

    # ---- raw data ---------------------------------------------------------------------------------------------
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int, difficulty: str = "easy") -> None:
        rng = np.random.default_rng(seed)
        make = _realistic_stroke_case if difficulty == "realistic" else _stroke_case
        numbers = sorted(int(n) for n in rng.choice(np.arange(1, 251), size=cases, replace=False))

        def fill(scratch: Path) -> None:
            for number in numbers:
                case_id = f"sub-strokecase{number:04d}"
                paths = case_paths(scratch / ROOT, case_id)
                for name, (array, grid) in make(rng).items():
                    write_volume(paths[name], array, grid.geometry)

        write_archive(downloads / ARCHIVE, fill)
        # The sheet's columns are unknown and no task reads it, and writing a real .xlsx needs a spreadsheet
        # library rexmle does not depend on: a named placeholder keeps the download's file list complete.
        (downloads / CENTRE_SHEET).write_bytes(b"synthetic placeholder for center_ids.xlsx (not a spreadsheet)\n")

    def _root(self, raw: Path) -> Path:
        return require_folder([raw / ROOT], f"the {ROOT}/ folder of {ARCHIVE}")

    def case_ids(self, raw: Path) -> list[str]:
        root = self._root(raw)
        ids = []
        for folder in sorted(root.iterdir()):
            if CASE_PATTERN.fullmatch(folder.name):
                paths = case_paths(root, folder.name)
                missing = [p.name for p in paths.values() if not p.is_file()]
                if missing:
                    log.warning("skipping ISLES'22 case %s: %s missing", folder.name, ", ".join(missing))
                else:
                    ids.append(folder.name)
        return ids

    # ---- preparation ------------------------------------------------------------------------------------------
    def prepare(self, ctx: PrepareContext) -> TestManifest:
        root = self._root(ctx.raw)
        for case_id in ctx.split.train:
            paths = case_paths(root, case_id)
            self._copy_inputs(paths, ctx.public / "train", case_id)
            copy_label_on_image_grid(paths["mask"], paths["dwi"], ctx.public / "train" / "labels" / f"{case_id}.nii.gz")
        geometry = {}
        rows = []
        for case_id in ctx.split.test:
            paths = case_paths(root, case_id)
            dwi = self._copy_inputs(paths, ctx.public / "test", case_id)
            copy_label_on_image_grid(paths["mask"], paths["dwi"], ctx.private / "labels" / f"{case_id}.nii.gz")
            geometry[case_id] = image_geometry(dwi)
            rows.append((case_id, f"labels/{case_id}.nii.gz"))
        write_answers(ctx.private, ID_COLUMN, rows)
        return TestManifest(ids=tuple(ctx.split.test), geometry=geometry)

    @staticmethod
    def _copy_inputs(paths: dict[str, Path], dest: Path, case_id: str) -> Path:
        """Copy DWI, ADC (nnU-Net channel names) and FLAIR; returns the public DWI path."""
        for name, channel in CHANNELS.items():
            copy_file(paths[name], dest / "images" / f"{case_id}_{channel}.nii.gz")
        copy_file(paths["flair"], dest / "flair" / f"{case_id}_flair.nii.gz")
        return dest / "images" / f"{case_id}_{CHANNELS['dwi']}.nii.gz"


@dataclass(frozen=True)
class _Brain:
    """The anatomy of one synthetic case in the DWI scan's coordinates (mm)."""

    brain: Ellipsoid
    ventricles: tuple[Ellipsoid, ...]
    lesions: tuple[tuple[Ellipsoid, ...], ...]  # each lesion: the parts of a lumpy blob

    def seen_by(self, pose: Pose) -> _Brain:
        return _Brain(self.brain.seen_by(pose), tuple(v.seen_by(pose) for v in self.ventricles),
                      tuple(tuple(part.seen_by(pose) for part in lesion) for lesion in self.lesions))

    def tissue(self, grid: Grid) -> np.ndarray:
        tissue = np.full(grid.shape, OUTSIDE, dtype=np.uint8)
        tissue[self.brain.mask(grid)] = BRAIN
        tissue[union(grid, self.ventricles)] = CSF
        for lesion in self.lesions:  # infarcts lie in the parenchyma, never in the ventricles
            tissue[union(grid, lesion) & (tissue == BRAIN)] = LESION
        return tissue


def _stroke_case(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, Grid]]:
    """One synthetic case: DWI, ADC and mask on one grid, FLAIR on its own grid of a slightly moved head."""
    brain_radii = np.array([60.0, 72.0, 54.0]) * rng.uniform(0.92, 1.08, 3)
    dwi_spacing = [(2.0, 2.0, 3.0), (1.8, 1.8, 4.0), (2.2, 2.2, 3.0)][int(rng.integers(3))]
    dwi_grid = Grid.covering(2.2 * brain_radii, dwi_spacing, centre=rng.uniform(-4, 4, 3))
    flair_grid = Grid.covering(2.3 * brain_radii, (1.6, 1.6, 5.0), centre=rng.uniform(-4, 4, 3))
    ventricles = tuple(Ellipsoid.of(np.array([side * 8.0, -4.0, 10.0]) + rng.uniform(-2, 2, 3), (5.0, 17.0, 9.0))
                       for side in (-1, 1))
    brightness = {"dwi": rng.uniform(0.8, 1.25), "adc": rng.uniform(0.9, 1.1), "flair": rng.uniform(0.85, 1.2)}
    while True:  # every ISLES'22 training case has a lesion: redraw lesions that a ventricle swallowed
        lesions = tuple(tuple(lumpy_blob(rng, *_lesion_site(rng, brain_radii)))
                        for _ in range(int(rng.integers(1, 4))))
        anatomy = _Brain(Ellipsoid.of((0, 0, 0), brain_radii), ventricles, lesions)
        dwi_tissue = anatomy.tissue(dwi_grid)
        if (dwi_tissue == LESION).sum() >= 10:
            break
    pose = Pose(float(rng.uniform(-6, 6)), tuple(float(v) for v in rng.uniform(-4, 4, 3)))  # type: ignore[arg-type]

    def image(tissue: np.ndarray, sequence: str) -> np.ndarray:
        lut = {k: v * brightness[sequence] for k, v in SEQUENCES[sequence].items()}
        return to_int16(np.maximum(render(tissue, lut, rng, noise_sd=NOISE_SD[sequence], texture=0.05), 0.0))

    return {
        "dwi": (image(dwi_tissue, "dwi"), dwi_grid),
        "adc": (image(dwi_tissue, "adc"), dwi_grid),
        "flair": (image(anatomy.seen_by(pose).tissue(flair_grid), "flair"), flair_grid),
        "mask": ((dwi_tissue == LESION).astype(np.uint8), dwi_grid),
    }


def _lesion_site(rng: np.random.Generator, brain_radii: np.ndarray) -> tuple[np.ndarray, float]:
    """(centre, radius) in mm of one infarct, well inside the brain."""
    direction = rng.normal(size=3)
    centre = direction / np.linalg.norm(direction) * rng.uniform(0.15, 0.7) * brain_radii
    return centre, float(rng.uniform(3.5, 14.0))


# ---- the realistic mirror ----------------------------------------------------------------------------------------
# What makes real ISLES'22 hard for a threshold: scanners (1.5 T / 3 T) differ in noise and in the unnormalised DWI
# scale, the EPI readout leaves a strong bias field and bright susceptibility artefacts near the skull base, old
# infarcts are bright on DWI too (T2 shine-through) but bright, not dark, on ADC, sub-acute lesions are only faintly
# bright, many lesions are a few voxels, and the reference masks are drawn by hand (boundaries off by a voxel).
ACUTE, SUBACUTE, OLD_INFARCT, ARTEFACT = 4, 5, 6, 7  # tissue codes beside OUTSIDE, BRAIN, CSF (LESION is unused)
LABELLED = (ACUTE, SUBACUTE)
RELATIVE = {  # tissue mean relative to the brain's, per sequence; drawn per case within these ranges
    "dwi": {CSF: (0.2, 0.25), ACUTE: (2.0, 2.8), SUBACUTE: (1.3, 1.7), OLD_INFARCT: (1.4, 2.0), ARTEFACT: (1.8, 3.0)},
    "adc": {CSF: (3.0, 3.4), ACUTE: (0.5, 0.65), SUBACUTE: (0.7, 0.85), OLD_INFARCT: (1.3, 1.7), ARTEFACT: (0.65, 1.1)},
    "flair": {CSF: (0.25, 0.3), ACUTE: (1.0, 1.1), SUBACUTE: (1.2, 1.4), OLD_INFARCT: (1.3, 1.6), ARTEFACT: (0.9, 1.1)},
}


def _realistic_stroke_case(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, Grid]]:
    """One case of the realistic mirror: the layout of :func:`_stroke_case`, the confounders described above."""
    brain_radii = np.array([60.0, 72.0, 54.0]) * rng.uniform(0.88, 1.12, 3)
    dwi_spacing = [(2.0, 2.0, 3.0), (1.8, 1.8, 4.0), (2.2, 2.2, 3.0)][int(rng.integers(3))]
    dwi_grid = Grid.covering(2.2 * brain_radii, dwi_spacing, centre=rng.uniform(-6, 6, 3))
    flair_grid = Grid.covering(2.3 * brain_radii, (1.6, 1.6, 5.0), centre=rng.uniform(-4, 4, 3))
    ventricles = tuple(Ellipsoid.of(np.array([side * 8.0, -4.0, 10.0]) + rng.uniform(-3, 3, 3),
                                    (5.0, 17.0, 9.0) * rng.uniform(0.7, 1.5, 3)) for side in (-1, 1))
    brain = Ellipsoid.of((0, 0, 0), brain_radii)
    while True:
        lesions = [(ACUTE if rng.uniform() < 0.6 else SUBACUTE,
                    tuple(lumpy_blob(rng, *_small_or_large(rng, brain_radii)))) for _ in range(int(rng.integers(1, 7)))]
        distractors = [(OLD_INFARCT, tuple(lumpy_blob(rng, *_lesion_site(rng, brain_radii))))
                       for _ in range(int(rng.integers(0, 3)))]
        if rng.uniform() < 0.6:  # susceptibility artefact: a flat bright patch at the frontal-temporal base
            side = rng.choice([-1.0, 1.0])
            centre = np.array([side * 0.45, 0.55, -0.75]) * brain_radii + rng.uniform(-4, 4, 3)
            distractors.append((ARTEFACT, (Ellipsoid.of(centre, (rng.uniform(6, 12), rng.uniform(4, 8), 3.0),
                                                        float(rng.uniform(0, 180))),)))
        tissue = np.full(dwi_grid.shape, OUTSIDE, dtype=np.uint8)
        tissue[brain.mask(dwi_grid)] = BRAIN
        tissue[union(dwi_grid, ventricles)] = CSF
        for code, parts in (*distractors, *lesions):  # lesions last: they win where they overlap a distractor
            tissue[union(dwi_grid, parts) & (tissue != OUTSIDE) & (tissue != CSF)] = code
        if np.isin(tissue, LABELLED).sum() >= 4:
            break
    # the FLAIR scan of a slightly moved head, with the same anatomy resampled by nearest neighbour
    pose = Pose(float(rng.uniform(-6, 6)), tuple(float(v) for v in rng.uniform(-4, 4, 3)))  # type: ignore[arg-type]
    flair_tissue = np.full(flair_grid.shape, OUTSIDE, dtype=np.uint8)
    flair_tissue[brain.seen_by(pose).mask(flair_grid)] = BRAIN
    flair_tissue[union(flair_grid, tuple(v.seen_by(pose) for v in ventricles))] = CSF
    for code, parts in (*distractors, *lesions):
        flair_tissue[union(flair_grid, tuple(p.seen_by(pose) for p in parts)) & (flair_tissue == BRAIN)] = code
    three_tesla = rng.uniform() < 0.5
    scale = {"dwi": rng.uniform(0.5, 2.0) * 110, "adc": rng.uniform(0.75, 1.3) * 820,
             "flair": rng.uniform(0.7, 1.4) * 320}
    noise = {"dwi": 0.07 if three_tesla else 0.12, "adc": 0.06 if three_tesla else 0.1, "flair": 0.06}
    bias = {"dwi": 0.6, "adc": 0.35, "flair": 0.25}

    def image(tissue_map: np.ndarray, sequence: str) -> np.ndarray:
        lut = {OUTSIDE: 0.0, BRAIN: scale[sequence]}
        for code, (low, high) in RELATIVE[sequence].items():
            lut[code] = scale[sequence] * rng.uniform(low, high)
        values = render(tissue_map, lut, rng, noise_sd=noise[sequence] * scale[sequence], texture=0.12,
                        bias=bias[sequence])
        return to_int16(np.maximum(values, 0.0))

    mask = np.isin(tissue, LABELLED)
    return {
        "dwi": (image(tissue, "dwi"), dwi_grid),
        "adc": (image(tissue, "adc"), dwi_grid),
        "flair": (image(flair_tissue, "flair"), flair_grid),
        "mask": (_hand_drawn(rng, mask, tissue != OUTSIDE).astype(np.uint8), dwi_grid),
    }


def _small_or_large(rng: np.random.Generator, brain_radii: np.ndarray) -> tuple[np.ndarray, float]:
    """(centre, radius) of one infarct: radii log-uniform between 2 and 14 mm, so many lesions are a few voxels."""
    centre, _ = _lesion_site(rng, brain_radii)
    return centre, float(np.exp(rng.uniform(np.log(2.0), np.log(14.0))))


def _hand_drawn(rng: np.random.Generator, mask: np.ndarray, inside: np.ndarray) -> np.ndarray:
    """A reference mask as an annotator draws it: stretches of the boundary a voxel out or in (a lesion is never
    lost, and a lesion of a few voxels is drawn whole)."""
    from scipy import ndimage

    patches = ndimage.gaussian_filter(rng.standard_normal(mask.shape), 2.0)
    grown = ndimage.binary_dilation(mask) & inside & (patches > 1.0 * patches.std())
    shrunk = mask & ~(ndimage.binary_erosion(mask) | (patches > -1.0 * patches.std()))
    labels, n = ndimage.label(mask)
    sizes = ndimage.sum(mask, labels, range(1, n + 1))
    small = np.isin(labels, [i + 1 for i, size in enumerate(sizes) if size < 30])
    return (mask | grown) & ~(shrunk & ~small)
