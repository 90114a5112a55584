"""SEG.A. 2023 (AVT dataset, figshare article 14806362): aortic vessel tree segmentation in CT angiography.

Real download (DATA_LAYOUTS.md §6): figshare serves the whole article as one zip, saved as ``avt_dataset.zip``,
holding three nested zips, one per institution::

    Dongyang.zip -> Dongyang/D1/D1.nrrd, Dongyang/D1/D1.seg.nrrd, ... (D1-D18)
    KiTS.zip     -> KiTS/K1/K1.nrrd, KiTS/K1/K1.seg.nrrd, ...         (K1-K20; also spelt KiTs.zip)
    Rider.zip    -> Rider/<case folder>/R1.nrrd, R1.seg.nrrd, ...    (R1-R18; folder names unknown)

``extract`` unpacks the nested zips straight into ``raw/`` (and accepts the three zips downloaded separately).
A case is an ``X.nrrd`` with an ``X.seg.nrrd`` (a 3D Slicer segmentation, binary) in the same folder; its id is
``X`` (``D1``, ``K13``, ``R17``), whatever the folder is called.

Prepared layout: ``public/train/images/<id>.nrrd``, ``public/train/labels/<id>.seg.nrrd``,
``public/test/images/<id>.nrrd``; ``private/labels/<id>.seg.nrrd`` and ``private/answers.csv``
(``image_id, label_path``). Labels are copied unchanged unless they are not on their image's grid.

Synthetic mirrors: ``easy`` (one tissue model, the lumen the brightest soft tissue) and ``realistic`` (three
centres' protocols and the confounders of real CTA; see "the realistic mirror" below).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from rexmle_grade.errors import TaskDataMissingError
from rexmle_grade.grader import TestManifest
from rexmle_grade.io import Geometry, write_volume
from rexmle_tasks.base import PrepareContext, TaskFamily, register_family, safe_extract_zip
from rexmle_tasks.families.synth2d import copy_file
from rexmle_tasks.families.synth3d import (
    Ellipsoid,
    Grid,
    copy_label_on_image_grid,
    image_geometry,
    polyline,
    render,
    to_int16,
    tube,
    write_answers,
    write_archive,
)

log = logging.getLogger(__name__)

ARCHIVE = "avt_dataset.zip"
SEG_SUFFIX = ".seg.nrrd"
IMAGE_SUFFIX = ".nrrd"
ID_COLUMN = "image_id"
# institution -> (nested zip, case-id prefix, number of real cases, slice spacing of its synthetic scans)
INSTITUTIONS = {
    "Dongyang": ("Dongyang.zip", "D", 18, (1.7, 1.7, 2.5)),
    "KiTS": ("KiTS.zip", "K", 20, (1.9, 1.9, 3.0)),
    "Rider": ("Rider.zip", "R", 18, (1.5, 1.5, 2.0)),
}

# synthetic tissue codes and CT numbers (HU)
AIR, BODY, FAT, LUNG, BONE, KIDNEY, LIVER, VESSEL = range(8)
CTA_HU = {AIR: -1000, BODY: 40, FAT: -90, LUNG: -820, BONE: 800, KIDNEY: 160, LIVER: 70, VESSEL: 340}


@register_family
class SegaFamily(TaskFamily):
    name = "sega"
    synthetic_difficulties = ("easy", "realistic")

    # ---- raw data ---------------------------------------------------------------------------------------------
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int, difficulty: str = "easy") -> None:
        rng = np.random.default_rng(seed)
        per_institution = np.full(3, cases // 3) + (np.arange(3) < cases % 3)

        def make(institution: str, spacing: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, Grid]:
            if difficulty == "realistic":
                return _realistic_aorta_cta(rng, institution)
            return _aorta_cta(rng, spacing)

        def fill_outer(outer: Path) -> None:
            for (institution, (zip_name, prefix, n_real, spacing)), n in zip(INSTITUTIONS.items(), per_institution,
                                                                              strict=True):
                numbers = sorted(int(k) for k in rng.choice(np.arange(1, n_real + 1), size=int(n), replace=False))
                cases_of = [(f"{prefix}{k}", make(institution, spacing)) for k in numbers]
                write_archive(outer / zip_name, partial(_write_institution, institution, cases_of, rng))

        write_archive(downloads / ARCHIVE, fill_outer)

    def extract(self, downloads: Path, raw: Path) -> None:
        """Unpack the article zip's nested institution zips into ``raw/``, deleting each nested zip once unpacked
        (6 GB in the real article); a zip holding no zips (an institution zip downloaded on its own) is unpacked
        as it is."""
        raw.mkdir(parents=True, exist_ok=True)
        for archive in sorted(downloads.glob("*.zip")):
            with tempfile.TemporaryDirectory(prefix=".unpacking-", dir=raw) as scratch:
                safe_extract_zip(archive, Path(scratch))
                nested = sorted(Path(scratch).rglob("*.zip"))
                for inner in nested:
                    safe_extract_zip(inner, raw)
                    inner.unlink()
                if not nested:
                    for item in sorted(Path(scratch).iterdir()):
                        shutil.move(item, raw / item.name)

    def _pairs(self, raw: Path) -> dict[str, tuple[Path, Path]]:
        pairs: dict[str, tuple[Path, Path]] = {}
        for label in sorted(raw.rglob(f"*{SEG_SUFFIX}")):
            case_id = label.name[: -len(SEG_SUFFIX)]  # Path.stem would keep ".seg"
            image = label.with_name(case_id + IMAGE_SUFFIX)
            if not image.is_file():
                log.warning("skipping SEG.A. case %s: no image %s beside its segmentation", case_id, image)
                continue
            if case_id in pairs:
                raise TaskDataMissingError(
                    f"SEG.A. case {case_id!r} appears twice: {pairs[case_id][0]} and {image}",
                    hint=f"{raw} holds two copies of the data (an earlier unpacking?); re-run with --force",
                )
            pairs[case_id] = (image, label)
        return pairs

    def case_ids(self, raw: Path) -> list[str]:
        return sorted(self._pairs(raw))

    # ---- preparation ------------------------------------------------------------------------------------------
    def prepare(self, ctx: PrepareContext) -> TestManifest:
        pairs = self._pairs(ctx.raw)
        for case_id in ctx.split.train:
            image, label = pairs[case_id]
            copy_file(image, ctx.public / "train" / "images" / f"{case_id}{IMAGE_SUFFIX}")
            copy_label_on_image_grid(label, image, ctx.public / "train" / "labels" / f"{case_id}{SEG_SUFFIX}")
        geometry = {}
        rows = []
        for case_id in ctx.split.test:
            image, label = pairs[case_id]
            public_image = copy_file(image, ctx.public / "test" / "images" / f"{case_id}{IMAGE_SUFFIX}")
            copy_label_on_image_grid(label, image, ctx.private / "labels" / f"{case_id}{SEG_SUFFIX}")
            geometry[case_id] = image_geometry(public_image)
            rows.append((case_id, f"labels/{case_id}{SEG_SUFFIX}"))
        write_answers(ctx.private, ID_COLUMN, rows)
        return TestManifest(ids=tuple(ctx.split.test), geometry=geometry)


def _write_institution(institution: str, cases: list[tuple[str, tuple[np.ndarray, np.ndarray, Grid]]],
                       rng: np.random.Generator, root: Path) -> None:
    for case_id, (image, label, grid) in cases:
        # Rider's case-folder names are unknown: a name unlike the file stem keeps prepare from relying on it
        folder = f"{case_id}_{int(rng.integers(1000, 9999))}" if institution == "Rider" else case_id
        write_volume(root / institution / folder / f"{case_id}{IMAGE_SUFFIX}", image, grid.geometry)
        _write_slicer_segmentation(root / institution / folder / f"{case_id}{SEG_SUFFIX}", label, grid.geometry)


def _write_slicer_segmentation(path: Path, mask: np.ndarray, geometry: Geometry) -> None:
    """A binary segmentation as 3D Slicer saves it: uint8 NRRD with ``Segment0_*`` header fields."""
    import SimpleITK as sitk

    image = sitk.GetImageFromArray(mask.astype(np.uint8))
    image.SetSpacing(geometry.spacing)
    image.SetOrigin(geometry.origin)
    image.SetDirection(geometry.direction)
    z, y, x = (np.flatnonzero(mask.any(axis=axes)) for axes in ((1, 2), (0, 2), (0, 1)))
    extent = " ".join(f"{int(v[0])} {int(v[-1])}" for v in (x, y, z))
    fields = {
        "Segment0_ID": "Segment_1", "Segment0_Name": "Segment_1", "Segment0_LabelValue": "1",
        "Segment0_Layer": "0", "Segment0_Color": "0.501961 0.682353 0.501961", "Segment0_Extent": extent,
        "Segment0_Tags": "TerminologyEntry:Segmentation category and type - 3D Slicer General Anatomy list~"
                         "SCT^85756007^Tissue~SCT^85756007^Tissue~^^~Anatomic codes - DICOM master list~^^~^^|",
        "Segmentation_MasterRepresentation": "Binary labelmap",
        "Segmentation_ContainedRepresentationNames": "Binary labelmap|",
        "Segmentation_ReferenceImageExtentOffset": "0 0 0",
        "Segmentation_ConversionParameters": "Collapse labelmaps|1|Merge the labelmaps into as few shared labelmaps "
                                             "as possible&Compute surface normals|1|Compute surface normals.",
    }
    for key, value in fields.items():
        image.SetMetaData(key, value)
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(image, str(path), useCompression=True)


def _aorta_cta(rng: np.random.Generator, spacing: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, Grid]:
    """One synthetic chest-abdomen-pelvis CTA: (int16 HU image, uint8 binary vessel-tree label, grid).
    Patient axes: x towards the patient's left, y posterior, z superior (LPS); the aortic arch lies near z = +60."""
    s = rng.uniform(0.92, 1.08)
    extent = np.array([100.0, 82.0, 160.0]) * rng.uniform(0.96, 1.06, 3)
    grid = Grid.covering(extent, spacing, centre=(0.0, 0.0, rng.uniform(-4, 4)))

    def p(x: float, y: float, z: float, wobble: float = 2.0) -> np.ndarray:
        return np.array([x, y, z]) * s + rng.uniform(-wobble, wobble, 3)

    def organ(centre: np.ndarray, radii: tuple[float, float, float]) -> np.ndarray:
        return Ellipsoid.of(centre, np.asarray(radii) * s).mask(grid)

    tissue = np.full(grid.shape, AIR, dtype=np.uint8)
    body_centre = p(0, 2, 0, 1)
    tissue[organ(body_centre, (46, 36, 400))] = FAT  # a rim of subcutaneous fat around the body
    tissue[organ(body_centre, (41, 31, 400))] = BODY
    for side in (-1, 1):
        tissue[organ(p(22 * side, 2, 55), (15, 20, 32))] = LUNG
        tissue[organ(p(20 * side, 14, -8), (6, 5, 11))] = KIDNEY
    tissue[organ(p(-20, -4, 14), (17, 17, 18))] = LIVER
    tissue[organ(p(0, 23, 0, 0.5), (8, 7, 400))] = BONE  # vertebral column

    # the aortic tree: ascending aorta, arch, descending and abdominal aorta, iliac bifurcation, main branches
    r = rng.uniform(6.0, 7.5) * s
    trunk = polyline([p(-5, -8, 30), p(-4, -6, 58), p(1, 3, 66), p(5, 10, 56), p(4, 12, 25), p(2, 12, -15),
                      p(1, 11, -45)])
    vessels = tube(grid, trunk, np.linspace(r, 0.8 * r, len(trunk)))
    for side in (-1, 1):
        iliac = polyline([trunk[-1], p(8 * side, 9, -58), p(17 * side, 6, -80)])
        vessels |= tube(grid, iliac, np.linspace(0.6 * r, 0.5 * r, len(iliac)))
        renal = np.array([p(2, 12, -5, 0.5), p(18 * side, 13, -8)])
        vessels |= tube(grid, renal, [0.3 * r, 0.25 * r])
    arch = trunk[trunk[:, 2] > trunk[:, 2].max() - 5 * s]
    for x_offset in (-4.0, 1.0, 5.0):  # brachiocephalic, left carotid and left subclavian arteries
        base = arch[np.argmin(np.abs(arch[:, 0] - x_offset * s))]
        top = base + np.array([x_offset * 1.5, 0.0, 22.0]) * s + rng.uniform(-2, 2, 3)
        vessels |= tube(grid, np.array([base, top]), [0.4 * r, 0.35 * r])
    vessels &= tissue != AIR
    tissue[vessels] = VESSEL

    contrast = rng.uniform(0.8, 1.3)  # bolus timing varies between scans
    hu = {**CTA_HU, VESSEL: CTA_HU[VESSEL] * contrast}
    image = render(tissue, hu, rng, noise_sd=18.0, texture=0.0, bias=0.0, background=None)
    return to_int16(image), vessels.astype(np.uint8), grid


