"""End-to-end checks shared by the 3-D volume tasks: synthetic download -> prepare -> public/private contents ->
sample, gold and a trivial fitted model graded by the task's grader; determinism of the mirrors."""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
from scipy import ndimage

from rexmle_grade.grader import Direction, TestManifest, write_submission_csv
from rexmle_grade.grading import grade_submission
from rexmle_grade.io import read_volume_geometry, write_volume
from rexmle_grade.validation import validate_submission
from rexmle_tasks.check import check_task
from rexmle_tasks.registry import get_task
from rexmle_tasks.splits import file_checksums, make_split


@dataclass(frozen=True)
class Layout:
    """Where a prepared task keeps each case's files (``{id}`` is the case id)."""

    image: str  # the input the grid is defined by, under train/ or test/
    label: str  # under train/ (public) and, for test cases, as private/answers.csv names it
    other_inputs: tuple[str, ...]  # further inputs per case, under train/ and test/
    normalise: bool  # MR intensities have no unit: divide by the median of the non-zero voxels
    largest_component: bool
    primary: str  # the metric the trivial model must improve
    # the window's upper bound raised by this share of its width: SEG.A.'s bolus timing scales the aorta's HU by
    # 0.8-1.3 between scans, so a test scan can be brighter than every training scan (bone, at 800 HU, stays out)
    upper_margin: float = 0.0


LAYOUTS = {
    "panther-task1": Layout("images/{id}_0000.mha", "labels/{id}.mha", (), True, True, "dsc"),
    "panther-task2": Layout("images/{id}_0000.mha", "labels/{id}.mha", (), True, True, "dsc"),
    "isles22": Layout("images/{id}_0000.nii.gz", "labels/{id}.nii.gz",
                      ("images/{id}_0001.nii.gz", "flair/{id}_flair.nii.gz"), True, False, "dice"),
    "seg_a": Layout("images/{id}.nrrd", "labels/{id}.seg.nrrd", (), False, True, "dsc_50pc", upper_margin=0.5),
}
TASKS = sorted(LAYOUTS)


def split_ids(public: Path) -> tuple[list[str], list[str]]:
    manifest = json.loads((public / "split_manifest.json").read_text())
    return manifest["train_ids"], manifest["test_ids"]


def read_array(path: Path) -> np.ndarray:
    return sitk.GetArrayFromImage(sitk.ReadImage(str(path)))


@pytest.mark.parametrize("task_id", TASKS)
def test_metadata_description_and_leaderboard_agree_with_the_grader(task_id: str) -> None:
    task = get_task(task_id)
    with (task.folder / "leaderboard.csv").open(newline="") as fh:
        header = next(csv.reader(fh))
    assert header[:3] == ["rank", "team", "mean_position"]
    for metric in task.grader.ranked_metrics:
        assert metric.name in header and f"{metric.name}_position" in header
    template = task.description_template
    for placeholder in ("{{metrics}}", "{{conventions}}", "{{submission_format}}", "{{n_train}}", "{{n_test}}"):
        assert placeholder in template
    for secret in ("private", "leaderboard", "seed", str(task.meta.split.seed)):
        assert secret not in template.lower()
    assert task.meta.split.test_fraction == 0.2
    assert task.meta.cases.test == math.ceil(0.2 * task.meta.cases.total)


