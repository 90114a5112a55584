"""The ``easy`` synthetic mirrors stay byte-for-byte what they were when the ``realistic`` ones were added (issue
36): the tests, the main job and every earlier offline comparison keep meaning the same. Each digest covers every
extracted raw file's path and bytes for a pinned secret and seed; a change to an easy generator is a new mirror and
needs a new digest here (and a word in the changelog), never a silent one."""

from __future__ import annotations

from pathlib import Path

import pytest

from rexmle_tasks.pipeline import prepare_task, task_dirs
from rexmle_tasks.registry import all_tasks, get_task
from rexmle_tasks.splits import tree_digest

PINNED = {
    "dentex": "8e29cf177eff07ad",
    "isles22": "30b1f26e9bd75bce",
    "ldct-iqa": "497a06bfbc0cd1b2",
    "neurips-cellseg": "cb78b864624a917d",
    "panther-task1": "8900de4882f3d1b4",
    "panther-task2": "8900de4882f3d1b4",
    "puma-track1-task1": "948d8d3ebc21104b",
    "puma-track1-task2": "948d8d3ebc21104b",
    "puma-track2-task1": "948d8d3ebc21104b",
    "puma-track2-task2": "948d8d3ebc21104b",
    "ravir": "7be52fa4684207a1",
    "seg_a": "15b4fd5f31d6405e",
    "topbrain-track1": "cad952e1bf2db365",
    "topbrain-track2": "cad952e1bf2db365",
    "topcow-track1-task1": "ef283d05b351fc59",
    "topcow-track1-task2": "ef283d05b351fc59",
    "topcow-track1-task3": "ef283d05b351fc59",
    "topcow-track2-task1": "ef283d05b351fc59",
    "topcow-track2-task2": "ef283d05b351fc59",
    "topcow-track2-task3": "ef283d05b351fc59",
    "usenhance": "ccdce4dfae3d44e9",
}




def test_every_task_has_a_pinned_easy_digest() -> None:
    assert set(all_tasks()) == set(PINNED)


@pytest.mark.parametrize("task_id", sorted(PINNED))
def test_the_easy_mirror_is_unchanged(task_id: str, tmp_path: Path) -> None:
    task = get_task(task_id)
    dirs = task_dirs(task, tmp_path)
    prepare_task(task, dirs, synthetic=True, cases=None, seed=3, secret="easy-mirror-pin")
    assert tree_digest(dirs.raw)[:16] == PINNED[task_id]
