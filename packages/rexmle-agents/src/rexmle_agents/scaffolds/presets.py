"""The three scaffolds the ReX-MLE paper compares, as named presets of (policy, operators, parameters).

``AideAgent``, ``MctsAgent`` and ``RdLoopAgent`` are agent factories (the ``rexmle.agents`` entry points ``aide``,
``mcts``, ``rdloop``). ``agent_config`` overrides any parameter; ``policy`` names another policy and ``operators``
maps an operator slot (``draft``, ``debug``, ``improve``, ``analyse``, ``hypothesise``, ``feedback``) to another
registered operator, so any combination can be run under any preset's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from rexmle_agents.harness.agent import BaseAgent
from rexmle_agents.scaffolds.engine import STATE_KEY, Settings, Workbench
from rexmle_agents.scaffolds.operators import OPERATORS, get_operator
from rexmle_agents.scaffolds.policies import POLICIES, get_policy_class
from rexmle_agents.scaffolds.tree import Tree
from rexmle_grade.errors import BudgetExceededError, UnknownNameError, UserInputError

if TYPE_CHECKING:
    from rexmle_agents.harness.context import RunContext

SCAFFOLD_VERSION = "0.1.0"


@dataclass(frozen=True)
class Preset:
    policy: str
    description: str
    params: dict[str, Any] = field(default_factory=dict)
    operators: dict[str, str] = field(default_factory=dict)  # slot -> operator name; unnamed slots use their own


PRESETS: dict[str, Preset] = {
    "aide": Preset(policy="greedy", description="AIDE: greedy tree search (drafts, then debug or improve the best)",
                   params={"num_drafts": 5, "debug_prob": 0.5, "max_debug_depth": 3}),
    "mcts": Preset(policy="mcts", description="ML-Master-style MCTS with decaying UCT exploration and parallel workers",
                   params={"workers": 1}),
    "rdloop": Preset(policy="rdloop",
                     description="R&D-Agent-style loop: hypothesis, code, sample run, full run, feedback, knowledge"),
}


def _settings_defaults() -> dict[str, Any]:
    return {f.name: f.default for f in fields(Settings)}


class ScaffoldAgent(BaseAgent):
    """A scaffold = a policy + operators + parameters; subclasses name the preset they start from."""

    preset: ClassVar[str]
    version: ClassVar[str] = SCAFFOLD_VERSION
    roles: ClassVar[tuple[str, ...]] = ("code", "feedback")

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        config = dict(config or {})
        preset = PRESETS[self.preset]
        policy_name = config.pop("policy", preset.policy)
        policy_cls = get_policy_class(policy_name)
        params = {**_settings_defaults(), **policy_cls.defaults}
        # A preset's parameters carry over to another policy only where that policy has them too.
        params.update({k: v for k, v in preset.params.items() if k in params})
        operators = {slot: slot for slot in policy_cls.slots}
        if policy_name == preset.policy:
            operators.update(preset.operators)
        requested_ops = config.pop("operators", {}) or {}
        unknown = sorted(set(config) - set(params))
        if unknown:
            raise UserInputError(
                f"agent {self.name!r} (policy {policy_name!r}) has no setting(s) {', '.join(map(repr, unknown))}",
                hint="its settings: " + ", ".join(f"{k}={v!r}" for k, v in params.items()))
        if not isinstance(requested_ops, Mapping):
            raise UserInputError(f"'operators' must map operator slots to operator names, got {requested_ops!r}",
                                 hint='e.g. {"operators": {"improve": "my_improve"}}')
        for slot, op_name in requested_ops.items():
            if slot not in operators:
                raise UnknownNameError(f"operator slot of policy {policy_name!r}", slot, operators)
            if op_name not in OPERATORS:
                raise UnknownNameError("operator", op_name, OPERATORS)
        operators.update(requested_ops)
        params.update(config)
        self.policy_name = policy_name
        self.operator_names = operators
        self.config = {**params, "policy": policy_name, "operators": dict(operators)}

    def run(self, ctx: RunContext) -> None:
        policy_cls = get_policy_class(self.policy_name)
        policy = policy_cls({k: self.config[k] for k in policy_cls.defaults}, ctx.spec.seed)
        tree = Tree.from_state(ctx.load_state(STATE_KEY))
        bench = Workbench(ctx, Settings.from_config(self.config),
                          {slot: get_operator(name) for slot, name in self.operator_names.items()}, tree)
        ctx.log(f"{self.name}: policy {self.policy_name}, {len(tree.done)} node(s) already done",
                config=self.config)
        try:
            policy.run(bench)
        except BudgetExceededError:
            bench.finish()
            raise
        bench.finish()



class AideAgent(ScaffoldAgent):
    name = "aide"
    preset = "aide"
    description = PRESETS["aide"].description


class MctsAgent(ScaffoldAgent):
    name = "mcts"
    preset = "mcts"
    description = PRESETS["mcts"].description


class RdLoopAgent(ScaffoldAgent):
    name = "rdloop"
    preset = "rdloop"
    description = PRESETS["rdloop"].description


__all__ = ["POLICIES", "PRESETS", "AideAgent", "MctsAgent", "Preset", "RdLoopAgent", "ScaffoldAgent"]
