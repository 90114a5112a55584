"""mini-SWE-agent 2.4.6 (PyPI, unchanged, in its own cached environment) run end to end inside bubblewrap on the
synthetic LDCT-IQA task with its `mini` command, every model call answered through the relay's OpenAI chat
completions dialect (LiteLLM inside) by the scripted :class:`CliDriver`: the submission it writes is graded, each
call is in the journal with its usage, it ends on its own completion marker, the network attempt of the code it runs
is refused and nothing else of it reaches for the internet (LiteLLM's price table stays local), no key reaches it, a
spent budget stops it with a 402 it does not retry, and a recorded run replays offline.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from rexmle_agents.external.envs import AgentEnvironment
from rexmle_agents.harness.spec import Limits

from . import cli_agents
from .cli_driver import SCRIPT, CliDriver

PACKAGE = "mini-swe-agent==2.4.6"
# minisweagent/config/mini.yaml tells the model to end with this command; environments/local.py ends the session
# when a command's output starts with the marker
FINISH = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@pytest.fixture(scope="module")
def mini_env() -> AgentEnvironment:
    """mini-swe-agent's environment (litellm, datasets, textual...): about 2 min to build on 2 cores, then reused
    from the agent-environment cache."""
    return cli_agents.agent_environment("mini-swe-agent", "mini-swe-agent", registry="pypi", packages=[PACKAGE])


def trajectory(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "logs" / "agent" / "attempt-1" / "trajectory.json").read_text())


def driver() -> CliDriver:
    return CliDriver(python=sys.executable, finish_command=FINISH)


def test_mini_swe_agent_end_to_end(mini_env: AgentEnvironment, run_external: Any, monkeypatch: Any) -> None:
    secret = "sk-rexmle-test-secret-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    model = driver()
    outcome = run_external("mini-swe-agent", model, roles=("code",), limits=Limits(time_limit_s=600, max_steps=20))
    cli_agents.assert_graded(outcome)
    run_dir = outcome.run_dir
    journal = cli_agents.journal_events(run_dir)

    # the whole script ran through mini's `bash` tool, then its completion marker ended the session: no side calls
    assert (model.turns, model.side_calls) == (len(SCRIPT) + 1, 0)
    assert model.commands[-1] == FINISH
    # the run's step limit is mini's step limit, its per-execution limit each command's timeout
    argv = cli_agents.exec_argv(journal)
    assert "agent.step_limit=20" in argv
    assert f"environment.timeout={int(Limits(time_limit_s=600).exec_timeout_s)}" in argv

    cli_agents.assert_calls_journalled(journal, model.turns)

    # the trajectory is kept: it ended on the marker, and shows the commands' outputs as mini saw them
    saved = trajectory(run_dir)
    assert saved["info"]["exit_status"] == "Submitted" and saved["info"]["mini_version"] == "2.4.6"
    assert saved["info"]["config"]["model"]["model_name"] == "openai/rexmle-code"
    cli_agents.assert_the_script_ran(json.dumps([m["content"] for m in saved["messages"] if m["role"] == "tool"]))
    # the probe was refused through the relay's proxy variables; it is the only request for the internet, so
    # LiteLLM fetched no price table
    cli_agents.assert_only_the_probe_was_refused(journal)
    cli_agents.assert_no_secret_in(run_dir, secret)


@pytest.mark.slow
def test_mini_swe_agent_stops_at_a_spent_budget(mini_env: AgentEnvironment, run_external: Any) -> None:
    """The token budget runs out after the training script ran (three calls of 460 tokens against 1300): the next
    call is answered 402, which mini asks once (MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1; its default would ask ten
    times over about five minutes); it stops, and the submission the script wrote is graded, the run naming the
    limit."""
    model = driver()
    outcome = run_external("mini-swe-agent", model, roles=("code",),
                           limits=Limits(time_limit_s=600, max_steps=20, max_tokens=1300))
    journal = cli_agents.assert_stopped_at_402(outcome, model, limit="tokens")
    # it exited by itself, before the harness's grace period ended
    assert cli_agents.exec_finished(journal)["stopped_by"] is None
    saved = trajectory(outcome.run_dir)
    assert saved["info"]["exit_status"] != "Submitted" and "402" in json.dumps(saved["messages"][-1])


@pytest.mark.slow
def test_a_recorded_mini_swe_agent_run_replays(mini_env: AgentEnvironment, data_root: Path, tmp_path: Path) -> None:
    """mini's calls are recorded through the relay like any model call; the same run asks the same questions again
    and replays from the cassette offline, graded the same."""
    second = cli_agents.replay_grades_the_same("mini-swe-agent", driver(), data_root, tmp_path)
    assert trajectory(second.run_dir)["info"]["exit_status"] == "Submitted"


@pytest.mark.slow
def test_the_step_limit_is_mini_swe_agents_step_limit(mini_env: AgentEnvironment, run_external: Any) -> None:
    model = driver()
    outcome = run_external("mini-swe-agent", model, roles=("code",), limits=Limits(time_limit_s=600, max_steps=2))
    assert model.turns == 2
    assert trajectory(outcome.run_dir)["info"]["exit_status"] == "LimitsExceeded"
    assert outcome.state == "failed" and "without leaving a submission" in str(outcome.reason)
