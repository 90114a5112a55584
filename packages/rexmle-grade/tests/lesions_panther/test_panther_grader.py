"""End-to-end tests of the panther-task1/panther-task2 graders, plus the per-case scoring rules."""

from __future__ import annotations

import csv
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from rexmle_grade.grader import get_grader
from rexmle_grade.graders.panther import score_panther_case, tumour_burden_rmse
from rexmle_grade.grading import grade_submission
from rexmle_grade.validation import validate_submission

IDS = ("10000_0001", "10001_0001")
SPACING = (1.0, 1.0, 2.0)  # SimpleITK (sx, sy, sz): 2 mm³ voxels
SHAPE = (3, 4, 4)


# ---- per-case rules (arrays) ------------------------------------------------------------------------------------
def test_worked_example_1_official_and_physical_order() -> None:
    gt = np.zeros((6, 6, 6), bool)
    gt[1:4, 1:4, 1:4] = True
    case = score_panther_case(gt, np.roll(gt, 1, axis=0), (1.0, 1.0, 3.0))
    assert case.outcome == "regular"
    assert (case.dsc, case.msd, case.hd95, case.masd) == pytest.approx((2 / 3, 1.0, 1.0, 0.3993979497), abs=1e-10)
    assert (case.msd_physical, case.hd95_physical, case.masd_physical) == pytest.approx((1.0, 3.0, 0.5893700275),
                                                                                          abs=1e-10)
    assert (case.gt_volume_mm3, case.pred_volume_mm3) == (81.0, 81.0)


def test_worked_example_2_penalty_distance() -> None:
    gt = np.zeros((2, 3, 4), bool)
    gt[1, 1, 1] = True
    case = score_panther_case(gt, np.zeros_like(gt), (1.0, 1.0, 3.0))
    assert case.outcome == "uniform_prediction"
    assert (case.dsc, case.msd, case.msd_physical) == (0.0, 0.0, 0.0)
    assert case.hd95 == case.masd == pytest.approx(12.5299640861, abs=1e-10)  # sqrt(2² + 3² + 12²)
    assert case.hd95_physical == case.masd_physical == pytest.approx(math.sqrt(61))  # sqrt(6² + 3² + 4²)
    assert (case.gt_volume_mm3, case.pred_volume_mm3) == (3.0, 0.0)


def test_worked_example_3() -> None:
    gt = np.zeros((3, 3, 8), bool)
    pred = np.zeros_like(gt)
    gt[1, 1, 1:4] = True
    pred[1, 1, 4:7] = True
    case = score_panther_case(gt, pred, (2.0, 2.0, 2.0))
    assert (case.dsc, case.msd, case.hd95, case.masd) == pytest.approx((0.0, 0.8827938108, 6.0, 3.0), abs=1e-10)
    assert (case.gt_volume_mm3, case.pred_volume_mm3) == (24.0, 24.0)


def test_all_ones_prediction_is_a_penalty_with_zero_volume() -> None:
    gt = np.zeros((2, 2, 2), bool)
    gt[0, 0, 0] = True
    case = score_panther_case(gt, np.ones_like(gt), (1.0, 2.0, 3.0))
    assert case.outcome == "uniform_prediction"
    assert case.pred_volume_mm3 == 0.0 and case.gt_volume_mm3 == 6.0
    assert case.hd95 == pytest.approx(math.sqrt(2**2 + 4**2 + 6**2))


def test_worked_example_5_empty_ground_truth_uses_our_convention() -> None:
    pred = np.zeros((6, 6, 6), bool)
    pred[1:4, 1:4, 1:4] = True
    case = score_panther_case(np.zeros_like(pred), pred, (1.0, 1.0, 3.0))
    # official: dsc 0, msd 0, hd95 inf, masd NaN; ours: the penalty distance instead of inf / NaN
    assert case.outcome == "empty_ground_truth"
    assert (case.dsc, case.msd, case.msd_physical) == (0.0, 0.0, 0.0)
    assert case.hd95 == case.masd == pytest.approx(math.sqrt(6**2 + 6**2 + 18**2))
    assert case.hd95_physical == case.masd_physical == pytest.approx(math.sqrt(18**2 + 6**2 + 6**2))
    assert (case.gt_volume_mm3, case.pred_volume_mm3) == (0.0, 81.0)


