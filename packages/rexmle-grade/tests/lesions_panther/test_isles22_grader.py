"""End-to-end tests of the isles22 grader on a tiny prepared task."""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from rexmle_grade.grader import get_grader
from rexmle_grade.grading import grade_submission
from rexmle_grade.io import write_volume
from rexmle_grade.validation import validate_submission

IDS = ("sub-strokecase0001", "sub-strokecase0002", "sub-strokecase0003")


@pytest.fixture
def grader():
    return get_grader("isles22")


@pytest.fixture
def task(make_task, geometry_for):
    """Case 1: worked example 1 (spacing 1x1x2); case 2: worked example 3 (1x1x1); case 3: no lesion."""
    first = np.zeros((1, 4, 6), np.uint8)
    first[0, 0, 0:2] = 1
    first[0, 3, 4:6] = 1
    second = np.zeros((1, 4, 6), np.uint8)
    second[0, 0, 0] = second[0, 0, 3] = 1
    third = np.zeros((2, 3, 4), np.uint8)
    cases = {
        IDS[0]: (first, geometry_for(first.shape, (1.0, 1.0, 2.0))),
        IDS[1]: (second, geometry_for(second.shape, (1.0, 1.0, 1.0))),
        IDS[2]: (third, geometry_for(third.shape, (0.9, 0.9, 3.0))),
    }
    public, private = make_task("case_id", cases)
    return public, private, cases


def worked_predictions(cases):
    first = np.zeros((1, 4, 6), np.uint8)
    first[0, 0, 1:3] = 1
    first[0, 2, 0] = 1
    second = np.zeros((1, 4, 6), np.uint8)
    second[0, 0, 0:4] = 255  # any non-zero value is lesion
    return {IDS[0]: (first, cases[IDS[0]][1]), IDS[1]: (second, cases[IDS[1]][1]),
            IDS[2]: (np.zeros((2, 3, 4), np.uint8), cases[IDS[2]][1])}


def test_registered_with_the_leaderboard_columns(grader) -> None:
    assert grader.grader_id == "isles22"
    assert [m.name for m in grader.ranked_metrics] == ["dice", "lesion_f1", "lesion_count_diff", "abs_volume_diff"]
    assert grader.schema.column_names == ["case_id", "predicted_mask_path"]
    assert grader.schema.example_row(IDS[0])["predicted_mask_path"] == f"predictions/{IDS[0]}_pred.nii.gz"
    assert any("ground-truth header" in c for c in grader.conventions)


def test_gold_submission_grades_best(grader, task, tmp_path) -> None:
    public, private, _ = task
    gold = tmp_path / "gold"
    grader.write_gold_submission(private, public, gold)
    result = grade_submission(grader, gold, public, private)
    assert result.status == "valid", result.problems or result.error
    assert result.metrics == {m.name: m.best for m in grader.metrics}


def test_worked_examples_through_the_grader(grader, task, write_masks) -> None:
    public, private, cases = task
    submission = write_masks(grader.schema, worked_predictions(cases))
    result = grade_submission(grader, submission, public, private)
    assert result.status == "valid", result.problems or result.error
    per_case = {row["case_id"]: row for row in result.per_case}
    assert per_case[IDS[0]]["dice"] == pytest.approx(2 / 7)
    assert per_case[IDS[0]]["abs_volume_diff"] == pytest.approx(0.002)
    assert per_case[IDS[1]]["lesion_f1"] == 1.0
    assert per_case[IDS[2]] == {"case_id": IDS[2], "dice": 1.0, "lesion_f1": 1.0, "lesion_count_diff": 0,
                                "abs_volume_diff": 0.0}
    # means over the three cases
    assert result.metrics == pytest.approx({
        "dice": (2 / 7 + 2 / 3 + 1.0) / 3,
        "lesion_f1": (0.5 + 1.0 + 1.0) / 3,
        "lesion_count_diff": (0 + 1 + 0) / 3,
        "abs_volume_diff": (0.002 + 0.002 + 0.0) / 3,
    }, abs=1e-12)


