"""rexmle-grade as an evaluation library: `rexmle grade files`, score_files and score_arrays on tiny folder pairs of
each task family (3-D masks, multiclass vessels with an extra answer, 2-D label images, JSON documents, CSV
values), with per-case details and warnings in results and reports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rexmle_grade import cli
from rexmle_grade.errors import UserInputError
from rexmle_grade.files import pair_by_id, score_arrays, score_files
from rexmle_grade.io import Geometry, write_volume
from rexmle_grade.report import GradingReport

IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)


def grid(shape: tuple[int, int, int], spacing: tuple[float, float, float] = (1.0, 1.0, 1.0),
         origin: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> Geometry:
    return Geometry(size=tuple(reversed(shape)), spacing=spacing, origin=origin, direction=IDENTITY)


def lesion_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Two ISLES'22 cases: case 1 predicted exactly, case 2 half of its lesion."""
    truth, pred = tmp_path / "truth", tmp_path / "pred"
    for n, fraction in ((1, 1.0), (2, 0.5)):
        gt = np.zeros((4, 8, 8), np.uint8)
        gt[1:3, 2:6, 2:6] = 1
        guess = gt.copy()
        guess[:, :, 2 + int(4 * fraction):] = 0
        write_volume(truth / f"sub-strokecase000{n}.nii.gz", gt, grid(gt.shape, (1.0, 1.0, 2.0)))
        write_volume(pred / f"sub-strokecase000{n}_pred.nii.gz", guess, grid(gt.shape, (1.0, 1.0, 2.0)))
    return truth, pred


def test_score_files_pairs_by_case_id_and_scores_like_the_task(tmp_path: Path) -> None:
    truth, pred = lesion_pair(tmp_path)
    result = score_files("isles22", truth, pred)
    assert result.status == "valid", result.problems or result.error
    by_id = {row["case_id"]: row for row in result.per_case}
    assert by_id["sub-strokecase0001"]["dice"] == 1.0
    assert by_id["sub-strokecase0002"]["dice"] == pytest.approx(2 * 16 / (32 + 16))
    assert result.metrics["dice"] == pytest.approx((1.0 + 2 / 3) / 2)
    assert result.metrics["abs_volume_diff"] == pytest.approx(16 * 0.002 / 2)  # ml, ground-truth spacing


def test_cli_grade_files_writes_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truth, pred = lesion_pair(tmp_path)
    out = tmp_path / "report.json"
    code = cli.main(["grade", "files", "isles22", "--truth", str(truth), "--pred", str(pred), "-j", "2",
                     "-o", str(out)])
    assert code == 0, capsys.readouterr()
    assert "dice = 0.833333" in capsys.readouterr().out
    entry = GradingReport.read(out).entries[0]
    assert entry.status == "valid" and entry.metrics["dice"] == pytest.approx(5 / 6)
    assert [row["case_id"] for row in entry.per_case] == ["sub-strokecase0001", "sub-strokecase0002"]


def test_missing_and_unpaired_predictions_are_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truth, pred = lesion_pair(tmp_path)
    (pred / "sub-strokecase0002_pred.nii.gz").rename(pred / "stray.nii.gz")
    result = score_files("isles22", truth, pred)
    assert result.status == "invalid_submission"
    assert any("missing" in p and "sub-strokecase0002" in p for p in result.problems), result.problems
    assert any("stray" in p for p in result.problems), result.problems
    assert cli.main(["grade", "files", "isles22", "--truth", str(truth), "--pred", str(pred)]) == 1
    assert "stray" in capsys.readouterr().out


def test_pairing_takes_the_longest_id_followed_by_a_separator() -> None:
    files = [Path("a_1_0000.nii.gz"), Path("a_1.nii.gz"), Path("a_10.nii.gz"), Path("ab.nii.gz")]
    paired, unpaired = pair_by_id(["a_1", "a_10"], files)
    assert paired == {"a_1": [files[0], files[1]], "a_10": [files[2]]}
    assert unpaired == [files[3]]


def vessel_case(folder: Path, case: str) -> np.ndarray:
    label = np.zeros((5, 8, 9), np.uint8)
    label[1:4, 4, 1:8] = 1
    label[2, 1:7, 5] = 4
    write_volume(folder / "labels" / f"{case}.nii.gz", label, grid(label.shape, (0.5, 0.5, 0.8)))
    return label


