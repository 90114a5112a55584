"""neurips-cellseg grader end to end on tiny prepared tasks."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from rexmle_grade.graders.cellseg import CellSegGrader

METRICS = ("f1_0.5", "f1_0.6", "f1_0.7", "f1_0.8", "f1_0.9")


def worked_example() -> tuple[np.ndarray, np.ndarray]:
    gt = np.zeros((12, 12), dtype=np.uint16)
    gt[0:2, 0:4] = 3
    gt[3:7, 3:7] = 1
    gt[3:7, 8:10] = 2
    pred = np.zeros((12, 12), dtype=np.uint16)
    pred[3:7, 3:6] = 5
    pred[3:8, 8:10] = 7
    pred[8:10, 4:6] = 9
    pred[10:12, 9:11] = 11
    return gt, pred


def prepare(make_task, labels: dict[str, np.ndarray]):
    grader = CellSegGrader()
    task = make_task(grader, list(labels), {i: (a.shape[1], a.shape[0]) for i, a in labels.items()})
    (task.private / "labels").mkdir()
    for case_id, array in labels.items():
        tifffile.imwrite(task.private / "labels" / f"{case_id}.tif", array)
    task.write_answers([{"image_id": i, "label_path": f"labels/{i}.tif"} for i in labels])
    return task


def test_worked_example_through_the_grader(make_task):
    gt, pred = worked_example()
    task = prepare(make_task, {"im1": gt, "im2": np.zeros((12, 12), dtype=np.uint16)})
    sub = task.sample()
    tifffile.imwrite(sub / "predictions" / "im1_label.tiff", pred)
    metrics = task.grade_ok(sub)
    assert {m: metrics[m] for m in METRICS} == pytest.approx(
        {"f1_0.5": 0.4, "f1_0.6": 0.4, "f1_0.7": 0.4, "f1_0.8": 0.2, "f1_0.9": 0.0})
    # the gold submission: im1 perfect (1.0), im2 empty on both sides (0.0, official rule)
    assert set(task.grade_ok(task.gold()).values()) == {0.5}


def test_gold_sample_and_corrupted_submissions(make_task):
    gt, _ = worked_example()
    other = np.zeros((14, 10), dtype=np.uint32)
    other[4:8, 3:7] = 70000
    task = prepare(make_task, {"im1": gt, "im2": other})
    gold = task.gold()
    assert task.grade_ok(gold) == dict.fromkeys(METRICS, 1.0)
    result = task.grade(gold)
    assert {r["image_id"]: r["n_cells"] for r in result.per_case} == {"im1": 2, "im2": 1}
    assert task.grade_ok(task.sample()) == dict.fromkeys(METRICS, 0.0)

    sub = task.sample()

    def corrupted(name: str, array: np.ndarray):
        bad = task.variant(sub, name)
        tifffile.imwrite(bad / "predictions" / "im2_label.tiff", array)
        return bad

    task.assert_invalid(corrupted("shape", np.zeros((14, 11), dtype=np.uint16)), "11x14", "10x14")
    task.assert_invalid(corrupted("float", np.full((14, 10), np.nan, dtype=np.float32)), "integer type")
    task.assert_invalid(corrupted("negative", np.full((14, 10), -1, dtype=np.int16)), "0..2147483647")
    task.assert_invalid(corrupted("rgb", np.zeros((14, 10, 3), dtype=np.uint8)), "single-channel")
    garbage = task.variant(sub, "garbage")
    (garbage / "predictions" / "im2_label.tiff").write_bytes(b"not a tiff at all")
    task.assert_invalid(garbage, "cannot be read")
    missing = task.variant(sub, "missing")
    task.write_rows(missing, task.rows(missing)[:1])
    task.assert_invalid(missing, "missing: im2")
    suffix = task.variant(sub, "suffix")
    (suffix / "predictions" / "im2_label.png").write_bytes(b"x")
    task.set_cell(suffix, 1, "predicted_mask_path", "predictions/im2_label.png")
    task.assert_invalid(suffix, "expected one of .tiff, .tif")
    task.assert_paths_contained(sub, "predicted_mask_path")


def test_size_is_checked_against_the_answer_when_the_manifest_has_none(make_task):
    grader = CellSegGrader()
    task = make_task(grader, ["im1"])
    gt, _ = worked_example()
    (task.private / "labels").mkdir()
    tifffile.imwrite(task.private / "labels" / "im1.tif", gt)
    task.write_answers([{"image_id": "im1", "label_path": "labels/im1.tif"}])
    sub = task.gold()
    tifffile.imwrite(sub / "predictions" / "im1_label.tiff", np.zeros((12, 13), dtype=np.uint16))
    assert task.validate(sub).ok  # nothing public says the size
    result = task.grade(sub)
    assert result.status == "invalid_submission"
    assert "is 13x12 (width x height); the test image is 12x12" in result.problems[0]
