"""Search policies: which node to make next. Register a new one with :func:`register_policy`."""

from __future__ import annotations

from typing import Any

from rexmle_agents.scaffolds.policies.base import Policy
from rexmle_agents.scaffolds.policies.evolution import Evolutionary
from rexmle_agents.scaffolds.policies.greedy import Greedy
from rexmle_agents.scaffolds.policies.mcts import Mcts
from rexmle_agents.scaffolds.policies.rdloop import RdLoop
from rexmle_grade.errors import UnknownNameError

POLICIES: dict[str, Any] = {}


def register_policy(cls: Any) -> Any:
    POLICIES[cls.name] = cls
    return cls


def get_policy_class(name: str) -> Any:
    if name not in POLICIES:
        raise UnknownNameError("policy", name, POLICIES)
    return POLICIES[name]


for _cls in (Greedy, Mcts, RdLoop, Evolutionary):
    register_policy(_cls)

__all__ = ["POLICIES", "Evolutionary", "Greedy", "Mcts", "Policy", "RdLoop", "get_policy_class", "register_policy"]
