"""Synthetic prepared tasks for the baseline tests, made once per session in a temporary data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class PreparedTasks:
    """Prepares synthetic tasks on first use (small ``cases``) under one data root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.roots: dict[str, Path] = {}  # task id -> the data root of its latest preparation

    def public(self, task_id: str, *, cases: int = 6) -> Path:
        from rexmle_tasks.pipeline import prepare_task, task_dirs
        from rexmle_tasks.registry import get_task

        task = get_task(task_id)
        self.roots[task_id] = self.root / f"cases{cases}"  # one root per size: a task is prepared once per root
        dirs = task_dirs(task, self.roots[task_id])
        # the synthetic secret pinned: the quick checks' thresholds hold for this data, not for every draw
        prepare_task(task, dirs, synthetic=True, cases=cases, seed=0, secret=b"rexmle-baselines-tests")
        return dirs.public

    def private(self, task_id: str) -> Path:
        from rexmle_tasks.pipeline import task_dirs
        from rexmle_tasks.registry import get_task

        return task_dirs(get_task(task_id), self.roots[task_id]).private

    def beats_sample(self, task_id: str, submission: Path) -> dict[str, float]:
        """Grade ``submission`` like any other (on the task's latest preparation): valid, no ranked metric worse than
        the sample submission's and at least one better. Returns its metrics."""
        from rexmle_grade.evaluate import evaluate_submission
        from rexmle_grade.grader import Direction, get_grader
        from rexmle_grade.targets import resolve_target

        target = resolve_target(task_id, self.roots[task_id])
        ours = evaluate_submission(target, submission)
        sample = evaluate_submission(target, target.public_dir / "sample_submission")
        assert ours.valid_submission, ours.problems
        better = worse = 0
        for metric in get_grader(target.grader_id).ranked_metrics:
            sign = 1 if metric.direction is Direction.HIGHER_BETTER else -1
            difference = sign * (ours.metrics[metric.name] - sample.metrics[metric.name])
            better += difference > 1e-9
            worse += difference < -1e-9
        assert better > 0 and worse == 0, (ours.metrics, sample.metrics)
        return ours.metrics


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> PreparedTasks:
    return PreparedTasks(tmp_path_factory.mktemp("baseline-data"))
