"""RAVIR: synthetic mirror layout, preparation (incl. the duplicate IR_Case_002), grading, learnability."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from rexmle_grade.errors import TaskDataMissingError
from rexmle_tasks.base import safe_extract_zip
from rexmle_tasks.families.ravir import LABELLED_CASES, RavirFamily, check_mask
from rexmle_tasks.registry import get_task


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare("ravir")


def test_mirror_has_the_real_tree_with_a_space_in_the_top_folder(prepared, kit) -> None:
    downloads = prepared.dirs.raw / "downloads"
    assert [p.name for p in downloads.iterdir()] == ["ravir.zip"]
    members = kit.zip_members(downloads / "ravir.zip")
    names = [f"{n}.png" for n in LABELLED_CASES[:10]]
    assert members == [m for n in names for m in (f"RAVIR Dataset/train/training_images/{n}",
                                                  f"RAVIR Dataset/train/training_masks/{n}")] + [
        "RAVIR Dataset/test/IR_Case_006.png", "RAVIR Dataset/test/IR_Case_060.png"]
    mask = Image.open(prepared.dirs.raw / "RAVIR Dataset" / "train" / "training_masks" / names[0])
    assert mask.mode == "L" and set(np.unique(np.asarray(mask))) == {0, 128, 255}


def test_prepared_folders(prepared) -> None:
    public, test_ids = prepared.dirs.public, prepared.test_ids
    assert (prepared.info.n_train, prepared.info.n_test) == (8, 2)
    train = sorted(p.name for p in (public / "train" / "images").iterdir())
    assert train == sorted(p.name for p in (public / "train" / "labels").iterdir()) and len(train) == 8
    assert sorted(p.stem for p in (public / "test" / "images").iterdir()) == sorted(test_ids)
    assert sorted(p.name for p in (public / "unlabelled" / "images").iterdir()) == ["IR_Case_006.png",
                                                                                  "IR_Case_060.png"]
    for case_id in test_ids:
        assert prepared.manifest.geometry[case_id].size == (128, 128)
    prepared.assert_no_leaks()


def test_sample_and_gold_submissions(prepared, tmp_path: Path) -> None:
    assert prepared.grade_sample().metrics["dice"] == 0.0
    prepared.assert_gold_is_best(prepared.grade_gold(tmp_path / "gold"))


def test_duplicate_case_002_and_mac_resource_forks_are_left_out_bad_masks_refused(prepared, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    safe_extract_zip(prepared.dirs.raw / "downloads" / "ravir.zip", raw)
    train = raw / "RAVIR Dataset" / "train"
    for folder in ("training_images", "training_masks"):
        shutil.copy(train / folder / "IR_Case_011.png", train / folder / "IR_Case_002.png")
    # what a zip made on a Mac also carries: resource forks in __MACOSX/ and ._ files
    fork = raw / "__MACOSX" / "RAVIR Dataset" / "train" / "training_images"
    fork.mkdir(parents=True)
    (fork.parent / "training_masks").mkdir()
    (train / "training_images" / "._IR_Case_011.png").write_bytes(b"\0\5\x16\7")
    ids = RavirFamily(get_task("ravir").meta).case_ids(raw)
    assert len(ids) == 10 and "IR_Case_002" not in ids
    rgb = np.zeros((8, 8, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    with pytest.raises(TaskDataMissingError, match="single-channel"):
        check_mask(tmp_path / "rgb.png")
    Image.fromarray(np.full((8, 8), 200, dtype=np.uint8)).save(tmp_path / "grey.png")
    with pytest.raises(TaskDataMissingError, match="200"):
        check_mask(tmp_path / "grey.png")


def test_local_contrast_thresholds_learned_from_training_masks_beat_the_empty_sample(prepared, tmp_path: Path,
                                                                                     kit) -> None:
    """Vessels are darker than the surrounding fundus, veins more than arteries: each pixel's contrast to a
    median-filtered background is assigned to the nearest of the three classes' mean contrasts."""
    public = prepared.dirs.public

    def contrast(path: Path) -> np.ndarray:
        image = np.asarray(Image.open(path), dtype=float)
        return ndimage.gaussian_filter(image, 0.7) - ndimage.median_filter(image, size=15)

    values, labels = [], []
    for image in sorted((public / "train" / "images").iterdir()):
        values.append(contrast(image).ravel())
        labels.append(np.asarray(Image.open(public / "train" / "labels" / image.name)).ravel())
    codes = (0, 128, 255)
    centroids = kit.class_means(np.concatenate(values)[:, None], np.concatenate(labels), codes)

    def predict(case_id: str, path: Path) -> None:
        values = contrast(public / "test" / "images" / f"{case_id}.png")[..., None]
        Image.fromarray(np.asarray(codes, dtype=np.uint8)[kit.nearest_centroid(values, centroids)]).save(path)

    model = prepared.grade(prepared.write_files(tmp_path / "model", predict)).metrics["dice"]
    assert model > 0.4 > prepared.grade_sample().metrics["dice"]
