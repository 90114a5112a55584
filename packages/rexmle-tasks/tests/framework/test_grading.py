"""The grading resolver behind ``rexmle grade TASK`` (entry point ``rexmle.grading_targets``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rexmle_grade.errors import RexmleError, TaskDataMissingError, UnknownNameError
from rexmle_grade.grader import Direction
from rexmle_grade.grading import grade_submission
from rexmle_grade.ranking import rank_submission
from rexmle_grade.targets import resolve_target
from rexmle_tasks.grading import resolve_grading_target
from rexmle_tasks.pipeline import PREPARED_MARKER, prepare_task, task_dirs


def test_unknown_task_names_close_matches(toy, tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError, match="toy-task"):
        resolve_grading_target("toy-tsk", tmp_path)


def test_unprepared_task_names_the_prepare_command(toy, tmp_path: Path) -> None:
    with pytest.raises(TaskDataMissingError) as info:
        resolve_grading_target("toy-task", tmp_path)
    assert "rexmle prepare toy-task --synthetic" in str(info.value)


def test_prepared_task_resolves_with_its_leaderboard(toy, tmp_path: Path) -> None:
    dirs = task_dirs(toy.task, tmp_path)
    prepare_task(toy.task, dirs, synthetic=True)
    target = resolve_target("toy-task", tmp_path)  # through the installed entry point
    assert (target.task_id, target.grader_id, target.task_version) == ("toy-task", "toy-task", "1.0.0")
    assert (target.public_dir, target.private_dir) == (dirs.public, dirs.private)
    assert (target.task_type, target.dim, target.synthetic) == ("regression", "2d", True)
    board = target.leaderboard
    assert board is not None and board.teams == ("alpha", "beta", "gamma")
    assert board.directions == {"mae": Direction.LOWER_BETTER} and board.values["mae"] == (0.5, 1.5, 4.0)
    assert board.provenance.retrieved == "2026-11-22" and board.provenance.phase == "final test phase"
    assert board.version == "1.0.0"
    # a perfect submission beats every row
    gold = tmp_path / "gold"
    toy.task.grader.write_gold_submission(dirs.private, dirs.public, gold)
    result = grade_submission(toy.task.grader, gold, dirs.public, dirs.private)
    assert result.valid and result.metrics == {"mae": 0.0}
    assert rank_submission(board, result.metrics).gold


def test_task_without_leaderboard_resolves_to_none(toy, tmp_path: Path) -> None:
    task = toy.task
    bare = type(task)(meta=task.meta.model_copy(update={"leaderboard": None}), folder=task.folder)
    toy.replace(bare)
    prepare_task(bare, task_dirs(bare, tmp_path), synthetic=True)
    assert resolve_grading_target("toy-task", tmp_path).leaderboard is None


def test_leaderboard_column_unknown_to_the_grader_is_an_error(toy, tmp_path: Path) -> None:
    prepare_task(toy.task, task_dirs(toy.task, tmp_path), synthetic=True)
    board = toy.task.folder / "leaderboard.csv"
    board.write_text(board.read_text().replace("mae_position", "mae_position,rmse").replace(",1.0\n", ",1.0,1\n")
                     .replace(",2.0\n", ",2.0,2\n").replace(",3.0\n", ",3.0,3\n"))
    with pytest.raises(RexmleError, match="rmse"):
        resolve_grading_target("toy-task", tmp_path)


def test_preparation_of_another_task_version_must_be_redone(toy, tmp_path: Path) -> None:
    dirs = task_dirs(toy.task, tmp_path)
    prepare_task(toy.task, dirs, synthetic=True)
    marker = json.loads((dirs.root / PREPARED_MARKER).read_text())
    (dirs.root / PREPARED_MARKER).write_text(json.dumps({**marker, "task_version": "0.9.0"}))
    with pytest.raises(TaskDataMissingError, match=r"version 0\.9\.0") as info:
        resolve_grading_target("toy-task", tmp_path)
    assert "--force --synthetic" in str(info.value)