def test_sample_submission_validates_and_grades(grader, task, tmp_path) -> None:
    public, private, _ = task
    sample = tmp_path / "sample"
    grader.write_sample_submission(public, sample)
    assert validate_submission(grader, sample, public).ok
    result = grade_submission(grader, sample, public, private)
    assert result.status == "valid", result.problems or result.error
    # empty predictions: cases 1 and 2 score 0 (two lesions each, 4 and 2 voxels), case 3 is empty vs empty
    assert result.metrics == pytest.approx({
        "dice": 1 / 3, "lesion_f1": 1 / 3, "lesion_count_diff": 4 / 3, "abs_volume_diff": (0.008 + 0.002) / 3})


# ---- corrupted submissions: rejected with a clear problem, never a crash ---------------------------------------
def rewrite_row(submission: Path, case_id: str, path: str) -> None:
    csv_path = submission / "submission.csv"
    with csv_path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        if row["case_id"] == case_id:
            row["predicted_mask_path"] = path
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["case_id", "predicted_mask_path"])
        writer.writeheader()
        writer.writerows(rows)


def corrupt(kind: str, submission: Path, geometry_for, tmp_path: Path) -> None:
    target = submission / f"predictions/{IDS[0]}_pred.nii.gz"
    if kind == "shape":
        write_volume(target, np.zeros((1, 4, 5), np.uint8), geometry_for((1, 4, 5), (1.0, 1.0, 2.0)))
    elif kind == "spacing":
        write_volume(target, np.zeros((1, 4, 6), np.uint8), geometry_for((1, 4, 6), (1.0, 1.0, 0.5)))
    elif kind == "nan":
        array = np.zeros((1, 4, 6), np.float32)
        array[0, 0, 0] = np.nan
        write_volume(target, array, geometry_for((1, 4, 6), (1.0, 1.0, 2.0)))
    elif kind == "negative":
        write_volume(target, np.full((1, 4, 6), -1, np.int16), geometry_for((1, 4, 6), (1.0, 1.0, 2.0)))
    elif kind == "garbage":
        target.write_bytes(b"not a nifti file at all")
    elif kind == "missing_id":
        lines = (submission / "submission.csv").read_text().splitlines()
        (submission / "submission.csv").write_text("\n".join(ln for ln in lines if IDS[0] not in ln) + "\n")
    elif kind == "dotdot":
        rewrite_row(submission, IDS[0], f"../outside/{IDS[0]}_pred.nii.gz")
    elif kind == "absolute":
        rewrite_row(submission, IDS[0], str(target))
    elif kind == "symlink":
        outside = tmp_path / "elsewhere.nii.gz"
        shutil.copy(target, outside)
        target.unlink()
        os.symlink(outside, target)
    else:
        raise AssertionError(kind)


EXPECTED = {
    "shape": "size [5, 4, 1] but the test image has size [6, 4, 1]",
    "spacing": "spacing",
    "nan": "integer type",
    "negative": "negative values",
    "garbage": "not a readable 3-D image",
    "missing_id": "missing",
    "dotdot": "'..'",
    "absolute": "absolute",
    "symlink": "outside the submission folder",
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_corrupted_submission_is_rejected(kind, grader, task, write_masks, geometry_for, tmp_path) -> None:
    public, private, cases = task
    submission = write_masks(grader.schema, worked_predictions(cases))
    corrupt(kind, submission, geometry_for, tmp_path)
    report = validate_submission(grader, submission, public)
    assert not report.ok
    assert any(EXPECTED[kind] in p for p in report.problems), report.problems
    result = grade_submission(grader, submission, public, private)
    assert result.status == "invalid_submission", result.error
    assert any(EXPECTED[kind] in p for p in result.problems), result.problems
    assert result.metrics == {}


def test_manifest_disagreeing_with_the_ground_truth_is_a_grader_error(grader, task, write_masks, geometry_for):
    public, private, cases = task
    label = cases[IDS[0]][0]
    write_volume(private / f"labels/{IDS[0]}.nii.gz", label, geometry_for(label.shape, (1.0, 1.0, 2.5)))
    result = grade_submission(grader, write_masks(grader.schema, worked_predictions(cases)), public, private)
    assert result.status == "grader_error"
    assert "re-run `rexmle prepare TASK --force`" in result.error


def test_missing_ground_truth_is_a_grader_error(grader, task, write_masks):
    public, private, cases = task
    (private / f"labels/{IDS[1]}.nii.gz").unlink()
    result = grade_submission(grader, write_masks(grader.schema, worked_predictions(cases)), public, private)
    assert result.status == "grader_error"
    assert "TaskDataMissingError" in result.error
