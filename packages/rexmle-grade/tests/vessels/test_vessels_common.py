"""Shared multiclass machinery: per-label scores vs a dense reference, label checks, region reads, grid checks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from scipy import ndimage
from skimage import measure

from rexmle_grade.errors import InvalidSubmissionError
from rexmle_grade.grader import get_grader
from rexmle_grade.graders._vessels import Foreground, check_label_values, class_average, detections, label_scores
from rexmle_grade.grading import grade_submission
from rexmle_grade.io import write_volume
from rexmle_grade.metrics.surface import contour_hausdorff
from rexmle_grade.metrics.topology import cldice

TOPCOW_LABELS = frozenset({0, *range(1, 13), 15})


def random_label_map(rng: np.random.Generator, shape: tuple[int, int, int], labels: list[int]) -> np.ndarray:
    smooth = ndimage.gaussian_filter(rng.random(shape), 1.0)
    out = np.zeros(shape, np.uint8)
    keep = smooth > np.quantile(smooth, 0.6)
    out[keep] = rng.choice(labels, int(keep.sum()))
    return ndimage.median_filter(out, size=2)


@pytest.mark.parametrize("seed", range(4))
def test_label_scores_match_a_dense_per_label_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = (9, 12, 14)
    gt = random_label_map(rng, shape, [1, 2, 3, 5])
    pred = random_label_map(rng, shape, [1, 2, 3, 7])
    spacing = (1.5, 0.5, 0.7)
    scores = label_scores(gt, pred, spacing, missing_distance=90.0, per_class_cldice=True)
    present = sorted({int(v) for v in np.unique(np.concatenate([gt.ravel(), pred.ravel()])) if v})
    assert sorted(scores) == present
    for label in present:
        g, p = gt == label, pred == label
        s = scores[label]
        assert (s.gt_voxels, s.pred_voxels, s.intersection) == (g.sum(), p.sum(), (g & p).sum())
        expected_dice = 2 * (g & p).sum() / (g.sum() + p.sum())
        assert s.dice == pytest.approx(expected_dice, abs=1e-12)
        assert s.gt_components == measure.label(g, connectivity=3, return_num=True)[1]
        assert s.pred_components == measure.label(p, connectivity=3, return_num=True)[1]
        if g.any() and p.any():
            whole = contour_hausdorff(g, p, spacing)  # on the whole arrays, no cropping
            assert (s.hd95, s.hd) == pytest.approx((whole.hd95, whole.hd), abs=1e-9)
            assert s.cldice == pytest.approx(cldice(g, p), abs=1e-12)
        else:
            assert (s.hd95, s.hd, s.cldice) == (90.0, 90.0, 0.0)


def test_label_scores_of_empty_maps() -> None:
    empty = np.zeros((3, 4, 5), np.uint8)
    assert label_scores(empty, empty, (1.0, 1.0, 1.0), missing_distance=90.0, per_class_cldice=False) == {}
    assert class_average([]) == 0.0
    assert detections({}, (8, 9)) == {"8": "TN", "9": "TN"}
    with pytest.raises(ValueError, match="shape"):
        label_scores(empty, empty[:2], (1.0, 1.0, 1.0), missing_distance=90.0, per_class_cldice=False)


def test_foreground_boxes_equal_find_objects() -> None:
    rng = np.random.default_rng(1)
    labels = random_label_map(rng, (10, 11, 12), [1, 4, 9, 15])
    boxes = Foreground.of(labels).boxes()
    expected = {i + 1: box for i, box in enumerate(ndimage.find_objects(labels)) if box is not None}
    assert boxes == expected
    assert Foreground.of(np.zeros((2, 2, 2), np.uint8)).boxes() == {}


@pytest.mark.parametrize(("value", "dtype", "ok"), [(12, np.uint8, True), (15, np.uint8, True), (13, np.uint8, False),
                                                    (14, np.int16, False), (16, np.uint16, False),
                                                    (-1, np.int16, False), (255, np.uint8, False)])
def test_label_check_with_holes(value: int, dtype: type, ok: bool) -> None:
    array = np.zeros((20, 20, 20), dtype)
    array[3, 4, 5] = 1
    array[10, 11, 12] = value
    if ok:
        check_label_values(array, TOPCOW_LABELS, what="mask", name="m.nii.gz")
    else:
        with pytest.raises(InvalidSubmissionError, match=f"label values {value}"):
            check_label_values(array, TOPCOW_LABELS, what="mask", name="m.nii.gz")


def test_label_check_of_non_integer_arrays_and_empty_maps() -> None:
    check_label_values(np.zeros((4, 4, 4), np.uint8), TOPCOW_LABELS, what="mask", name="m")
    floats = np.zeros((4, 4, 4), np.float32)
    floats[1, 1, 1] = 1.5
    with pytest.raises(InvalidSubmissionError, match="1"):
        check_label_values(floats, TOPCOW_LABELS, what="ground truth", name="gt")
    floats[1, 1, 1] = 2.0
    check_label_values(floats, TOPCOW_LABELS, what="ground truth", name="gt")


@pytest.fixture
def one_case(make_task: Callable, geometry_for: Callable, tmp_path):
    """A TopCoW task-1 case whose ROI sticks out of the image (negative location, oversize)."""

    def make(with_geometry: bool, gt_spacing: tuple[float, ...] = (1.0, 1.0, 1.0)):
        gt = np.zeros((6, 7, 8), np.uint8)
        gt[1:5, 3, 0:8] = 1
        gt[2, 1:6, 4] = 4
        geometry = geometry_for(gt.shape)
        answers = {"topcow_ct_001": {"label_path": "labels/a.nii.gz", "roi_path": "roi.txt"}}
        public, private = make_task("image_id", {"topcow_ct_001": geometry if with_geometry else None}, answers)
        write_volume(private / "labels/a.nii.gz", gt, geometry_for(gt.shape, gt_spacing))
        (private / "roi.txt").write_text("--- ROI Meta Data ---\nSize (Voxels): 20 20 20\nLocation (Voxels): -2 -3 -1")
        return gt, public, private

    return make


def submit_mask(grader, write_submission: Callable, array: np.ndarray, geometry) -> object:
    row = grader.schema.example_row("topcow_ct_001")
    dest = write_submission(grader, [row])
    write_volume(dest / row["predicted_mask_path"], array, geometry)
    return dest


def test_roi_outside_the_image_is_clipped(one_case, write_submission, geometry_for) -> None:
    gt, public, private = one_case(with_geometry=True)
    grader = get_grader("topcow-track1-task1")
    result = grade_submission(grader, submit_mask(grader, write_submission, gt, geometry_for(gt.shape)), public,
                              private)
    assert result.status == "valid", result.problems or result.error
    assert (result.metrics["dice"], result.metrics["hd95"]) == (1.0, 0.0)


def test_grid_mismatch_without_manifest_geometry_is_the_submissions_fault(one_case, write_submission,
                                                                          geometry_for) -> None:
    gt, public, private = one_case(with_geometry=False)
    grader = get_grader("topcow-track1-task1")
    bad = submit_mask(grader, write_submission, np.pad(gt, ((0, 1), (0, 0), (0, 0))), geometry_for((7, 7, 8)))
    result = grade_submission(grader, bad, public, private)
    assert result.status == "invalid_submission"
    assert any("size" in p for p in result.problems), result.problems


def test_header_difference_without_manifest_geometry_is_ignored_with_a_warning(one_case, write_submission,
                                                                               geometry_for) -> None:
    gt, public, private = one_case(with_geometry=False)
    grader = get_grader("topcow-track1-task1")
    other_header = submit_mask(grader, write_submission, gt, geometry_for(gt.shape, (1.0, 1.0, 2.0)))
    result = grade_submission(grader, other_header, public, private)
    assert result.status == "valid", result.problems or result.error
    assert (result.metrics["dice"], result.metrics["hd95"]) == (1.0, 0.0)
    assert len(result.warnings) == 1 and "spacing" in result.warnings[0], result.warnings


def test_manifest_disagreeing_with_the_ground_truth_is_a_grader_error(one_case, write_submission,
                                                                      geometry_for) -> None:
    gt, public, private = one_case(with_geometry=True, gt_spacing=(1.0, 1.0, 3.0))
    grader = get_grader("topcow-track1-task1")
    result = grade_submission(grader, submit_mask(grader, write_submission, gt, geometry_for(gt.shape)), public,
                              private)
    assert result.status == "grader_error"
    assert "re-run" in (result.error or "")


def test_missing_ground_truth_is_a_grader_side_error(one_case, write_submission, geometry_for) -> None:
    gt, public, private = one_case(with_geometry=True)
    (private / "labels/a.nii.gz").unlink()
    grader = get_grader("topbrain-track1")
    row = grader.schema.example_row("topcow_ct_001")
    dest = write_submission(grader, [row], "brain")
    write_volume(dest / row["predicted_mask_path"], gt, geometry_for(gt.shape))
    result = grade_submission(grader, dest, public, private)
    assert result.status == "grader_error"
    assert "missing" in (result.error or "")
