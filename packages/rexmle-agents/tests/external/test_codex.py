"""Codex CLI 0.171.0 (npm, unchanged, its native binary behind its Node.js launcher, in its own cached environment)
run end to end inside bubblewrap on the synthetic LDCT-IQA task with `codex exec`, every model call answered through
the relay's OpenAI Responses dialect by the scripted :class:`CliDriver`: the submission it writes is graded, each
call is in the journal with its usage and is one step of the run, the web search and sub-agent tools are not
offered, the network attempt of the code it runs is refused, no key reaches it, a spent budget stops it with a 402
it does not retry, and a recorded run replays offline.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from rexmle_agents.external.envs import AgentEnvironment
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models.types import GenerateConfig, Message

from . import cli_agents
from .cli_driver import FINAL_TEXT, SCRIPT, CliDriver

PACKAGE = "@openai/codex@0.171.0"


@pytest.fixture(scope="module")
def codex_env() -> AgentEnvironment:
    """Codex's environment: about 600 MB (the native binary and Node.js), built once into the agent-environment
    cache (about 10 s from the registry here)."""
    return cli_agents.agent_environment("codex", "Codex CLI", registry="npm", packages=[PACKAGE])


def test_codex_end_to_end(codex_env: AgentEnvironment, run_external: Any, monkeypatch: Any) -> None:
    secret = "sk-proj-rexmle-test-secret-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    driver = cli_agents.RecordingDriver()
    outcome = run_external("codex", driver, roles=("code",), limits=Limits(time_limit_s=600, max_steps=20))
    cli_agents.assert_graded(outcome)
    run_dir = outcome.run_dir
    journal = cli_agents.journal_events(run_dir)

    # the task reached it as rexmle's CLI prompt (from the prompt file on its stdin)
    assert "running non-interactively in a sandbox" in driver.first_prompt
    assert "rexmle_agents.validate" in driver.first_prompt
    # the whole script ran through Codex's exec_command tool, and the session ended on the final text
    assert driver.turns == len(SCRIPT) + 1, (driver.turns, driver.side_calls)
    assert all("exec_command" in names for names in driver.offered)
    # no web search (switched off) and no sub-agents (a namespace tool the relay does not speak): function tools only
    offered = {name for names in driver.offered for name in names}
    assert not {"web_search", "multi_agent_v1", "spawn_agent"} & offered, offered

    # every model call went through the relay into the journal, with its usage, each call one step of the run
    calls = cli_agents.assert_calls_journalled(journal, driver.turns + driver.side_calls)
    turns = [e for e in journal if e["kind"] == "agent_turn"]
    assert [t["step"] for t in turns] == [c["step"] for c in calls] == list(range(1, len(calls) + 1))
    assert turns[0]["tool_calls"][0]["name"] == "exec_command"
    assert turns[0]["tool_calls"][0]["arguments"]["cmd"] == driver.commands[0]
    # Codex made no request of its own to the internet (update checks, analytics, the plugin catalogue): the one
    # refusal is the probe's, through the proxy variables
    refused = [e["message"] for e in cli_agents.relay_refusals(journal, "network_refused")]
    assert len(refused) == 1 and "pypi.org:443" in refused[0], refused

    # the streamed JSON events are kept: they show the commands and their outputs as Codex saw them
    lines = cli_agents.transcript_lines(run_dir)
    assert lines[0]["type"] == "thread.started"
    commands = [line["item"] for line in lines
                if line.get("type") == "item.completed" and line["item"].get("type") == "command_execution"]
    assert len(commands) == len(SCRIPT)
    assert [item["exit_code"] for item in commands] == [0] * len(SCRIPT)
    cli_agents.assert_the_script_ran(json.dumps([item["aggregated_output"] for item in commands]))
    messages = [line["item"]["text"] for line in lines
                if line.get("type") == "item.completed" and line["item"].get("type") == "agent_message"]
    assert messages[-1] == FINAL_TEXT
    assert lines[-1]["type"] == "turn.completed"
    # its own session rollout is among the run's logs
    assert list((run_dir / "logs" / "agent" / "attempt-1").rglob("rollout-*.jsonl"))
    cli_agents.assert_no_secret_in(run_dir, secret)


@pytest.mark.slow
def test_codex_stops_at_a_spent_budget(codex_env: AgentEnvironment, run_external: Any) -> None:
    """The token budget runs out after the training script ran (three calls of 460 tokens against 1300): the next
    call is answered 402, which Codex does not retry (stream_max_retries = 0); its turn fails and it exits, and the
    submission the script wrote is graded, the run naming the limit."""
    driver = cli_agents.RecordingDriver()
    outcome = run_external("codex", driver, roles=("code",),
                           limits=Limits(time_limit_s=600, max_steps=20, max_tokens=1300))
    journal = cli_agents.assert_stopped_at_402(outcome, driver, limit="tokens")
    # it exited by itself, before the harness's grace period ended
    assert cli_agents.exec_finished(journal)["stopped_by"] is None
    lines = cli_agents.transcript_lines(outcome.run_dir)
    assert lines[-1]["type"] == "turn.failed" and "402" in lines[-1]["error"]["message"]


@pytest.mark.slow
def test_the_step_limit_stops_codex(codex_env: AgentEnvironment, run_external: Any) -> None:
    """Codex 0.171.0 has no turn limit of its own: each model call is one step of the run (``steps: turn``), so
    --max-steps 3 lets three calls through (the data listed, the script written, the script run) and answers the
    fourth 402, which ends Codex's turn; the submission is graded and the run names the step limit."""
    driver = cli_agents.RecordingDriver()
    outcome = run_external("codex", driver, roles=("code",), limits=Limits(time_limit_s=600, max_steps=3))
    cli_agents.assert_stopped_at_402(outcome, driver, limit="steps")
    assert cli_agents.transcript_lines(outcome.run_dir)[-1]["type"] == "turn.failed"


def test_the_replay_key_leaves_out_only_codex_volatile_lines() -> None:
    """Codex heads every command output with a random chunk id and the wall time; the cassette key leaves those two
    lines out (so a recorded Codex run replays) and nothing else: a different output is a different request."""
    from rexmle_agents.models.replay import normalised_request, request_key

    def key(output: str, role: str = "tool") -> str:
        messages = [Message.user("run it"), Message(role=role, content=output, tool_call_id="call_0")
                    if role == "tool" else Message(role=role, content=output)]
        return request_key(normalised_request("scripted/model", messages, [], GenerateConfig()))

    framing = "Chunk ID: {}\nWall time: {} seconds\nProcess exited with code 0\nOutput:\n{}"
    assert key(framing.format("2b150d", "0.0000", "ok")) == key(framing.format("a450c2", "12.5031", "ok"))
    assert key(framing.format("2b150d", "0.0000", "ok")) != key(framing.format("2b150d", "0.0000", "failed"))
    assert key(framing.format("2b150d", "0.0000", "ok"), "user") != key(framing.format("a450c2", "1.0", "ok"), "user")


@pytest.mark.slow
def test_a_recorded_codex_run_replays(codex_env: AgentEnvironment, data_root: Path, tmp_path: Path) -> None:
    """Codex's calls are recorded through the relay like any model call; the same run asks the same questions
    again (its prompts hold the date and the sandbox's paths, the same in both runs) and replays from the cassette
    offline, graded the same."""
    cli_agents.replay_grades_the_same("codex", CliDriver(python=sys.executable), data_root, tmp_path)
