"""ISLES'22: the mirror's archive tree and file names, grids, lesion contrast, and the prepared channel layout."""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import SimpleITK as sitk

from rexmle_grade.io import read_volume_geometry

CASE_FILES = (
    "ISLES-2022/{c}/ses-0001/anat/{c}_ses-0001_FLAIR.nii.gz",
    "ISLES-2022/{c}/ses-0001/dwi/{c}_ses-0001_dwi.nii.gz",
    "ISLES-2022/{c}/ses-0001/dwi/{c}_ses-0001_adc.nii.gz",
    "ISLES-2022/derivatives/{c}/ses-0001/{c}_ses-0001_msk.nii.gz",
)


def test_the_mirror_has_the_real_archive_names_and_bids_tree(prepared) -> None:
    p = prepared("isles22")
    downloads = p.dirs.raw / "downloads"
    assert sorted(f.name for f in downloads.iterdir()) == ["ISLES-2022.zip", "center_ids.xlsx"]
    with zipfile.ZipFile(downloads / "ISLES-2022.zip") as zf:
        members = {n for n in zf.namelist() if not n.endswith("/")}
    cases = sorted({re.match(r"ISLES-2022/(sub-strokecase\d{4})/", n).group(1) for n in members
                    if re.match(r"ISLES-2022/sub-strokecase\d{4}/", n)})
    assert len(cases) == p.task.meta.synthetic_cases
    assert members == {pattern.format(c=c) for c in cases for pattern in CASE_FILES}
    assert p.task.family().case_ids(p.dirs.raw) == cases


def read(path: Path) -> tuple[np.ndarray, sitk.Image]:
    image = sitk.ReadImage(str(path))
    return sitk.GetArrayFromImage(image), image


def test_dwi_adc_and_mask_share_a_grid_flair_has_its_own_and_lesions_show_the_stroke_contrast(prepared) -> None:
    p = prepared("isles22")
    root = p.dirs.raw / "ISLES-2022"
    for case in sorted(root.glob("sub-strokecase*")):
        c = case.name
        flair, dwi, adc, mask = (root.parent / pattern.format(c=c) for pattern in CASE_FILES)
        dwi_grid = read_volume_geometry(dwi)[0]
        assert dwi_grid.mismatches(read_volume_geometry(adc)[0]) == []
        assert dwi_grid.mismatches(read_volume_geometry(mask)[0]) == []
        assert dwi_grid.mismatches(read_volume_geometry(flair)[0]) != []
        lesion = read(mask)[0]
        assert set(np.unique(lesion)) == {0, 1}
        dwi_values, adc_values = read(dwi)[0], read(adc)[0]
        tissue = (dwi_values > 0) & (lesion == 0)
        # restricted diffusion: bright on DWI, dark on ADC; skull-stripped: exactly 0 outside the brain
        assert np.median(dwi_values[lesion == 1]) > 1.8 * np.median(dwi_values[tissue])
        assert np.median(adc_values[lesion == 1]) < 0.75 * np.median(adc_values[tissue])
        assert dwi_values[0, 0, 0] == 0 and adc_values[0, 0, 0] == 0


def test_prepared_inputs_keep_flair_apart_from_the_nnunet_channels(prepared) -> None:
    p = prepared("isles22")
    for split in ("train", "test"):
        images = sorted(f.name for f in (p.dirs.public / split / "images").iterdir())
        flair = sorted(f.name for f in (p.dirs.public / split / "flair").iterdir())
        ids = sorted({name[: -len("_0000.nii.gz")] for name in images})
        assert images == sorted(f"{i}_{ch}.nii.gz" for i in ids for ch in ("0000", "0001"))
        assert flair == [f"{i}_flair.nii.gz" for i in ids]
    # the public DWI channel is the raw DWI file, byte for byte
    case = sorted((p.dirs.public / "test" / "images").iterdir())[0].name[: -len("_0000.nii.gz")]
    raw = p.dirs.raw / CASE_FILES[1].format(c=case)
    assert (p.dirs.public / "test" / "images" / f"{case}_0000.nii.gz").read_bytes() == raw.read_bytes()


def test_a_case_missing_a_file_is_not_listed(prepared, tmp_path) -> None:
    p = prepared("isles22")
    raw = tmp_path / "raw"
    shutil.copytree(p.dirs.raw / "ISLES-2022", raw / "ISLES-2022")
    family = p.task.family()
    ids = family.case_ids(raw)
    (raw / CASE_FILES[0].format(c=ids[0])).unlink()
    assert family.case_ids(raw) == ids[1:]
