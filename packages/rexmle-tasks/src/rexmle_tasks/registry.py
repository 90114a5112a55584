"""The task registry: every ``challenges/<id>/task.yaml`` in this package, plus third-party task folders.

A third-party package adds tasks through the ``rexmle.tasks`` entry-point group: the entry point names a
callable returning an iterable of task folders (each with task.yaml, description.md, leaderboard.csv).
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points
from importlib.resources import files
from pathlib import Path

from rexmle_grade.errors import UnknownNameError
from rexmle_tasks.base import Task
from rexmle_tasks.metadata import load_metadata

TASKS_ENTRY_POINT_GROUP = "rexmle.tasks"


def _task_folders() -> list[Path]:
    root = Path(str(files("rexmle_tasks") / "challenges"))
    folders = [p for p in sorted(root.iterdir()) if (p / "task.yaml").is_file()]
    for ep in entry_points(group=TASKS_ENTRY_POINT_GROUP):
        folders += [Path(p) for p in ep.load()()]
    return folders


@cache
def all_tasks() -> dict[str, Task]:
    tasks: dict[str, Task] = {}
    for folder in _task_folders():
        meta = load_metadata(folder / "task.yaml")
        if meta.id in tasks:
            raise ValueError(f"task {meta.id!r} is defined twice ({tasks[meta.id].folder} and {folder})")
        tasks[meta.id] = Task(meta=meta, folder=folder)
    return dict(sorted(tasks.items()))


def task_ids() -> list[str]:
    return list(all_tasks())


def get_task(task_id: str) -> Task:
    """The task with this id; an unknown id raises an error naming the close matches."""
    tasks = all_tasks()
    if task_id not in tasks:
        raise UnknownNameError("task", task_id, tasks)
    return tasks[task_id]
