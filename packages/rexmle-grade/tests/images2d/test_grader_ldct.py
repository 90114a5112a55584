"""ldct-iqa grader end to end on a tiny prepared task."""

from __future__ import annotations

import pytest

from rexmle_grade.graders.ldct import LdctGrader

GT = [0.4, 1.2, 2.0, 2.0, 3.6]
PRED = [1.0, 0.8, 2.5, 2.9, 3.1]
IDS = [f"{k:04d}" for k in range(5)]


def prepare(make_task):
    task = make_task(LdctGrader(), IDS)
    task.write_answers([{"image_id": i, "quality_score": str(g)} for i, g in zip(IDS, GT, strict=True)])
    return task


def with_scores(task, scores, name: str):
    sub = task.variant(task.sample(), name)
    task.write_rows(sub, [{"image_id": i, "quality_score": str(s)} for i, s in zip(IDS, scores, strict=True)])
    return sub


def test_official_example_gold_and_sample(make_task):
    task = prepare(make_task)
    metrics = task.grade_ok(with_scores(task, PRED, "example"))
    assert metrics["score"] == pytest.approx(2.4597, abs=5e-5)
    assert (metrics["plcc"], metrics["srocc"], metrics["krocc"]) == pytest.approx((0.8497, 0.8721, 0.7379), abs=5e-5)
    assert metrics["undefined_correlation"] == 0.0
    reversed_metrics = task.grade_ok(with_scores(task, [-p for p in PRED], "negated"))
    assert reversed_metrics["score"] == pytest.approx(metrics["score"])
    assert task.grade_ok(task.gold())["score"] == pytest.approx(3.0)
    sample = task.grade_ok(task.sample())  # one constant score: undefined correlations, scored 0 and flagged
    assert (sample["score"], sample["undefined_correlation"]) == (0.0, 1.0)


def test_corrupted_submissions(make_task):
    task = prepare(make_task)
    task.assert_invalid(with_scores(task, ["nan", 1, 2, 3, 4], "nan"), "finite")
    task.assert_invalid(with_scores(task, ["inf", 1, 2, 3, 4], "inf"), "finite")
    task.assert_invalid(with_scores(task, ["high", 1, 2, 3, 4], "text"), "'high', not a float")
    short = task.variant(task.sample(), "missing")
    task.write_rows(short, task.rows(short)[:4])
    task.assert_invalid(short, "missing: 0004")
    extra = task.variant(task.sample(), "extra")
    task.write_rows(extra, [*task.rows(extra), {"image_id": "9999", "quality_score": "1"}])
    task.assert_invalid(extra, "not test cases: 9999")