def test_vessel_graders_with_an_extra_answer_and_ignored_headers(tmp_path: Path) -> None:
    truth = tmp_path / "truth"
    label = vessel_case(truth, "topcow_ct_001")
    (truth / "rois").mkdir()
    (truth / "rois" / "topcow_ct_001.txt").write_text(
        "--- ROI Meta Data ---\nSize (Voxels): 9 8 5\nLocation (Voxels): 0 0 0\n")
    pred = tmp_path / "pred"
    write_volume(pred / "topcow_ct_001_0000.nii.gz", label, grid(label.shape, (1.0, 1.0, 1.0), (3.0, 0.0, 0.0)))
    result = score_files("topcow-track1-task1", truth / "labels", pred, roi_path=truth / "rois")
    assert result.status == "valid", result.problems or result.error
    assert result.metrics["dice"] == 1.0 and result.metrics["hd95"] == 0.0
    assert len(result.warnings) == 2 and all("topcow_ct_001" in w for w in result.warnings)
    details = result.per_case[0]["details"]
    assert set(details["per_class"]) == {"1", "4"} and details["per_class"]["4"]["dice"] == 1.0
    assert (result.per_case[0]["dice_merged_binary"], result.metrics["dice_merged_binary"]) == (1.0, 1.0)
    assert details["detections"] == {"8": "TN", "9": "TN", "10": "TN", "15": "TN"}
    out = tmp_path / "report.json"
    assert cli.main(["grade", "files", "topcow-track1-task1", "--truth", str(truth / "labels"), "--pred", str(pred),
                     "--extra", f"roi_path={truth / 'rois'}", "-o", str(out)]) == 0
    entry = GradingReport.read(out).entries[0]
    assert entry.warnings == result.warnings and entry.per_case[0]["details"] == details
    with pytest.raises(UserInputError, match="roi_path"):
        score_files("topcow-track1-task1", truth / "labels", pred)


def test_topbrain_and_json_and_value_families(tmp_path: Path) -> None:
    truth = tmp_path / "truth"
    label = vessel_case(truth, "topcow_mr_001")
    pred = tmp_path / "pred"
    write_volume(pred / "topcow_mr_001_0000.nii.gz", label, grid(label.shape, (0.5, 0.5, 0.8)))
    brain = score_files("topbrain-track2", truth / "labels", pred)
    assert brain.status == "valid" and brain.metrics["dice"] == 1.0 and not brain.warnings
    # JSON predictions: TopCoW task 2 boxes against ROI text files
    rois, boxes = tmp_path / "rois", tmp_path / "boxes"
    rois.mkdir()
    boxes.mkdir()
    (rois / "topcow_ct_007.txt").write_text("--- ROI Meta Data ---\nSize (Voxels): 10 10 10\n"
                                            "Location (Voxels): 0 0 0\n")
    (boxes / "topcow_ct_007_bbox.json").write_text(json.dumps({"size": [10, 10, 5], "location": [0, 0, 0]}))
    box = score_files("topcow-track1-task2", rois, boxes)
    assert box.status == "valid" and box.metrics["iou"] == pytest.approx(0.5)
    # CSV values: LDCT image quality, one CSV each
    (tmp_path / "truth.csv").write_text("image_id,quality_score\n" + "".join(f"i{n},{n}\n" for n in range(5)))
    (tmp_path / "pred.csv").write_text("image_id,quality_score\n" + "".join(f"i{n},{n * 2 + 1}\n" for n in range(5)))
    values = score_files("ldct-iqa", tmp_path / "truth.csv", tmp_path / "pred.csv")
    assert values.status == "valid" and values.metrics["plcc"] == pytest.approx(1.0)
    assert cli.main(["grade", "files", "ldct-iqa", "--truth", str(tmp_path / "truth.csv"), "--pred",
                     str(tmp_path / "pred.csv")]) == 0


def test_2d_label_images_from_files_and_from_arrays(tmp_path: Path) -> None:
    gt = np.zeros((16, 20), np.uint8)
    gt[2:8, 3:9] = 128
    gt[10:14, 10:18] = 255
    pred = gt.copy()
    pred[10:14, 10:14] = 0  # half the vein missed
    (tmp_path / "truth").mkdir()
    (tmp_path / "pred").mkdir()
    Image.fromarray(gt).save(tmp_path / "truth" / "IR_Case_011.png")
    Image.fromarray(pred).save(tmp_path / "pred" / "IR_Case_011.png")
    from_files = score_files("ravir", tmp_path / "truth", tmp_path / "pred")
    assert from_files.status == "valid", from_files.problems or from_files.error
    from_arrays = score_arrays("ravir", gt, pred)
    assert from_arrays.metrics == from_files.metrics
    assert from_arrays.metrics["dice"] == pytest.approx((1.0 + 2 * 16 / (32 + 16)) / 2)