@pytest.mark.parametrize("task_id", TASKS)
def test_prepared_folders_hold_the_split_and_leak_no_test_label(task_id: str, prepared) -> None:
    p = prepared(task_id)
    layout = LAYOUTS[task_id]
    public, private = p.dirs.public, p.dirs.private
    train, test = split_ids(public)
    n = p.task.meta.synthetic_cases
    assert (len(train), len(test)) == (n - math.ceil(0.2 * n), math.ceil(0.2 * n))
    assert not set(train) & set(test)
    for case_id in train:
        for pattern in (layout.image, layout.label, *layout.other_inputs):
            assert (public / "train" / pattern.format(id=case_id)).is_file()
    for case_id in test:
        for pattern in (layout.image, *layout.other_inputs):
            assert (public / "test" / pattern.format(id=case_id)).is_file()
    assert not (public / "test" / "labels").exists()

    assert check_task(p.task, p.dirs, regenerate=False) == []  # the leak checks (regeneration: test_all_tasks)
    # and, directly: nothing public is a link, names a test case outside test/ and sample_submission/, or
    # equals a test label
    for path in public.rglob("*"):
        assert not path.is_symlink()
        relative = path.relative_to(public).as_posix()
        if path.is_file() and not relative.startswith(("test/", "sample_submission/")) and relative.count("/"):
            # a whole id, not a prefix of another name (test case D1 beside training case D15)
            assert not any(re.search(rf"(?<![A-Za-z0-9]){re.escape(case_id)}(?![A-Za-z0-9])", path.name)
                           for case_id in test), relative
    label_digests = {d for name, d in file_checksums(private).items() if name.startswith("labels/")}
    assert len(label_digests) == len(test)
    assert not label_digests & set(file_checksums(public).values())

    manifest = TestManifest.read(public)
    assert list(manifest.ids) == test
    with (private / "answers.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    id_column = p.task.grader.schema.id_column
    assert list(rows[0]) == [id_column, *p.task.grader.answer_columns]
    assert [r[id_column] for r in rows] == test
    for row in rows:
        case_id = row[id_column]
        assert row["label_path"] == layout.label.format(id=case_id)
        image_geometry = read_volume_geometry(public / "test" / layout.image.format(id=case_id))[0]
        assert manifest.geometry[case_id] == image_geometry
        label_geometry = read_volume_geometry(private / row["label_path"])[0]
        assert image_geometry.mismatches(label_geometry) == []
        assert read_array(private / row["label_path"]).max() >= 1


@pytest.mark.parametrize("task_id", TASKS)
def test_sample_submission_validates_and_gold_grades_at_the_best_values(task_id: str, prepared, tmp_path) -> None:
    p = prepared(task_id)
    grader = p.task.grader
    sample = p.dirs.public / "sample_submission"
    report = validate_submission(grader, sample, p.dirs.public)
    assert report.ok, report.problems
    assert grade_submission(grader, sample, p.dirs.public, p.dirs.private).valid

    grader.write_gold_submission(p.dirs.private, p.dirs.public, tmp_path / "gold")
    gold = grade_submission(grader, tmp_path / "gold", p.dirs.public, p.dirs.private)
    assert gold.valid, gold.problems or gold.error
    for metric in grader.metrics:
        if metric.best is not None:
            assert gold.metrics[metric.name] == pytest.approx(metric.best, abs=1e-9), metric.name


def fit_intensity_window(public: Path, train: list[str], layout: Layout) -> tuple[float, float]:
    """The trivial model: the 1st-99th percentile window of (normalised) intensities under the foreground."""
    values = []
    for case_id in train:
        image = read_array(public / "train" / layout.image.format(id=case_id)).astype(np.float64)
        label = read_array(public / "train" / layout.label.format(id=case_id))
        values.append(normalised(image, layout)[label == 1])
    pooled = np.concatenate(values)
    low, high = float(np.percentile(pooled, 1)), float(np.percentile(pooled, 99))
    return low, high + layout.upper_margin * (high - low)


def normalised(image: np.ndarray, layout: Layout) -> np.ndarray:
    return image / np.median(image[image > 0]) if layout.normalise else image


def predict(image: np.ndarray, window: tuple[float, float], layout: Layout) -> np.ndarray:
    values = normalised(image.astype(np.float64), layout)
    mask = (values >= window[0]) & (values <= window[1])
    if layout.largest_component:
        mask = ndimage.binary_opening(mask, np.ones((1, 3, 3), dtype=bool))
        components, n = ndimage.label(mask)
        if n:
            mask = components == 1 + int(np.argmax(np.bincount(components.ravel())[1:]))
    return mask.astype(np.uint8)


@pytest.mark.parametrize("task_id", TASKS)
def test_a_trivial_model_fitted_on_train_beats_the_sample_submission(task_id: str, prepared, tmp_path) -> None:
    p = prepared(task_id)
    layout = LAYOUTS[task_id]
    grader = p.task.grader
    public = p.dirs.public
    train, _ = split_ids(public)
    window = fit_intensity_window(public, train, layout)
    manifest = TestManifest.read(public)
    (column,) = grader.schema.file_columns
    rows = []
    for case_id in manifest.ids:
        row = grader.schema.example_row(case_id)
        image = read_array(public / "test" / layout.image.format(id=case_id))
        write_volume(tmp_path / row[column.name], predict(image, window, layout), manifest.geometry[case_id])
        rows.append(row)
    write_submission_csv(tmp_path, grader.schema, rows)

    fitted = grade_submission(grader, tmp_path, public, p.dirs.private)
    sample = grade_submission(grader, public / "sample_submission", public, p.dirs.private)
    assert fitted.valid and sample.valid, fitted.problems or fitted.error
    primary = layout.primary
    sign = 1 if grader.directions[primary] is Direction.HIGHER_BETTER else -1
    assert sign * fitted.metrics[primary] > sign * sample.metrics[primary] + 0.3, (fitted.metrics, sample.metrics)


@pytest.mark.parametrize("task_id", TASKS)
def test_the_synthetic_mirror_is_byte_stable_for_a_seed(task_id: str, tmp_path) -> None:
    task = get_task(task_id)
    family = task.family()
    digests = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        downloads = tmp_path / name / "downloads"
        family.write_synthetic_download(downloads, cases=4, seed=seed)
        family.extract(downloads, tmp_path / name)
        ids = family.case_ids(tmp_path / name)
        assert len(ids) == 4
        split = make_split(ids, seed=task.meta.split.seed, test_fraction=task.meta.split.test_fraction)
        digests[name] = (file_checksums(downloads), split.digest)
    assert digests["a"] == digests["b"]
    assert digests["a"][0] != digests["c"][0]
