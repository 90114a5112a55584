"""Operators: each one prompt template + one model call by role + parsing. Policies look them up by name, so a
preset (or ``agent_config["operators"]``) can swap one for another registered here."""

from __future__ import annotations

from typing import Any

from rexmle_agents.scaffolds.operators.base import Operator, ParsedScript, parse_script
from rexmle_agents.scaffolds.operators.code import PARSE_FAILURE, Debug, Draft, Improve, Merge, Revise
from rexmle_agents.scaffolds.operators.research import Critique, GiveFeedback, Hypothesise, SummariseMemory
from rexmle_agents.scaffolds.operators.review import SUBMIT_REVIEW, Analyse, Review
from rexmle_grade.errors import UnknownNameError

OPERATORS: dict[str, Any] = {}


def register_operator(cls: Any) -> Any:
    """Make an operator class available by its ``name`` to every policy and preset."""
    OPERATORS[cls.name] = cls
    return cls


def get_operator(name: str) -> Any:
    if name not in OPERATORS:
        raise UnknownNameError("operator", name, OPERATORS)
    return OPERATORS[name]()


for _cls in (Draft, Debug, Improve, Merge, Revise, Analyse, Hypothesise, GiveFeedback, Critique, SummariseMemory):
    register_operator(_cls)

__all__ = ["OPERATORS", "PARSE_FAILURE", "SUBMIT_REVIEW", "Analyse", "Critique", "Debug", "Draft", "GiveFeedback",
           "Hypothesise", "Improve", "Merge", "Operator", "ParsedScript", "Review", "Revise", "SummariseMemory",
           "get_operator", "parse_script", "register_operator"]
