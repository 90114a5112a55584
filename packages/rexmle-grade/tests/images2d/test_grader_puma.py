"""PUMA tissue (micro Dice) and nuclei (macro F1) graders end to end on tiny prepared tasks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tifffile

from rexmle_grade.grader import Grader
from rexmle_grade.graders.puma import (
    TRACK1_NUCLEI,
    TRACK2_NUCLEI,
    PumaNucleiGrader,
    PumaTissueGrader,
    scored_values,
    tissue_micro_dice,
)

IMG1_GT = [[1, 1, 3, 3], [1, 1, 3, 3], [0, 0, 3, 3], [0, 0, 2, 2]]
IMG1_PRED = [[1, 1, 1, 3], [1, 1, 3, 3], [0, 0, 3, 3], [0, 0, 0, 2]]
IMG2_GT = [[1, 1, 1, 1], [1, 1, 1, 1], [4, 4, 0, 0], [4, 4, 0, 0]]
IMG2_PRED = [[1, 1, 1, 1], [1, 1, 1, 3], [4, 4, 4, 0], [0, 0, 0, 0]]


def tissue_task(make_task, grader_id: str, maps: dict[str, list[list[int]]]):
    grader = PumaTissueGrader(grader_id, "test")
    task = make_task(grader, list(maps), {i: (len(m[0]), len(m)) for i, m in maps.items()})
    (task.private / "tissue").mkdir()
    for case_id, class_map in maps.items():
        tifffile.imwrite(task.private / "tissue" / f"{case_id}.tif", np.asarray(class_map, dtype=np.uint8))
    task.write_answers([{"case_id": i, "label_path": f"tissue/{i}.tif"} for i in maps])
    return task


@pytest.mark.parametrize("grader_id", ["puma-track1-task1", "puma-track2-task1"])
def test_tissue_worked_example(make_task, grader_id):
    # 4x4 maps: the grader resizes them to 1024x1024 with nearest-neighbour, as the official evaluator does
    task = tissue_task(make_task, grader_id, {"img1": IMG1_GT, "img2": IMG2_GT})
    sub = task.sample()
    for case_id, pred in (("img1", IMG1_PRED), ("img2", IMG2_PRED)):
        tifffile.imwrite(sub / "predictions" / f"{case_id}.tif", np.asarray(pred, dtype=np.uint8))
    metrics = task.grade_ok(sub)
    assert metrics["dice"] == pytest.approx(0.597619, abs=1e-6)
    assert metrics["dice_stroma"] == pytest.approx(22 / 24, abs=1e-6)
    assert metrics["dice_blood_vessel"] == pytest.approx(2 / 3, abs=1e-6)
    assert metrics["dice_tumor"] == pytest.approx(10 / 12, abs=1e-6)
    assert metrics["dice_epidermis"] == pytest.approx(4 / 7, abs=1e-6)
    assert metrics["dice_necrosis"] == 0.0
    # the unranked per-image Dice of the official code (a class absent from both maps scores 1) averages 0.796941
    per_image = [np.mean([row[k] for k in row if k.startswith("image_dice_")]) for row in task.grade(sub).per_case]
    assert np.mean(per_image) == pytest.approx(0.796941, abs=1e-6)
    # gold: every present class 1, necrosis absent everywhere still 0
    assert task.grade_ok(task.gold())["dice"] == pytest.approx(0.8)


def test_tissue_micro_dice_rule_and_foreign_values():
    assert scored_values(np.array([[7, 3], [-1, 5]])).tolist() == [[0, 3], [0, 5]]
    assert tissue_micro_dice(0, 10) == 0.0
    assert tissue_micro_dice(0, 0) == 0.0
    assert tissue_micro_dice(11, 24) == pytest.approx((22 + 1e-5) / (24 + 1e-5))


def test_tissue_gold_sample_and_corrupted(make_task):
    full = np.repeat(np.arange(6, dtype=np.uint8), 6).reshape(6, 6).T  # every class in every row
    task = tissue_task(make_task, "puma-track1-task1", {"a": full.tolist(), "b": full[::-1].tolist()})
    assert task.grade_ok(task.gold())["dice"] == pytest.approx(1.0)
    assert task.grade_ok(task.sample())["dice"] == 0.0
    sub = task.sample()

    def corrupted(name: str, array: np.ndarray):
        bad = task.variant(sub, name)
        tifffile.imwrite(bad / "predictions" / "b.tif", array)
        return bad

    task.assert_invalid(corrupted("value6", np.full((6, 6), 6, dtype=np.uint8)), "label values 6")
    task.assert_invalid(corrupted("shape", np.zeros((7, 6), dtype=np.uint8)), "6x7")
    task.assert_invalid(corrupted("float", np.zeros((6, 6), dtype=np.float32)), "integer type")
    task.assert_invalid(corrupted("rgb", np.zeros((6, 6, 3), dtype=np.uint8)), "single-channel")
    missing = task.variant(sub, "missing")
    task.write_rows(missing, task.rows(missing)[1:])
    task.assert_invalid(missing, "missing: a")
    task.assert_paths_contained(sub, "predicted_mask_path")


# ---- nuclei ---------------------------------------------------------------------------------------------------
def polygons(*nuclei: tuple[str, float, float]) -> dict:
    """Squares given by centre (the vertex mean is the centre)."""
    return {"type": "Multiple polygons", "polygons": [
        {"name": name, "path_points": [[x - 3, y - 3, 0], [x + 3, y - 3, 0], [x + 3, y + 3, 0], [x - 3, y + 3, 0]],
         "sub_type": "", "groups": [], "probability": 0.1}
        for name, x, y in nuclei], "version": {"major": 1, "minor": 0}}


TUMOR, LYMPH, OTHER = TRACK1_NUCLEI
I1_GT = polygons((TUMOR, 100, 100), (TUMOR, 200, 100), (LYMPH, 300, 300), (OTHER, 500, 500))
I1_PRED = polygons((TUMOR, 105, 100), (TUMOR, 600, 600), (LYMPH, 300, 312), (OTHER, 500, 516))
I2 = polygons((TUMOR, 100, 100), (LYMPH, 150, 150))


def nuclei_task(make_task, grader: Grader, truth: dict[str, dict]):
    task = make_task(grader, list(truth), {i: (1024, 1024) for i in truth})
    (task.private / "nuclei").mkdir()
    for case_id, data in truth.items():
        (task.private / "nuclei" / f"{case_id}.json").write_text(json.dumps(data))
    task.write_answers([{"case_id": i, "nuclei_path": f"nuclei/{i}.json"} for i in truth])
    return task


def track1() -> PumaNucleiGrader:
    return PumaNucleiGrader("puma-track1-task2", "test", TRACK1_NUCLEI, "macro_f1_nuclei")


def test_nuclei_worked_example(make_task):
    task = nuclei_task(make_task, track1(), {"i1": I1_GT, "i2": I2})
    sub = task.sample()
    (sub / "predictions" / "i1.json").write_text(json.dumps(I1_PRED))
    (sub / "predictions" / "i2.json").write_text(json.dumps(I2))
    metrics = task.grade_ok(sub)
    assert metrics["f1"] == pytest.approx(0.583333, abs=1e-6)
    assert (metrics[f"f1_{TUMOR}"], metrics[f"f1_{LYMPH}"], metrics[f"f1_{OTHER}"]) == (0.75, 1.0, 0.0)
    assert metrics["unknown_classes"] == 0
    # gold: 'other' occurs in one ROI of two, so even a perfect prediction scores (1 + 1 + 0.5) / 3
    assert task.grade_ok(task.gold())["f1"] == pytest.approx(2.5 / 3)
    # the sample (no nuclei) scores 0 for every class seen in the ground truth
    assert task.grade_ok(task.sample())["f1"] == 0.0


def test_nuclei_track2_gold_unknown_names_and_scores(make_task):
    grader = PumaNucleiGrader("puma-track2-task2", "test", TRACK2_NUCLEI, "macro_f1_nuclei_average")
    truth = {"r1": polygons(*((name, 40 * k + 20, 50) for k, name in enumerate(TRACK2_NUCLEI))),
             "r2": polygons(*((name, 50, 40 * k + 20) for k, name in enumerate(TRACK2_NUCLEI)))}
    task = nuclei_task(make_task, grader, truth)
    assert task.grade_ok(task.gold())["f1"] == pytest.approx(1.0)
    sub = task.gold()
    extra = dict(truth["r1"])
    extra["polygons"] = [*truth["r1"]["polygons"], *polygons(("tumor", 900, 900))["polygons"]]
    (sub / "predictions" / "r1.json").write_text(json.dumps(extra))
    metrics = task.grade_ok(sub)
    assert metrics["unknown_classes"] == 1
    assert metrics["f1"] == pytest.approx(10 / 11)  # ten classes at 1 and 'tumor' at 0 (present in one ROI)
    # a 2-point polygon is skipped, as officially: the ROI loses that nucleus
    short = json.loads(json.dumps(truth["r2"]))
    short["polygons"][0]["path_points"] = short["polygons"][0]["path_points"][:2]
    (sub / "predictions" / "r2.json").write_text(json.dumps(short))
    (sub / "predictions" / "r1.json").write_text(json.dumps(truth["r1"]))
    assert task.grade_ok(sub)[f"f1_{TRACK2_NUCLEI[0]}"] == pytest.approx(0.5)


def test_nuclei_corrupted_submissions(make_task):
    task = nuclei_task(make_task, track1(), {"i1": I1_GT, "i2": I2})
    sub = task.gold()

    def corrupted(name: str, text: str):
        bad = task.variant(sub, name)
        (bad / "predictions" / "i2.json").write_text(text)
        return bad

    good = I2["polygons"][0]
    task.assert_invalid(corrupted("nan", '{"polygons": [{"name": "nuclei_tumor", "path_points": [[NaN, 1]]}]}'),
                        "not valid JSON")
    task.assert_invalid(corrupted("nokey", json.dumps({"type": "Multiple polygons"})), "'polygons' list")
    task.assert_invalid(corrupted("list", json.dumps([good])), "expected a JSON object")
    task.assert_invalid(corrupted("name", json.dumps({"polygons": [{**good, "name": 3}]})), "'name' is 3")
    task.assert_invalid(corrupted("noname", json.dumps({"polygons": [{"path_points": good["path_points"]}]})),
                        "'name' is None")
    task.assert_invalid(corrupted("points", json.dumps({"polygons": [{**good, "path_points": [[1, "a"]]}]})),
                        "'path_points' must be")
    task.assert_invalid(corrupted("score", json.dumps({"polygons": [{**good, "score": "high"}]})),
                        "'score' is 'high'")
    task.assert_invalid(corrupted("infscore", json.dumps({"polygons": [{**good, "score": 1}]}).replace(
        '"score": 1', '"score": 1e400')), "'score' is inf")
    task.assert_invalid(corrupted("empty", ""), "empty")
    missing = task.variant(sub, "missing")
    task.write_rows(missing, task.rows(missing)[:1])
    task.assert_invalid(missing, "missing: i2")
    task.assert_paths_contained(sub, "predicted_nuclei_path")
