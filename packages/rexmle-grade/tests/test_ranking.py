"""Ranking against a leaderboard: hand-computed positions, percentile, medals, inserted rank, NaN handling."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rexmle_grade.grader import Direction
from rexmle_grade.ranking import Leaderboard, position, rank_submission, rerank

H, L = Direction.HIGHER_BETTER, Direction.LOWER_BETTER


@pytest.fixture()
def board(tmp_path: Path) -> Leaderboard:
    # 4 teams; dice higher better, hd lower better. Positions per metric computed by hand below.
    csv_text = (
        "rank,team,mean_position,dice,dice_position,hd,hd_position\n"
        "1,A,1.5,0.90,1.0,3.0,2.0\n"
        "2,B,1.5,0.85,2.0,2.0,1.0\n"
        "3,C,3.0,0.85,2.0,4.0,4.0\n"
        "4,D,3.0,0.70,4.0,3.0,2.0\n"
    )
    path = tmp_path / "lb.csv"
    path.write_text(csv_text)
    return Leaderboard.from_csv(path, {"dice": H, "hd": L})


def test_position_ties_go_to_the_better_place() -> None:
    assert position(0.85, [0.9, 0.85, 0.85, 0.7], H) == 2
    assert position(0.95, [0.9, 0.85], H) == 1
    assert position(0.1, [0.9, 0.85], H) == 3
    assert position(3.0, [3.0, 2.0, 4.0], L) == 2
    assert position(math.nan, [1.0, 2.0], L) == 3
    assert position(None, [1.0, 2.0], H) == 3
    assert position(1.0, [math.nan, 2.0], L) == 1  # NaN rows are never better


def test_recorded_positions_are_reproduced(board: Leaderboard) -> None:
    for m in board.metrics:
        for i, value in enumerate(board.values[m]):
            assert position(value, board.values[m], board.directions[m]) == board.recorded_positions[m][i]
    assert rerank(board) == list(board.mean_positions)


def test_rank_hand_computed(board: Leaderboard) -> None:
    # dice 0.88 -> 1 better (0.90) -> pos 2; hd 2.5 -> 1 better (2.0) -> pos 2; mean 2.0
    r = rank_submission(board, {"dice": 0.88, "hd": 2.5})
    assert r.positions == {"dice": 2, "hd": 2}
    assert r.mean_position == 2.0
    assert r.percentile == pytest.approx(1 - (2.0 - 1) / 4)
    assert (r.gold, r.silver, r.bronze) == (False, False, True)  # thresholds 1.5, 1.5, 3.0
    assert r.above_median  # median threshold = mp[4 // 2] = 3.0
    # among 5 entries: A(dice1,hd2)=1.5? recomputed with the submission: A dice1 hd3 -> 2.0; B dice 3 hd1 -> 2.0;
    # sub dice2 hd2 -> 2.0; C dice3 hd5 -> 4.0; D dice5 hd3 -> 4.0 => submission ties for rank 1
    assert r.inserted_rank == 1


def test_best_and_worst(board: Leaderboard) -> None:
    best = rank_submission(board, {"dice": 1.0, "hd": 0.0})
    assert best.mean_position == 1.0 and best.percentile == 1.0 and best.gold and best.medal == "gold"
    worst = rank_submission(board, {"dice": 0.0, "hd": 99.0})
    assert worst.mean_position == 5.0 and worst.percentile == 0.0 and not worst.any_medal
    assert not worst.above_median and worst.inserted_rank == 5


def test_nan_metric_takes_worst_position(board: Leaderboard) -> None:
    r = rank_submission(board, {"dice": math.nan, "hd": 0.0})
    assert r.positions == {"dice": 5, "hd": 1}
    assert r.nan_metrics == ["dice"]
    assert rank_submission(board, {"hd": 0.0}).nan_metrics == ["dice"]


def test_leaderboard_without_direction_is_rejected(tmp_path: Path) -> None:
    from rexmle_grade.errors import RexmleError

    path = tmp_path / "lb.csv"
    path.write_text("rank,team,mean_position,x,x_position\n1,A,1,0.5,1\n")
    with pytest.raises(RexmleError, match="without a direction"):
        Leaderboard.from_csv(path, {})
