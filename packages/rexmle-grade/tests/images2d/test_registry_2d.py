"""The 2-D graders are registered under their challenge ids with the leaderboard's ranked metric names."""

from __future__ import annotations

import importlib

import pytest

from rexmle_grade import grader as grader_module
from rexmle_grade.grader import Direction

SETS = ("mean", "quadrant", "enumeration", "diagnosis")
# column names of leaderboards/<id>.csv (ravir has no leaderboard)
RANKED = {
    "neurips-cellseg": ["f1_0.5", "f1_0.6", "f1_0.7", "f1_0.8", "f1_0.9"],
    "puma-track1-task1": ["dice"],
    "puma-track2-task1": ["dice"],
    "puma-track1-task2": ["f1"],
    "puma-track2-task2": ["f1"],
    "dentex": [f"{field}_{s}" for s in SETS for field in ("ap", "ap50", "ap75", "ar")],
    "ldct-iqa": ["score"],
    "usenhance": ["lncc", "ssim", "psnr"],
    "ravir": ["dice"],
}


@pytest.mark.parametrize("grader_id", sorted(RANKED))
def test_registered_with_leaderboard_metric_names(grader_id):
    for module in ("cellseg", "puma", "dentex", "ldct", "usenhance", "ravir"):
        importlib.import_module(f"rexmle_grade.graders.{module}")
    grader = grader_module._REGISTRY[grader_id]()
    assert grader.grader_id == grader_id
    assert [m.name for m in grader.ranked_metrics] == RANKED[grader_id]
    assert all(m.direction is Direction.HIGHER_BETTER for m in grader.ranked_metrics)
    assert grader.conventions and grader.reference
    assert "submission.csv" in grader.schema.to_markdown(["x"])