# ---- the realistic mirror ----------------------------------------------------------------------------------------
# What makes real AVT scans hard for an HU threshold (EXPERT_REPORTS.md §6, DATA_LAYOUTS.md §6, the brief of issue 36):
# three centres with their own scanners, protocols and fields of view -- Dongyang's dedicated CTAs (thorax to
# pelvis, slices 2-3 mm), KiTS' abdominal kidney-tumour CTs (nephrographic phase, thicker slices, no aortic arch),
# Rider's chest-abdomen scans -- so the lumen lies anywhere between about 150 and 550 HU; the cancellous bone of the
# vertebrae (150-350 HU, with a cortical shell of 700-1100 HU) sits a millimetre behind the aorta; the left heart
# (the aortic root's neighbour), the pulmonary artery, enhancing kidney cortex, the veins of a late phase and
# undiluted contrast in the superior vena cava (with its streaks) are as bright as the lumen; calcified plaques are
# brighter than bone; aneurysms carry mural thrombus (soft tissue, inside the vessel wall) and dissections an
# intimal flap; branches are two or three voxels wide and fade by partial volume; annotators stop the branches at
# different lengths; a few Dongyang scans hold metal far above the CT range (DATA_LAYOUTS.md: D3 up to 6484, D17 up
# to 14542); origins follow the table position. Where the release is silent these are our choices: KiTS as a later
# (nephrographic) phase with 2.5-3.5 mm slices, an aneurysm's mask covering its thrombus, plaques inside the mask.
# The anatomy is the easy mirror's at about 0.4 of adult size (the aorta about 0.45), so that a case is about
# 60 x 50 x 70 voxels and a trained network sees whole organs in a 32-voxel patch on a CPU. The task's default of
# 9 cases leaves 2 test scans; the difficulty ladder is measured on 24 (19 training, 5 test), on which the quick
# network trains for 60 epochs in about 5 CPU minutes.
MARROW, DISC, MYOCARDIUM, LEFT_HEART, RIGHT_HEART, VEIN, INFLOW, MEDULLA, SPLEEN, THROMBUS, PLAQUE, FLAP, \
    FALSE_LUMEN, TABLE, METAL = range(8, 23)


