"""PANTHER: the mirror's archives and tree, both unpacked layouts, unlabelled scans, the tumour check."""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from rexmle_grade.errors import RexmleError
from rexmle_tasks.base import PrepareContext
from rexmle_tasks.registry import get_task
from rexmle_tasks.splits import Split

TASK1_MEMBER = re.compile(r"PANTHER_Task1/(ImagesTr/\d{5}_0001_0000\.mha|LabelsTr/\d{5}_0001\.mha"
                          r"|ImagesTr_unlabeled/[^/]+\.mha)")
TASK2_MEMBER = re.compile(r"PANTHER_Task2/(ImagesTr/\d{5}_0000\.mha|LabelsTr/\d{5}\.mha)")
# ids in the task-2 range that are not among the 50 published with the PANTHER baseline
NOT_TASK2_IDS = {"10305", "10308", "10311", "10384"}


def member_files(archive: Path) -> list[str]:
    with zipfile.ZipFile(archive) as zf:
        return [n for n in zf.namelist() if not n.endswith("/")]


def test_each_task_downloads_both_real_archives_with_the_real_tree(prepared) -> None:
    for task_id in ("panther-task1", "panther-task2"):
        downloads = prepared(task_id).dirs.raw / "downloads"
        assert sorted(p.name for p in downloads.iterdir()) == ["PANTHER_Task1.zip", "PANTHER_Task2.zip"]
    downloads = prepared("panther-task1").dirs.raw / "downloads"
    task1 = member_files(downloads / "PANTHER_Task1.zip")
    task2 = member_files(downloads / "PANTHER_Task2.zip")
    assert all(TASK1_MEMBER.fullmatch(n) for n in task1), task1
    assert all(TASK2_MEMBER.fullmatch(n) for n in task2), task2
    assert "PANTHER_Task1/ImagesTr/10000_0001_0000.mha" in task1  # the real ids start at 10000
    assert any("/ImagesTr_unlabeled/" in n for n in task1)
    task2_ids = {Path(n).name[:5] for n in task2}
    assert len(task2_ids) == prepared("panther-task1").task.meta.synthetic_cases
    assert all("10303" <= i <= "10383" for i in task2_ids) and not task2_ids & NOT_TASK2_IDS


def test_prepared_ids_and_label_values_follow_the_real_conventions(prepared) -> None:
    for task_id, pattern in (("panther-task1", r"\d{5}_0001"), ("panther-task2", r"\d{5}")):
        p = prepared(task_id)
        labels = sorted((p.dirs.public / "train" / "labels").glob("*.mha"))
        assert labels and all(re.fullmatch(pattern, f.name[: -len(".mha")]) for f in labels)
        for label in labels:
            image = sitk.ReadImage(str(label))
            assert image.GetPixelID() == sitk.sitkUInt8
            assert set(np.unique(sitk.GetArrayViewFromImage(image))) == {0, 1, 2}  # background, tumour, pancreas


def test_task1_ships_every_unlabelled_scan_and_task2_none(prepared) -> None:
    task1 = prepared("panther-task1")
    raw_unlabelled = sorted(p.name for p in (task1.dirs.raw / "PANTHER_Task1" / "ImagesTr_unlabeled").glob("*.mha"))
    public_unlabelled = sorted(p.name for p in (task1.dirs.public / "train_unlabeled" / "images").iterdir())
    assert public_unlabelled == raw_unlabelled and len(raw_unlabelled) >= 2
    assert not (prepared("panther-task2").dirs.public / "train_unlabeled").exists()


def flatten(raw: Path, dest: Path) -> Path:
    """Both archives unpacked without their top folders into one raw folder (the release's expectation)."""
    for top in ("PANTHER_Task1", "PANTHER_Task2"):
        shutil.copytree(raw / top, dest, dirs_exist_ok=True)
    return dest


def test_a_flat_raw_folder_holding_both_tasks_gives_each_task_its_own_cases(prepared, tmp_path) -> None:
    for task_id in ("panther-task1", "panther-task2"):
        p = prepared(task_id)
        family = p.task.family()
        flat = flatten(p.dirs.raw, tmp_path / task_id / "raw")
        assert family.case_ids(flat) == family.case_ids(p.dirs.raw)
        ids = family.case_ids(flat)
        ctx = PrepareContext(raw=flat, public=tmp_path / task_id / "public", private=tmp_path / task_id / "private",
                             split=Split(train=tuple(ids[1:]), test=(ids[0],)), options=p.task.meta.options)
        ctx.private.mkdir(parents=True)
        manifest = family.prepare(ctx)
        assert manifest.ids == (ids[0],)
        assert len(list((ctx.public / "train" / "images").iterdir())) == len(ids) - 1


def test_a_test_case_without_tumour_is_refused(prepared, tmp_path) -> None:
    p = prepared("panther-task1")
    raw = tmp_path / "raw"
    shutil.copytree(p.dirs.raw / "PANTHER_Task1", raw / "PANTHER_Task1")
    family = p.task.family()
    ids = family.case_ids(raw)
    label_path = raw / "PANTHER_Task1" / "LabelsTr" / f"{ids[0]}.mha"
    label = sitk.ReadImage(str(label_path))
    array = sitk.GetArrayFromImage(label)
    array[array == 1] = 2  # the tumour becomes pancreas
    tumour_free = sitk.GetImageFromArray(array)
    tumour_free.CopyInformation(label)
    sitk.WriteImage(tumour_free, str(label_path))
    ctx = PrepareContext(raw=raw, public=tmp_path / "public", private=tmp_path / "private",
                         split=Split(train=tuple(ids[1:]), test=(ids[0],)), options=p.task.meta.options)
    ctx.private.mkdir()
    with pytest.raises(RexmleError, match="no tumour"):
        family.prepare(ctx)
    # the same case in train is fine: tumour-free training labels are legitimate
    ctx = PrepareContext(raw=raw, public=tmp_path / "public2", private=tmp_path / "private2",
                         split=Split(train=tuple(ids[:-1]), test=(ids[-1],)), options=p.task.meta.options)
    ctx.private.mkdir()
    assert family.prepare(ctx).ids == (ids[-1],)


def test_an_unknown_task_number_is_a_configuration_error() -> None:
    from rexmle_grade.errors import ConfigurationError

    meta = get_task("panther-task1").meta.model_copy(update={"options": {"task": 3}})
    family = get_task("panther-task1").family().__class__(meta)
    with pytest.raises(ConfigurationError, match="expected 1 or 2"):
        family.case_ids(Path("."))
