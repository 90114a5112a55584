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
from pathlib import Path

import numpy as np

from rexmle_grade.errors import ConfigurationError, RexmleError
from rexmle_grade.grader import TestManifest
from rexmle_grade.io import write_volume
from rexmle_tasks.base import PrepareContext, TaskFamily, register_family
from rexmle_tasks.families.synth2d import copy_file
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

    @property
    def task_number(self) -> int:
        number = self.options.get("task")
        if number not in ARCHIVES:
            raise ConfigurationError(
                f"task {self.meta.id!r}: PANTHER option 'task' is {number!r}; expected 1 or 2 in its task.yaml"
            )
        return int(number)

    # ---- raw data ---------------------------------------------------------------------------------------------
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int) -> None:
        # the record is downloaded whole by either task, so the mirror always writes both archives
        rng = np.random.default_rng(seed)
        n_unlabelled = max(2, cases // 3)
        pids = [str(p) for p in rng.choice(np.arange(10001, 10460), size=cases - 1 + n_unlabelled, replace=False)]
        labelled = sorted(["10000", *pids[: cases - 1]])  # the real task-1 ids start at 10000
        unlabelled = sorted(pids[cases - 1 :])
        task2 = sorted(str(p) for p in rng.choice(TASK2_IDS, size=min(cases, len(TASK2_IDS)), replace=False))

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
    from scipy import ndimage

    return ndimage.binary_dilation(mask, iterations=1)
