"""Fixtures of the integration tests: the synthetic LDCT-IQA task (2-D images, a CSV submission: the cheapest to
run end to end)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TASK = "ldct-iqa"


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    root = tmp_path_factory.mktemp("inspect-data")
    task = get_task(TASK)
    prepare_task(task, task_dirs(task, root), synthetic=True, cases=10, seed=0, force=False)
    return root
