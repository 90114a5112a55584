"""ravir grader end to end on a tiny prepared task."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from rexmle_grade.graders.ravir import ARTERY, VEIN, RavirGrader


def masks() -> dict[str, np.ndarray]:
    both = np.zeros((16, 16), dtype=np.uint8)
    both[2:6, 2:6] = ARTERY  # 16 px
    both[10:12, 4:12] = VEIN  # 16 px
    artery_only = np.zeros((16, 16), dtype=np.uint8)
    artery_only[8:12, 8:12] = ARTERY
    return {"IR_Case_011": both, "IR_Case_017": artery_only}


def prepare(make_task):
    truth = masks()
    task = make_task(RavirGrader(), list(truth), {i: (16, 16) for i in truth})
    (task.private / "masks").mkdir()
    for case_id, mask in truth.items():
        Image.fromarray(mask).save(task.private / "masks" / f"{case_id}.png")
    task.write_answers([{"image_id": i, "label_path": f"masks/{i}.png"} for i in truth])
    return task


def test_hand_computed_gold_and_sample(make_task):
    task = prepare(make_task)
    truth = masks()
    sub = task.sample()
    shifted = truth["IR_Case_011"].copy()
    shifted[2:6, 2:7] = 0
    shifted[2:6, 3:7] = ARTERY  # artery moved one column: overlap 12, Dice 24/32, Jaccard 12/20
    Image.fromarray(shifted).save(sub / "predictions" / "IR_Case_011.png")
    Image.fromarray(truth["IR_Case_017"]).save(sub / "predictions" / "IR_Case_017.png")
    metrics = task.grade_ok(sub)
    # image 1: (0.75 + 1) / 2; image 2: artery 1, vein absent from both sides scores 1 (our convention)
    assert metrics == pytest.approx({"dice": (0.875 + 1.0) / 2, "dice_artery": (0.75 + 1) / 2, "dice_vein": 1.0,
                                     "jaccard_artery": (0.6 + 1) / 2, "jaccard_vein": 1.0})
    assert task.grade_ok(task.gold()) == pytest.approx(dict.fromkeys(metrics, 1.0))
    # the empty sample: every class present in the truth scores 0; image 2's absent vein still scores 1
    assert task.grade_ok(task.sample())["dice"] == pytest.approx((0.0 + 0.5) / 2)


def test_corrupted_submissions(make_task):
    task = prepare(make_task)
    sub = task.gold()

    def corrupted(name: str, image: Image.Image):
        bad = task.variant(sub, name)
        image.save(bad / "predictions" / "IR_Case_017.png")
        return bad

    remapped = np.where(masks()["IR_Case_017"] == ARTERY, 1, 0).astype(np.uint8)
    task.assert_invalid(corrupted("remapped", Image.fromarray(remapped)), "label values 1")
    task.assert_invalid(corrupted("rgb", Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8))), "mode 'RGB'")
    task.assert_invalid(corrupted("size", Image.fromarray(np.zeros((15, 16), dtype=np.uint8))), "16x15")
    task.assert_invalid(corrupted("vein256", Image.fromarray(np.full((16, 16), VEIN, dtype=np.uint16) + 1)),
                        "mode 'I;16'")
    missing = task.variant(sub, "missing")
    task.write_rows(missing, task.rows(missing)[1:])
    task.assert_invalid(missing, "missing: IR_Case_011")
    task.assert_paths_contained(sub, "predicted_mask_path")
