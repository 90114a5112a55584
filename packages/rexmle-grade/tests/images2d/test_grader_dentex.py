"""DENTEX grader end to end: the metrics page's three worked examples, gold, sample, corrupted submissions."""

from __future__ import annotations

import json

import pytest

from rexmle_grade.graders.dentex import DentexGrader
from rexmle_grade.metrics.coco import DetectedBox, GroundTruthBox, coco_box_scores

SETS = ("quadrant", "enumeration", "diagnosis")
FIELDS = ("ap", "ap50", "ap75", "ar")
A = [100, 100, 100, 200]
B = [300, 100, 100, 200]


def coco_file(boxes: dict[str, list[tuple[list[float], tuple[int, int, int]]]]) -> dict:
    images, annotations = [], []
    for n, (image_id, image_boxes) in enumerate(boxes.items()):
        images.append({"id": 10 + n, "file_name": f"{image_id}.png", "width": 2000, "height": 1000})
        for bbox, (q, e, d) in image_boxes:
            annotations.append({"id": len(annotations) + 1, "image_id": 10 + n, "bbox": bbox,
                                "area": bbox[2] * bbox[3] * 0.8, "iscrowd": 0,
                                "category_id_1": q, "category_id_2": e, "category_id_3": d})

    def categories(count: int) -> list[dict]:
        return [{"id": i, "name": str(i + 1), "supercategory": str(i + 1)} for i in range(count)]

    return {"images": images, "annotations": annotations, "categories_1": categories(4),
            "categories_2": categories(8), "categories_3": categories(4)}


def box(bbox, ids, score) -> dict:
    return {"bbox": bbox, "category_id_1": ids[0], "category_id_2": ids[1], "category_id_3": ids[2], "score": score}


def prepare(make_task, truth: dict, name: str = "task"):
    grader = DentexGrader()
    task = make_task(grader, list(truth), {i: (2000, 1000) for i in truth}, name=name)
    (task.private / "test.json").write_text(json.dumps(coco_file(truth)))
    task.write_answers([{"image_id": i, "coco_json": "test.json"} for i in truth])
    return task


def graded(task, predictions: dict[str, list[dict]]) -> dict[str, float]:
    sub = task.sample()
    for image_id, boxes in predictions.items():
        (sub / "predictions" / f"{image_id}.json").write_text(json.dumps(boxes))
    return task.grade_ok(sub)


def every(values: dict[str, float]) -> dict[str, float]:
    """The same four values for every label set and for the means."""
    return {f"{field}_{s}": values[field] for s in (*SETS, "mean") for field in FIELDS}


def test_example_1_id_zero_is_scored(make_task):
    task = prepare(make_task, {"xray": [(A, (0, 0, 1)), (B, (1, 2, 3))]})
    metrics = graded(task, {"xray": [box(A, (0, 0, 1), 0.90), box([320, 100, 100, 200], (1, 2, 3), 0.80),
                                     box([600, 100, 100, 200], (0, 0, 1), 0.95)]})
    assert metrics == pytest.approx(every({"ap": 0.45, "ap50": 0.75, "ap75": 0.25, "ar": 0.70}))


def test_example_2_wrong_diagnosis(make_task):
    task = prepare(make_task, {"xray": [(A, (0, 0, 1)), (B, (1, 2, 3))]})
    metrics = graded(task, {"xray": [box(A, (0, 0, 2), 0.90), box(B, (1, 2, 3), 0.80)]})
    for field in FIELDS:
        assert metrics[f"{field}_quadrant"] == metrics[f"{field}_enumeration"] == pytest.approx(1.0)
        assert metrics[f"{field}_diagnosis"] == pytest.approx(0.5)
        assert metrics[f"{field}_mean"] == pytest.approx(2.5 / 3)


def test_example_3_only_class_zero(make_task):
    task = prepare(make_task, {"xray": [(A, (0, 0, 0))]})
    assert graded(task, {"xray": [box(A, (0, 0, 0), 0.9)]}) == pytest.approx(every(dict.fromkeys(FIELDS, 1.0)))


