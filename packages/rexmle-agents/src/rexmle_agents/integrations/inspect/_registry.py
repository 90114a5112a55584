"""The module Inspect's ``inspect_ai`` entry point names (``rexmle``): importing it registers rexmle's tasks,
sandbox, scorer and metrics with Inspect."""

from rexmle_agents.integrations.inspect.sandbox import RexmleSandboxEnvironment
from rexmle_agents.integrations.inspect.scorer import medal_rate, rexmle_scorer, valid_rate
from rexmle_agents.integrations.inspect.tasks import TASKS

__all__ = ["TASKS", "RexmleSandboxEnvironment", "medal_rate", "rexmle_scorer", "valid_rate"]