def test_empty_ground_truth_and_empty_prediction_is_the_official_penalty() -> None:
    empty = np.zeros((2, 2, 2), bool)
    case = score_panther_case(empty, empty, (1.0, 1.0, 1.0))
    assert case.outcome == "uniform_prediction" and case.dsc == 0.0


def test_perfect_case() -> None:
    gt = np.zeros((4, 5, 6), bool)
    gt[1:3, 1:4, 2:5] = True
    case = score_panther_case(gt, gt.copy(), (1.19, 1.19, 3.0))
    assert (case.dsc, case.msd, case.hd95, case.masd, case.msd_physical, case.hd95_physical,
            case.masd_physical) == (1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0)


def test_rmse_is_pooled_over_cases() -> None:
    assert tumour_burden_rmse([8.0, 8.0], [10.0, 2.0]) == pytest.approx(4.4721359550, abs=1e-10)
    with pytest.raises(ValueError):
        tumour_burden_rmse([], [])


# ---- the grader on a tiny prepared task -----------------------------------------------------------------------
@pytest.fixture(params=["panther-task1", "panther-task2"])
def grader(request):
    return get_grader(request.param)


def example_4_labels() -> np.ndarray:
    label = np.zeros(SHAPE, np.uint8)
    label[1, 1:3, 1:3] = 1  # 4 tumour voxels
    label[2, 0:2, 0:2] = 2  # pancreas: never tumour
    return label


@pytest.fixture
def task(make_task, geometry_for):
    geometry = geometry_for(SHAPE, SPACING)
    cases = {case_id: (example_4_labels(), geometry) for case_id in IDS}
    public, private = make_task("image_id", cases, suffix=".mha")
    return public, private, geometry


def example_4_predictions(geometry) -> dict[str, tuple[np.ndarray, object]]:
    grown = (example_4_labels() == 1).astype(np.uint8)
    grown[1, 1, 3] = 1
    single = np.zeros(SHAPE, np.uint8)
    single[1, 1, 1] = 255  # {0, k}: tumour = k
    return {IDS[0]: (grown, geometry), IDS[1]: (single, geometry)}


def test_registered_ids_and_columns() -> None:
    for task_number in (1, 2):
        grader = get_grader(f"panther-task{task_number}")
        assert grader.grader_id == f"panther-task{task_number}"
        assert [m.name for m in grader.ranked_metrics] == ["dsc", "msd", "hd95", "masd", "rmse"]
        assert {m.name for m in grader.metrics if not m.ranked} == {"hd95_physical", "masd_physical", "msd_physical"}
        assert grader.schema.column_names == ["image_id", "predicted_mask_path"]
        assert grader.schema.example_row("10303")["predicted_mask_path"] == "predictions/10303.mha"
        assert any("official spacing order" in c for c in grader.conventions)
        assert any("Our choice" in c for c in grader.conventions)


def test_worked_example_4_aggregation(grader, task, write_masks) -> None:
    public, private, geometry = task
    submission = write_masks(grader.schema, example_4_predictions(geometry))
    result = grade_submission(grader, submission, public, private)
    assert result.status == "valid", result.problems or result.error
    ranked = {k: result.metrics[k] for k in ("dsc", "msd", "hd95", "masd", "rmse")}
    assert ranked == pytest.approx({"dsc": 0.6444444444, "msd": 1.0, "hd95": 2.0, "masd": 0.1968771955,
                                    "rmse": 4.4721359550}, abs=1e-10)
    assert [row["outcome"] for row in result.per_case] == ["regular", "regular"]
    assert not any(key.endswith("volume_mm3") for row in result.per_case for key in row)  # ground-truth facts


