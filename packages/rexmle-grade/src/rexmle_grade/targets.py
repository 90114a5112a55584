"""What ``rexmle grade`` needs to grade a submission for a *task id*, found through installed task packages.

rexmle-grade does not depend on rexmle-tasks (dependencies flow one way). A task package registers a resolver in
the ``rexmle.grading_targets`` entry-point group: a callable ``(task_id, data_root) -> GradingTarget``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from rexmle_grade.errors import ConfigurationError, UnknownNameError
from rexmle_grade.ranking import Leaderboard

GRADING_TARGETS_ENTRY_POINT_GROUP = "rexmle.grading_targets"


@dataclass(frozen=True)
class GradingTarget:
    task_id: str
    task_version: str
    grader_id: str
    public_dir: Path
    private_dir: Path
    leaderboard: Leaderboard | None
    task_type: str = ""
    dim: str = ""
    synthetic: bool = False


def resolve_target(task_id: str, data_root: str | Path | None = None) -> GradingTarget:
    """Ask the installed task packages for ``task_id``'s grading target (the first that knows it wins)."""
    resolvers = list(entry_points(group=GRADING_TARGETS_ENTRY_POINT_GROUP))
    if not resolvers:
        raise ConfigurationError(
            "no task package is installed, so task ids cannot be resolved",
            hint="pip install rexmle-tasks (or call rexmle_grade.grading.grade_submission with explicit folders)",
        )
    errors: list[UnknownNameError] = []
    for ep in resolvers:
        try:
            return ep.load()(task_id, data_root)
        except UnknownNameError as exc:  # this resolver does not know the task; try the next one
            errors.append(exc)
    raise errors[-1]