@dataclass(frozen=True)
class _Protocol:
    """How one centre's scans differ; each case draws its values within these ranges (HU, mm)."""

    aorta: tuple[float, float]        # the lumen's enhancement
    right_heart: tuple[float, float]  # right heart and pulmonary artery, relative to the lumen
    vein: tuple[float, float]         # IVC and renal veins, relative to the lumen
    kidney: tuple[float, float]       # cortex
    medulla: tuple[float, float]      # relative to the cortex (1: the homogeneous nephrographic phase)
    liver: tuple[float, float]
    noise: tuple[float, float]
    in_plane: tuple[float, float]
    slice: tuple[float, float]
    z_range: tuple[tuple[float, float], tuple[float, float]]  # bottom and top of the field of view (anatomy mm)
    inflow: float   # chance of undiluted contrast in the superior vena cava
    disease: float  # chance of an aneurysm, and half of it of a dissection
    metal: float    # chance of a metal object far above the CT range


PROTOCOLS = {
    "Dongyang": _Protocol(aorta=(300, 560), right_heart=(0.3, 0.8), vein=(0.25, 0.45), kidney=(160, 240),
                          medulla=(0.4, 0.6), liver=(60, 95), noise=(14, 24), in_plane=(1.5, 1.8), slice=(2.0, 3.0),
                          z_range=((-90, -84), (86, 94)), inflow=0.5, disease=0.45, metal=0.35),
    "KiTS": _Protocol(aorta=(150, 270), right_heart=(0.75, 0.95), vein=(0.65, 0.85), kidney=(170, 240),
                      medulla=(0.8, 1.0), liver=(95, 135), noise=(20, 34), in_plane=(1.6, 1.95), slice=(2.5, 3.5),
                      z_range=((-90, -82), (18, 32)), inflow=0.0, disease=0.1, metal=0.0),
    "Rider": _Protocol(aorta=(200, 420), right_heart=(0.5, 1.0), vein=(0.3, 0.6), kidney=(150, 220),
                       medulla=(0.5, 0.8), liver=(65, 110), noise=(16, 28), in_plane=(1.5, 1.8), slice=(2.0, 2.5),
                       z_range=((-58, -44), (86, 94)), inflow=0.4, disease=0.2, metal=0.0),
}


