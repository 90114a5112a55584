"""NeurIPS CellSeg: synthetic mirror layout, preparation (incl. repeated Tuning names), grading, learnability."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image
from scipy import ndimage

from rexmle_grade.errors import TaskDataMissingError
from rexmle_tasks.base import PrepareContext, reset_dir, safe_extract_zip
from rexmle_tasks.families.cellseg import CellSegFamily, find_cases
from rexmle_tasks.registry import get_task
from rexmle_tasks.splits import Split

ARCHIVES = ["Testing.zip", "Training-labeled.zip", "Tuning.zip", "train-unlabeled-part1.zip",
            "train-unlabeled-part2.zip"]


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare("neurips-cellseg")


def _read(path: Path) -> np.ndarray:
    return tifffile.imread(path) if path.suffix in (".tif", ".tiff") else np.asarray(Image.open(path))


def test_mirror_has_the_real_archives_and_folders(prepared, kit) -> None:
    downloads = prepared.dirs.raw / "downloads"
    assert sorted(p.name for p in downloads.iterdir()) == ARCHIVES
    tops = {archive: {m.split("/")[0] for m in kit.zip_members(downloads / archive)} for archive in ARCHIVES}
    assert tops == {"Testing.zip": {"Testing"}, "Training-labeled.zip": {"Training-labeled"}, "Tuning.zip": {"Tuning"},
                    "train-unlabeled-part1.zip": {"release-part1"},
                    "train-unlabeled-part2.zip": {"train-unlabeled-part2"}}
    assert all(m.startswith("Testing/Public/") for m in kit.zip_members(downloads / "Testing.zip"))
    raw = prepared.dirs.raw
    suffixes, channels = set(), set()
    for folder in ("Training-labeled", "Tuning"):
        images = sorted((raw / folder / "images").iterdir())
        labels = sorted((raw / folder / "labels").iterdir())
        assert [p.name for p in labels] == [f"{p.stem}_label.tiff" for p in images]
        for image, label in zip(images, labels, strict=True):
            pixels, instances = _read(image), tifffile.imread(label)
            assert pixels.shape[:2] == instances.shape and np.issubdtype(instances.dtype, np.integer)
            suffixes.add(image.suffix)
            channels.add(pixels.ndim)
    assert suffixes >= {".png", ".bmp", ".tif", ".tiff"} and channels == {2, 3}


def test_prepared_folders(prepared) -> None:
    public, private, test_ids = prepared.dirs.public, prepared.dirs.private, prepared.test_ids
    assert (prepared.info.n_train, prepared.info.n_test) == (8, 2)
    train_images = sorted((public / "train" / "images").iterdir())
    assert len(train_images) == 8
    assert sorted(p.name for p in (public / "train" / "labels").iterdir()) == sorted(
        f"{p.stem}_label.tiff" for p in train_images)
    assert sorted(p.stem for p in (public / "test" / "images").iterdir()) == sorted(test_ids)
    answers = prepared.answers()
    for case_id in test_ids:
        label = tifffile.imread(private / answers[case_id]["label_path"])
        assert prepared.manifest.geometry[case_id].size == (label.shape[1], label.shape[0])
    prepared.assert_no_leaks()


def test_sample_and_gold_submissions(prepared, tmp_path: Path) -> None:
    assert prepared.grade_sample().metrics["f1_0.5"] == 0.0
    prepared.assert_gold_is_best(prepared.grade_gold(tmp_path / "gold"))


def test_a_tuning_name_that_repeats_a_training_name_gets_its_own_id(prepared, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    for archive in ("Training-labeled.zip", "Tuning.zip"):
        safe_extract_zip(prepared.dirs.raw / "downloads" / archive, raw)
    taken = sorted((raw / "Training-labeled" / "images").iterdir())[0]
    tuning = sorted((raw / "Tuning" / "images").iterdir())[0]
    tuning_label = raw / "Tuning" / "labels" / f"{tuning.stem}_label.tiff"
    shutil.move(tuning, raw / "Tuning" / "images" / f"{taken.stem}{tuning.suffix}")
    shutil.move(tuning_label, raw / "Tuning" / "labels" / f"{taken.stem}_label.tiff")
    cases = find_cases(raw)
    assert len(cases) == 10 and f"Tuning_{taken.stem}" in cases and cases[taken.stem].image == taken
    family = CellSegFamily(get_task("neurips-cellseg").meta)
    ids = sorted(cases)
    split = Split(train=tuple(i for i in ids if i != f"Tuning_{taken.stem}"), test=(f"Tuning_{taken.stem}",))
    ctx = PrepareContext(raw=raw, public=reset_dir(tmp_path / "public"), private=reset_dir(tmp_path / "private"),
                         split=split, options={})
    family.prepare(ctx)
    assert (tmp_path / "public" / "test" / "images" / f"Tuning_{taken.stem}{tuning.suffix}").is_file()
    assert (tmp_path / "public" / "train" / "images" / taken.name).is_file()
    # within one folder, two images of one stem would share a label: refused
    shutil.copy(taken, taken.with_suffix(".jpg" if taken.suffix != ".jpg" else ".png"))
    with pytest.raises(TaskDataMissingError, match=taken.stem):
        find_cases(raw)


def test_a_learned_threshold_with_connected_components_beats_the_empty_sample(prepared, tmp_path: Path) -> None:
    """Cells differ from the (majority) background: pixels whose distance from the image median exceeds a
    threshold learned from the training labels are cells, and each connected group is one cell."""
    public = prepared.dirs.public

    def deviation(path: Path) -> np.ndarray:
        pixels = _read(path).astype(float)
        grey = pixels.mean(axis=2) if pixels.ndim == 3 else pixels
        return ndimage.gaussian_filter(np.abs(grey - np.median(grey)), 1.0)

    inside, outside = [], []
    for image in sorted((public / "train" / "images").iterdir()):
        cells = tifffile.imread(public / "train" / "labels" / f"{image.stem}_label.tiff") > 0
        values = deviation(image)
        inside.append(values[cells].mean())
        outside.append(values[~cells].mean())
    threshold = (np.mean(inside) + np.mean(outside)) / 2

    def predict(case_id: str, path: Path) -> None:
        (image,) = (public / "test" / "images").glob(f"{case_id}.*")
        instances, _ = ndimage.label(deviation(image) > threshold)
        tifffile.imwrite(path, instances.astype(np.uint16))

    model = prepared.grade(prepared.write_files(tmp_path / "model", predict)).metrics
    assert model["f1_0.5"] > 0.7 > prepared.grade_sample().metrics["f1_0.5"]
