"""PANTHER 2025 (Zenodo 15192302): pancreatic tumour segmentation in MRI, tasks 1 (diagnostic T1 arterial) and 2
(MR-Linac T2).

Real download (DATA_LAYOUTS.md §3): the record holds ``PANTHER_Task1.zip`` and ``PANTHER_Task2.zip``; each task
downloads both into its own raw folder. They unpack into ``PANTHER_TaskN/`` (the layout third parties show) or,
possibly, straight into ``raw/`` (what the ReX-MLE release expected); both are accepted, including both tasks' files
mixed in one flat ``ImagesTr/``, which is why cases are told apart by their id pattern::

    PANTHER_Task1/ImagesTr/<pid>_0001_0000.mha   LabelsTr/<pid>_0001.mha   ImagesTr_unlabeled/*.mha
    PANTHER_Task2/ImagesTr/<pid>_0000.mha        LabelsTr/<pid>.mha

Labels: 0 background, 1 tumour, 2 pancreas. Case ids: ``10000_0001`` (task 1), ``10303`` (task 2).

Prepared layout (nnU-Net style): ``public/train/images/<id>_0000.mha``, ``public/train/labels/<id>.mha`` (raw
label maps, 0/1/2), ``public/test/images/<id>_0000.mha``; task 1 also ``public/train_unlabeled/images/*.mha`` (every
unannotated scan, as the release shipped them). ``private/labels/<id>.mha`` (raw 0/1/2 maps; the grader scores
tumour = 1) and ``private/answers.csv`` (``image_id, label_path``).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from enum import IntEnum
from pathlib import Path

import numpy as np
from scipy import ndimage

from rexmle_grade.errors import ConfigurationError, RexmleError
from rexmle_grade.grader import TestManifest
from rexmle_grade.io import Geometry, write_volume
from rexmle_tasks.base import PrepareContext, TaskFamily, register_family
from rexmle_tasks.families.synth2d import copy_file, smooth_noise
from rexmle_tasks.families.synth3d import (
    Ellipsoid,
    Grid,
    copy_label_on_image_grid,
    image_geometry,
    lumpy_blob,
    polyline,
    render,
    require_folder,
    to_int16,
    tube,
    union,
    write_answers,
    write_archive,
)

log = logging.getLogger(__name__)

ARCHIVES = {1: "PANTHER_Task1.zip", 2: "PANTHER_Task2.zip"}
CHANNEL_SUFFIX = "_0000.mha"
# task-1 ids carry a 4-digit sequence number (10000_0001); task-2 ids are the bare 5-digit patient id (10303)
ID_PATTERNS = {1: re.compile(r"\d{5}_\d{4}"), 2: re.compile(r"\d{5}")}
TUMOUR, PANCREAS = 1, 2
ID_COLUMN = "image_id"

# the 50 task-2 patients (DIAGNijmegen/PANTHER_baseline, TASK2_baseline/task2_splits_final.json)
TASK2_IDS = (
    "10303", "10304", "10306", "10307", "10309", "10310", "10312", "10314", "10315", "10317", "10318", "10321", "10322",
    "10323", "10324", "10325", "10327", "10328", "10329", "10330", "10331", "10333", "10334", "10336", "10338", "10339",
    "10340", "10341", "10342", "10343", "10344", "10346", "10348", "10352", "10353", "10354", "10355", "10358", "10359",
    "10361", "10362", "10364", "10365", "10368", "10372", "10373", "10379", "10380", "10381", "10383",
)

# synthetic tissue codes and their mean intensity per sequence
AIR, BODY, LIVER, KIDNEY, SPLEEN, SPINE, AORTA, FLUID, PANCREAS_T, TUMOUR_T = range(10)
T1_ARTERIAL = {AIR: 0, BODY: 420, LIVER: 520, KIDNEY: 720, SPLEEN: 560, SPINE: 330, AORTA: 950, FLUID: 90,
               PANCREAS_T: 690, TUMOUR_T: 240}  # fat-suppressed; hypo-enhancing adenocarcinoma
T2_LINAC = {AIR: 0, BODY: 300, LIVER: 210, KIDNEY: 760, SPLEEN: 460, SPINE: 330, AORTA: 60, FLUID: 900,
            PANCREAS_T: 400, TUMOUR_T: 580}  # flow void in the aorta, tumour mildly hyperintense
OTHER_SEQUENCES = (  # task 1's unannotated scans are other sequences: portal-venous and T2-like contrasts
    {AIR: 0, BODY: 380, LIVER: 600, KIDNEY: 640, SPLEEN: 610, SPINE: 180, AORTA: 700, FLUID: 70, PANCREAS_T: 560,
     TUMOUR_T: 330},
    T2_LINAC,
)


@register_family
class PantherFamily(TaskFamily):
    name = "panther"
    synthetic_difficulties = ("easy", "realistic")

    @property
    def task_number(self) -> int:
        number = self.options.get("task")
        if number not in ARCHIVES:
            raise ConfigurationError(
                f"task {self.meta.id!r}: PANTHER option 'task' is {number!r}; expected 1 or 2 in its task.yaml"
            )
        return int(number)

    # ---- raw data ---------------------------------------------------------------------------------------------
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int, difficulty: str = "easy") -> None:
        # the record is downloaded whole by either task, so the mirror always writes both archives
        if difficulty == "realistic":
            _write_realistic_download(downloads, cases=cases, seed=seed)
            return
        rng = np.random.default_rng(seed)
        labelled, unlabelled, task2 = _mirror_ids(rng, cases)

        def fill_task1(root: Path) -> None:
            top = root / "PANTHER_Task1"
            for pid in labelled:
                image, label, grid = _abdomen(rng, T1_ARTERIAL, spacing=(1.2, 1.2, 3.0))
                write_volume(top / "ImagesTr" / f"{pid}_0001{CHANNEL_SUFFIX}", image, grid.geometry)
                write_volume(top / "LabelsTr" / f"{pid}_0001.mha", label, grid.geometry)
            # the unannotated file names are unknown; any *.mha name is accepted by prepare
            for k, pid in enumerate(unlabelled):
                image, _, grid = _abdomen(rng, OTHER_SEQUENCES[k % 2], spacing=(1.4, 1.4, 4.0))
                write_volume(top / "ImagesTr_unlabeled" / f"{pid}_000{2 + k % 2}_0000.mha", image, grid.geometry)

        def fill_task2(root: Path) -> None:
            top = root / "PANTHER_Task2"
            for pid in task2:
                image, label, grid = _abdomen(rng, T2_LINAC, spacing=(1.0, 1.0, 2.0))
                write_volume(top / "ImagesTr" / f"{pid}{CHANNEL_SUFFIX}", image, grid.geometry)
                write_volume(top / "LabelsTr" / f"{pid}.mha", label, grid.geometry)

        write_archive(downloads / ARCHIVES[1], fill_task1)
        write_archive(downloads / ARCHIVES[2], fill_task2)

    def _task_root(self, raw: Path) -> Path:
        images = [raw / f"PANTHER_Task{self.task_number}" / "ImagesTr", raw / "ImagesTr"]
        return require_folder(images, f"PANTHER task {self.task_number} images").parent

    def _pairs(self, raw: Path) -> dict[str, tuple[Path, Path]]:
        root = self._task_root(raw)
        pattern = ID_PATTERNS[self.task_number]
        pairs: dict[str, tuple[Path, Path]] = {}
        for image in sorted((root / "ImagesTr").glob(f"*{CHANNEL_SUFFIX}")):
            case_id = image.name[: -len(CHANNEL_SUFFIX)]
            label = root / "LabelsTr" / f"{case_id}.mha"
            if not pattern.fullmatch(case_id):
                continue  # the other task's scans, when both archives were unpacked into one folder
            if label.is_file():
                pairs[case_id] = (image, label)
            else:
                log.warning("skipping PANTHER case %s: no label %s", case_id, label)
        return pairs

    def case_ids(self, raw: Path) -> list[str]:
        return sorted(self._pairs(raw))

    # ---- preparation ------------------------------------------------------------------------------------------
    def prepare(self, ctx: PrepareContext) -> TestManifest:
        pairs = self._pairs(ctx.raw)
        for case_id in ctx.split.train:
            image, label = pairs[case_id]
            copy_file(image, ctx.public / "train" / "images" / f"{case_id}{CHANNEL_SUFFIX}")
            copy_label_on_image_grid(label, image, ctx.public / "train" / "labels" / f"{case_id}.mha")
        if self.task_number == 1:
            unlabelled = self._task_root(ctx.raw) / "ImagesTr_unlabeled"
            for image in sorted(unlabelled.glob("*.mha")):
                copy_file(image, ctx.public / "train_unlabeled" / "images" / image.name)
        geometry = {}
        rows = []
        for case_id in ctx.split.test:
            image, label = pairs[case_id]
            public_image = copy_file(image, ctx.public / "test" / "images" / f"{case_id}{CHANNEL_SUFFIX}")
            private_label = copy_label_on_image_grid(label, image, ctx.private / "labels" / f"{case_id}.mha")
            _require_tumour(private_label, case_id)
            geometry[case_id] = image_geometry(public_image)
            rows.append((case_id, f"labels/{case_id}.mha"))
        write_answers(ctx.private, ID_COLUMN, rows)
        return TestManifest(ids=tuple(ctx.split.test), geometry=geometry)


def _mirror_ids(rng: np.random.Generator, cases: int) -> tuple[list[str], list[str], list[str]]:
    """The mirror's patient ids: task 1's labelled and unlabelled scans, and task 2's (a subset of the real 50)."""
    n_unlabelled = max(2, cases // 3)
    pids = [str(p) for p in rng.choice(np.arange(10001, 10460), size=cases - 1 + n_unlabelled, replace=False)]
    labelled = sorted(["10000", *pids[: cases - 1]])  # the real task-1 ids start at 10000
    unlabelled = sorted(pids[cases - 1 :])
    task2 = sorted(str(p) for p in rng.choice(TASK2_IDS, size=min(cases, len(TASK2_IDS)), replace=False))
    return labelled, unlabelled, task2


def _require_tumour(label: Path, case_id: str) -> None:
    """A test case without tumour cannot be graded meaningfully: the official evaluation gives it hd95 = inf and
    masd = NaN, and even its perfect (empty) prediction takes the uniform-prediction penalty (Dice 0)."""
    import SimpleITK as sitk

    if not (sitk.GetArrayViewFromImage(sitk.ReadImage(str(label))) == TUMOUR).any():
        raise RexmleError(
            f"PANTHER test case {case_id!r} has no tumour voxels (label {TUMOUR}) in {label.name}: even a perfect "
            "(empty) prediction of it would score Dice 0 under the official penalty rule",
            hint="report this to the rexmle maintainers: the task's split must keep tumour-free cases out of the "
                 "test set before it can be graded",
        )


def _abdomen(rng: np.random.Generator, lut: dict[int, float], *, spacing: tuple[float, float, float],
             ) -> tuple[np.ndarray, np.ndarray, Grid]:
    """One synthetic upper-abdomen MRI: (int16 image, uint8 label 0/1/2, grid). Patient axes: x towards the
    patient's left, y posterior, z superior (LPS), origin near the pancreas."""
    scale = rng.uniform(0.9, 1.1)
    extent = np.array([84.0, 72.0, 114.0]) * rng.uniform(0.95, 1.08, 3)
    grid = Grid.covering(extent, spacing, centre=rng.uniform(-3, 3, 3))

    def jitter(point: tuple[float, float, float], amount: float = 2.5) -> np.ndarray:
        return np.asarray(point) * scale + rng.uniform(-amount, amount, 3)

    def organ(centre: tuple[float, float, float], radii: tuple[float, float, float], angle_deg: float = 0.0,
              wobble: float = 2.5) -> np.ndarray:
        return Ellipsoid.of(jitter(centre, wobble), np.asarray(radii) * scale, angle_deg).mask(grid)

    tissue = np.full(grid.shape, AIR, dtype=np.uint8)
    tissue[organ((0, 2, 0), (38, 31, 400))] = BODY
    tissue[organ((-20, 0, 14), (17, 19, 26), angle_deg=15)] = LIVER
    tissue[organ((26, 12, 14), (8, 7, 14))] = SPLEEN
    for side in (-1, 1):
        tissue[organ((19 * side, 15, -4), (6, 5, 12))] = KIDNEY
    tissue[organ((0, 22, 0), (7, 6.5, 400), wobble=1.0)] = SPINE
    tissue[organ((-13, -10, -12), (5, 4, 6))] = FLUID  # bowel / duodenum
    aorta_x = 4 * scale + rng.uniform(-1.5, 1.5)
    tissue[tube(grid, np.array([[aorta_x, 11.0, -80.0], [aorta_x, 11.0, 80.0]]), [3.6 * scale] * 2)] = AORTA

    # pancreas: a curved tube from the head (patient's right, low) to the tail (left, high, towards the spleen)
    path = polyline([jitter((-14, -3, -8)), jitter((-4, -8, -2)), jitter((9, -4, 3)), jitter((21, 5, 8))])
    radii = np.linspace(6.0, 3.8, len(path)) * scale
    pancreas = tube(grid, path, radii)
    tumour = _tumour(rng, grid, path, pancreas)
    tissue[pancreas] = PANCREAS_T
    tissue[tumour] = TUMOUR_T

    label = np.zeros(grid.shape, dtype=np.uint8)
    label[pancreas] = PANCREAS
    label[tumour] = TUMOUR
    intensity_scale = rng.uniform(0.85, 1.2)  # MR intensities carry no absolute unit
    image = render(tissue, {k: v * intensity_scale for k, v in lut.items()}, rng, noise_sd=22.0 * intensity_scale,
                   texture=0.05, bias=0.1)
    return to_int16(np.maximum(image, 0.0)), label, grid


def _tumour(rng: np.random.Generator, grid: Grid, path: np.ndarray, pancreas: np.ndarray) -> np.ndarray:
    """A lumpy tumour centred on the pancreas, allowed to bulge slightly beyond it; never empty."""
    while True:
        centre = path[int(rng.integers(1, len(path) - 1))] + rng.uniform(-1.5, 1.5, 3)
        blob = union(grid, lumpy_blob(rng, centre, float(rng.uniform(4.5, 9.0))))
        tumour = blob & _dilated(pancreas)
        if tumour.sum() >= 20:
            return tumour


def _dilated(mask: np.ndarray) -> np.ndarray:
    return ndimage.binary_dilation(mask, iterations=1)


# ---- the realistic mirror ----------------------------------------------------------------------------------------
# What makes real PANTHER hard for a threshold (EXPERT_REPORTS.md §3: the winner's cross-validated tumour Dice is
# 0.66 on task 1 and 0.52 on task 2; the organisers' baseline first finds the pancreas, then the tumour in a crop):
#
# - the tumour is told apart by where it lies, not by its intensity: on fat-suppressed arterial T1 the
#   adenocarcinoma is hypo-enhancing, as dark as peripancreatic fat, muscle, the unenhanced IVC or bowel content, and
#   it sits inside (or bulging out of) the brightly enhancing pancreas, next to the duodenum and the SMV; on the
#   MR-Linac T2 it is only mildly hyperintense to the pancreas and darker than the unsuppressed fat around it;
# - a dilated pancreatic duct upstream of a head tumour (the obstructed duct: a dark tube on T1, bright on T2) is
#   pancreas, not tumour;
# - each case is drawn in its own field of view: where the technologist centred the scan varies, so the pancreas
#   lies up to 20 mm (22 mm craniocaudally) from its average place relative to the image centre; its tail runs flat
#   or steeply up towards the spleen; tumours sit in the head (60 %), body or tail, 7-15 mm in radius, a small part
#   of the volume (class imbalance);
# - spacing varies per case and is anisotropic: task 1 about 1.0-1.5 mm in plane and 2.5-4 mm slices (the real
#   nnU-Net fingerprint: 1.19 x 1.19 x 3.0 mm), task 2 0.9-1.25 mm and 1.6-2.5 mm (real mean 1 x 1 x 2 mm);
# - MR has no intensity unit: the pancreas level spans a decade across sites, the receive coils leave a strong
#   bias field (30-50 %), noise is Rician (magnitude images) and higher on the MR-Linac, fat suppression works
#   better in some scans than others;
# - breathing: a failed breath hold ghosts a faint copy of the anatomy along the phase-encoding (anterior-posterior)
#   axis in a third of task-1 scans; the free-breathing MR-Linac scans are blurred along y and z and ghost in half;
# - the reference masks are drawn by hand on a low-contrast boundary: stretches of the tumour outline lie about
#   1.5 mm out or in;
# - headers carry the scanner's coordinates: origins differ by tens of centimetres between scans (the table
#   position), direction axial (identity).
#
# Sizes, scaled to CPU training: a crop of the upper abdomen around the pancreas (about 140 x 112 x 90 mm, task 1
# about 110 x 90 x 28 voxels; task 2 128 x 104 x 84 mm, about 120 x 97 x 41 voxels) with the organs at their real
# size. The default case count is the task's (10); the ladder is measured on 30 cases (24 training, 6 test), since
# single test cases swing the tumour Dice between 0 and 0.6.


class _Tissue(IntEnum):
    AIR = 0
    FAT = 1
    MUSCLE = 2
    LIVER = 3
    SPLEEN = 4
    CORTEX = 5
    MEDULLA = 6
    BONE = 7
    ARTERY = 8
    IVC = 9
    PORTAL = 10  # SMV, splenic and portal veins
    GUT_WALL = 11
    GUT_CONTENT = 12
    DUCT = 13
    PANCREAS = 14
    TUMOUR = 15


# each tissue's mean relative to the normal pancreas, drawn per case within these ranges
_T = _Tissue
_T1_ARTERIAL_REL = {
    _T.AIR: (0.0, 0.0), _T.FAT: (0.22, 0.45), _T.MUSCLE: (0.42, 0.55), _T.LIVER: (0.6, 0.75), _T.SPLEEN: (0.75, 0.95),
    _T.CORTEX: (1.1, 1.35), _T.MEDULLA: (0.5, 0.65), _T.BONE: (0.35, 0.5), _T.ARTERY: (1.5, 2.0),
    _T.IVC: (0.45, 0.6), _T.PORTAL: (0.7, 1.0), _T.GUT_WALL: (0.75, 0.95), _T.GUT_CONTENT: (0.15, 0.6),
    _T.DUCT: (0.15, 0.3), _T.PANCREAS: (1.0, 1.0), _T.TUMOUR: (0.45, 0.68),
}
_T2_LINAC_REL = {
    _T.AIR: (0.0, 0.0), _T.FAT: (1.3, 1.8), _T.MUSCLE: (0.45, 0.6), _T.LIVER: (0.5, 0.65), _T.SPLEEN: (1.1, 1.4),
    _T.CORTEX: (1.3, 1.6), _T.MEDULLA: (1.6, 2.0), _T.BONE: (0.7, 0.9), _T.ARTERY: (0.1, 0.3), _T.IVC: (0.2, 0.5),
    _T.PORTAL: (0.2, 0.5), _T.GUT_WALL: (0.8, 1.0), _T.GUT_CONTENT: (1.5, 3.0), _T.DUCT: (2.5, 3.2),
    _T.PANCREAS: (1.0, 1.0), _T.TUMOUR: (1.12, 1.35),
}
_PORTAL_VENOUS_REL = {  # one of the unannotated task-1 sequences
    **_T1_ARTERIAL_REL, _T.LIVER: (0.9, 1.05), _T.SPLEEN: (0.95, 1.05), _T.ARTERY: (1.1, 1.3), _T.IVC: (1.0, 1.2),
    _T.PORTAL: (1.2, 1.4), _T.TUMOUR: (0.6, 0.8),
}


@dataclass(frozen=True)
class _Protocol:
    """How one task's scans are acquired in the realistic mirror."""

    contrast: dict[_Tissue, tuple[float, float]]
    in_plane_mm: tuple[float, float]
    slice_mm: tuple[float, float]
    extent_mm: tuple[float, float, float]
    noise: tuple[float, float]  # Rician noise sd relative to the pancreas
    bias: tuple[float, float]
    ghost_chance: float
    free_breathing: bool


_TASK1 = _Protocol(_T1_ARTERIAL_REL, (1.0, 1.5), (2.5, 4.0), (140.0, 112.0, 90.0), (0.05, 0.09), (0.3, 0.45),
                   1 / 3, False)
_TASK2 = _Protocol(_T2_LINAC_REL, (0.9, 1.25), (1.6, 2.5), (128.0, 104.0, 84.0), (0.08, 0.13), (0.3, 0.5), 0.5, True)


def _write_realistic_download(downloads: Path, *, cases: int, seed: int) -> None:
    """Both archives of the realistic mirror: the easy mirror's files and ids, :func:`_realistic_case`'s scans."""
    rng = np.random.default_rng(seed)
    labelled, unlabelled, task2 = _mirror_ids(rng, cases)

    def fill_task1(root: Path) -> None:
        top = root / "PANTHER_Task1"
        for pid in labelled:
            image, label, geometry = _realistic_case(rng, _TASK1)
            write_volume(top / "ImagesTr" / f"{pid}_0001{CHANNEL_SUFFIX}", image, geometry)
            write_volume(top / "LabelsTr" / f"{pid}_0001.mha", label, geometry)
        for k, pid in enumerate(unlabelled):  # portal-venous and T2 scans of other patients
            contrast = _PORTAL_VENOUS_REL if k % 2 == 0 else _T2_LINAC_REL
            image, _, geometry = _realistic_case(rng, replace(_TASK1, contrast=contrast))
            write_volume(top / "ImagesTr_unlabeled" / f"{pid}_000{2 + k % 2}_0000.mha", image, geometry)

    def fill_task2(root: Path) -> None:
        top = root / "PANTHER_Task2"
        for pid in task2:
            image, label, geometry = _realistic_case(rng, _TASK2)
            write_volume(top / "ImagesTr" / f"{pid}{CHANNEL_SUFFIX}", image, geometry)
            write_volume(top / "LabelsTr" / f"{pid}.mha", label, geometry)

    write_archive(downloads / ARCHIVES[1], fill_task1)
    write_archive(downloads / ARCHIVES[2], fill_task2)


def _realistic_case(rng: np.random.Generator, protocol: _Protocol) -> tuple[np.ndarray, np.ndarray, Geometry]:
    """One scan of the realistic mirror: (int16 image, uint8 label 0/1/2, geometry); see the notes above."""
    in_plane = rng.uniform(*protocol.in_plane_mm)
    spacing = (in_plane, in_plane, rng.uniform(*protocol.slice_mm))
    extent = np.asarray(protocol.extent_mm) * rng.uniform(0.94, 1.06, 3)
    # the pancreatic neck is at the origin; where the technologist centred the scan varies, the craniocaudal most
    fov_centre = rng.uniform([-14, -12, -22], [26, 20, 22])
    grid = Grid.covering(extent, spacing, centre=fov_centre)
    tissue, tumour, gland = _upper_abdomen(rng, grid)

    level = 10 ** rng.uniform(2.3, 3.3)  # the pancreas's value: MR intensities carry no unit
    lut = {code: level * rng.uniform(low, high) for code, (low, high) in protocol.contrast.items()}
    clean = render(tissue, lut, rng, noise_sd=0.0, texture=0.06, bias=rng.uniform(*protocol.bias), background=None)
    if protocol.free_breathing:  # respiratory blur along the anterior-posterior and cranio-caudal axes
        clean = ndimage.gaussian_filter(clean, (rng.uniform(0.3, 0.8), rng.uniform(0.4, 1.2), 0.0))
    if rng.uniform() < protocol.ghost_chance:
        shift = int(grid.shape[1] * rng.uniform(0.2, 0.4))
        clean = clean + rng.uniform(0.05, 0.15) * (np.roll(clean, shift, axis=1) + np.roll(clean, -shift, axis=1)) / 2
    sd = level * rng.uniform(*protocol.noise)
    image = np.hypot(clean + sd * rng.standard_normal(grid.shape), sd * rng.standard_normal(grid.shape))

    label = np.zeros(grid.shape, dtype=np.uint8)
    label[gland] = PANCREAS  # what the annotator leaves out of the tumour stays pancreas
    label[_hand_drawn_tumour(rng, tumour, gland | tumour, spacing)] = TUMOUR
    table = rng.uniform([-30, -60, -200], [30, 60, 200])  # the scanner's coordinates: the table position
    geometry = replace(grid, origin=tuple(float(o + t) for o, t in zip(grid.origin, table, strict=True))).geometry
    return to_int16(image), label, geometry


def _upper_abdomen(rng: np.random.Generator, grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tissue map of one patient (``_Tissue`` codes), the tumour and the gland (the pancreas with its duct
    and the tumour's part of it). Patient axes as in :func:`_abdomen` (x left, y posterior, z superior), the
    pancreatic neck at the origin, organs at about their real size."""
    scale = rng.uniform(0.9, 1.1)

    def at(point: tuple[float, float, float], amount: float = 4.0) -> np.ndarray:
        return np.asarray(point) * scale + rng.uniform(-amount, amount, 3)

    def ellipsoid(centre: tuple[float, float, float], radii: tuple[float, float, float], angle: float = 0.0,
                  amount: float = 4.0) -> np.ndarray:
        return Ellipsoid.of(at(centre, amount), np.asarray(radii) * scale * rng.uniform(0.9, 1.1, 3),
                            angle + rng.uniform(-10, 10)).mask(grid)

    def hollow(path: np.ndarray, radius: float, wall: float) -> tuple[np.ndarray, np.ndarray]:
        """A gut loop along ``path``: (the whole tube, its lumen)."""
        return tube(grid, path, [radius] * len(path)), tube(grid, path, [radius - wall] * len(path))

    tissue = np.full(grid.shape, _T.FAT, dtype=np.uint8)  # the FOV lies inside the body: visceral fat between organs
    vertical = np.array([[0.0, 0.0, -300.0], [0.0, 0.0, 300.0]])
    tissue[tube(grid, vertical + at((0, 58, 0), 2), [17 * scale] * 2)] = _T.BONE  # vertebral bodies
    for side in (-1, 1):
        tissue[ellipsoid((26 * side, 50, -25), (12, 12, 60), amount=2)] = _T.MUSCLE  # psoas
        tissue[ellipsoid((11 * side, 38, 25), (5, 8, 40), amount=2)] = _T.MUSCLE  # diaphragmatic crura
    for centre, angle in (((55, 42, -15), 25.0), ((-52, 44, -25), -25.0)):  # kidneys: cortex, medulla, sinus fat
        kidney_centre = at(centre)
        radii = np.array([24.0, 20.0, 50.0]) * scale * rng.uniform(0.9, 1.1, 3)
        for fraction, code in ((1.0, _T.CORTEX), (0.7, _T.MEDULLA), (0.3, _T.FAT)):
            tissue[Ellipsoid.of(kidney_centre, radii * fraction, angle).mask(grid)] = code
    tissue[ellipsoid((-62, 0, 45), (55, 60, 48))] = _T.LIVER
    tissue[ellipsoid((-12, -42, 36), (40, 18, 22))] = _T.LIVER  # left lobe
    tissue[ellipsoid((72, 22, 30), (22, 34, 45), angle=30)] = _T.SPLEEN
    stomach_wall = ellipsoid((32, -38, 26), (34, 18, 26), angle=-20)
    tissue[stomach_wall] = _T.GUT_WALL
    tissue[ndimage.binary_erosion(stomach_wall, iterations=3)] = _T.GUT_CONTENT
    tissue[tube(grid, vertical + at((-22, 27, 0), 2), [10 * scale] * 2)] = _T.IVC
    tissue[tube(grid, vertical + at((4, 33, 0), 2), [10 * scale] * 2)] = _T.ARTERY
    # duodenum: the C-loop around the pancreatic head, then jejunal loops below the body
    duodenum = polyline([at((-14, -26, 22)), at((-40, -8, 14)), at((-46, 4, -10)), at((-34, 6, -36)),
                         at((0, 16, -46)), at((26, 6, -36))])
    radius = rng.uniform(8.0, 11.0) * scale
    wall, lumen = hollow(duodenum, radius, rng.uniform(2.5, 4.0))
    tissue[wall] = _T.GUT_WALL
    tissue[lumen] = _T.GUT_CONTENT
    for _ in range(int(rng.integers(3, 7))):
        start = rng.uniform([5, -55, -50], [60, -15, -15])
        loop = polyline([start, start + rng.uniform(-25, 25, 3), start + rng.uniform(-25, 25, 3)])
        wall, lumen = hollow(loop, rng.uniform(8, 11) * scale, rng.uniform(2.5, 4.0))
        tissue[wall] = _T.GUT_WALL
        tissue[lumen] = _T.GUT_CONTENT

    # pancreas: head (patient's right, low) with the uncinate process, neck at the origin, body, tail towards the
    # spleen; the tail runs flat or steeply up (an anatomical variant)
    rise = rng.uniform(0.0, 22.0)
    path = polyline([at((-26, 2, -18), 3), at((-16, -2, -6), 3), at((0, -4, 0), 2), at((20, -2, 6 + rise / 3), 3),
                     at((44, 14, 10 + rise * 2 / 3), 4), at((58, 22, 12 + rise), 4)], per_segment=5)
    widths = np.interp(np.linspace(0, 1, len(path)), [0, 0.2, 0.4, 0.6, 1], [14, 12, 7, 9, 6]) * scale
    gland = tube(grid, path, widths * rng.uniform(0.85, 1.15)) | ellipsoid((-12, 8, -24), (10, 6, 8), amount=2)
    tissue[gland] = _T.PANCREAS
    tumour, site = _realistic_tumour(rng, grid, path, gland)
    duct = np.full(len(path), 1.0)
    if site < len(path) // 2 and rng.uniform() < 0.6:  # an obstructing head tumour dilates the duct upstream
        duct[site + 2 :] = rng.uniform(2.5, 4.5)
    tissue[tube(grid, path, duct) & gland] = _T.DUCT
    # vessels behind the neck and along the body: the SMA, the SMV-portal trunk and the splenic vein
    tissue[tube(grid, np.asarray([at((4, 28, 16), 2), at((4, 13, 0), 2), at((5, 6, -40), 2)]), [3.5, 3.5, 3.0])] = \
        _T.ARTERY
    confluence = at((-7, 9, 0), 2)
    tissue[tube(grid, np.asarray([at((-6, 9, -40), 2), confluence, at((-30, 6, 40), 3)]), [6.0, 6.5, 7.0])] = _T.PORTAL
    tissue[tube(grid, np.asarray([confluence, at((22, 10, 8 + rise / 3)), at((50, 22, 14 + rise * 2 / 3))]),
                [4.5, 4.0, 3.5])] = _T.PORTAL
    gland &= np.isin(tissue, (_T.PANCREAS, _T.DUCT))
    tissue[tumour] = _T.TUMOUR
    return tissue, tumour, gland | (tumour & ndimage.binary_dilation(gland))


def _realistic_tumour(rng: np.random.Generator, grid: Grid, path: np.ndarray, gland: np.ndarray,
                      ) -> tuple[np.ndarray, int]:
    """A lumpy adenocarcinoma in the head (60 %), body or tail, 7-15 mm in radius, bulging up to 5 mm out of the
    gland; returns the mask and the index of its site on the pancreas path."""
    n = len(path)
    region = rng.choice(3, p=[0.6, 0.25, 0.15])
    lows, highs = (0, int(0.45 * n), int(0.75 * n)), (int(0.45 * n), int(0.75 * n), n - 1)
    reach = ndimage.distance_transform_edt(~gland, sampling=tuple(reversed(grid.spacing))) <= 5.0
    while True:
        site = int(rng.integers(lows[region], highs[region]))
        radius = float(np.exp(rng.uniform(np.log(7.0), np.log(15.0))))
        blob = union(grid, lumpy_blob(rng, path[site] + rng.uniform(-3, 3, 3), radius))
        tumour = blob & reach
        if tumour.sum() >= 30:
            return tumour, site


def _hand_drawn_tumour(rng: np.random.Generator, tumour: np.ndarray, allowed: np.ndarray,
                       spacing: tuple[float, float, float]) -> np.ndarray:
    """The tumour outline as an annotator draws it on a low-contrast boundary: the signed distance to the true
    outline (mm) against a smooth random offset of about 1.5 mm, so stretches lie a voxel or two out or in."""
    box = tuple(slice(max(0, s.start - 4), s.stop + 4) for s in ndimage.find_objects(tumour.astype(np.uint8))[0])
    part = tumour[box]
    sampling = tuple(reversed(spacing))
    signed = ndimage.distance_transform_edt(~part, sampling=sampling) - ndimage.distance_transform_edt(
        part, sampling=sampling)
    offset = 1.5 * smooth_noise(rng, part.shape, 2.0)
    drawn = np.zeros_like(tumour)
    drawn[box] = (signed < offset) & allowed[box]
    return drawn if drawn.sum() >= 20 else tumour
