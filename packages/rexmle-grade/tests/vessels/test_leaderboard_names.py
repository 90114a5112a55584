"""Ranked metric names and directions of the vessel graders equal the human leaderboards' columns."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from rexmle_grade.grader import get_grader

LEADERBOARDS = Path("/work/shared/reference/leaderboards")
GRADERS = [f"topcow-track{t}-task{k}" for t in (1, 2) for k in (1, 2, 3)] + ["topbrain-track1", "topbrain-track2",
                                                                             "seg_a"]


@pytest.mark.parametrize("grader_id", GRADERS)
def test_ranked_metrics_are_the_leaderboard_columns(grader_id: str) -> None:
    board = LEADERBOARDS / f"{grader_id}.csv"
    if not board.is_file():
        pytest.skip(f"reference leaderboard {board} is not available here")
    with board.open(newline="") as fh:
        header = next(csv.reader(fh))
    columns = [c for c in header if c not in ("rank", "team", "mean_position") and not c.endswith("_position")]
    directions = json.loads((LEADERBOARDS / f"{grader_id}.directions.json").read_text())["metric_directions"]
    grader = get_grader(grader_id)
    assert sorted(m.name for m in grader.ranked_metrics) == sorted(columns)
    for metric in grader.metrics:
        if metric.name in directions:
            assert metric.direction.value == directions[metric.name], metric.name