def test_gold_submission_grades_best(grader, task, tmp_path) -> None:
    public, private, _ = task
    gold = tmp_path / "gold"
    grader.write_gold_submission(private, public, gold)
    result = grade_submission(grader, gold, public, private)
    assert result.status == "valid", result.problems or result.error
    assert result.metrics == {m.name: m.best for m in grader.metrics}


def test_sample_submission_validates_and_gets_the_penalty(grader, task, tmp_path) -> None:
    public, private, _ = task
    sample = tmp_path / "sample"
    grader.write_sample_submission(public, sample)
    assert validate_submission(grader, sample, public).ok
    result = grade_submission(grader, sample, public, private)
    assert result.status == "valid", result.problems or result.error
    diagonal = math.sqrt(3**2 + 4**2 + 8**2)  # (nz·sx, ny·sy, nx·sz)
    assert result.metrics == pytest.approx({
        "dsc": 0.0, "msd": 0.0, "hd95": diagonal, "masd": diagonal, "rmse": 8.0,
        "msd_physical": 0.0, "hd95_physical": math.sqrt(6**2 + 4**2 + 4**2),
        "masd_physical": math.sqrt(6**2 + 4**2 + 4**2)})
    assert {row["outcome"] for row in result.per_case} == {"uniform_prediction"}


# ---- prediction values and geometry ---------------------------------------------------------------------------
def graded_with(grader, task, write_masks, first: np.ndarray, geometry=None):
    public, private, task_geometry = task
    masks = example_4_predictions(task_geometry)
    masks[IDS[0]] = (first, geometry or task_geometry)
    submission = write_masks(grader.schema, masks)
    return validate_submission(grader, submission, public), grade_submission(grader, submission, public, private)


@pytest.mark.parametrize("values", [(0, 1, 2), (1, 2), (2,), (0, 3, 7)])
def test_multi_valued_predictions_are_rejected(values, grader, task, write_masks) -> None:
    array = np.zeros(SHAPE, np.uint8)
    flat = array.reshape(-1)
    flat[: len(values)] = values
    flat[len(values):] = values[-1]
    report, result = graded_with(grader, task, write_masks, array)
    assert not report.ok and result.status == "invalid_submission"
    assert any("Submit the tumour only" in p for p in result.problems), result.problems


def test_two_valued_prediction_is_binarised(grader, task, write_masks) -> None:
    public, private, geometry = task
    ones = grade_submission(grader, write_masks(grader.schema, example_4_predictions(geometry), "ones"), public,
                            private)
    predictions = example_4_predictions(geometry)
    predictions[IDS[0]] = (predictions[IDS[0]][0] * np.uint8(7), geometry)
    sevens = grade_submission(grader, write_masks(grader.schema, predictions, "sevens"), public, private)
    assert ones.status == sevens.status == "valid"
    assert ones.metrics == sevens.metrics


def test_negative_values_are_rejected(grader, task, write_masks) -> None:
    report, result = graded_with(grader, task, write_masks, np.full(SHAPE, -1, np.int16))
    assert not report.ok and any("negative values" in p for p in result.problems)


def test_spacing_must_match_within_1e4_mm(grader, task, write_masks, geometry_for) -> None:
    array = np.zeros(SHAPE, np.uint8)
    array[1, 1, 1] = 1
    off = geometry_for(SHAPE, (1.0, 1.0, 2.001))
    report, result = graded_with(grader, task, write_masks, array, off)
    assert result.status == "invalid_submission" and any("spacing" in p for p in result.problems)
    close = geometry_for(SHAPE, (1.0, 1.0, 2.00005))
    report, result = graded_with(grader, task, write_masks, array, close)
    assert report.ok and result.status == "valid", result.problems


def test_shape_mismatch_is_rejected(grader, task, write_masks, geometry_for) -> None:
    array = np.zeros((3, 4, 5), np.uint8)
    array[1, 1, 1] = 1
    report, result = graded_with(grader, task, write_masks, array, geometry_for((3, 4, 5), SPACING))
    assert not report.ok and result.status == "invalid_submission"
    assert any("size [5, 4, 3] but the test image has size [4, 4, 3]" in p for p in result.problems)


