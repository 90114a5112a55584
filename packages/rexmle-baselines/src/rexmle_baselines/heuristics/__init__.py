"""The simple heuristic of every task: what a person does in ten minutes without training a network (a threshold,
an image statistic, the mean training label), fitted on the public training data only.

It is the middle rung of each synthetic mirror's difficulty ladder (issue 36): on a ``realistic`` mirror the sample
submission must score below it and the quick trained baseline clearly above it, so that an offline comparison of
agents measures more than plumbing; on real data it is a floor any agent should clear.

Each family module here holds ``HEURISTICS``: task id -> :class:`Heuristic`. Heuristics use numpy, scipy and
scikit-image only (no torch), so the ``heuristic`` baseline runs in the lightweight install.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rexmle_baselines.base import BaselineContext

# one module per task family; each defines HEURISTICS
FAMILY_MODULES = ("ldct", "isles", "vessels", "panther", "puma", "cellseg", "sega", "dentex", "usenhance", "ravir")


@dataclass(frozen=True)
class Heuristic:
    #: one line for tables and logs: what it does, e.g. "one DWI threshold fitted on the training masks"
    summary: str
    #: reads ``ctx.public_dir`` (training data and test inputs only), writes a valid submission into ``ctx.out_dir``
    run: Callable[[BaselineContext], None]
    #: the trained rung this task's mirror is measured against (:mod:`rexmle_baselines.ladder`): a baseline's name
    #: (None: the preferred quick baseline) and overrides of its ``quick`` config, e.g. {"epochs": 60}
    ladder_baseline: str | None = None
    ladder_overrides: Mapping[str, object] = field(default_factory=dict)


@cache
def heuristics() -> dict[str, Heuristic]:
    """Every task's heuristic, by task id (the family modules that exist; each registers its own tasks)."""
    found: dict[str, Heuristic] = {}
    for name in FAMILY_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
            continue
        for task_id, heuristic in module.HEURISTICS.items():
            if task_id in found:
                raise ValueError(f"two heuristics for task {task_id!r} (the second in {module.__name__})")
            found[task_id] = heuristic
    return found
