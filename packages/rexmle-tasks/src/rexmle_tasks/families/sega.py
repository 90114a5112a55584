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
"""

from __future__ import annotations

import logging
import shutil
import tempfile
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

    # ---- raw data ---------------------------------------------------------------------------------------------
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        per_institution = np.full(3, cases // 3) + (np.arange(3) < cases % 3)

        def fill_outer(outer: Path) -> None:
            for (institution, (zip_name, prefix, n_real, spacing)), n in zip(INSTITUTIONS.items(), per_institution,
                                                                              strict=True):
                numbers = sorted(int(k) for k in rng.choice(np.arange(1, n_real + 1), size=int(n), replace=False))
                cases_of = [(f"{prefix}{k}", _aorta_cta(rng, spacing)) for k in numbers]
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
