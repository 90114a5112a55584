"""The policy interface: which node to make next. Everything else (prompts, execution, review, persistence) is the
workbench's, so a new policy is a class with ``name``, ``defaults`` (its parameters), ``slots`` (the operator slots
it calls) and ``run(bench)``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from rexmle_agents.scaffolds.engine import Workbench


class Policy(Protocol):
    name: ClassVar[str]
    defaults: ClassVar[dict[str, Any]]
    slots: ClassVar[tuple[str, ...]]

    def __init__(self, params: Mapping[str, Any], seed: int) -> None: ...

    def run(self, bench: Workbench) -> None:
        """Make nodes until ``bench.out_of_nodes()``; budget errors propagate (the agent then submits the best).
        Nodes left pending by a killed attempt (``bench.tree.reset_pending()``) are redone first."""
