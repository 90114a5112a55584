"""Ranking behaviours a user would notice if they changed: medal and median thresholds met exactly, NaN on either
side, the direction of each metric, small boards, misspelled metrics, and how a board CSV is read."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rexmle_grade.errors import RexmleError, UserInputError
from rexmle_grade.grader import Direction
from rexmle_grade.ranking import Leaderboard, inserted_rank, position, rank_submission, rerank

H, L = Direction.HIGHER_BETTER, Direction.LOWER_BETTER


def board_of(dice: list[float], hd: list[float] | None = None) -> Leaderboard:
    """A board whose rows are already sorted by rank; mean positions recomputed from the values."""
    values = {"dice": tuple(dice)} | ({"hd": tuple(hd)} if hd is not None else {})
    directions = {"dice": H} | ({"hd": L} if hd is not None else {})
    draft = Leaderboard(teams=tuple(f"T{i}" for i in range(len(dice))), mean_positions=(), values=values,
                        directions=directions)
    return Leaderboard(teams=draft.teams, mean_positions=tuple(rerank(draft)), values=values, directions=directions)


def test_a_mean_position_equal_to_each_threshold_earns_that_medal() -> None:
    board = board_of([0.9, 0.8, 0.7, 0.6, 0.5])  # thresholds 1, 2, 3; median row 5 // 2 = 2 -> 3
    tie_first, tie_second, tie_third = (rank_submission(board, {"dice": v}) for v in (0.9, 0.8, 0.7))
    assert (tie_first.mean_position, tie_first.medal) == (1.0, "gold")
    assert (tie_second.mean_position, tie_second.medal) == (2.0, "silver")
    assert (tie_third.mean_position, tie_third.medal) == (3.0, "bronze")
    assert tie_third.thresholds == {"gold": 1.0, "silver": 2.0, "bronze": 3.0, "median": 3.0}
    assert tie_third.above_median  # equal to the median row's mean position counts as above the median
    fourth = rank_submission(board, {"dice": 0.65})
    assert fourth.mean_position == 4.0 and fourth.medal is None and not fourth.any_medal and not fourth.above_median


def test_exactly_one_medal_is_awarded_and_the_best_one_wins() -> None:
    board = board_of([0.9, 0.8, 0.7, 0.6])
    gold = rank_submission(board, {"dice": 0.95})
    assert (gold.gold, gold.silver, gold.bronze) == (True, False, False)
    silver = rank_submission(board, {"dice": 0.85})
    assert (silver.gold, silver.silver, silver.bronze) == (False, True, False)
    bronze = rank_submission(board, {"dice": 0.75})
    assert (bronze.gold, bronze.silver, bronze.bronze) == (False, False, True)
    assert [r.medal for r in (gold, silver, bronze)] == ["gold", "silver", "bronze"]
    assert all(r.any_medal for r in (gold, silver, bronze))


def test_on_boards_of_one_and_two_rows_the_missing_medal_rows_reuse_the_last_row() -> None:
    single = board_of([0.5])
    assert rank_submission(single, {"dice": 0.4}).thresholds == {"gold": 1.0, "silver": 1.0, "bronze": 1.0,
                                                                 "median": 1.0}
    pair = board_of([0.9, 0.5])
    second = rank_submission(pair, {"dice": 0.7})
    assert second.thresholds == {"gold": 1.0, "silver": 2.0, "bronze": 2.0, "median": 2.0}
    assert second.medal == "silver" and second.percentile == pytest.approx(0.5)
    last = rank_submission(pair, {"dice": 0.1})
    assert last.mean_position == 3.0 and last.percentile == 0.0 and last.medal is None


def test_percentile_is_one_minus_the_mean_position_less_one_over_the_board_size() -> None:
    board = board_of([0.9, 0.8, 0.7, 0.6, 0.5], hd=[1.0, 2.0, 3.0, 4.0, 5.0])
    result = rank_submission(board, {"dice": 0.85, "hd": 3.5})  # positions 2 and 4
    assert result.positions == {"dice": 2, "hd": 4}
    assert result.mean_position == 3.0
    assert result.percentile == pytest.approx(1 - 2 / 5)
    assert result.n_rows == 5


def test_nan_metric_values_take_the_worst_position_in_either_direction() -> None:
    board = board_of([0.9, 0.8], hd=[1.0, 2.0])
    for metrics in ({"dice": math.nan, "hd": math.nan}, {"dice": None, "hd": None}, {}):
        result = rank_submission(board, metrics)
        assert result.positions == {"dice": 3, "hd": 3}
        assert result.nan_metrics == ["dice", "hd"]
        assert result.percentile == 0.0 and result.inserted_rank == 3
    assert position(math.nan, [0.1, 0.2], L) == 3
    assert position(math.nan, [], H) == 1


def test_nan_cells_of_the_board_are_never_better_than_a_real_value() -> None:
    assert position(0.0, [math.nan, math.nan], H) == 1
    assert position(99.0, [math.nan, 1.0], L) == 2
    board = board_of([math.nan, 0.5])
    result = rank_submission(board, {"dice": 0.1})
    assert result.positions == {"dice": 2}  # only the real 0.5 beats 0.1; the NaN row does not
    assert result.nan_metrics == []


def test_equal_values_are_ties_in_both_directions() -> None:
    assert position(0.5, [0.5, 0.5, 0.4], H) == 1
    assert position(2.0, [2.0, 1.0, 3.0], L) == 2
    assert position(2.0, [2.0, 3.0], L) == 1
    assert position(0.6, [0.5, 0.7], H) == 2
    assert position(0.6, [0.5, 0.7], L) == 2
    assert position(0.4, [0.5, 0.7], L) == 1


def test_a_metric_name_not_on_the_board_while_a_board_column_is_missing_is_a_misspelling() -> None:
    board = board_of([0.9, 0.8], hd=[1.0, 2.0])
    with pytest.raises(UserInputError) as caught:
        rank_submission(board, {"dice": 0.5, "hd95": 3.0})
    assert caught.value.hint == "'hd95': did you mean 'hd'?"
    assert "['hd95']" in caught.value.message
    with pytest.raises(UserInputError) as unrelated:
        rank_submission(board, {"dice": 0.5, "zzz": 3.0})
    assert unrelated.value.hint == "pass only the leaderboard's ranked metrics"
    # extra unranked metrics beside every board column are fine; so is a missing column alone (ranked last)
    assert rank_submission(board, {"dice": 0.95, "hd": 0.5, "extra": 1.0}).mean_position == 1.0
    assert rank_submission(board, {"dice": 0.95}).positions == {"dice": 1, "hd": 3}


def test_inserted_rank_recomputes_every_row_with_the_submission_added() -> None:
    board = board_of([0.9, 0.8, 0.7], hd=[3.0, 1.0, 2.0])
    # with the submission (dice 0.85 -> 2nd, hd 1.5 -> 2nd): rows A (1, 4), B (3, 1), C (4, 3); sub (2, 2)
    assert rerank(board, {"dice": 0.85, "hd": 1.5}) == [2.5, 2.0, 3.5, 2.0]
    assert inserted_rank(board, {"dice": 0.85, "hd": 1.5}) == 1  # ties with B for the best rank
    assert inserted_rank(board, {"dice": 0.1, "hd": 9.0}) == 4
    assert inserted_rank(board, {"dice": 0.75, "hd": 2.5}) == 3  # (3, 3) = 3.0: behind B 1.5 and A 2.5, tied with C
    assert rerank(board, {"dice": None, "hd": None})[-1] == 4.0


def test_to_json_carries_every_field_and_the_medal() -> None:
    result = rank_submission(board_of([0.9, 0.8, 0.7]), {"dice": 0.75})
    data = result.to_json()
    assert data["medal"] == "bronze" and data["any_medal"] is True
    assert data["positions"] == {"dice": 3} and data["inserted_rank"] == 3 and data["n_rows"] == 3
    assert set(data) >= {"mean_position", "percentile", "gold", "silver", "bronze", "above_median", "nan_metrics",
                         "thresholds"}


def write_board(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "board.csv"
    path.write_text(text)
    return path


def test_a_board_csv_is_sorted_by_rank_and_keeps_its_recorded_positions(tmp_path: Path) -> None:
    path = write_board(tmp_path, "rank,team,mean_position,dice,dice_position,hd\n"
                                 "2,B,2,0.8,2,2.0\n"
                                 "1,A,1,0.9,1,1.0\n"
                                 "3,C,3,n/a,3,3.0\n")
    board = Leaderboard.from_csv(path, {"dice": H, "hd": L}, version="v7")
    assert board.teams == ("A", "B", "C") and board.mean_positions == (1.0, 2.0, 3.0)
    assert board.values["dice"][:2] == (0.9, 0.8) and math.isnan(board.values["dice"][2])
    assert board.recorded_positions == {"dice": (1.0, 2.0, 3.0)}  # hd has no _position column
    assert board.metrics == ["dice", "hd"] and board.n_rows == 3 and board.version == "v7"


def test_a_board_csv_without_rows_or_fixed_columns_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(RexmleError, match="has no rows"):
        Leaderboard.from_csv(write_board(tmp_path, "rank,team,mean_position,dice\n"), {"dice": H})
    with pytest.raises(RexmleError, match=r"lacks columns \['mean_position'\]"):
        Leaderboard.from_csv(write_board(tmp_path, "rank,team,dice\n1,A,0.5\n"), {"dice": H})
