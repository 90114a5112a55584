"""Codex CLI 0.171.0 (npm, unchanged, its native binary behind its Node.js launcher, in its own cached environment)
run end to end inside bubblewrap on the synthetic LDCT-IQA task with `codex exec`, every model call answered through
the relay's OpenAI Responses dialect by the scripted :class:`CliDriver`: the submission it writes is graded, each
call is in the journal with its usage and is one step of the run, the web search and sub-agent tools are not
offered, the network attempt of the code it runs is refused, no key reaches it, a spent budget stops it with a 402
it does not retry, and a recorded run replays offline.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from rexmle_agents.external.envs import AgentEnvironment, EnvironmentBuildError, ensure_environment
from rexmle_agents.external.spec import load_spec
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import ModelResponse
from rexmle_agents.models.types import GenerateConfig, Message, ToolSpec
from rexmle_agents.results.schemas import load_schema

from .cli_driver import FINAL_TEXT, SCRIPT, CliDriver

PACKAGE = "@openai/codex@0.171.0"


def _registry_unreachable() -> str | None:
    """Why the npm registry cannot serve the package (a reason to skip), or None."""
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed"
    try:
        done = subprocess.run([npm, "view", PACKAGE, "version"], capture_output=True, text=True, timeout=60,
                              check=False)
    except subprocess.TimeoutExpired:
        return "the npm registry did not answer in 60 s"
    return None if done.returncode == 0 else f"the npm registry did not serve {PACKAGE}: {done.stderr.strip()[-300:]}"


@pytest.fixture(scope="module")
def codex_env() -> AgentEnvironment:
    """Codex's environment: about 600 MB (the native binary and Node.js), built once into the agent-environment
    cache (about 10 s from the registry here)."""
    try:
        return ensure_environment(load_spec("codex"), source="codex")
    except EnvironmentBuildError:
        reason = _registry_unreachable()
        if reason is not None:
            pytest.skip(f"Codex CLI cannot be installed here: {reason}")
        raise


class RecordingDriver(CliDriver):
    """The scripted model, also keeping the tool names each call offered."""

    def __init__(self) -> None:
        super().__init__(python=sys.executable)
        self.offered: list[list[str]] = []
        self.first_prompt = ""

    def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig
                 ) -> ModelResponse:
        self.offered.append([t.name for t in tools])
        self.first_prompt = self.first_prompt or "\n".join(m.content for m in messages if m.role == "user")
        return super().__call__(messages, tools, config)


def events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]


def transcript(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "logs" / "agent" / "attempt-1" / "transcript.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_codex_end_to_end(codex_env: AgentEnvironment, run_external: Any, monkeypatch: Any) -> None:
    secret = "sk-proj-rexmle-test-secret-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    driver = RecordingDriver()
    outcome = run_external("codex", driver, roles=("code",), limits=Limits(time_limit_s=600, max_steps=20))
    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid", outcome.grade
    run_dir = outcome.run_dir
    journal = events(run_dir)

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
    calls = [e for e in journal if e["kind"] == "model_call"]
    assert len(calls) == driver.turns + driver.side_calls
    assert all(c["usage"]["input_tokens"] == 400 and c["usage"]["output_tokens"] == 60 for c in calls)
    turns = [e for e in journal if e["kind"] == "agent_turn"]
    assert [t["step"] for t in turns] == [c["step"] for c in calls] == list(range(1, len(calls) + 1))
    assert turns[0]["tool_calls"][0]["name"] == "exec_command"
    assert turns[0]["tool_calls"][0]["arguments"]["cmd"] == driver.commands[0]
    schema = load_schema("journal-event")
    checker = jsonschema.validators.validator_for(schema)(schema)
    for event in journal:
        assert not list(checker.iter_errors(event)), event["kind"]
    # Codex made no request of its own to the internet (update checks, analytics, the plugin catalogue): the one
    # refusal is the probe's, through the proxy variables
    refused = [e["message"] for e in journal if e["kind"] == "log" and e.get("relay") == "network_refused"]
    assert len(refused) == 1 and "pypi.org:443" in refused[0], refused

    # the streamed JSON events are kept: they show the commands and their outputs as Codex saw them
    lines = transcript(run_dir)
    assert lines[0]["type"] == "thread.started"
    commands = [line["item"] for line in lines
                if line.get("type") == "item.completed" and line["item"].get("type") == "command_execution"]
    assert len(commands) == len(SCRIPT)
    assert [item["exit_code"] for item in commands] == [0] * len(SCRIPT)
    outputs = json.dumps([item["aggregated_output"] for item in commands])
    assert re.search(r"trained: mean score [0-9.]+ over \d+ slices; wrote \d+ predictions", outputs)
    # the code's network attempt was refused (no network in the sandbox, or the relay's proxy refusal)
    assert "network refused" in outputs and "NETWORK REACHED" not in outputs
    messages = [line["item"]["text"] for line in lines
                if line.get("type") == "item.completed" and line["item"].get("type") == "agent_message"]
    assert messages[-1] == FINAL_TEXT
    assert lines[-1]["type"] == "turn.completed"
    # its own session rollout is among the run's logs
    assert list((run_dir / "logs" / "agent" / "attempt-1").rglob("rollout-*.jsonl"))

    # no key inside: the agent was given the placeholder, and the real key is nowhere in the run folder
    for path in run_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert secret.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_codex_stops_at_a_spent_budget(codex_env: AgentEnvironment, run_external: Any) -> None:
    """The token budget runs out after the training script ran (three calls of 460 tokens against 1300): the next
    call is answered 402, which Codex does not retry (stream_max_retries = 0); its turn fails and it exits, and the
    submission the script wrote is graded, the run naming the limit."""
    driver = RecordingDriver()
    outcome = run_external("codex", driver, roles=("code",),
                           limits=Limits(time_limit_s=600, max_steps=20, max_tokens=1300))
    assert (outcome.state, outcome.limit) == ("finished", "tokens"), outcome.reason
    journal = events(outcome.run_dir)
    assert sum(e["kind"] == "model_call" for e in journal) == 3 and driver.turns == 3
    refused = [e for e in journal if e["kind"] == "log" and e.get("relay") == "budget_exhausted"]
    assert len(refused) == 1 and refused[0]["status"] == 402
    exec_finished = next(e for e in journal if e["kind"] == "exec_finished")
    assert exec_finished["stopped_by"] is None  # it exited by itself, before the harness's grace period ended
    lines = transcript(outcome.run_dir)
    assert lines[-1]["type"] == "turn.failed" and "402" in lines[-1]["error"]["message"]
    assert outcome.grade is not None and outcome.grade.status == "valid"


@pytest.mark.slow
def test_the_step_limit_stops_codex(codex_env: AgentEnvironment, run_external: Any) -> None:
    """Codex 0.171.0 has no turn limit of its own: each model call is one step of the run (``steps: turn``), so
    --max-steps 3 lets three calls through (the data listed, the script written, the script run) and answers the
    fourth 402, which ends Codex's turn; the submission is graded and the run names the step limit."""
    driver = RecordingDriver()
    outcome = run_external("codex", driver, roles=("code",), limits=Limits(time_limit_s=600, max_steps=3))
    assert (outcome.state, outcome.limit) == ("finished", "steps"), outcome.reason
    journal = events(outcome.run_dir)
    assert sum(e["kind"] == "model_call" for e in journal) == 3 and driver.turns == 3
    assert [e["status"] for e in journal if e["kind"] == "log" and e.get("relay") == "budget_exhausted"] == [402]
    assert transcript(outcome.run_dir)[-1]["type"] == "turn.failed"
    assert outcome.grade is not None and outcome.grade.status == "valid"


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
    from rexmle_agents.harness.runner import build_spec, execute_run
    from rexmle_agents.models import Model, RecordingBackend, ReplayBackend, RetryPolicy, ScriptedBackend

    cassette = tmp_path / "cassette.jsonl"
    spec = build_spec("ldct-iqa", agent="codex", models={"code": "scripted/model"}, seed=3,
                      limits=Limits(time_limit_s=600, max_steps=20), sandbox="bwrap", data_root=data_root,
                      group="test")
    recorder = Model(RecordingBackend(ScriptedBackend(CliDriver(python=sys.executable)), cassette),
                     retry=RetryPolicy(max_attempts=1))
    first = execute_run(spec, tmp_path / "recorded", models={"code": recorder}, grace_s=5.0)
    player = Model(ReplayBackend(cassette, "scripted/model"), retry=RetryPolicy(max_attempts=1))
    second = execute_run(spec, tmp_path / "replayed", models={"code": player}, grace_s=5.0)
    assert (first.state, second.state) == ("finished", "finished"), second.reason
    assert first.grade is not None and second.grade is not None and first.grade.status == "valid"
    assert first.grade.score == second.grade.score
    recorded = len(cassette.read_text().splitlines())
    replayed = events(second.run_dir)
    assert sum(e["kind"] == "model_call" for e in replayed) == recorded == len(SCRIPT) + 1
    assert not [e for e in replayed if e["kind"] == "log" and e.get("relay") == "upstream_error"]
