"""What ``rexmle grade TASK`` needs, resolved from a task id (the ``rexmle.grading_targets`` entry point).

rexmle-grade cannot import the tasks (dependencies flow one way), so it asks this resolver for the prepared
folders, the grader id and the human leaderboard of a task.
"""

from __future__ import annotations

from pathlib import Path

from rexmle_grade.errors import RexmleError, TaskDataMissingError
from rexmle_grade.ranking import Leaderboard, LeaderboardProvenance
from rexmle_grade.targets import GradingTarget
from rexmle_tasks.base import Task
from rexmle_tasks.pipeline import require_prepared, task_dirs
from rexmle_tasks.registry import get_task


def load_leaderboard(task: Task) -> Leaderboard | None:
    """The task's human leaderboard, ranked on the grader's ranked metrics (None when the task has none)."""
    info = task.meta.leaderboard
    if info is None:
        return None
    path = task.folder / info.file
    if not path.is_file():
        raise RexmleError(f"task {task.id!r} declares leaderboard {info.file} but {path} is missing",
                          hint="reinstall rexmle-tasks; the package is incomplete")
    directions = {m.name: m.direction for m in task.grader.ranked_metrics}
    provenance = LeaderboardProvenance(source_url=info.source_url, via=info.via, retrieved=info.retrieved.isoformat(),
                                       phase=info.phase, notes=info.notes)
    return Leaderboard.from_csv(path, directions, provenance=provenance, version=task.meta.version)


def resolve_grading_target(task_id: str, data_root: str | Path | None = None) -> GradingTarget:
    """The grading target of a prepared task; unknown ids raise UnknownNameError, unprepared tasks
    TaskDataMissingError naming the prepare command."""
    task = get_task(task_id)
    dirs = task_dirs(task, data_root)
    info = require_prepared(task, dirs)
    if info.task_version != task.meta.version:
        raise TaskDataMissingError(
            f"task {task.id!r} was prepared for version {info.task_version}, but version {task.meta.version} is "
            "installed",
            hint=f"run `rexmle prepare {task.id} --force{' --synthetic' if info.synthetic else ''}`",
        )
    return GradingTarget(
        task_id=task.id,
        task_version=task.meta.version,
        grader_id=task.meta.grader,
        public_dir=dirs.public,
        private_dir=dirs.private,
        leaderboard=load_leaderboard(task),
        task_type=task.meta.task_type,
        dim=task.meta.dim,
        synthetic=info.synthetic,
    )
