"""TopCoW graders: worked examples of topcow.md §5 through the graders, topology rules, end-to-end grading."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest

from rexmle_grade.errors import TaskDataMissingError
from rexmle_grade.grader import CaseInput, get_grader
from rexmle_grade.graders.topcow import (
    TopCowSegmentationGrader,
    edge_lists,
    left_right_flipped,
    median_x,
    read_roi,
    variant,
)
from rexmle_grade.grading import grade_submission
from rexmle_grade.io import Geometry, write_volume
from rexmle_grade.metrics.boxes import VoxelBox
from rexmle_grade.metrics.topology import label_adjacency
from rexmle_grade.validation import validate_submission

# bars of the synthetic Circle of Willis: label -> (x first, x last, y first, y last); z is 4..7 for all.
# LPS+: left vessels at larger x than their right twins; anterior = small y.
COW_BARS = {
    1: (13, 14, 14, 19), 2: (4, 12, 14, 15), 3: (15, 23, 14, 15), 4: (5, 8, 5, 7), 5: (0, 4, 5, 6),
    6: (19, 22, 5, 7), 7: (23, 27, 5, 6), 8: (6, 7, 8, 13), 9: (20, 21, 8, 13), 10: (13, 14, 2, 3),
    11: (8, 12, 2, 4), 12: (15, 19, 2, 4), 15: (13, 14, 0, 1),
}
COW_SHAPE = (12, 20, 28)  # (z, y, x)
SWAP_SIDES = {2: 3, 3: 2, 4: 6, 6: 4, 5: 7, 7: 5, 8: 9, 9: 8, 11: 12, 12: 11}


def cow(without: tuple[int, ...] = (15,)) -> np.ndarray:
    labels = np.zeros(COW_SHAPE, np.uint8)
    for label, (x0, x1, y0, y1) in COW_BARS.items():
        if label not in without:
            labels[4:8, y0:y1 + 1, x0:x1 + 1] = label
    return labels


def roi_text(box: VoxelBox) -> str:
    return ("--- ROI Meta Data ---\nSize (Voxels): {} {} {}\nLocation (Voxels): {} {} {}\n"
            .format(*box.size, *box.location))


def whole_image(shape_zyx: tuple[int, ...]) -> VoxelBox:
    return VoxelBox(location=(0, 0, 0), size=tuple(reversed(shape_zyx)))


@pytest.fixture
def seg_task(make_task: Callable, geometry_for: Callable) -> Callable[..., tuple[Path, Path]]:
    """seg_task({id: (gt, roi)}, spacing_xyz) -> (public, private) of a TopCoW task-1 test set."""

    def make(cases: Mapping[str, tuple[np.ndarray, VoxelBox]],
             spacing_xyz: tuple[float, ...] = (1.0, 1.0, 1.0)) -> tuple[Path, Path]:
        geometries = {case_id: geometry_for(gt.shape, spacing_xyz) for case_id, (gt, _) in cases.items()}
        answers = {case_id: {"label_path": f"labels/{case_id}.nii.gz", "roi_path": f"roi/{case_id}.txt"}
                   for case_id in cases}
        public, private = make_task("image_id", geometries, answers)
        for case_id, (gt, roi) in cases.items():
            write_volume(private / answers[case_id]["label_path"], gt, geometries[case_id])
            (private / "roi").mkdir(exist_ok=True)
            (private / answers[case_id]["roi_path"]).write_text(roi_text(roi))
        return public, private

    return make


@pytest.fixture
def mask_submission(write_submission: Callable) -> Callable[..., Path]:
    """mask_submission(grader, {id: (array, geometry)}, name) -> submission folder of task-1 masks."""

    def make(grader: TopCowSegmentationGrader, predictions: Mapping[str, tuple[np.ndarray, Geometry]],
             name: str = "submission") -> Path:
        rows = [grader.schema.example_row(case_id) for case_id in predictions]
        dest = write_submission(grader, rows, name)
        for row, (array, geometry) in zip(rows, predictions.values(), strict=True):
            write_volume(dest / row["predicted_mask_path"], array, geometry)
        return dest

    return make


def grade_one(seg_task: Callable, mask_submission: Callable, geometry_for: Callable, gt: np.ndarray,
              pred: np.ndarray, roi: VoxelBox | None = None, spacing_xyz: tuple[float, ...] = (1.0, 1.0, 1.0)):
    grader = get_grader("topcow-track1-task1")
    public, private = seg_task({"topcow_ct_001": (gt, roi or whole_image(gt.shape))}, spacing_xyz)
    submission = mask_submission(grader, {"topcow_ct_001": (pred, geometry_for(pred.shape, spacing_xyz))})
    result = grade_submission(grader, submission, public, private)
    assert result.status == "valid", result.problems or result.error
    return result


# ---- worked examples --------------------------------------------------------------------------------------------
def test_e1_class_set_and_missing_label_conventions(seg_task, mask_submission, geometry_for) -> None:
    gt = np.zeros((3, 3, 7), np.uint8)
    pred = gt.copy()
    gt[1, 1, 0:4] = 1
    pred[1, 1, 0:3] = 1
    pred[1, 1, 5] = 15
    result = grade_one(seg_task, mask_submission, geometry_for, gt, pred)
    case = result.per_case[0]
    assert case["dice"] == pytest.approx(0.428571, abs=1e-6)
    assert case["b0_error"] == pytest.approx(0.5)
    assert case["hd95"] == pytest.approx(45.425)
    assert case["hd"] == pytest.approx((1.0 + 90.0) / 2)
    assert case["cldice"] == pytest.approx(0.75)
    assert result.metrics["f1_grp2"] == 0.0  # 3rd-A2 FP, other Group-2 labels TN


def test_e4_empty_roi(seg_task, mask_submission, geometry_for) -> None:
    gt = np.zeros((6, 6, 6), np.uint8)
    pred = gt.copy()
    gt[0, 0, 0] = pred[5, 5, 5] = 1  # outside the ROI: ignored
    result = grade_one(seg_task, mask_submission, geometry_for, gt, pred, VoxelBox((1, 1, 1), (4, 4, 4)))
    m = result.metrics
    assert (m["dice"], m["cldice"], m["b0_error"], m["hd95"], m["f1_grp2"]) == (0.0, 0.0, 0.0, 0.0, 0.0)
    # both regions match, which counts as correct for that case's (empty) variant
    assert (m["anterior_topology"], m["posterior_topology"]) == (1.0, 1.0)
    assert (m["anterior_graph_acc"], m["posterior_graph_acc"]) == (1.0, 1.0)


def test_scores_are_limited_to_the_roi(seg_task, mask_submission, geometry_for) -> None:
    gt = cow()
    pred = gt.copy()
    pred[0:2, 0:3, 0:3] = 7  # a stray L-MCA blob outside the ROI
    roi = VoxelBox(location=(0, 0, 3), size=(28, 20, 6))
    result = grade_one(seg_task, mask_submission, geometry_for, gt, pred, roi)
    assert result.metrics["dice"] == 1.0
    assert result.metrics["hd95"] == 0.0
    assert result.metrics["b0_error"] == 0.0


def test_hd95_uses_the_ground_truth_spacing(seg_task, mask_submission, geometry_for) -> None:
    gt = np.zeros((3, 3, 7), np.uint8)
    pred = gt.copy()
    gt[1, 1, 0:4] = 1
    pred[1, 1, 0:3] = 1
    result = grade_one(seg_task, mask_submission, geometry_for, gt, pred, spacing_xyz=(0.5, 1.0, 1.0))
    assert result.per_case[0]["hd95"] == pytest.approx(0.425)


# ---- graph and topology --------------------------------------------------------------------------------------------
def test_edge_lists_and_variants_of_the_synthetic_cow() -> None:
    labels = cow()
    present = {int(v) for v in np.unique(labels) if v}
    edges = edge_lists(present, label_adjacency(labels))
    assert edges == {"anterior": (1, 1, 0, 1), "posterior": (1, 1, 1, 1)}
    assert variant("anterior", edges["anterior"]) == "Var_Ant_1_1_0_1"
    no_acom = cow(without=(10, 15, 8))
    present = {int(v) for v in np.unique(no_acom) if v}
    assert edge_lists(present, label_adjacency(no_acom)) == {"anterior": (1, 0, 0, 1), "posterior": (1, 1, 1, 0)}


def test_one_acom_voxel_removed_fails_anterior_topology(seg_task, mask_submission, geometry_for) -> None:
    # official example: Acom keeps IoU 0.5 (TP) and the graph is unchanged, but it touches only R-ACA now
    gt = np.zeros((3, 3, 9), np.uint8)
    gt[1, 1, 0:3], gt[1, 1, 3:5], gt[1, 1, 5:8] = 11, 10, 12
    pred = gt.copy()
    pred[1, 1, 4] = 0
    result = grade_one(seg_task, mask_submission, geometry_for, gt, pred)
    case = result.per_case[0]
    assert (case["anterior_graph_match"], case["anterior_topology_match"]) == (1, 0)
    assert case["posterior_topology_match"] == 1
    assert result.metrics["anterior_topology"] == 0.0
    assert result.metrics["anterior_graph_acc"] == 1.0


def test_left_right_flip_rules() -> None:
    labels = cow()
    present = {int(v) for v in np.unique(labels) if v}
    assert not left_right_flipped(labels, present, "anterior")
    assert not left_right_flipped(labels, present, "posterior")
    swapped = np.vectorize(lambda v: SWAP_SIDES.get(int(v), int(v)), otypes=[np.uint8])(labels)
    assert left_right_flipped(swapped, present, "anterior")
    assert left_right_flipped(swapped, present, "posterior")
    # without both ICAs the ACAs decide; without both PCAs there is no posterior check
    no_icas = swapped.copy()
    no_icas[np.isin(no_icas, (4, 6, 3))] = 0
    assert left_right_flipped(no_icas, present - {4, 6, 3}, "anterior")
    assert not left_right_flipped(no_icas, present - {4, 6, 3}, "posterior")


def test_median_x_matches_numpy() -> None:
    rng = np.random.default_rng(6)
    for density in (0.001, 0.05, 0.5):
        mask = rng.random((5, 6, 40)) < density
        mask[0, 0, 3] = True
        assert median_x(mask) == np.median(np.nonzero(mask)[2])


def test_swapped_sides_fail_topology_but_not_dice_of_symmetric_labels(seg_task, mask_submission, geometry_for) -> None:
    gt = cow()
    swapped = np.vectorize(lambda v: SWAP_SIDES.get(int(v), int(v)), otypes=[np.uint8])(gt)
    result = grade_one(seg_task, mask_submission, geometry_for, gt, swapped)
    assert result.metrics["anterior_topology"] == 0.0
    assert result.metrics["posterior_topology"] == 0.0


# ---- end to end ------------------------------------------------------------------------------------------------
@pytest.fixture
def cow_task(seg_task: Callable) -> tuple[Path, Path, dict[str, np.ndarray]]:
    cases = {"topcow_ct_001": cow(without=()), "topcow_ct_002": cow(), "topcow_ct_003": cow(without=(10, 15, 8))}
    roi = VoxelBox(location=(0, 0, 2), size=(28, 20, 8))
    public, private = seg_task({k: (v, roi) for k, v in cases.items()}, (0.5, 0.5, 0.8))
    return public, private, cases


@pytest.mark.parametrize("grader_id", ["topcow-track1-task1", "topcow-track2-task1"])
def test_gold_submission_grades_best(grader_id: str, cow_task, tmp_path: Path) -> None:
    public, private, _ = cow_task
    grader = get_grader(grader_id)
    modality = grader.modality
    gold = tmp_path / "gold"
    grader.write_gold_submission(private, public, gold)
    assert validate_submission(grader, gold, public).ok
    result = grade_submission(grader, gold, public, private)
    assert result.status == "valid", result.problems or result.error
    assert set(result.metrics) == {m.name for m in grader.metrics}
    for metric in grader.metrics:
        # f1_grp2 has no general best (a label absent from the whole test set caps it); every Group-2 label occurs here
        expected = 1.0 if metric.name == "f1_grp2" else metric.best
        assert result.metrics[metric.name] == expected, metric.name
    assert all(row["image_id"] for row in result.per_case)
    assert (gold / "submission.csv").read_text().splitlines()[1].split(",")[1] == modality


def test_sample_submission_validates_and_grades(cow_task, tmp_path: Path) -> None:
    public, private, _cases = cow_task
    grader = get_grader("topcow-track1-task1")
    sample = tmp_path / "sample"
    grader.write_sample_submission(public, sample)
    assert validate_submission(grader, sample, public).ok
    result = grade_submission(grader, sample, public, private)
    assert result.status == "valid", result.problems or result.error
    m = result.metrics
    assert (m["dice"], m["cldice"], m["hd95"], m["f1_grp2"]) == (0.0, 0.0, 90.0, 0.0)
    assert m["b0_error"] == 1.0  # every ground-truth bar is one component, nothing predicted
    assert (m["anterior_topology"], m["posterior_topology"]) == (0.0, 0.0)


def test_imperfect_prediction_between_bounds(cow_task, mask_submission, geometry_for) -> None:
    public, private, cases = cow_task
    grader = get_grader("topcow-track1-task1")
    predictions = {}
    for case_id, gt in cases.items():
        pred = gt.copy()
        pred[4:8, 14:20, 13:15] = 0  # basilar artery missed
        pred[5, 10, 10] = 8  # a stray R-Pcom voxel
        predictions[case_id] = (pred, geometry_for(gt.shape, (0.5, 0.5, 0.8)))
    result = grade_submission(grader, mask_submission(grader, predictions), public, private)
    assert result.status == "valid", result.problems or result.error
    assert 0.5 < result.metrics["dice"] < 1.0
    assert result.metrics["hd95"] > 0.0
    assert result.metrics["posterior_graph_acc"] == 0.0  # P1 edges vanish with the BA
    assert result.metrics["anterior_graph_acc"] == 1.0


def corrupt(grader, submission: Path, case_id: str, array: np.ndarray, geometry: Geometry) -> None:
    write_volume(submission / grader.schema.example_row(case_id)["predicted_mask_path"], array, geometry)


@pytest.mark.parametrize("kind", ["shape", "label", "nan", "missing_id", "dotdot", "absolute", "symlink",
                                  "modality"])
def test_corrupted_submissions_are_rejected(kind: str, cow_task, tmp_path: Path, geometry_for) -> None:
    public, private, cases = cow_task
    grader = get_grader("topcow-track1-task1")
    submission = tmp_path / "bad"
    grader.write_gold_submission(private, public, submission)
    csv_path = submission / "submission.csv"
    geometry = geometry_for(COW_SHAPE, (0.5, 0.5, 0.8))
    expected = {
        "shape": "size", "label": "label values 13", "nan": "integer type",
        "missing_id": "missing", "dotdot": "'..'", "absolute": "absolute", "symlink": "outside", "modality": "modality",
    }[kind]
    if kind == "shape":
        corrupt(grader, submission, "topcow_ct_002", np.zeros((12, 20, 27), np.uint8), geometry_for((12, 20, 27)))
    elif kind == "label":
        bad = cases["topcow_ct_002"].copy()
        bad[5, 5, 5] = 13
        corrupt(grader, submission, "topcow_ct_002", bad, geometry)
    elif kind == "nan":
        bad = cases["topcow_ct_002"].astype(np.float32)
        bad[5, 5, 5] = np.nan
        corrupt(grader, submission, "topcow_ct_002", bad, geometry)
    elif kind == "missing_id":
        lines = csv_path.read_text().splitlines()
        csv_path.write_text("\n".join(line for line in lines if "topcow_ct_002" not in line) + "\n")
    else:
        outside = tmp_path / "outside.nii.gz"
        write_volume(outside, cases["topcow_ct_002"], geometry)
        if kind == "symlink":
            link = submission / "predictions" / "link.nii.gz"
            os.symlink(outside, link)
            replacement = "predictions/link.nii.gz"
        elif kind == "dotdot":
            replacement = "../outside.nii.gz"
        elif kind == "absolute":
            replacement = str(outside)
        else:
            replacement = None
        text = csv_path.read_text()
        if replacement is not None:
            text = text.replace("predictions/topcow_ct_002_0000.nii.gz", replacement)
        else:
            text = text.replace("topcow_ct_002,ct", "topcow_ct_002,mr")
        csv_path.write_text(text)
    report = validate_submission(grader, submission, public)
    assert not report.ok
    assert any(expected in p for p in report.problems), report.problems
    result = grade_submission(grader, submission, public, private)
    assert result.status == "invalid_submission"
    assert any(expected in p for p in result.problems), result.problems


# ---- task 2: boxes ---------------------------------------------------------------------------------------------
@pytest.fixture
def box_task(make_task: Callable, geometry_for: Callable) -> tuple[Path, Path]:
    boxes = {"topcow_mr_001": VoxelBox((0, 0, 0), (10, 10, 10)), "topcow_mr_002": VoxelBox((20, 30, 5), (40, 25, 12))}
    geometries = {case_id: geometry_for((40, 80, 90)) for case_id in boxes}
    public, private = make_task("image_id", geometries, {k: {"roi_path": f"roi/{k}.txt"} for k in boxes})
    (private / "roi").mkdir()
    for case_id, box in boxes.items():
        (private / "roi" / f"{case_id}.txt").write_text(roi_text(box))
    return public, private


def write_boxes(grader, write_submission: Callable, boxes: Mapping[str, object], name: str = "boxes") -> Path:
    rows = [grader.schema.example_row(case_id) for case_id in boxes]
    dest = write_submission(grader, rows, name)
    for row, content in zip(rows, boxes.values(), strict=True):
        path = dest / row["predicted_bbox_path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return dest


def test_box_task_gold_sample_and_worked_example(box_task, tmp_path: Path, write_submission: Callable) -> None:
    public, private = box_task
    grader = get_grader("topcow-track2-task2")
    gold = tmp_path / "gold"
    grader.write_gold_submission(private, public, gold)
    assert grade_submission(grader, gold, public, private).metrics == {"boundary_iou": 1.0, "iou": 1.0}
    sample = tmp_path / "sample"
    grader.write_sample_submission(public, sample)
    assert validate_submission(grader, sample, public).ok
    assert grade_submission(grader, sample, public, private).status == "valid"
    shifted = {"topcow_mr_001": {"size": [10, 10, 10], "location": [2, 0, 0]},
               "topcow_mr_002": {"location": [60, 55, 17], "size": [40, 25, 12]}}  # face-adjacent: 0, 0
    result = grade_submission(grader, write_boxes(grader, write_submission, shifted), public, private)
    assert result.per_case[0]["boundary_iou"] == pytest.approx(512 / 1056)
    assert result.per_case[0]["iou"] == pytest.approx(800 / 1200)
    assert result.metrics["boundary_iou"] == pytest.approx(512 / 1056 / 2)


@pytest.mark.parametrize(("content", "expected"), [
    ({"size": [10, 10, 10]}, "exactly the keys"),
    ({"size": [10, 10, 10], "location": [0, 0, 0], "centre": [1, 1, 1]}, "exactly the keys"),
    ({"size": [10.0, 10, 10], "location": [0, 0, 0]}, "3 integers"),
    ({"size": [10, 10], "location": [0, 0, 0]}, "3 integers"),
    ({"size": [10, 10, 10], "location": [True, 0, 0]}, "3 integers"),
    ({"size": [10, 0, 10], "location": [0, 0, 0]}, ">= 1"),
    ('{"size": [10, 10, 10], "location": [NaN, 0, 0]}', "not valid JSON"),
    ([10, 10, 10, 0, 0, 0], "exactly the keys"),
])
def test_invalid_boxes_are_rejected(content: object, expected: str, box_task, write_submission: Callable) -> None:
    public, private = box_task
    grader = get_grader("topcow-track1-task2")
    boxes = {"topcow_mr_001": content, "topcow_mr_002": {"size": [1, 1, 1], "location": [0, 0, 0]}}
    submission = write_boxes(grader, write_submission, boxes)
    report = validate_submission(grader, submission, public)
    assert not report.ok and any(expected in p for p in report.problems), report.problems
    assert grade_submission(grader, submission, public, private).status == "invalid_submission"


# ---- task 3: edge lists ------------------------------------------------------------------------------------------
GT_YAML = {
    "topcow_ct_001": "anterior:\n    L-A1:    1\n    Acom:    1\n    3rd-A2:  0\n    R-A1:    1\n"
                     "posterior:\n    L-Pcom:  0\n    L-P1:    1\n    R-P1:    1\n    R-Pcom:  1\n",
    "topcow_ct_002": "anterior:\n  3rd-A2: 0\n\n  Acom: 1\n  R-A1: 1\n  L-A1: 1\nposterior:\n  L-Pcom: 1\n"
                     "  L-P1: 1\n  R-P1: 1\n  R-Pcom: 1\n",
    "topcow_ct_003": "anterior:\n  L-A1: 1\n  Acom: 0\n  3rd-A2: 0\n  R-A1: 1\nposterior:\n  L-Pcom: 1\n"
                     "  L-P1: 1\n  R-P1: 1\n  R-Pcom: 1\n",
}


@pytest.fixture
def edge_task(make_task: Callable) -> tuple[Path, Path]:
    public, private = make_task("image_id", dict.fromkeys(GT_YAML), {k: {"edges_path": f"edges/{k}.yml"}
                                                                     for k in GT_YAML})
    (private / "edges").mkdir()
    for case_id, text in GT_YAML.items():
        (private / "edges" / f"{case_id}.yml").write_text(text)
    return public, private


def edges(anterior: tuple[int, ...], posterior: tuple[int, ...]) -> dict[str, dict[str, int]]:
    return {"anterior": dict(zip(("L-A1", "Acom", "3rd-A2", "R-A1"), anterior, strict=True)),
            "posterior": dict(zip(("L-Pcom", "L-P1", "R-P1", "R-Pcom"), posterior, strict=True))}


def write_edges(grader, write_submission: Callable, contents: Mapping[str, object], name: str = "edges",
                suffix: str = ".json") -> Path:
    rows = []
    for case_id in contents:
        row = grader.schema.example_row(case_id)
        row["predicted_edges_path"] = row["predicted_edges_path"].replace(".json", suffix)
        rows.append(row)
    dest = write_submission(grader, rows, name)
    for row, content in zip(rows, contents.values(), strict=True):
        path = dest / row["predicted_edges_path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return dest


def test_edge_task_gold_sample_and_balanced_accuracy(edge_task, tmp_path: Path, write_submission: Callable) -> None:
    public, private = edge_task
    grader = get_grader("topcow-track1-task3")
    gold = tmp_path / "gold"
    grader.write_gold_submission(private, public, gold)
    assert grade_submission(grader, gold, public, private).metrics == {"anterior_acc": 1.0, "posterior_acc": 1.0}
    sample = tmp_path / "sample"
    grader.write_sample_submission(public, sample)
    assert validate_submission(grader, sample, public).ok
    # the sample has no edge, a variant nobody has: 0 on both, though every posterior edge (D below) is a variant
    # here and would have scored 1/2
    assert grade_submission(grader, sample, public, private).metrics == {"anterior_acc": 0.0, "posterior_acc": 0.0}
    assert json.loads(next((sample / "predictions").iterdir()).read_text()) == {
        "anterior": {"L-A1": 0, "Acom": 0, "3rd-A2": 0, "R-A1": 0},
        "posterior": {"L-Pcom": 0, "L-P1": 0, "R-P1": 0, "R-Pcom": 0}}
    # anterior truth: [A, A, B] with A = 1_1_0_1, B = 1_0_0_1; predictions A, B, B -> (1/2 + 1) / 2
    # posterior truth: [C, D, D] with C = 0_1_1_1, D = 1_1_1_1; predictions D, D, D -> (0 + 1) / 2
    predictions = {"topcow_ct_001": edges((1, 1, 0, 1), (1, 1, 1, 1)),
                   "topcow_ct_002": edges((1, 0, 0, 1), (1, 1, 1, 1)),
                   "topcow_ct_003": "anterior:\n  L-A1: 1\n  Acom: 0\n  3rd-A2: 0\n  R-A1: 1\n"
                                    "posterior: {L-Pcom: 1, L-P1: 1, R-P1: 1, R-Pcom: 1}\n"}
    submission = write_edges(grader, write_submission, {k: v for k, v in predictions.items() if k != "topcow_ct_003"})
    yaml_path = submission / "predictions" / "topcow_ct_003_edges.yml"
    yaml_path.write_text(predictions["topcow_ct_003"])
    with (submission / "submission.csv").open("a") as fh:
        fh.write("topcow_ct_003,ct,predictions/topcow_ct_003_edges.yml\n")
    result = grade_submission(grader, submission, public, private)
    assert result.status == "valid", result.problems or result.error
    assert result.metrics["anterior_acc"] == pytest.approx(0.75)
    assert result.metrics["posterior_acc"] == pytest.approx(0.5)
    assert [row["anterior_correct"] for row in result.per_case] == [1, 0, 1]


@pytest.mark.parametrize(("content", "expected"), [
    ({"anterior": edges((1, 1, 0, 1), (0, 0, 0, 0))["anterior"]}, "exactly the keys"),
    ({**edges((1, 1, 0, 1), (0, 0, 0, 0)), "extra": {}}, "exactly the keys"),
    ({"anterior": {"L-A1": 1, "Acom": 1, "3rd-A2": 0}, "posterior": edges((0,) * 4, (0,) * 4)["posterior"]},
     "exactly the keys"),
    (edges((1, 2, 0, 1), (0, 0, 0, 0)), "0 or 1"),
    (edges((1, True, 0, 1), (0, 0, 0, 0)), "0 or 1"),
    (edges((1, "1", 0, 1), (0, 0, 0, 0)), "0 or 1"),
    (edges((1, 1.0, 0, 1), (0, 0, 0, 0)), "0 or 1"),
    ("[1, 1, 0, 1]", "exactly the keys"),
])
def test_invalid_edge_lists_are_rejected(content: object, expected: str, edge_task, write_submission: Callable) -> None:
    public, _private = edge_task
    grader = get_grader("topcow-track2-task3")
    contents = {k: edges((1, 1, 0, 1), (1, 1, 1, 1)) for k in GT_YAML}
    contents["topcow_ct_002"] = content
    report = validate_submission(grader, write_edges(grader, write_submission, contents), public)
    assert not report.ok and any(expected in p for p in report.problems), report.problems


def test_edge_yaml_syntax_error_is_invalid(edge_task, write_submission: Callable) -> None:
    public, _ = edge_task
    grader = get_grader("topcow-track1-task3")
    contents = {k: edges((1, 1, 0, 1), (1, 1, 1, 1)) for k in GT_YAML}
    contents["topcow_ct_001"] = "anterior: [unclosed\n"
    report = validate_submission(grader, write_edges(grader, write_submission, contents, suffix=".yaml"), public)
    assert not report.ok and any("not valid YAML" in p for p in report.problems), report.problems


def test_missing_or_malformed_private_roi_is_a_task_data_error(tmp_path: Path) -> None:
    case = CaseInput(case_id="x", row={}, submission_dir=tmp_path, answer={"roi_path": "roi.txt"},
                     private_dir=tmp_path, geometry=None)
    with pytest.raises(TaskDataMissingError, match="missing"):
        read_roi(case)
    (tmp_path / "roi.txt").write_text("--- ROI Meta Data ---\nSize (Voxels): 1 2\nLocation (Voxels): 0 0 0\n")
    with pytest.raises(TaskDataMissingError, match="malformed"):
        read_roi(case)
