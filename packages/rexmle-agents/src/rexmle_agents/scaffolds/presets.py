"""The scaffolds, as named presets of (policy, operators, parameters): the three the ReX-MLE paper compares and
AIRA's evolutionary search.

``AideAgent``, ``MctsAgent`` and ``RdLoopAgent`` are agent factories (the ``rexmle.agents`` entry points ``aide``,
``mcts``, ``rdloop``); ``EvoAgent`` (``evo``) registers as a built-in agent. ``agent_config`` overrides any
parameter; ``preset`` starts from another preset; ``policy`` names another policy and ``operators`` maps an operator
slot (``draft``, ``debug``, ``improve``, ``merge``, ``revise``, ``analyse``, ``hypothesise``, ``feedback``,
``critique``, ``summarise_memory``) to another registered operator, so any combination can be run under any agent's
name. The resolved configuration (every parameter, the policy, the operator of every slot) is journaled when the run
starts.
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
# operator slots the workbench itself may call, whatever the policy (memory summaries)
WORKBENCH_SLOTS = ("summarise_memory",)
# the originals' sampling temperature (AIDE's and ML-Master's code and feedback models, R&D-Agent's chat model)
ORIGINALS_TEMPERATURE = 0.5


@dataclass(frozen=True)
class Preset:
    policy: str
    description: str
    params: dict[str, Any] = field(default_factory=dict)
    operators: dict[str, str] = field(default_factory=dict)  # slot -> operator name; unnamed slots use their own


PRESETS: dict[str, Preset] = {
    "aide": Preset(policy="greedy", description="AIDE: greedy tree search (drafts, then debug or improve the best)",
                   params={"num_drafts": 5, "debug_prob": 0.5, "max_debug_depth": 3, "data_preview": True,
                           "temperature": ORIGINALS_TEMPERATURE}),
    "mcts": Preset(policy="mcts", description="ML-Master-style MCTS with decaying UCT exploration, adaptive memory, "
                                              "branch termination and parallel workers",
                   params={"workers": 1, "adaptive_memory": True, "stagnation_limit": 2, "reward_debug_fixed": 1.0,
                           "temperature": ORIGINALS_TEMPERATURE}),
    "rdloop": Preset(policy="rdloop",
                     description="R&D-Agent-style loop: hypothesis, code with review rounds, sample run, full run, "
                                 "feedback that decides the best, knowledge",
                     params={"coding_rounds": 3, "feedback_decides_best": True, "temperature": ORIGINALS_TEMPERATURE}),
    "evo": Preset(policy="evolutionary",
                  description="AIRA-style evolutionary search: population, tournament selection, mutation = improve, "
                              "crossover = merge",
                  params={"population_size": 6, "tournament_size": 3, "crossover_prob": 0.3,
                          "temperature": ORIGINALS_TEMPERATURE}),
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
        preset_name = config.pop("preset", self.preset)
        if preset_name not in PRESETS:
            raise UnknownNameError("scaffold preset", preset_name, PRESETS)
        preset = PRESETS[preset_name]
        policy_name = config.pop("policy", preset.policy)
        policy_cls = get_policy_class(policy_name)
        params = {**_settings_defaults(), **policy_cls.defaults}
        # A preset's parameters carry over to another policy only where that policy has them too.
        params.update({k: v for k, v in preset.params.items() if k in params})
        operators = {slot: slot for slot in (*policy_cls.slots, *WORKBENCH_SLOTS)}
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
        self.config = {**params, "preset": preset_name, "policy": policy_name, "operators": dict(operators)}

    def run(self, ctx: RunContext) -> None:
        policy_cls = get_policy_class(self.policy_name)
        policy = policy_cls({k: self.config[k] for k in policy_cls.defaults}, ctx.spec.seed)
        tree = Tree.from_states(ctx.load_states(STATE_KEY))
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


class EvoAgent(ScaffoldAgent):
    name = "evo"
    preset = "evo"
    description = PRESETS["evo"].description


__all__ = ["POLICIES", "PRESETS", "AideAgent", "EvoAgent", "MctsAgent", "Preset", "RdLoopAgent", "ScaffoldAgent"]
