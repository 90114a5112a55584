"""An evolutionary policy in the manner of AIRA-dojo's: a population of working solutions evolved by mutation
(the ``improve`` operator) and crossover (the ``merge`` operator), parents chosen by tournament.

``population_size`` drafts seed the population; afterwards the population is the ``population_size`` best valid
nodes (elitist: a solution survives while it is among the best). Each new node is, in this order of chances: with
probability ``debug_prob`` a debug of a buggy leaf (at most ``max_debug_depth`` debug steps deep, as AIDE); else,
with at least two members and probability ``crossover_prob``, a merge of two distinct tournament winners; else an
improvement of one tournament winner. A tournament draws ``tournament_size`` members at random and keeps the fittest
(the best validation metric in the task's direction; the earlier node on a tie). With no working solution yet it
drafts. The random draws are seeded by the run seed and the tree size, so a resumed run makes the same choices.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from rexmle_agents.scaffolds.node import Node, Stage
from rexmle_agents.scaffolds.tree import Tree

if TYPE_CHECKING:
    from rexmle_agents.scaffolds.engine import Workbench


class Evolutionary:
    name: ClassVar[str] = "evolutionary"
    defaults: ClassVar[dict[str, Any]] = {"population_size": 6, "tournament_size": 3, "crossover_prob": 0.3,
                                          "debug_prob": 0.3, "max_debug_depth": 3}
    slots: ClassVar[tuple[str, ...]] = ("draft", "debug", "improve", "merge", "analyse")

    def __init__(self, params: Mapping[str, Any], seed: int) -> None:
        self.population_size = int(params["population_size"])
        self.tournament_size = max(1, int(params["tournament_size"]))
        self.crossover_prob = float(params["crossover_prob"])
        self.debug_prob = float(params["debug_prob"])
        self.max_debug_depth = int(params["max_debug_depth"])
        self.seed = seed

    def population(self, tree: Tree) -> list[Node]:
        """The fittest ``population_size`` valid nodes, fittest first (earlier nodes first among equals)."""
        ranked = sorted(tree.good, key=lambda n: (-n.score, n.id))  # type: ignore[operator]
        return ranked[: self.population_size]

    def tournament(self, members: Sequence[Node], rng: random.Random, exclude: Node | None = None) -> Node:
        pool = [m for m in members if m is not exclude]
        drawn = rng.sample(pool, min(self.tournament_size, len(pool)))
        return min(drawn, key=lambda n: (-n.score, n.id))  # type: ignore[operator]

    def choose(self, tree: Tree) -> tuple[str, int | None, int | None]:
        """(stage, parent id, second parent id for a merge) of the next node."""
        if len(tree.drafts) < self.population_size:
            return Stage.DRAFT.value, None, None
        rng = random.Random(f"evolutionary:{self.seed}:{len(tree)}")
        if rng.random() < self.debug_prob:
            debuggable = [n for n in tree.buggy_leaves if n.debug_depth <= self.max_debug_depth]
            if debuggable:
                return Stage.DEBUG.value, rng.choice(debuggable).id, None
        members = self.population(tree)
        if not members:
            return Stage.DRAFT.value, None, None
        if len(members) >= 2 and rng.random() < self.crossover_prob:
            first = self.tournament(members, rng)
            second = self.tournament(members, rng, exclude=first)
            return Stage.MERGE.value, first.id, second.id
        return Stage.IMPROVE.value, self.tournament(members, rng).id, None

    def run(self, bench: Workbench) -> None:
        for pending in bench.tree.reset_pending():
            with bench.node_step(pending.stage, pending.parent, redo=pending) as node:
                bench.develop(node)
        while not bench.out_of_nodes():
            stage, parent, other = self.choose(bench.tree)
            values = {"merged_with": other} if other is not None else {}
            with bench.node_step(stage, parent, **values) as node:
                bench.develop(node)