def _realistic_aorta_cta(rng: np.random.Generator, institution: str) -> tuple[np.ndarray, np.ndarray, Grid]:
    """One case of the realistic mirror: (int16 HU image, uint8 label, grid), the confounders described above.
    Patient axes as in :func:`_aorta_cta`: x towards the patient's left, y posterior, z superior."""
    from scipy import ndimage

    proto = PROTOCOLS[institution]
    s = rng.uniform(0.9, 1.1)
    body = np.array([46.0, 36.0]) * rng.uniform(0.9, 1.12, 2)
    spacing = (*(2 * [float(rng.uniform(*proto.in_plane))]), float(rng.uniform(*proto.slice)))
    bottom, top = rng.uniform(*proto.z_range[0]), rng.uniform(*proto.z_range[1])
    fov = 2 * body * rng.uniform(0.95, 1.15, 2) + np.array([4.0, 14.0])  # the table lies behind the back
    grid = Grid.covering((*fov, top - bottom), spacing, centre=(0.0, 6.0, (top + bottom) / 2))

    def p(x: float, y: float, z: float, wobble: float = 2.0) -> np.ndarray:
        return np.array([x, y, z]) * s + rng.uniform(-wobble, wobble, 3)

    def blob(centre: np.ndarray, radii: tuple[float, float, float], angle: float = 0.0) -> np.ndarray:
        return Ellipsoid.of(centre, np.asarray(radii) * s, angle).mask(grid)

    tissue = np.full(grid.shape, AIR, dtype=np.uint8)
    tissue[Ellipsoid.of((0, body[1] + 6, 0), (fov[0], 4.0, 900)).mask(grid)] = TABLE
    tissue[Ellipsoid.of((0, 2, 0), (*body, 900)).mask(grid)] = FAT
    tissue[Ellipsoid.of((0, 2, 0), (*(body - rng.uniform(3, 7)), 900)).mask(grid)] = BODY
    for side in (-1, 1):
        tissue[blob(p(22 * side, 2, 58), (15, 20, 32))] = LUNG
    tissue[blob(p(-20, -4, 10), (17, 17, 16))] = LIVER
    tissue[blob(p(24, 8, 10), (7, 6, 9), 30)] = SPLEEN
    kidneys = [p(21 * side, 16, -8) for side in (-1, 1)]
    for centre in kidneys:
        tissue[blob(centre, (7, 6, 12), 20)] = KIDNEY
        tissue[blob(centre, (4, 3, 8), 20)] = MEDULLA

    # the aortic tree: its centreline, the branches (each labelled only as far as the annotator followed it)
    r = rng.uniform(4.8, 6.2) * s
    trunk = polyline([p(-5, -8, 30), p(-4, -6, 58), p(1, 3, 66), p(5, 10, 56), p(5, 11, 25), p(4, 11, -15),
                      p(1, 10, -45)])
    trunk_radii = np.linspace(r, 0.8 * r, len(trunk))
    branches: list[tuple[np.ndarray, tuple[float, float]]] = []
    arch = trunk[trunk[:, 2] > trunk[:, 2].max() - 5 * s]
    for x_offset in (-4.0, 1.0, 5.0):  # brachiocephalic, left carotid and left subclavian arteries
        base = arch[np.argmin(np.abs(arch[:, 0] - x_offset * s))]
        branches.append((np.array([base, base + np.array([x_offset * 1.5, 0.0, 24.0]) * s + rng.uniform(-2, 2, 3)]),
                         (0.4 * r, 0.33 * r)))
    branches.append((polyline([p(4, 9, 8, 1), p(4, 2, 6), p(3, -4, 7)]), (0.3 * r, 0.25 * r)))  # coeliac trunk
    branches.append((polyline([p(4, 9, 2, 1), p(4, 0, -4), p(3, -4, -30)]), (0.3 * r, 0.2 * r)))  # SMA
    for side, kidney in zip((-1, 1), kidneys, strict=True):
        branches.append((np.array([p(2, 11, -5, 0.5), kidney + np.array([-9.0 * side, -1.0, 0.0])]),
                         (0.3 * r, 0.24 * r)))  # renal artery to the hilum
        common = polyline([trunk[-1], p(8 * side, 9, -58), p(17 * side, 6, -84)])
        branches.append((common, (0.6 * r, 0.45 * r)))
        branches.append((np.array([p(8 * side, 9, -58, 0.5), p(11 * side, 18, -74)]), (0.3 * r, 0.22 * r)))

    tissue[tube(grid, trunk, trunk_radii + 2.5)] = FAT  # periaortic fat
    # the heart: myocardium around the contrast-filled left ventricle (the aortic root opens from it), right heart
    tissue[blob(p(-2, -13, 16), (21, 17, 18), 25)] = MYOCARDIUM
    tissue[blob(p(-12, -20, 13), (8, 7, 11))] = RIGHT_HEART
    tissue[blob(p(-1, -10, 17), (12, 10, 14), 25)] = LEFT_HEART  # the left ventricle, below the aortic valve
    left_atrium = p(0, 3, 30)
    tissue[Ellipsoid.of(left_atrium, np.array([12.0, 7.0, 7.0]) * s).mask(grid)] = LEFT_HEART
    for side in (-1, 1):  # pulmonary veins bring the contrast back from the lungs into the left atrium
        vein = np.array([left_atrium, left_atrium + np.array([20.0 * side, 2.0, 4.0]) * s])
        tissue[tube(grid, vein, [0.4 * r, 0.35 * r])] = LEFT_HEART
    pulmonary = polyline([p(-8, -18, 26), p(-2, -14, 46), p(4, -6, 50)])
    tissue[tube(grid, pulmonary, np.linspace(0.9 * r, 0.8 * r, len(pulmonary)))] = RIGHT_HEART
    for side in (-1, 1):
        tissue[tube(grid, np.array([pulmonary[-1], p(18 * side, -2, 48)]), [0.6 * r, 0.45 * r])] = RIGHT_HEART
    # the spine: vertebral bodies (cortical shell, marrow) with discs between them, the neural arch behind
    period = rng.uniform(9.0, 11.0) * s
    for z in np.arange(bottom - period, top + period, period):
        centre = np.array([0.0, 25.0 * s, z]) + rng.uniform(-0.5, 0.5, 3)
        tissue[Ellipsoid.of(centre, (8 * s, 7 * s, 0.38 * period)).mask(grid)] = BONE
        tissue[Ellipsoid.of(centre, (6.3 * s, 5.3 * s, 0.3 * period)).mask(grid)] = MARROW
        tissue[Ellipsoid.of(centre + np.array([0, 0, period / 2]), (7.5 * s, 6.5 * s, 0.12 * period)).mask(grid)] = DISC
        tissue[Ellipsoid.of(centre + np.array([0, 12 * s, 0]), (5 * s, 3 * s, 0.35 * period)).mask(grid)] = BONE
    for z in np.arange(24.0, 84.0, 8.0) * s:  # ribs: arcs from the spine round to the front, sloping down
        for side in (-1, 1):
            angles = np.linspace(0.15, 0.85, 8) * np.pi
            arc = np.stack([side * (body[0] - 5) * np.sin(angles), (body[1] - 5) * np.cos(angles) + 2,
                            z - 10 * (1 - np.cos(angles))], axis=1)
            tissue[tube(grid, arc, np.full(len(arc), 1.7))] = BONE
    tissue[tube(grid, np.array([p(0, -31, 72), p(0, -33, 30)]), [2.5, 2.5])] = BONE  # sternum
    for side in (-1, 1):  # iliac wings and the sacrum
        tissue[blob(p(30 * side, 14, -70), (5, 15, 15), -35 * side)] = BONE
        tissue[blob(p(30 * side, 14, -70), (3, 12, 12), -35 * side)] = MARROW
    tissue[blob(p(0, 24, -70), (10, 5, 12))] = BONE
    # veins: IVC right of the spine with the renal veins, and the superior vena cava into the right heart
    ivc = polyline([p(-10, 14, -48), p(-11, 13, -5), p(-9, 6, 18)])
    tissue[tube(grid, ivc, np.full(len(ivc), 0.85 * r))] = VEIN
    for kidney in kidneys:
        tissue[tube(grid, np.array([p(-10, 13, -7, 0.5), kidney]), [0.35 * r, 0.3 * r])] = VEIN
    svc = np.array([p(-11, -8, 95), p(-10, -10, 30)])
    dense_inflow = rng.uniform() < proto.inflow
    tissue[tube(grid, svc, [0.6 * r, 0.6 * r])] = INFLOW if dense_inflow else VEIN

    vessels = tube(grid, trunk, trunk_radii)
    labelled = vessels.copy()
    for path, radii in branches:
        vessels |= tube(grid, path, np.linspace(*radii, len(path)))
        kept, kept_radii = _followed(path, radii, rng.uniform(0.55, 1.0))
        labelled |= tube(grid, kept, kept_radii)
    tissue[vessels] = VESSEL
    if rng.uniform() < proto.disease:
        _aneurysm(rng, grid, tissue, labelled, trunk, r, s)
        if rng.uniform() < 0.5:
            _dissection(rng, grid, tissue, labelled, trunk)
    if rng.uniform() < 0.6:  # calcified plaques on the wall of the abdominal aorta and the iliacs
        _plaques(rng, grid, tissue, trunk, r, int(rng.integers(2, 12)))
    metal = None
    if rng.uniform() < proto.metal:  # an ECG electrode on the chest wall
        metal = blob(p(rng.uniform(-20, 20), -body[1] / s - 1, rng.uniform(40, 75), 0), (2.5, 1.2, 2.5))
        tissue[metal] = METAL
    inside = tissue != AIR
    labelled &= inside & (tissue != TABLE)

    aorta = rng.uniform(*proto.aorta)
    kidney_hu = rng.uniform(*proto.kidney)
    hu = {AIR: -1000.0, BODY: rng.uniform(40, 60), FAT: rng.uniform(-110, -80), LUNG: rng.uniform(-870, -800),
          BONE: rng.uniform(700, 1100), MARROW: rng.uniform(150, 330), DISC: rng.uniform(70, 100),
          LIVER: rng.uniform(*proto.liver), SPLEEN: rng.uniform(100, 160), KIDNEY: kidney_hu,
          MEDULLA: kidney_hu * rng.uniform(*proto.medulla), MYOCARDIUM: rng.uniform(90, 130),
          VESSEL: aorta, LEFT_HEART: aorta * rng.uniform(0.92, 1.05), FALSE_LUMEN: aorta * rng.uniform(0.5, 0.8),
          RIGHT_HEART: aorta * rng.uniform(*proto.right_heart), VEIN: aorta * rng.uniform(*proto.vein),
          INFLOW: rng.uniform(900, 2500), THROMBUS: rng.uniform(35, 70), FLAP: rng.uniform(60, 110),
          PLAQUE: rng.uniform(800, 1400), TABLE: rng.uniform(-300, -100), METAL: rng.uniform(6000, 14500)}
    values = np.zeros(grid.shape, dtype=np.float64)
    for code, mean in hu.items():
        values[tissue == code] = mean
    x, y, z = grid.coords()
    # the bolus thins out along the aorta: the lumen dims by up to 15% from the arch to the iliacs
    values[vessels] *= (1.0 + rng.uniform(0.0, 0.15) * np.clip(z / 60.0, -1.0, 1.0) * np.ones(grid.shape))[vessels]
    if dense_inflow:  # streaks from the undiluted contrast, through the axial slices the SVC crosses
        angle = np.arctan2(y - svc[0, 1], x - svc[0, 0])
        distance = np.hypot(x - svc[0, 0], y - svc[0, 1])
        rays = np.cos(int(rng.integers(5, 9)) * angle + rng.uniform(0, np.pi)) * np.exp(-distance / 25.0)
        levels = (z >= svc[1, 2]) & (z <= svc[0, 2])
        values += np.where(levels & (tissue != AIR), rng.uniform(80, 200) * rays, 0.0)
    # partial volume: each voxel averages its slice thickness and a little of its neighbours in plane
    values = ndimage.gaussian_filter(values, sigma=(0.5, 0.45, 0.45))
    if metal is not None:
        values[metal] = hu[METAL]
    noise = ndimage.gaussian_filter(rng.standard_normal(grid.shape), sigma=(0.0, 0.6, 0.6))
    values += rng.uniform(*proto.noise) * noise / noise.std()
    shift = (rng.uniform(-15, 15), rng.uniform(-15, 15), rng.uniform(-900, 100))  # table position
    placed = Grid(grid.size, grid.spacing, tuple(o + d for o, d in zip(grid.origin, shift, strict=True)))  # type: ignore[arg-type]
    return to_int16(values), labelled.astype(np.uint8), placed


