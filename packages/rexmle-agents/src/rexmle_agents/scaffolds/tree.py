"""The search tree (or, for the R&D loop, a trajectory: a tree whose nodes mostly have one child) and its state.

The tree also carries what a policy needs to resume exactly where it stopped: the knowledge log of the R&D loop and
the counter of node ids. It round-trips through JSON (``to_state`` / ``from_state``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rexmle_agents.scaffolds.node import Node, NodeStatus
from rexmle_grade.errors import RexmleError

STATE_FORMAT = 1


@dataclass
class Tree:
    nodes: dict[int, Node] = field(default_factory=dict)
    knowledge: list[dict[str, Any]] = field(default_factory=list)  # R&D loop: what worked and what failed

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes[i] for i in sorted(self.nodes))

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, node_id: int) -> Node:
        return self.nodes[node_id]

    def new_node(self, stage: str, parent: int | None = None, **values: Any) -> Node:
        node_id = max(self.nodes, default=-1) + 1
        depth = 0
        if parent is not None and stage == "debug":
            depth = self.nodes[parent].debug_depth + 1
        node = Node(id=node_id, stage=stage, parent=parent, debug_depth=depth, **values)
        self.nodes[node_id] = node
        if parent is not None:
            self.nodes[parent].children.append(node_id)
        return node

    # ---- views ------------------------------------------------------------------------------------------------
    @property
    def done(self) -> list[Node]:
        return [n for n in self if n.done]

    @property
    def pending(self) -> list[Node]:
        return [n for n in self if not n.done]

    @property
    def drafts(self) -> list[Node]:
        return [n for n in self if n.stage == "draft"]

    @property
    def good(self) -> list[Node]:
        return [n for n in self if n.is_valid]

    @property
    def buggy_leaves(self) -> list[Node]:
        """Failed nodes without children: what debugging starts from (a duplicate script has nothing to fix)."""
        return [n for n in self if n.done and n.is_buggy and not n.children and n.duplicate_of is None]

    def best(self) -> Node | None:
        """The valid node with the best metric in its own direction; the earliest wins ties. A NaN or infinite
        metric is no metric (such a node is not valid), so it never wins and never blocks a real one."""
        best: Node | None = None
        for node in self.good:
            if node.score is not None and (best is None or node.score > best.score):  # type: ignore[operator]
                best = node
        return best

    def path_to_root(self, node: Node) -> list[Node]:
        path = [node]
        while path[-1].parent is not None:
            path.append(self.nodes[path[-1].parent])
        return path

    def siblings(self, node: Node) -> list[Node]:
        if node.parent is None:
            return [n for n in self if n.parent is None and n.id != node.id]
        return [self.nodes[i] for i in self.nodes[node.parent].children if i != node.id]

    # ---- persistence ------------------------------------------------------------------------------------------
    # The tree is journaled as a full state now and then and as deltas in between (the nodes that changed, the
    # knowledge entries added): saving the whole tree after every node made a 500-node run's journal grow
    # quadratically (1.25 GB). A sequence of saved states folds back into the tree (:meth:`from_states`).
    def to_state(self) -> dict[str, Any]:
        return {"format": STATE_FORMAT, "nodes": [n.to_dict() for n in self], "knowledge": list(self.knowledge)}

    @staticmethod
    def delta(nodes: list[dict[str, Any]], knowledge_from: int, knowledge: list[dict[str, Any]]) -> dict[str, Any]:
        """A delta state: the records of the nodes that changed, and the knowledge entries from ``knowledge_from``."""
        return {"format": STATE_FORMAT, "delta": True, "nodes": nodes, "knowledge_from": knowledge_from,
                "knowledge": knowledge}

    @classmethod
    def from_states(cls, states: Sequence[Any]) -> Tree:
        """The tree that a sequence of saved states (full ones and deltas, oldest first) describes: the last full
        state with every later delta applied."""
        start = max((i for i, s in enumerate(states) if isinstance(s, dict) and not s.get("delta")), default=None)
        if start is None:
            if any(isinstance(s, dict) and s.get("delta") for s in states):
                raise RexmleError("the saved search state has deltas but no full state before them",
                                  hint="the journal was cut or edited; start the run afresh in a new folder")
            return cls()
        tree = cls.from_state(states[start])
        for state in states[start + 1:]:
            tree.apply(state)
        return tree

    @classmethod
    def from_journal(cls, events: Iterable[Mapping[str, Any]], key: str = "scaffold") -> Tree:
        """The tree saved in a run's journal under ``key``."""
        return cls.from_states([e["state"] for e in events if e.get("kind") == "agent_state" and e.get("key") == key])

    def apply(self, delta: Mapping[str, Any]) -> None:
        if delta.get("format") != STATE_FORMAT:
            raise RexmleError(f"a saved search delta has format {delta.get('format')!r}, expected {STATE_FORMAT}")
        for raw in delta.get("nodes", []):
            node = Node.from_dict(raw)
            self.nodes[node.id] = node
        del self.knowledge[int(delta.get("knowledge_from", len(self.knowledge))):]
        self.knowledge.extend(delta.get("knowledge", []))

    @classmethod
    def from_state(cls, state: Any) -> Tree:
        if state is None:
            return cls()
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            got = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise RexmleError(f"the saved search state has format {got!r}, expected {STATE_FORMAT}",
                              hint="resume the run with the rexmle-agents version that started it")
        tree = cls(knowledge=list(state.get("knowledge", [])))
        for raw in state["nodes"]:
            node = Node.from_dict(raw)
            tree.nodes[node.id] = node
        return tree

    def reset_pending(self) -> list[Node]:
        """Nodes whose step never finished, wiped back to what their policy chose, to be redone."""
        redo = []
        for node in self.pending:
            fresh = Node(id=node.id, stage=node.stage, parent=node.parent, children=node.children,
                         status=NodeStatus.PENDING.value, hypothesis=node.hypothesis, debug_depth=node.debug_depth,
                         worker=node.worker, merged_with=node.merged_with)
            self.nodes[node.id] = fresh
            redo.append(fresh)
        return redo
