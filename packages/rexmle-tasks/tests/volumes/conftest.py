"""Shared fixtures of the 3-D volume task tests (PANTHER, ISLES'22, SEG.A.): each task is prepared once per session
from its synthetic mirror; tests that change files work on copies."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from rexmle_grade.settings import TaskDirs
from rexmle_tasks.base import Task
from rexmle_tasks.pipeline import PreparedInfo, prepare_task
from rexmle_tasks.registry import get_task


@dataclass(frozen=True)
class Prepared:
    task: Task
    dirs: TaskDirs
    info: PreparedInfo


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Prepared]:
    """``prepared(task_id)``: the task prepared synthetically (default case count, seed 0), built on first use."""
    root = tmp_path_factory.mktemp("volume-tasks")
    cache: dict[str, Prepared] = {}

    def get(task_id: str) -> Prepared:
        if task_id not in cache:
            task = get_task(task_id)
            dirs = TaskDirs.for_task(task_id, raw_group=task.meta.raw_group, root=root)
            cache[task_id] = Prepared(task, dirs, prepare_task(task, dirs, synthetic=True, seed=0))
        return cache[task_id]

    return get