def _followed(path: np.ndarray, radii: tuple[float, float], fraction: float) -> tuple[np.ndarray, list[float]]:
    """The first ``fraction`` of a branch's length, as an annotator followed it (radii tapering as drawn)."""
    lengths = np.r_[0.0, np.cumsum(np.linalg.norm(np.diff(path, axis=0), axis=1))]
    stop = fraction * lengths[-1]
    n = int(np.searchsorted(lengths, stop, side="right"))
    end = path[n - 1] + (path[min(n, len(path) - 1)] - path[n - 1]) * (
        (stop - lengths[n - 1]) / max(lengths[min(n, len(path) - 1)] - lengths[n - 1], 1e-9))
    kept = np.vstack([path[:n], end])
    kept_radii = list(radii[0] + (radii[1] - radii[0]) * np.r_[lengths[:n], stop] / max(lengths[-1], 1e-9))
    return kept, kept_radii


def _aneurysm(rng: np.random.Generator, grid: Grid, tissue: np.ndarray, labelled: np.ndarray, trunk: np.ndarray,
              r: float, s: float) -> None:
    """An infrarenal aneurysm: a sac 1.6-2.3 times the aorta's width, partly filled by mural thrombus. The mask
    covers the whole sac (lumen and thrombus inside the wall): our reading of a vessel-tree segmentation."""
    below = trunk[trunk[:, 2] < -12 * s]
    centre = below[np.argmin(np.abs(below[:, 2] + 28 * s))] + np.array([1.5, -1.5, 0.0])
    width = rng.uniform(1.6, 2.3) * r
    sac = Ellipsoid.of(centre, (width, width * rng.uniform(0.85, 1.0), rng.uniform(11, 16) * s)).mask(grid)
    sac &= tissue != AIR
    lumen = Ellipsoid.of(centre + rng.uniform(-0.3, 0.3, 3) * width, (0.7 * width, 0.65 * width, 10 * s)).mask(grid)
    tissue[sac & ~lumen & (tissue != VESSEL)] = THROMBUS
    tissue[sac & lumen] = VESSEL
    labelled |= sac


