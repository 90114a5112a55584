"""Prompt modes: the expert report (one per task, shipped as task data) and the domain pack."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rexmle_agents.scaffolds.presets import AideAgent, MctsAgent, RdLoopAgent
from rexmle_agents.scaffolds.prompting import EXPERT_REPORT_FILENAME, system_prompt
from rexmle_grade.errors import UnknownNameError, UserInputError
from rexmle_tasks.registry import all_tasks


def fake_ctx(task_id: str) -> SimpleNamespace:
    return SimpleNamespace(instructions="RULES AND TASK", task=SimpleNamespace(task_id=task_id))


def test_every_task_ships_an_expert_report() -> None:
    missing = [t.id for t in all_tasks().values() if not (t.folder / EXPERT_REPORT_FILENAME).is_file()]
    assert not missing and len(all_tasks()) >= 21


def test_prompt_modes_add_the_report_and_the_domain_pack_only_when_asked() -> None:
    plain = system_prompt(fake_ctx("ldct-iqa"), expert_report_mode=False, domain_pack=False)
    assert "RULES AND TASK" in plain and "Expert report" not in plain and "CopyInformation" not in plain
    both = system_prompt(fake_ctx("ldct-iqa"), expert_report_mode=True, domain_pack=True)
    assert "ranked probability score" in both and "mask.CopyInformation(input_image)" in both
    assert "No expert report is available" in system_prompt(fake_ctx("ravir"), expert_report_mode=True,
                                                             domain_pack=False)


def test_presets_take_overrides_and_other_combinations() -> None:
    assert AideAgent({}).config["policy"] == "greedy" and MctsAgent({}).config["policy"] == "mcts"
    assert RdLoopAgent({}).config["operators"]["hypothesise"] == "hypothesise"
    mixed = AideAgent({"policy": "mcts", "c_start": 2.0, "operators": {"improve": "draft"}})
    assert mixed.config["c_start"] == 2.0 and mixed.config["operators"]["improve"] == "draft"
    with pytest.raises(UserInputError, match="no setting"):
        AideAgent({"c_start": 2.0})  # an MCTS parameter does not belong to the greedy policy
    with pytest.raises(UnknownNameError):
        AideAgent({"operators": {"improve": "improv"}})
    with pytest.raises(UnknownNameError):
        AideAgent({"policy": "beam"})


@pytest.mark.parametrize(("config", "agent"), [("paper-aide", AideAgent), ("paper-mcts", MctsAgent),
                                               ("paper-rdloop", RdLoopAgent), ("ablation-expert-report", AideAgent)])
def test_the_shipped_paper_configurations_are_valid_agent_configs(config: str, agent: type) -> None:
    from importlib.resources import files

    import yaml

    settings = yaml.safe_load((files("rexmle_agents.scaffolds.configs") / f"{config}.yaml").read_text())
    assert agent(settings).config.items() >= settings.items()
