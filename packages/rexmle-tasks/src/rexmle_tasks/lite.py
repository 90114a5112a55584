"""The lite split (``--tasks lite``): every competition family and every task type, at a fraction of the cost.

The split is computed from task metadata alone, never from results:

1. per competition family (``family``), the cheapest task: the smallest ``full_baseline_gpu_hours``, then the
   fewest cases (``cases.total``), then the id (so ties are broken the same way on every machine);
2. per task type that step 1 left without a task, the cheapest task of that type, by the same order.

A task without ``full_baseline_gpu_hours`` is never chosen. Lowering a task's figure below its family's pick moves
it in (and the pick out); raising a pick's figure above another task of its family moves it out.

The budget: at the paper's setting (one GPU, 12 h per run) a seed of the lite split is at most
:data:`LITE_SEED_BUDGET_GPU_HOURS` GPU-hours, against 12 h times the number of tasks for ``all``.
"""

from __future__ import annotations

from collections.abc import Mapping

from rexmle_tasks.base import Task

#: GPU-hours one seed of the lite split may take at one GPU and 12 h per run (tests check the split fits)
LITE_SEED_BUDGET_GPU_HOURS = 150.0
#: the per-run setting that budget is stated for
LITE_REFERENCE_RUN_HOURS = 12.0


def _cost_order(task: Task) -> tuple[float, int, str]:
    hours = task.meta.full_baseline_gpu_hours
    return (float("inf") if hours is None else hours, task.meta.cases.total, task.id)


def lite_tasks(tasks: Mapping[str, Task] | None = None) -> list[str]:
    """The ids of the lite split of ``tasks`` (default: every installed task), in id order."""
    if tasks is None:
        from rexmle_tasks.registry import all_tasks

        tasks = all_tasks()
    costed = sorted((t for t in tasks.values() if t.meta.full_baseline_gpu_hours is not None), key=_cost_order)
    chosen: dict[str, Task] = {}
    for task in costed:
        if task.meta.family not in {t.meta.family for t in chosen.values()}:
            chosen[task.id] = task
    for task in costed:
        if task.meta.task_type not in {t.meta.task_type for t in chosen.values()}:
            chosen[task.id] = task
    return sorted(chosen)


def lite_seed_gpu_hours(task_ids: list[str], *, run_hours: float = LITE_REFERENCE_RUN_HOURS,
                        gpus_per_run: int = 1) -> float:
    """GPU-hours one seed of ``task_ids`` is budgeted at ``run_hours`` and ``gpus_per_run`` per run."""
    return len(task_ids) * run_hours * gpus_per_run
