"""Every shipped human leaderboard, fed back through the ranking module, reproduces its recorded positions.

Also cross-checks the leaderboard against the task's grader: the ranked metric columns are exactly the grader's
ranked metrics, so a submission can always be placed on the board.
"""

from __future__ import annotations

import pytest

from rexmle_grade.ranking import Leaderboard, position, rank_submission, rerank
from rexmle_tasks.registry import all_tasks

BOARDS = [t for t in all_tasks().values() if t.meta.leaderboard is not None]


def load(task) -> Leaderboard:
    grader = task.grader
    return Leaderboard.from_csv(task.folder / task.meta.leaderboard.file,
                                {m.name: m.direction for m in grader.ranked_metrics})


@pytest.mark.parametrize("task", BOARDS, ids=lambda t: t.id)
def test_columns_match_the_grader(task) -> None:
    board = load(task)
    assert sorted(board.metrics) == sorted(m.name for m in task.grader.ranked_metrics)
    assert board.n_rows >= 6


@pytest.mark.parametrize("task", BOARDS, ids=lambda t: t.id)
def test_rows_reproduce_recorded_positions(task) -> None:
    board = load(task)
    for m in board.metrics:
        for i, value in enumerate(board.values[m]):
            assert position(value, board.values[m], board.directions[m]) == board.recorded_positions[m][i], (m, i)
    for recomputed, recorded in zip(rerank(board), board.mean_positions, strict=True):
        assert recomputed == pytest.approx(recorded, abs=0.006)


@pytest.mark.parametrize("task", BOARDS, ids=lambda t: t.id)
def test_each_row_ranked_as_a_submission(task) -> None:
    board = load(task)
    for i in range(board.n_rows):
        row = {m: board.values[m][i] for m in board.metrics}
        result = rank_submission(board, row)
        assert result.mean_position == pytest.approx(board.mean_positions[i], abs=0.006)
        assert 0.0 <= result.percentile <= 1.0
    top = rank_submission(board, {m: board.values[m][0] for m in board.metrics})
    assert top.gold