def _dissection(rng: np.random.Generator, grid: Grid, tissue: np.ndarray, labelled: np.ndarray,
                trunk: np.ndarray) -> None:
    """A type-B dissection: an intimal flap along the descending aorta, the false lumen less enhanced."""
    descending = trunk[np.argmax(trunk[:, 2]) + 1:]
    order = np.argsort(descending[:, 2])
    x, y, z = grid.coords()
    cx = np.interp(z, descending[order, 2], descending[order, 0])
    cy = np.interp(z, descending[order, 2], descending[order, 1])
    theta = rng.uniform(0, np.pi)
    signed = (x - cx) * np.cos(theta) + (y - cy) * np.sin(theta)
    top = descending[0, 2] - 4
    low = rng.uniform(descending[-1, 2], descending[0, 2] - 30)
    lumen = labelled & (tissue == VESSEL) & (z <= top) & (z >= low) & (y > cy - 12)
    tissue[lumen & (signed > 0.9)] = FALSE_LUMEN
    tissue[lumen & (np.abs(signed) <= 0.9)] = FLAP


def _plaques(rng: np.random.Generator, grid: Grid, tissue: np.ndarray, trunk: np.ndarray, r: float,
             count: int) -> None:
    """Calcified plaques: small spheres on the inner wall of the abdominal aorta, inside the vessel mask."""
    lower = trunk[trunk[:, 2] < 10]
    for _ in range(count):
        point = lower[int(rng.integers(len(lower)))]
        direction = np.r_[rng.normal(size=2), 0.0]
        centre = point + 0.9 * r * direction / np.linalg.norm(direction)
        sphere = Ellipsoid.of(centre, 3 * [float(rng.uniform(0.9, 1.8))]).mask(grid)
        tissue[sphere & (tissue == VESSEL)] = PLAQUE
