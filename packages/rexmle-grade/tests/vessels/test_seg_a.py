"""SEG.A. grader: worked example of topbrain_sega.md §2.3, our empty-mask choices, medians, end-to-end grading."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest

from rexmle_grade.grader import get_grader
from rexmle_grade.grading import grade_submission
from rexmle_grade.io import write_volume
from rexmle_grade.validation import validate_submission

SPACING_XYZ = (0.8, 0.8, 1.5)


@pytest.fixture
def aorta_task(make_task: Callable, geometry_for: Callable) -> Callable[[Mapping[str, np.ndarray]], tuple[Path, Path]]:
    def make(cases: Mapping[str, np.ndarray]) -> tuple[Path, Path]:
        geometries = {case_id: geometry_for(gt.shape, SPACING_XYZ) for case_id, gt in cases.items()}
        answers = {case_id: {"label_path": f"labels/{case_id}.seg.nrrd"} for case_id in cases}
        public, private = make_task("image_id", geometries, answers)
        for case_id, gt in cases.items():
            write_volume(private / answers[case_id]["label_path"], gt, geometries[case_id])
        return public, private

    return make


def submit(write_submission: Callable, geometry_for: Callable, predictions: Mapping[str, np.ndarray],
           suffix: str = ".seg.nrrd") -> Path:
    grader = get_grader("seg_a")
    rows = []
    for case_id in predictions:
        row = grader.schema.example_row(case_id)
        row["predicted_mask_path"] = f"predictions/{case_id}{suffix}"
        rows.append(row)
    dest = write_submission(grader, rows)
    for row, array in zip(rows, predictions.values(), strict=True):
        write_volume(dest / row["predicted_mask_path"], array, geometry_for(array.shape, SPACING_XYZ))
    return dest


def block() -> tuple[np.ndarray, np.ndarray]:
    gt = np.zeros((5, 6, 6), np.uint8)
    gt[1:3, 1:5, 1:5] = 1
    pred = gt.copy()
    pred[1:3, 1:5, 1] = 0
    pred[3, 1, 1] = 2  # any positive value is aorta
    return gt, pred


def test_worked_example_and_medians(aorta_task, write_submission, geometry_for) -> None:
    gt, pred = block()
    perfect = gt.copy()
    empty = np.zeros_like(gt)
    far = gt.copy()
    far[4, 5, 5] = 1  # one extra voxel: HD = distance to the block's nearest voxel (z 2 -> 4, y 4 -> 5, x 4 -> 5)
    cases = {"D1": gt, "K2": gt, "R3": gt, "D4": gt}
    public, private = aorta_task(cases)
    grader = get_grader("seg_a")
    submission = submit(write_submission, geometry_for, {"D1": pred, "K2": perfect, "R3": empty, "D4": far})
    result = grade_submission(grader, submission, public, private)
    assert result.status == "valid", result.problems or result.error
    by_id = {row["image_id"]: row for row in result.per_case}
    assert by_id["D1"]["dsc"] == pytest.approx(0.8421, abs=1e-4)
    assert by_id["D1"]["hd"] == pytest.approx(1.5)
    assert (by_id["K2"]["dsc"], by_id["K2"]["hd"], by_id["K2"]["hd95"]) == (1.0, 0.0, 0.0)
    diagonal = math.sqrt((5 * 0.8) ** 2 + (5 * 0.8) ** 2 + (4 * 1.5) ** 2)
    assert (by_id["R3"]["dsc"], by_id["R3"]["hd"], by_id["R3"]["hd95"]) == (0.0, pytest.approx(diagonal),
                                                                           pytest.approx(diagonal))
    far_hd = math.sqrt(3.0**2 + 0.8**2 + 0.8**2)
    assert by_id["D4"]["hd"] == pytest.approx(far_hd)
    hds = sorted([1.5, 0.0, diagonal, far_hd])
    assert result.metrics["hd_50pc"] == pytest.approx((hds[1] + hds[2]) / 2)
    dscs = sorted([48 / 57, 1.0, 0.0, 2 * 32 / 65])
    assert result.metrics["dsc_50pc"] == pytest.approx((dscs[1] + dscs[2]) / 2)
    assert set(result.metrics) == {"hd_50pc", "dsc_50pc", "hd95_50pc"}


def test_median_interpolates_like_pandas() -> None:
    grader = get_grader("seg_a")
    cases = [{"dsc": 1.0, "hd": h, "hd95": h} for h in (2.0, 3.0, 2.6, 8.1)]
    assert grader.aggregate(cases, Path("."))["hd_50pc"] == pytest.approx(2.8)


def test_both_empty_scores_perfect(aorta_task, write_submission, geometry_for) -> None:
    empty = np.zeros((3, 4, 4), np.uint8)
    public, private = aorta_task({"D1": empty})
    result = grade_submission(get_grader("seg_a"), submit(write_submission, geometry_for, {"D1": empty}), public,
                              private)
    assert result.metrics == {"hd_50pc": 0.0, "dsc_50pc": 1.0, "hd95_50pc": 0.0}


def test_gold_sample_and_rejections(aorta_task, write_submission, geometry_for, tmp_path: Path) -> None:
    gt, _ = block()
    public, private = aorta_task({"D1": gt * 1, "K1": np.roll(gt, 1, axis=2)})
    grader = get_grader("seg_a")
    gold = tmp_path / "gold"
    grader.write_gold_submission(private, public, gold)
    assert grade_submission(grader, gold, public, private).metrics == {"hd_50pc": 0.0, "dsc_50pc": 1.0,
                                                                        "hd95_50pc": 0.0}
    sample = tmp_path / "sample"
    grader.write_sample_submission(public, sample)
    assert validate_submission(grader, sample, public).ok
    assert grade_submission(grader, sample, public, private).metrics["dsc_50pc"] == 0.0
    negative = gt.astype(np.int16)
    negative[0, 0, 0] = -1
    report = validate_submission(grader, submit(write_submission, geometry_for, {"D1": negative, "K1": gt},
                                                suffix=".nii.gz"), public)
    assert not report.ok and any("negative" in p for p in report.problems), report.problems
