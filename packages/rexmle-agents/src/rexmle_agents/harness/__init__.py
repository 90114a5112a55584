"""The run harness: run any agent on any task, sandboxed, budgeted, journaled and resumable.

``rexmle run`` -> :class:`RunSpec` -> executor -> :func:`execute_run` (run folder, workspace, sandbox, watchdog,
agent steps, final submission) -> grading outside the sandbox -> report.
"""

from rexmle_agents.harness.agent import (
    Agent,
    AgentInfo,
    BaseAgent,
    all_agents,
    get_agent_info,
    make_agent,
    register_agent,
)
from rexmle_agents.harness.context import Remaining, RunCancelled, RunContext, Step, TaskInfo, Validation
from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.paths import RunPaths
from rexmle_agents.harness.runner import RunOutcome, build_spec, execute_run, read_spec
from rexmle_agents.harness.spec import Limits, Resources, RunSpec, parse_duration

__all__ = [
    "Agent",
    "AgentInfo",
    "BaseAgent",
    "Journal",
    "Limits",
    "Remaining",
    "Resources",
    "RunCancelled",
    "RunContext",
    "RunOutcome",
    "RunPaths",
    "RunSpec",
    "Step",
    "TaskInfo",
    "Validation",
    "all_agents",
    "build_spec",
    "execute_run",
    "get_agent_info",
    "make_agent",
    "parse_duration",
    "read_spec",
    "register_agent",
]
