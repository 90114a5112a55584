"""usenhance grader end to end on a tiny prepared task."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from rexmle_grade.graders.usenhance import UsenhanceGrader


def ramp() -> np.ndarray:
    image = np.tile(np.arange(16, dtype=np.uint8) * 10, (16, 1))
    image[8:] = image[8:, ::-1]
    return image


def prepare(make_task):
    task = make_task(UsenhanceGrader(), ["breast_1", "liver_2"], {"breast_1": (16, 16), "liver_2": (16, 16)})
    (task.private / "hq").mkdir()
    Image.fromarray(ramp()).save(task.private / "hq" / "breast_1.png")
    Image.fromarray(np.stack([ramp().T] * 3, axis=-1)).save(task.private / "hq" / "liver_2.png")  # RGB reference
    task.write_answers([{"image_id": i, "high_quality_path": f"hq/{i}.png"} for i in ("breast_1", "liver_2")])
    return task


def test_release_examples_gold_and_sample(make_task):
    task = prepare(make_task)
    sub = task.sample()
    Image.fromarray(ramp() + 10).save(sub / "enhanced" / "breast_1.png")
    Image.fromarray(np.full((16, 16), 75, dtype=np.uint8)).save(sub / "enhanced" / "liver_2.png")
    result = task.grade(sub)
    assert result.status == "valid", result.problems
    per_case = {row["image_id"]: row for row in result.per_case}
    breast, liver = per_case["breast_1"], per_case["liver_2"]
    assert (breast["lncc"], breast["ssim"], breast["psnr"]) == pytest.approx((1.0, 0.9898, 24.0824), abs=5e-5)
    assert (liver["lncc"], liver["ssim"], liver["psnr"]) == pytest.approx((0.0, 0.0325, 10.2482), abs=5e-5)
    assert result.metrics["psnr"] == pytest.approx((24.0824 + 10.2482) / 2, abs=5e-5)
    assert task.grade_ok(task.gold()) == pytest.approx({"lncc": 1.0, "ssim": 1.0, "psnr": 100.0})
    sample = task.grade_ok(task.sample())
    assert sample["lncc"] == 0.0 and np.isfinite(sample["psnr"])


def test_corrupted_submissions(make_task):
    task = prepare(make_task)
    sub = task.sample()

    def corrupted(name: str, image: Image.Image):
        bad = task.variant(sub, name)
        image.save(bad / "enhanced" / "liver_2.png")
        return bad

    gray = np.full((16, 16), 9, dtype=np.uint8)
    task.assert_invalid(corrupted("rgb", Image.fromarray(np.stack([gray] * 3, axis=-1))), "mode 'RGB'")
    task.assert_invalid(corrupted("palette", Image.fromarray(gray).convert("P")), "mode 'P'")
    task.assert_invalid(corrupted("16bit", Image.fromarray(gray.astype(np.uint16))), "mode 'I;16'")
    task.assert_invalid(corrupted("size", Image.fromarray(np.zeros((16, 17), dtype=np.uint8))), "17x16")
    missing = task.variant(sub, "missing")
    task.write_rows(missing, task.rows(missing)[:1])
    task.assert_invalid(missing, "missing: liver_2")
    task.assert_paths_contained(sub, "enhanced_image_path")