def test_gold_sample_and_image_ids_from_rows(make_task):
    task = prepare(make_task, {"train_1": [(A, (0, 0, 1)), (B, (1, 2, 3))], "train_2": [(B, (3, 7, 0))]})
    assert task.grade_ok(task.gold()) == pytest.approx(every(dict.fromkeys(FIELDS, 1.0)))
    # empty prediction set: 0 for every set with ground truth (the official evaluator crashed)
    assert task.grade_ok(task.sample()) == every(dict.fromkeys(FIELDS, 0.0))
    # boxes are attached to the image of their row: train_2's box predicted in train_1's file is a false positive
    swapped = graded(task, {"train_1": [box(B, (3, 7, 0), 0.9)], "train_2": []})
    assert swapped == every(dict.fromkeys(FIELDS, 0.0))


def test_corrupted_submissions(make_task):
    task = prepare(make_task, {"train_1": [(A, (0, 0, 1))], "train_2": [(B, (1, 2, 3))]})
    sub = task.gold()
    good = box(A, (0, 0, 1), 0.5)

    def corrupted(name: str, content):
        bad = task.variant(sub, name)
        text = content if isinstance(content, str) else json.dumps(content)
        (bad / "predictions" / "train_2.json").write_text(text)
        return bad

    without_score = {k: v for k, v in good.items() if k != "score"}
    task.assert_invalid(corrupted("noscore", [without_score]), "lacks field(s) ['score']")
    task.assert_invalid(corrupted("nan", '[{"bbox": [1, 2, 3, NaN]}]'), "not valid JSON")
    task.assert_invalid(corrupted("bbox3", [{**good, "bbox": [1, 2, 3]}]), "expected [x, y, w, h]")
    task.assert_invalid(corrupted("negative", [{**good, "bbox": [100, 100, -5, 10]}]), "negative width")
    task.assert_invalid(corrupted("quadrant4", [{**good, "category_id_1": 4}]), "'category_id_1' is 4")
    task.assert_invalid(corrupted("floatid", [{**good, "category_id_2": 1.0}]), "'category_id_2' is 1.0")
    task.assert_invalid(corrupted("boolscore", [{**good, "score": True}]), "'score' is True")
    huge = json.dumps([good]).replace('"score": 0.5', '"score": 1' + "0" * 400)
    task.assert_invalid(corrupted("hugescore", huge), "'score' is 1000")
    task.assert_invalid(corrupted("infscore", json.dumps([good]).replace("0.5", "1e400")), "'score' is inf")
    task.assert_invalid(corrupted("object", {"annotations": [good]}), "expected a JSON list")
    missing = task.variant(sub, "missing")
    task.write_rows(missing, task.rows(missing)[:1])
    task.assert_invalid(missing, "missing: train_2")
    task.assert_paths_contained(sub, "predictions_json")


def test_coco_scores_without_any_ground_truth_are_minus_one():
    scores = coco_box_scores([1], [0, 1], [], [DetectedBox(1, (0, 0, 5, 5), 0, 0.5)])
    assert (scores.ap, scores.ap50, scores.ap75, scores.ar100) == (-1.0, -1.0, -1.0, -1.0)
    truth = [GroundTruthBox(1, (0, 0, 10, 10), 1)]
    # a false positive in a category without ground truth costs nothing
    scores = coco_box_scores([1], [0, 1], truth, [DetectedBox(1, (0, 0, 10, 10), 1, 0.5),
                                                 DetectedBox(1, (50, 50, 5, 5), 0, 0.9)])
    assert scores.ap == pytest.approx(1.0)
    with pytest.raises(ValueError, match="not in the ground truth"):
        coco_box_scores([1], [0], truth, [DetectedBox(2, (0, 0, 1, 1), 0, 0.5)])