def test_float_prediction_with_nan_is_rejected(grader, task, write_masks) -> None:
    array = np.zeros(SHAPE, np.float32)
    array[0, 0, 0] = np.nan
    report, result = graded_with(grader, task, write_masks, array)
    assert not report.ok and any("integer type" in p for p in result.problems)


# ---- submission folder escapes ---------------------------------------------------------------------------------
def set_path(submission: Path, case_id: str, path: str | None) -> None:
    """Point ``case_id``'s row at ``path``, or drop the row (None)."""
    with (submission / "submission.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    kept = [r for r in rows if r["image_id"] != case_id or path is not None]
    for row in kept:
        if row["image_id"] == case_id:
            row["predicted_mask_path"] = path
    with (submission / "submission.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["image_id", "predicted_mask_path"])
        writer.writeheader()
        writer.writerows(kept)


@pytest.fixture
def valid_submission(task, write_masks):
    grader = get_grader("panther-task1")
    return grader, write_masks(grader.schema, example_4_predictions(task[2]))


def rejected(grader, submission, task, needle: str) -> None:
    public, private, _ = task
    report = validate_submission(grader, submission, public)
    assert not report.ok and any(needle in p for p in report.problems), report.problems
    result = grade_submission(grader, submission, public, private)
    assert result.status == "invalid_submission", result.error
    assert any(needle in p for p in result.problems), result.problems


def test_missing_id(valid_submission, task) -> None:
    grader, submission = valid_submission
    set_path(submission, IDS[1], None)
    rejected(grader, submission, task, "1 test id(s) missing: 10001_0001")


@pytest.mark.parametrize(("path", "needle"), [("../labels/10000_0001.mha", "'..'"), ("/etc/passwd.mha", "absolute")])
def test_paths_leaving_the_folder(path, needle, valid_submission, task) -> None:
    grader, submission = valid_submission
    set_path(submission, IDS[0], path)
    rejected(grader, submission, task, needle)


def test_symlink_leaving_the_folder(valid_submission, task) -> None:
    grader, submission = valid_submission
    private = task[1]
    link = submission / "predictions" / "link.mha"
    os.symlink(private / "labels" / f"{IDS[0]}.mha", link)
    set_path(submission, IDS[0], "predictions/link.mha")
    rejected(grader, submission, task, "outside the submission folder")


def write_detached_mha(mha: Path, array: np.ndarray, geometry, data_file: str) -> None:
    """An uncompressed .mha whose header reads the voxels from ``data_file`` (written beside it as ``.raw``)."""
    image = sitk.GetImageFromArray(array)
    image.SetSpacing(geometry.spacing)
    sitk.WriteImage(image, str(mha), useCompression=False)
    blob = mha.read_bytes()
    header, _, voxels = blob.partition(b"ElementDataFile = LOCAL\n")
    mha.with_suffix(".raw").write_bytes(voxels)
    mha.write_bytes(header + f"ElementDataFile = {data_file}\n".encode())


def test_header_naming_a_data_file_outside_is_rejected(valid_submission, task, tmp_path) -> None:
    grader, submission = valid_submission
    target = submission / "predictions" / f"{IDS[0]}.mha"
    outside = tmp_path / "outside.raw"
    write_detached_mha(target, example_4_predictions(task[2])[IDS[0]][0], task[2], str(outside))
    shutil.move(target.with_suffix(".raw"), outside)
    rejected(grader, submission, task, "reads its voxels from")


def test_header_naming_a_data_file_beside_it_is_read(valid_submission, task) -> None:
    grader, submission = valid_submission
    public, private, geometry = task
    target = submission / "predictions" / f"{IDS[0]}.mha"
    write_detached_mha(target, example_4_predictions(geometry)[IDS[0]][0], geometry, f"{IDS[0]}.raw")
    result = grade_submission(grader, submission, public, private)
    assert result.status == "valid", result.problems
    assert result.metrics["dsc"] == pytest.approx(0.6444444444, abs=1e-10)
