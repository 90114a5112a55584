"""AIDE's greedy policy: ``num_drafts`` drafts first; then, with probability ``debug_prob``, debug a buggy leaf whose
chain of debug steps is at most ``max_debug_depth`` long (AIDE's ``<=``: a leaf at the limit is debugged once more);
otherwise improve the best node (a draft when none works yet).

The random choice is seeded by the run seed and the tree size, so a resumed run makes the choices the killed one
would have made."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from rexmle_agents.scaffolds.node import Stage
from rexmle_agents.scaffolds.tree import Tree

if TYPE_CHECKING:
    from rexmle_agents.scaffolds.engine import Workbench


class Greedy:
    name: ClassVar[str] = "greedy"
    defaults: ClassVar[dict[str, Any]] = {"num_drafts": 5, "debug_prob": 0.5, "max_debug_depth": 3}
    slots: ClassVar[tuple[str, ...]] = ("draft", "debug", "improve", "analyse")

    def __init__(self, params: Mapping[str, Any], seed: int) -> None:
        self.num_drafts = int(params["num_drafts"])
        self.debug_prob = float(params["debug_prob"])
        self.max_debug_depth = int(params["max_debug_depth"])
        self.seed = seed

    def choose(self, tree: Tree) -> tuple[str, int | None]:
        """(stage, parent id) of the next node."""
        if len(tree.drafts) < self.num_drafts:
            return Stage.DRAFT.value, None
        rng = random.Random(f"greedy:{self.seed}:{len(tree)}")
        if rng.random() < self.debug_prob:
            debuggable = [n for n in tree.buggy_leaves if n.debug_depth <= self.max_debug_depth]
            if debuggable:
                return Stage.DEBUG.value, rng.choice(debuggable).id
        best = tree.best()
        if best is None:
            return Stage.DRAFT.value, None
        return Stage.IMPROVE.value, best.id

    def run(self, bench: Workbench) -> None:
        for pending in bench.tree.reset_pending():
            with bench.node_step(pending.stage, pending.parent, redo=pending) as node:
                bench.develop(node)
        while not bench.out_of_nodes():
            stage, parent = self.choose(bench.tree)
            with bench.node_step(stage, parent) as node:
                bench.develop(node)
