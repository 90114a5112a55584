"""Gemini CLI 0.61.0 (npm, unchanged, with its own Node.js in its cached environment) run end to end inside
bubblewrap on the synthetic LDCT-IQA task in its headless mode, every model call answered through the relay's Gemini
API dialect by the scripted :class:`CliDriver`: the submission it writes is graded, each call is in the journal with
its usage and is one step of the run, the web tools are not offered, the network attempt of the code it runs is
refused, no key reaches it, a spent budget stops it with a 402 it does not retry, the step limit is its own turn
limit, and a recorded run replays offline.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from rexmle_agents.external.envs import AgentEnvironment
from rexmle_agents.external.spec import SPEC_PACKAGE
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import ModelResponse
from rexmle_agents.models.types import GenerateConfig, Message, ToolSpec

from . import cli_agents
from .cli_driver import FINAL_TEXT, SCRIPT, CliDriver

PACKAGE = "@google/gemini-cli@0.61.0"


@pytest.fixture(scope="module")
def gemini_env() -> AgentEnvironment:
    """Gemini CLI's environment: its bundle, its dependencies and Node.js 22 (about 270 MB), built once into the
    agent-environment cache (about 30 s from the registry here)."""
    return cli_agents.agent_environment("gemini-cli", "Gemini CLI", registry="npm", packages=[PACKAGE])


def test_gemini_cli_end_to_end(gemini_env: AgentEnvironment, run_external: Any, monkeypatch: Any) -> None:
    secret = "AIzaSy-rexmle-test-secret-0123456789abcdef"
    monkeypatch.setenv("GEMINI_API_KEY", secret)
    monkeypatch.setenv("GOOGLE_API_KEY", secret)
    driver = cli_agents.RecordingDriver()
    outcome = run_external("gemini-cli", driver, roles=("code",), limits=Limits(time_limit_s=600, max_steps=20))
    cli_agents.assert_graded(outcome)
    run_dir = outcome.run_dir
    journal = cli_agents.journal_events(run_dir)

    # the task reached it as rexmle's CLI prompt
    assert "running non-interactively in a sandbox" in driver.first_prompt
    assert "rexmle_agents.validate" in driver.first_prompt
    # the whole script ran through its run_shell_command tool, and the session ended on the final text; with the
    # model named, no routing call was made (nor any other side call)
    assert driver.turns == len(SCRIPT) + 1 and driver.side_calls == 0, (driver.turns, driver.side_calls)
    assert all("run_shell_command" in names for names in driver.offered)
    offered = {name for names in driver.offered for name in names}
    assert not {"google_web_search", "web_fetch"} & offered, offered
    argv = cli_agents.exec_argv(journal)
    assert argv[argv.index("-m") + 1] == "rexmle-code"

    # every model call went through the relay into the journal, with its usage, each call one step of the run
    calls = cli_agents.assert_calls_journalled(journal, driver.turns)
    turns = [e for e in journal if e["kind"] == "agent_turn"]
    assert [t["step"] for t in turns] == [c["step"] for c in calls] == list(range(1, len(calls) + 1))
    assert turns[0]["tool_calls"][0]["name"] == "run_shell_command"
    assert turns[0]["tool_calls"][0]["arguments"]["command"] == driver.commands[0]
    # Gemini CLI made no request of its own to the internet (usage statistics, telemetry, update checks): the one
    # refusal is the probe's, through the proxy variables
    cli_agents.assert_only_the_probe_was_refused(journal)

    # the streamed JSON events are kept: they show the commands and their outputs as Gemini CLI saw them
    lines = cli_agents.transcript_lines(run_dir)
    assert lines[0]["type"] == "init" and lines[0]["model"] == "rexmle-code"
    uses = [line for line in lines if line.get("type") == "tool_use"]
    assert [line["tool_name"] for line in uses] == ["run_shell_command"] * len(SCRIPT)
    results = [line for line in lines if line.get("type") == "tool_result"]
    assert [line["status"] for line in results] == ["success"] * len(SCRIPT)
    cli_agents.assert_the_script_ran(json.dumps([line.get("output") for line in results]))
    said = "".join(line["content"] for line in lines if line.get("type") == "message" and line["role"] == "assistant")
    assert said.endswith(FINAL_TEXT)
    assert lines[-1]["type"] == "result" and lines[-1]["status"] == "success"
    assert lines[-1]["stats"]["input_tokens"] == 400 * len(calls)
    # its own session record is among the run's logs
    assert list((run_dir / "logs" / "agent" / "attempt-1").rglob("chats/session-*"))
    cli_agents.assert_no_secret_in(run_dir, secret)


@pytest.mark.slow
def test_gemini_cli_stops_at_a_spent_budget(gemini_env: AgentEnvironment, run_external: Any) -> None:
    """The token budget runs out after the training script ran (three calls of 460 tokens against 1300): the next
    call is answered 402, which Gemini CLI does not retry (it retries 429, 499 and 5xx); its session ends with the
    error, and the submission the script wrote is graded, the run naming the limit."""
    driver = cli_agents.RecordingDriver()
    outcome = run_external("gemini-cli", driver, roles=("code",),
                           limits=Limits(time_limit_s=600, max_steps=20, max_tokens=1300))
    journal = cli_agents.assert_stopped_at_402(outcome, driver, limit="tokens")
    # it exited by itself, before the harness's grace period ended (a kill of the harness is a named reason): with
    # the HTTP status as its exit status, 402 % 256 = 146, which reads as 128 + signal 18
    exec_finished = cli_agents.exec_finished(journal)
    assert exec_finished["stopped_by"] == "signal:18", exec_finished
    lines = cli_agents.transcript_lines(outcome.run_dir)
    assert lines[-1]["type"] == "result" and lines[-1]["status"] == "error"
    error = json.loads(lines[-1]["error"]["message"].removeprefix("[API Error: ").removesuffix("]"))["error"]
    assert (error["code"], error["status"]) == (402, "FAILED_PRECONDITION")  # Google's shape, as it parsed it


@pytest.mark.slow
def test_the_step_limit_is_gemini_clis_turn_limit(gemini_env: AgentEnvironment, run_external: Any) -> None:
    """--max-steps 3 is its model.maxSessionTurns: three model round trips (the data listed, the script written,
    the script run), then it stops by itself, before asking the relay a fourth time; the submission is graded."""
    driver = cli_agents.RecordingDriver()
    outcome = run_external("gemini-cli", driver, roles=("code",), limits=Limits(time_limit_s=600, max_steps=3))
    journal = cli_agents.journal_events(outcome.run_dir)
    assert cli_agents.model_calls(journal) == 3 and driver.turns == 3
    assert not cli_agents.relay_refusals(journal)  # the relay refused nothing
    result = cli_agents.transcript_lines(outcome.run_dir)[-1]
    assert result["type"] == "result" and result["status"] == "error"
    assert "max session turns" in json.dumps(result)
    assert outcome.grade is not None and outcome.grade.status == "valid"


@pytest.mark.slow
def test_a_recorded_gemini_cli_run_replays(gemini_env: AgentEnvironment, data_root: Path, tmp_path: Path) -> None:
    """Gemini CLI's calls are recorded through the relay like any model call; the same run asks the same questions
    again (its prompts hold the date and the sandbox's paths, the same in both runs) and replays from the cassette
    offline, graded the same."""
    cli_agents.replay_grades_the_same("gemini-cli", CliDriver(python=sys.executable), data_root, tmp_path)


@pytest.mark.slow
def test_side_calls_name_the_alias_too(gemini_env: AgentEnvironment, run_external: Any, tmp_path: Path) -> None:
    """With the model left to its router ("auto"), Gemini CLI first asks a non-streamed generateContent with a JSON
    schema to classify the task, a call named after a model-config alias that resolves to a Gemini model; the spec's
    modelConfigs.customOverrides name the run's alias for every such alias, so the router's call reaches the model
    (answered with the JSON object its schema asks for) and so does every later call: the relay refuses nothing."""
    raw = yaml.safe_load(resources.files(SPEC_PACKAGE).joinpath("gemini-cli.yaml").read_text())
    command = list(raw["command"])
    command[command.index("-m") + 1] = "auto"
    path = tmp_path / "gemini-cli-auto.yaml"
    path.write_text(yaml.safe_dump({**raw, "name": "gemini-cli-auto", "command": command}, sort_keys=False))

    seen: list[tuple[bool, dict[str, Any]]] = []

    class SchemaDriver(cli_agents.RecordingDriver):
        def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig
                     ) -> ModelResponse:
            answer = super().__call__(messages, tools, config)
            seen.append((bool(tools), dict(config.extra)))
            return answer

    driver = SchemaDriver()
    outcome = run_external("external", driver, config={"spec": str(path)}, roles=("code",),
                           limits=Limits(time_limit_s=600, max_steps=20))
    cli_agents.assert_graded(outcome)
    journal = cli_agents.journal_events(outcome.run_dir)
    cli_agents.assert_only_the_probe_was_refused(journal)
    # the router's call: no tools, a JSON schema (its OpenAPI type names read as JSON Schema's), answered as JSON
    routing = [extra for offered, extra in seen if not offered]
    assert driver.side_calls >= 1 and len(routing) == driver.side_calls
    schema = routing[0]["response_format"]["json_schema"]["schema"]
    assert schema["type"] == "object" and schema["properties"], schema
    assert driver.turns == len(SCRIPT) + 1
    assert cli_agents.model_calls(journal) == driver.turns + driver.side_calls


@pytest.mark.slow
def test_a_model_slower_than_gemini_clis_header_timeout_is_asked_once(gemini_env: AgentEnvironment,
                                                                      run_external: Any) -> None:
    """Gemini CLI gives up on an answer whose headers take over 60 s (undici's headersTimeout) and sends the call
    again, paying twice. The relay starts a streamed Gemini answer at once and keeps it alive with newlines while
    the model works: a first answer that takes 70 s is asked for once, and the run goes on to its graded end."""
    import time

    class Slow(cli_agents.RecordingDriver):
        def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig
                     ) -> ModelResponse:
            if not self.offered:
                time.sleep(70)
            return super().__call__(messages, tools, config)

    driver = Slow()
    outcome = run_external("gemini-cli", driver, roles=("code",), limits=Limits(time_limit_s=900, max_steps=20))
    cli_agents.assert_graded(outcome)
    assert len(driver.offered) == len(SCRIPT) + 1 == cli_agents.model_calls(cli_agents.journal_events(outcome.run_dir))
