"""SEG.A.: the nested article zip, Slicer segmentations, extraction variants, label grids and duplicate ids."""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from rexmle_grade.errors import TaskDataMissingError
from rexmle_tasks.base import PrepareContext
from rexmle_tasks.splits import Split

INSTITUTIONS = {"Dongyang.zip": ("Dongyang", "D"), "KiTS.zip": ("KiTS", "K"), "Rider.zip": ("Rider", "R")}


def test_the_article_zip_nests_one_zip_per_institution_with_the_real_tree(prepared, tmp_path) -> None:
    p = prepared("seg_a")
    downloads = p.dirs.raw / "downloads"
    assert [f.name for f in downloads.iterdir()] == ["avt_dataset.zip"]
    with zipfile.ZipFile(downloads / "avt_dataset.zip") as outer:
        assert sorted(n for n in outer.namelist() if not n.endswith("/")) == sorted(INSTITUTIONS)
        outer.extractall(tmp_path)
    for zip_name, (folder, prefix) in INSTITUTIONS.items():
        with zipfile.ZipFile(tmp_path / zip_name) as inner:
            members = [n for n in inner.namelist() if not n.endswith("/")]
        assert members
        for name in members:
            match = re.fullmatch(rf"{folder}/([^/]+)/({prefix}\d+)(\.seg)?\.nrrd", name)
            assert match, name
            # Dongyang and KiTS folders are named after the case; Rider's folder names are unknown, so the
            # mirror uses other names and prepare may only pair files within a folder
            assert (match.group(1) == match.group(2)) == (folder != "Rider"), name


def test_labels_are_binary_slicer_segmentations_on_the_image_grid(prepared) -> None:
    p = prepared("seg_a")
    labels = sorted(p.dirs.raw.rglob("*.seg.nrrd"))
    assert len(labels) == p.task.meta.synthetic_cases
    for label_path in labels:
        header = label_path.read_bytes().split(b"\n\n", 1)[0].decode()
        assert "Segment0_ID:=" in header and "Segment0_LabelValue:=1" in header
        label = sitk.ReadImage(str(label_path))
        image = sitk.ReadImage(str(label_path.with_name(label_path.name.replace(".seg.nrrd", ".nrrd"))))
        assert label.GetPixelID() == sitk.sitkUInt8 and image.GetPixelID() == sitk.sitkInt16
        assert label.GetSize() == image.GetSize() and label.GetSpacing() == image.GetSpacing()
        mask = sitk.GetArrayFromImage(label)
        hu = sitk.GetArrayFromImage(image)
        assert set(np.unique(mask)) == {0, 1}
        assert 200 < np.median(hu[mask == 1]) < 600  # contrast-filled lumen
        assert np.median(hu[mask == 0]) < 100


def test_extraction_unpacks_the_nested_zips_and_removes_them(prepared) -> None:
    raw = prepared("seg_a").dirs.raw
    assert sorted(p.name for p in raw.iterdir() if p.is_dir()) == ["Dongyang", "KiTS", "Rider", "downloads"]
    assert not [p for p in raw.rglob("*.zip") if p.parent.name != "downloads"]
    ids = prepared("seg_a").task.family().case_ids(raw)
    assert all(re.fullmatch(r"[DKR]\d+", i) for i in ids)  # never "D1.seg"


def test_institution_zips_downloaded_separately_extract_to_the_same_cases(prepared, tmp_path) -> None:
    p = prepared("seg_a")
    downloads = tmp_path / "downloads"
    with zipfile.ZipFile(p.dirs.raw / "downloads" / "avt_dataset.zip") as outer:
        outer.extractall(downloads)
    (downloads / "KiTS.zip").rename(downloads / "KiTs.zip")  # the spelling an older loader used
    family = p.task.family()
    family.extract(downloads, tmp_path / "raw")
    assert family.case_ids(tmp_path / "raw") == family.case_ids(p.dirs.raw)


def copy_raw(prepared_raw: Path, dest: Path) -> Path:
    for institution in ("Dongyang", "KiTS", "Rider"):
        shutil.copytree(prepared_raw / institution, dest / institution)
    return dest


def test_a_segmentation_saved_cropped_to_its_extent_is_put_back_on_the_image_grid(prepared, tmp_path) -> None:
    p = prepared("seg_a")
    raw = copy_raw(p.dirs.raw, tmp_path / "raw")
    family = p.task.family()
    ids = family.case_ids(raw)
    label_path = next(raw.rglob(f"{ids[0]}.seg.nrrd"))
    full = sitk.ReadImage(str(label_path))
    cropped = sitk.RegionOfInterest(full, [s - 4 for s in full.GetSize()], [2, 2, 2])  # keeps physical placement
    sitk.WriteImage(cropped, str(label_path), useCompression=True)
    ctx = PrepareContext(raw=raw, public=tmp_path / "public", private=tmp_path / "private",
                         split=Split(train=tuple(ids[:-1]), test=(ids[-1],)), options={})
    ctx.private.mkdir()
    family.prepare(ctx)
    restored = sitk.ReadImage(str(ctx.public / "train" / "labels" / f"{ids[0]}.seg.nrrd"))
    assert restored.GetSize() == full.GetSize() and restored.GetOrigin() == full.GetOrigin()
    original = sitk.GetArrayFromImage(full)
    expected = np.zeros_like(original)  # the cropped-away border is background
    expected[2:-2, 2:-2, 2:-2] = original[2:-2, 2:-2, 2:-2]
    assert np.array_equal(sitk.GetArrayFromImage(restored), expected)


def test_a_case_found_twice_is_an_error(prepared, tmp_path) -> None:
    raw = copy_raw(prepared("seg_a").dirs.raw, tmp_path / "raw")
    first = next((raw / "Dongyang").iterdir())
    shutil.copytree(first, raw / "Dongyang" / "Dongyang" / first.name)  # the release's doubled folder
    with pytest.raises(TaskDataMissingError, match="appears twice"):
        prepared("seg_a").task.family().case_ids(raw)
