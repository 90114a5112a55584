"""The lite split: computed from task metadata (each task's full-baseline GPU-hours, its family, its type), it
keeps every family and task type, is the list the README documents, fits its stated budget, and moves when a
task's budget field moves."""

from __future__ import annotations

import re
from pathlib import Path

from rexmle_tasks.base import Task
from rexmle_tasks.lite import LITE_SEED_BUDGET_GPU_HOURS, lite_seed_gpu_hours, lite_tasks
from rexmle_tasks.registry import all_tasks

README = Path(__file__).parents[4] / "README.md"


def with_hours(tasks: dict[str, Task], task_id: str, hours: float | None) -> dict[str, Task]:
    """The tasks with one task's ``full_baseline_gpu_hours`` changed (a copy; the registry is left alone)."""
    changed = dict(tasks)
    task = tasks[task_id]
    changed[task_id] = Task(meta=task.meta.model_copy(update={"full_baseline_gpu_hours": hours}), folder=task.folder)
    return changed


def test_every_shipped_task_declares_its_full_baseline_gpu_hours() -> None:
    assert all(t.meta.full_baseline_gpu_hours for t in all_tasks().values())


def test_the_lite_split_keeps_every_family_and_task_type_within_its_budget() -> None:
    tasks = all_tasks()
    lite = lite_tasks(tasks)
    assert {tasks[t].meta.family for t in lite} == {t.meta.family for t in tasks.values()}
    assert {tasks[t].meta.task_type for t in lite} == {t.meta.task_type for t in tasks.values()}
    assert len(lite) < len(tasks)
    assert lite_seed_gpu_hours(lite) <= LITE_SEED_BUDGET_GPU_HOURS < lite_seed_gpu_hours(list(tasks))


def test_the_rule_reproduces_the_list_the_readme_documents() -> None:
    text = README.read_text()
    match = re.search(r"<!-- lite-split -->(.*?)<!-- /lite-split -->", text, re.S)
    assert match is not None, "README.md has no lite-split block"
    documented = re.findall(r"`([a-z0-9_-]+)`", match.group(1))
    assert documented == lite_tasks()
    assert documented == ["dentex", "isles22", "ldct-iqa", "neurips-cellseg", "panther-task2", "puma-track1-task1",
                          "ravir", "seg_a", "topbrain-track1", "topcow-track1-task1", "topcow-track1-task3",
                          "usenhance"]


def test_a_change_of_a_tasks_budget_field_moves_it_in_or_out() -> None:
    tasks = all_tasks()
    # in: panther-task1 made cheaper than panther-task2 replaces it as its family's pick
    cheaper = lite_tasks(with_hours(tasks, "panther-task1", 100))
    assert "panther-task1" in cheaper and "panther-task2" not in cheaper
    # out: the family's pick made dearer than its sibling leaves; the sibling comes in
    dearer = lite_tasks(with_hours(tasks, "panther-task2", 500))
    assert "panther-task2" not in dearer and "panther-task1" in dearer
    # out: a task without the field is never chosen (its family's next task stands in)
    unset = lite_tasks(with_hours(tasks, "topcow-track1-task3", None))
    assert "topcow-track1-task3" not in unset and "topcow-track2-task3" in unset
    # the type rule: the only classification tasks are TopCoW's; the cheapest of them comes in even though the
    # family already has its pick
    assert {"topcow-track1-task1", "topcow-track1-task3"} <= set(lite_tasks(tasks))


def test_ties_are_broken_by_case_count_then_id() -> None:
    tasks = all_tasks()
    # panther-task1 (92 cases) and panther-task2 (50) at equal hours: the smaller wins
    assert tasks["panther-task1"].meta.full_baseline_gpu_hours == tasks["panther-task2"].meta.full_baseline_gpu_hours
    assert "panther-task2" in lite_tasks(tasks)
    # equal hours and cases (PUMA's four tasks share their 206 images): the first id
    assert "puma-track1-task1" in lite_tasks(tasks)
