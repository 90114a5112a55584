"""OpenHands (the OpenHands SDK 1.58.2 and its tools, PyPI, unchanged, in their own cached Python 3.12 environment)
run end to end inside bubblewrap on the synthetic LDCT-IQA task: its standard CodeAct agent, run headless the SDK's
documented way, every model call answered through the relay's OpenAI chat completions dialect (LiteLLM inside) by the
scripted :class:`CliDriver`. The submission it writes is graded, each call is in the journal with its usage, the
conversation's events are kept, the network attempt of the code it runs is refused and nothing else of it reaches for
the internet, no key reaches it, a spent budget stops it with a 402 it does not retry, and a recorded run replays
offline. Skipped where no Python 3.12 is found (python3.12 on PATH, or one pyenv installed): the SDK needs 3.12+.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from rexmle_agents.external.envs import AgentEnvironment, base_interpreter
from rexmle_agents.external.spec import load_spec
from rexmle_agents.harness.spec import Limits
from rexmle_grade.errors import ConfigurationError

from . import cli_agents
from .cli_driver import FINAL_TEXT, SCRIPT, CliDriver

PACKAGES = ("openhands-sdk==1.58.2", "openhands-tools==1.58.2")


@pytest.fixture(scope="module")
def openhands_env() -> AgentEnvironment:
    """The SDK's environment (litellm, fastmcp, browser-use's packages...): a few minutes to build on 2 cores, then
    reused from the agent-environment cache."""
    try:
        python = base_interpreter(load_spec("openhands"))
    except ConfigurationError as exc:
        pytest.skip(f"OpenHands needs Python >= 3.12 for its own environment and none is installed here: "
                    f"{exc.message}")
    return cli_agents.agent_environment("openhands", "OpenHands", registry="pypi", packages=PACKAGES, python=python)


def conversation_events(run_dir: Path) -> list[dict[str, Any]]:
    """The events OpenHands persisted (one JSON file each, in order), of the attempt's one conversation."""
    folders = [p for p in (run_dir / "logs" / "agent" / "attempt-1" / "conversations").iterdir() if p.is_dir()]
    assert len(folders) == 1, folders
    return [json.loads(p.read_text()) for p in sorted((folders[0] / "events").glob("*.json"))]


def test_openhands_end_to_end(openhands_env: AgentEnvironment, run_external: Any, monkeypatch: Any) -> None:
    secret = "sk-rexmle-test-secret-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    model = CliDriver(python=sys.executable)
    outcome = run_external("openhands", model, roles=("code",), limits=Limits(time_limit_s=600, max_steps=20))
    cli_agents.assert_graded(outcome)
    run_dir = outcome.run_dir
    journal = cli_agents.journal_events(run_dir)
    # its environment was made from a Python 3.12 (pyenv's, on this kind of machine), not from rexmle's
    built = next(e for e in journal if e["kind"] == "log" and e.get("spec") == "openhands")
    assert built["python"].startswith("3.12.")

    # the whole script ran through OpenHands' terminal tool, and the conversation finished on the final text
    assert model.turns == len(SCRIPT) + 1, (model.turns, model.side_calls)
    # the run's step limit is the conversation's iteration limit (the runner's seventh argument)
    argv = cli_agents.exec_argv(journal)
    runner = next(i for i, a in enumerate(argv) if a.endswith("/run_openhands.py"))
    assert argv[runner + 7] == "20"

    cli_agents.assert_calls_journalled(journal, model.turns + model.side_calls)

    # the conversation's events are kept: every command went to its terminal tool, whose outputs show what
    # OpenHands saw, and the conversation ended on the final text
    persisted = conversation_events(run_dir)
    actions = [e for e in persisted if e["kind"] == "ActionEvent"]
    assert [e["tool_name"] for e in actions] == ["terminal"] * len(SCRIPT)
    last = persisted[-1]
    assert last["kind"] == "MessageEvent" and last["source"] == "agent"
    assert last["llm_message"]["content"][0]["text"] == FINAL_TEXT
    observed = [e["observation"]["content"] for e in persisted if e["kind"] == "ObservationEvent"]
    cli_agents.assert_the_script_ran(json.dumps(observed))
    # its terminal is a tmux session wherever tmux is installed (a plain subprocess otherwise)
    if shutil.which("tmux"):
        stderr = next((run_dir / "logs" / "exec").glob("*agent-attempt1.stderr")).read_text()
        assert "TmuxPanePool initialized" in stderr
    # the probe was refused through the relay's proxy variables; it is the only request for the internet (no
    # skills fetched, no tracing, no price table)
    cli_agents.assert_only_the_probe_was_refused(journal)
    cli_agents.assert_no_secret_in(run_dir, secret)


@pytest.mark.slow
def test_openhands_stops_at_a_spent_budget(openhands_env: AgentEnvironment, run_external: Any) -> None:
    """The token budget runs out after the training script ran (three calls of 460 tokens against 1300): the next
    call is answered 402, which OpenHands does not retry (it retries 408/409/429 and 5xx); the conversation ends in
    error, and the submission the script wrote is graded, the run naming the limit."""
    model = CliDriver(python=sys.executable)
    outcome = run_external("openhands", model, roles=("code",),
                           limits=Limits(time_limit_s=600, max_steps=20, max_tokens=1300))
    journal = cli_agents.assert_stopped_at_402(outcome, model, limit="tokens")
    # it exited by itself, before the harness's grace period ended
    assert cli_agents.exec_finished(journal)["stopped_by"] is None


@pytest.mark.slow
def test_a_recorded_openhands_run_replays(openhands_env: AgentEnvironment, data_root: Path, tmp_path: Path) -> None:
    """OpenHands' calls are recorded through the relay like any model call; the same run asks the same questions
    again and replays from the cassette offline, graded the same."""
    # the number of calls is not pinned: OpenHands may make side calls besides the script's
    cli_agents.replay_grades_the_same("openhands", CliDriver(python=sys.executable), data_root, tmp_path, calls=None)


@pytest.mark.slow
def test_the_step_limit_is_the_conversations_iteration_limit(openhands_env: AgentEnvironment,
                                                             run_external: Any) -> None:
    model = CliDriver(python=sys.executable)
    outcome = run_external("openhands", model, roles=("code",), limits=Limits(time_limit_s=600, max_steps=2))
    assert model.turns == 2
    errors = [e for e in conversation_events(outcome.run_dir) if e["kind"] == "ConversationErrorEvent"]
    assert [e["code"] for e in errors] == ["MaxIterationsReached"]
    assert outcome.state == "failed" and "without leaving a submission" in str(outcome.reason)