def test_3d_arrays_with_a_geometry(tmp_path: Path) -> None:
    gt = np.zeros((4, 8, 8), np.uint8)
    gt[1:3, 2:6, 2:6] = 1
    result = score_arrays("isles22", {"a": gt, "b": gt}, {"a": gt, "b": np.zeros_like(gt)},
                          geometry=grid(gt.shape, (1.0, 1.0, 2.0)))
    assert result.status == "valid"
    assert result.metrics["dice"] == pytest.approx(0.5)
    assert result.metrics["abs_volume_diff"] == pytest.approx(32 * 0.002 / 2)
    with pytest.raises(UserInputError, match="not arrays"):
        score_arrays("topcow-track1-task2", gt, gt)


def test_details_keep_what_aggregation_uses(tmp_path: Path) -> None:
    tumour = np.zeros((6, 8, 8), np.uint8)
    tumour[2:4, 2:6, 2:6] = 1
    smaller = tumour.copy()
    smaller[3] = 0
    result = score_arrays("panther-task2", tumour, smaller, geometry=grid(tumour.shape, (1.0, 1.0, 2.0)))
    assert result.status == "valid"
    assert result.per_case[0]["details"] == {"gt_volume_mm3": 64.0, "pred_volume_mm3": 32.0}


def test_one_answer_file_for_the_whole_set(tmp_path: Path) -> None:
    """DENTEX: one COCO ground-truth file, one prediction JSON per image."""
    images = [{"id": 1 + n, "file_name": f"xray{n}.png", "width": 800, "height": 400} for n in range(2)]
    annotations = [{"id": 1 + n, "image_id": 1 + n, "bbox": [100, 100, 50, 80], "area": 4000, "iscrowd": 0,
                    "category_id_1": 0, "category_id_2": 1, "category_id_3": 2} for n in range(2)]
    categories = {f"categories_{k}": [{"id": i, "name": str(i + 1)} for i in range(count)]
                  for k, count in ((1, 4), (2, 8), (3, 4))}
    truth = tmp_path / "test_coco.json"
    truth.write_text(json.dumps({"images": images, "annotations": annotations, **categories}))
    pred = tmp_path / "pred"
    pred.mkdir()
    for n in range(2):
        boxes = [{"bbox": [100, 100, 50, 80], "category_id_1": 0, "category_id_2": 1, "category_id_3": 2,
                  "score": 0.9}]
        (pred / f"xray{n}.json").write_text(json.dumps(boxes))
    result = score_files("dentex", truth, pred)
    assert result.status == "valid", result.problems or result.error
    assert result.metrics["ap50_mean"] == pytest.approx(1.0)


def test_merged_binary_values_of_the_topbrain_worked_example() -> None:
    """topbrain_sega.md E1: class-average Dice 0.2564 and MergedBin Dice 0.625 (unranked), per class in details."""
    gt = np.zeros((3, 5, 7), np.uint8)
    pred = gt.copy()
    gt[1] = [[0, 0, 0, 2, 0, 0, 0], [0, 0, 0, 2, 0, 0, 0], [1] * 7, [0] * 7, [0] * 7]
    pred[1] = [[5, 0, 0, 0, 0, 0, 0], [0] * 7, [1, 1, 1, 1, 1, 0, 0], [0] * 7, [0, 0, 0, 0, 0, 0, 1]]
    result = score_arrays("topbrain-track1", gt, pred, geometry=grid(gt.shape, (0.5, 0.5, 1.0)))
    assert result.status == "valid", result.problems or result.error
    assert result.metrics["dice"] == pytest.approx(0.2564, abs=1e-4)
    assert result.metrics["dice_merged_binary"] == pytest.approx(0.625)
    per_class = result.per_case[0]["details"]["per_class"]
    assert per_class["1"]["dice"] == pytest.approx(10 / 13) and per_class["2"]["hd95"] == 290.0
    assert per_class["5"]["b0_error"] == 1.0
