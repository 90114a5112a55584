"""ML-Master-style Monte-Carlo tree search over solutions.

Selection descends from a virtual root by UCT, ``Q/N + c(t) * sqrt(ln N_parent / N)``, whose exploration constant
decays linearly from ``c_start`` to ``c_end`` over ``c_decay_nodes`` nodes. A node is expanded while it has fewer
children than the cap of its action: the root drafts (``num_drafts``), a working node is improved
(``max_improve_children``), a buggy one is debugged (``max_debug_children``, down to ``max_debug_depth``). The new
node's reward (``reward_buggy``, or ``reward_valid`` plus ``reward_improved`` when it beats the best so far, plus
``reward_debug_fixed`` when a debug node fixed its parent) is backed up along its path. A working node whose last
``stagnation_limit`` improvements all failed to beat it is a stagnant branch: it is expanded no further (ML-Master's
branch termination; 0 turns it off). ML-Master's adaptive memory is the workbench's ``adaptive_memory`` setting,
on in the ``mcts`` preset. With ``workers`` > 1 several nodes are developed at once in a thread pool; nodes in
flight count towards their parent's cap and are never descended into.

Steps: with one worker each node is one harness step around its model calls and execution. Steps do not nest, so
parallel workers develop their nodes outside any step and the coordinating thread records one ``node`` step per
finished node (their execution events carry the node id in their name); the step limit is checked at dispatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, ClassVar

from rexmle_agents.scaffolds.node import Node, Stage
from rexmle_agents.scaffolds.tree import Tree
from rexmle_grade.errors import BudgetExceededError

if TYPE_CHECKING:
    from rexmle_agents.scaffolds.engine import Workbench


class Mcts:
    name: ClassVar[str] = "mcts"
    defaults: ClassVar[dict[str, Any]] = {
        "num_drafts": 5, "max_improve_children": 3, "max_debug_children": 2, "max_debug_depth": 3,
        "c_start": 1.414, "c_end": 0.1, "c_decay_nodes": 40,
        "reward_buggy": -1.0, "reward_valid": 1.0, "reward_improved": 1.0, "reward_debug_fixed": 1.0,
        "stagnation_limit": 2,
    }
    slots: ClassVar[tuple[str, ...]] = ("draft", "debug", "improve", "analyse")

    def __init__(self, params: Mapping[str, Any], seed: int) -> None:
        # no random choice is made (UCT ties break by node id), so the run seed is not kept
        self.p = {k: params[k] for k in self.defaults}

    # ---- selection ------------------------------------------------------------------------------------------
    def exploration(self, nodes_done: int) -> float:
        fraction = min(1.0, nodes_done / max(1, self.p["c_decay_nodes"]))
        return self.p["c_start"] + (self.p["c_end"] - self.p["c_start"]) * fraction

    def action(self, node: Node | None, tree: Tree | None = None) -> tuple[str | None, int]:
        """The expansion action of ``node`` (None: the root) and its cap on children; (None, 0) when terminal
        (given ``tree``, a stagnant branch is terminal too)."""
        if node is None:
            return Stage.DRAFT.value, self.p["num_drafts"]
        if node.is_valid:
            if tree is not None and self.stagnant(tree, node):
                return None, 0
            return Stage.IMPROVE.value, self.p["max_improve_children"]
        if node.duplicate_of is None and node.debug_depth < self.p["max_debug_depth"]:
            return Stage.DEBUG.value, self.p["max_debug_children"]
        return None, 0

    def stagnant(self, tree: Tree, node: Node) -> bool:
        """Whether the last ``stagnation_limit`` finished improvements of ``node`` all failed to beat it."""
        limit = int(self.p["stagnation_limit"])
        tries = [tree[i] for i in node.children if tree[i].done and tree[i].stage == Stage.IMPROVE.value]
        if limit <= 0 or len(tries) < limit:
            return False
        return all(not t.is_valid or t.score <= node.score for t in tries[-limit:])  # type: ignore[operator]

    def _children(self, tree: Tree, node: Node | None) -> list[Node]:
        if node is None:
            return [n for n in tree if n.parent is None]
        return [tree[i] for i in node.children]

    def is_open(self, tree: Tree, node: Node) -> bool:
        """Whether selection can still make a node somewhere in this subtree (in-flight nodes are closed)."""
        if not node.done:
            return False
        action, cap = self.action(node, tree)
        children = self._children(tree, node)
        return (action is not None and len(children) < cap) or any(self.is_open(tree, c) for c in children)

    def uct(self, child: Node, parent_visits: int, c: float) -> float:
        if child.visits == 0:
            return math.inf
        return child.value_sum / child.visits + c * math.sqrt(math.log(max(parent_visits, 1)) / child.visits)

    def select(self, tree: Tree) -> tuple[str, int | None]:
        """(stage, parent id) of the next node to make."""
        c = self.exploration(len(tree.done))
        current: Node | None = None
        while True:
            action, cap = self.action(current, tree)
            children = self._children(tree, current)
            if action is not None and len(children) < cap:
                return action, None if current is None else current.id
            candidates = [ch for ch in children if self.is_open(tree, ch)]
            if not candidates:
                break
            visits = len(tree.done) if current is None else current.visits
            current = max(candidates, key=lambda ch: (self.uct(ch, visits, c), -ch.id))
        # Everything reachable is at its cap or in flight: keep working from the best node rather than stop.
        best = tree.best()
        return (Stage.IMPROVE.value, best.id) if best else (Stage.DRAFT.value, None)

    # ---- backup ---------------------------------------------------------------------------------------------
    def reward(self, tree: Tree, node: Node) -> float:
        if not node.is_valid:
            return float(self.p["reward_buggy"])
        earlier = [n.score for n in tree.good if n.id != node.id and n.reward is not None]
        improved = not earlier or node.score > max(earlier)  # type: ignore[operator]
        fixed = node.stage == Stage.DEBUG.value  # a valid debug node repaired its buggy parent
        return (float(self.p["reward_valid"]) + (float(self.p["reward_improved"]) if improved else 0.0)
                + (float(self.p["reward_debug_fixed"]) if fixed else 0.0))

    def backup(self, tree: Tree, node: Node) -> None:
        node.reward = self.reward(tree, node)
        for ancestor in tree.path_to_root(node):
            ancestor.visits += 1
            ancestor.value_sum += node.reward

    # ---- the loop -------------------------------------------------------------------------------------------
    def run(self, bench: Workbench) -> None:
        redo = bench.tree.reset_pending()
        if bench.settings.workers <= 1:
            self._run_serial(bench, redo)
        else:
            self._run_parallel(bench, redo)

    def _run_serial(self, bench: Workbench, redo: list[Node]) -> None:
        for pending in redo:
            with bench.node_step(pending.stage, pending.parent, redo=pending, after=self._backup_of(bench)) as node:
                bench.develop(node)
        while not bench.out_of_nodes():
            stage, parent = self.select(bench.tree)
            with bench.node_step(stage, parent, after=self._backup_of(bench)) as node:
                bench.develop(node)

    def _backup_of(self, bench: Workbench) -> Callable[[Node], None]:
        return lambda node: self.backup(bench.tree, node)

    def _run_parallel(self, bench: Workbench, redo: list[Node]) -> None:
        workers = bench.settings.workers
        free = list(range(workers))
        queued = list(redo)
        in_flight: dict[Future[None], Node] = {}
        stop: BudgetExceededError | None = None
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mcts-worker") as pool:
            while True:
                while stop is None and free and self._may_dispatch(bench, len(in_flight)):
                    if queued:
                        node = queued.pop(0)
                    else:
                        stage, parent = self.select(bench.tree)
                        node = bench.tree.new_node(stage, parent)
                    node.worker = free.pop(0)
                    bench.save()
                    in_flight[pool.submit(bench.develop, node, worker=node.worker)] = node
                if not in_flight:
                    break
                finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in finished:
                    node = in_flight.pop(future)
                    free.append(node.worker)
                    error = future.exception()
                    if isinstance(error, BudgetExceededError):
                        stop = stop or error
                        continue
                    if error is not None:
                        raise error
                    self._record(bench, node)
        if stop is not None:
            raise stop
        steps = bench.ctx.remaining().steps
        if steps == 0 and not bench.out_of_nodes():
            raise BudgetExceededError(f"step limit reached: {bench.ctx.steps_done} of "
                                      f"{bench.ctx.spec.limits.max_steps} steps done")

    def _may_dispatch(self, bench: Workbench, in_flight: int) -> bool:
        limit = bench.settings.max_nodes
        if limit is not None and len(bench.tree.done) + in_flight >= limit:
            return False
        steps = bench.ctx.remaining().steps
        return steps is None or steps > in_flight

    def _record(self, bench: Workbench, node: Node) -> None:
        bench.complete(node, after=self._backup_of(bench))
        with bench.ctx.step("node", node=node.id, stage=node.stage, parent=node.parent, worker=node.worker) as step:
            node.step = step.number
            bench.save()  # the step number too: the last nodes of a run are saved no more after this
            step.result = node.journal_record()
