"""Gemini CLI 0.61.0 (npm, unchanged, with its own Node.js in its cached environment) run end to end inside
bubblewrap on the synthetic LDCT-IQA task in its headless mode, every model call answered through the relay's Gemini
API dialect by the scripted :class:`CliDriver`: the submission it writes is graded, each call is in the journal with
its usage and is one step of the run, the web tools are not offered, the network attempt of the code it runs is
refused, no key reaches it, a spent budget stops it with a 402 it does not retry, the step limit is its own turn
limit, and a recorded run replays offline.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from rexmle_agents.external.envs import AgentEnvironment, EnvironmentBuildError, ensure_environment
from rexmle_agents.external.spec import SPEC_PACKAGE, load_spec
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import ModelResponse
from rexmle_agents.models.types import GenerateConfig, Message, ToolSpec
from rexmle_agents.results.schemas import load_schema

from .cli_driver import FINAL_TEXT, SCRIPT, CliDriver

PACKAGE = "@google/gemini-cli@0.61.0"


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
def gemini_env() -> AgentEnvironment:
    """Gemini CLI's environment: its bundle, its dependencies and Node.js 22 (about 270 MB), built once into the
    agent-environment cache (about 30 s from the registry here)."""
    try:
        return ensure_environment(load_spec("gemini-cli"), source="gemini-cli")
    except EnvironmentBuildError:
        reason = _registry_unreachable()
        if reason is not None:
            pytest.skip(f"Gemini CLI cannot be installed here: {reason}")
        raise


class RecordingDriver(CliDriver):
    """The scripted model, also keeping the tool names each call offered and the first user prompt."""

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


def test_gemini_cli_end_to_end(gemini_env: AgentEnvironment, run_external: Any, monkeypatch: Any) -> None:
    secret = "AIzaSy-rexmle-test-secret-0123456789abcdef"
    monkeypatch.setenv("GEMINI_API_KEY", secret)
    monkeypatch.setenv("GOOGLE_API_KEY", secret)
    driver = RecordingDriver()
    outcome = run_external("gemini-cli", driver, roles=("code",), limits=Limits(time_limit_s=600, max_steps=20))
    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid", outcome.grade
    run_dir = outcome.run_dir
    journal = events(run_dir)

    # the task reached it as rexmle's CLI prompt
    assert "running non-interactively in a sandbox" in driver.first_prompt
    assert "rexmle_agents.validate" in driver.first_prompt
    # the whole script ran through its run_shell_command tool, and the session ended on the final text; with the
    # model named, no routing call was made (nor any other side call)
    assert driver.turns == len(SCRIPT) + 1 and driver.side_calls == 0, (driver.turns, driver.side_calls)
    assert all("run_shell_command" in names for names in driver.offered)
    offered = {name for names in driver.offered for name in names}
    assert not {"google_web_search", "web_fetch"} & offered, offered
    argv = next(e for e in journal if e["kind"] == "exec_started")["argv"]
    assert argv[argv.index("-m") + 1] == "rexmle-code"

    # every model call went through the relay into the journal, with its usage, each call one step of the run
    calls = [e for e in journal if e["kind"] == "model_call"]
    assert len(calls) == driver.turns
    assert all(c["usage"]["input_tokens"] == 400 and c["usage"]["output_tokens"] == 60 for c in calls)
    turns = [e for e in journal if e["kind"] == "agent_turn"]
    assert [t["step"] for t in turns] == [c["step"] for c in calls] == list(range(1, len(calls) + 1))
    assert turns[0]["tool_calls"][0]["name"] == "run_shell_command"
    assert turns[0]["tool_calls"][0]["arguments"]["command"] == driver.commands[0]
    schema = load_schema("journal-event")
    checker = jsonschema.validators.validator_for(schema)(schema)
    for event in journal:
        assert not list(checker.iter_errors(event)), event["kind"]
    # Gemini CLI made no request of its own to the internet (usage statistics, telemetry, update checks): the one
    # refusal is the probe's, through the proxy variables
    refused = [(e["relay"], e.get("target")) for e in journal if e["kind"] == "log" and e.get("relay")]
    assert refused == [("network_refused", "pypi.org:443")], refused

    # the streamed JSON events are kept: they show the commands and their outputs as Gemini CLI saw them
    lines = transcript(run_dir)
    assert lines[0]["type"] == "init" and lines[0]["model"] == "rexmle-code"
    uses = [line for line in lines if line.get("type") == "tool_use"]
    assert [line["tool_name"] for line in uses] == ["run_shell_command"] * len(SCRIPT)
    results = [line for line in lines if line.get("type") == "tool_result"]
    assert [line["status"] for line in results] == ["success"] * len(SCRIPT)
    outputs = json.dumps([line.get("output") for line in results])
    assert re.search(r"trained: mean score [0-9.]+ over \d+ slices; wrote \d+ predictions", outputs)
    # the code's network attempt was refused (no network in the sandbox, or the relay's proxy refusal)
    assert "network refused" in outputs and "NETWORK REACHED" not in outputs
    said = "".join(line["content"] for line in lines if line.get("type") == "message" and line["role"] == "assistant")
    assert said.endswith(FINAL_TEXT)
    assert lines[-1]["type"] == "result" and lines[-1]["status"] == "success"
    assert lines[-1]["stats"]["input_tokens"] == 400 * len(calls)
    # its own session record is among the run's logs
    assert list((run_dir / "logs" / "agent" / "attempt-1").rglob("chats/session-*"))

    # no key inside: the agent was given the placeholder, and the real key is nowhere in the run folder
    for path in run_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert secret.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_gemini_cli_stops_at_a_spent_budget(gemini_env: AgentEnvironment, run_external: Any) -> None:
    """The token budget runs out after the training script ran (three calls of 460 tokens against 1300): the next
    call is answered 402, which Gemini CLI does not retry (it retries 429, 499 and 5xx); its session ends with the
    error, and the submission the script wrote is graded, the run naming the limit."""
    driver = RecordingDriver()
    outcome = run_external("gemini-cli", driver, roles=("code",),
                           limits=Limits(time_limit_s=600, max_steps=20, max_tokens=1300))
    assert (outcome.state, outcome.limit) == ("finished", "tokens"), outcome.reason
    journal = events(outcome.run_dir)
    assert sum(e["kind"] == "model_call" for e in journal) == 3 and driver.turns == 3
    refused = [e for e in journal if e["kind"] == "log" and e.get("relay") == "budget_exhausted"]
    assert len(refused) == 1 and refused[0]["status"] == 402
    # it exited by itself, before the harness's grace period ended (a kill of the harness is a named reason): with
    # the HTTP status as its exit status, 402 % 256 = 146, which reads as 128 + signal 18
    exec_finished = next(e for e in journal if e["kind"] == "exec_finished")
    assert exec_finished["stopped_by"] == "signal:18", exec_finished
    lines = transcript(outcome.run_dir)
    assert lines[-1]["type"] == "result" and lines[-1]["status"] == "error"
    error = json.loads(lines[-1]["error"]["message"].removeprefix("[API Error: ").removesuffix("]"))["error"]
    assert (error["code"], error["status"]) == (402, "FAILED_PRECONDITION")  # Google's shape, as it parsed it
    assert outcome.grade is not None and outcome.grade.status == "valid"


@pytest.mark.slow
def test_the_step_limit_is_gemini_clis_turn_limit(gemini_env: AgentEnvironment, run_external: Any) -> None:
    """--max-steps 3 is its model.maxSessionTurns: three model round trips (the data listed, the script written,
    the script run), then it stops by itself, before asking the relay a fourth time; the submission is graded."""
    driver = RecordingDriver()
    outcome = run_external("gemini-cli", driver, roles=("code",), limits=Limits(time_limit_s=600, max_steps=3))
    journal = events(outcome.run_dir)
    assert sum(e["kind"] == "model_call" for e in journal) == 3 and driver.turns == 3
    assert not [e for e in journal if e["kind"] == "log" and e.get("relay")]  # the relay refused nothing
    result = transcript(outcome.run_dir)[-1]
    assert result["type"] == "result" and result["status"] == "error"
    assert "max session turns" in json.dumps(result)
    assert outcome.grade is not None and outcome.grade.status == "valid"


@pytest.mark.slow
def test_a_recorded_gemini_cli_run_replays(gemini_env: AgentEnvironment, data_root: Path, tmp_path: Path) -> None:
    """Gemini CLI's calls are recorded through the relay like any model call; the same run asks the same questions
    again (its prompts hold the date and the sandbox's paths, the same in both runs) and replays from the cassette
    offline, graded the same."""
    from rexmle_agents.harness.runner import build_spec, execute_run
    from rexmle_agents.models import Model, RecordingBackend, ReplayBackend, RetryPolicy, ScriptedBackend

    cassette = tmp_path / "cassette.jsonl"
    spec = build_spec("ldct-iqa", agent="gemini-cli", models={"code": "scripted/model"}, seed=3,
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

    class SchemaDriver(RecordingDriver):
        def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig
                     ) -> ModelResponse:
            answer = super().__call__(messages, tools, config)
            seen.append((bool(tools), dict(config.extra)))
            return answer

    driver = SchemaDriver()
    outcome = run_external("external", driver, config={"spec": str(path)}, roles=("code",),
                           limits=Limits(time_limit_s=600, max_steps=20))
    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid", outcome.grade
    journal = events(outcome.run_dir)
    refused = [(e["relay"], e.get("target")) for e in journal if e["kind"] == "log" and e.get("relay")]
    assert refused == [("network_refused", "pypi.org:443")], refused  # the probe's; no model name was refused
    # the router's call: no tools, a JSON schema (its OpenAPI type names read as JSON Schema's), answered as JSON
    routing = [extra for offered, extra in seen if not offered]
    assert driver.side_calls >= 1 and len(routing) == driver.side_calls
    schema = routing[0]["response_format"]["json_schema"]["schema"]
    assert schema["type"] == "object" and schema["properties"], schema
    assert driver.turns == len(SCRIPT) + 1
    assert sum(e["kind"] == "model_call" for e in journal) == driver.turns + driver.side_calls


@pytest.mark.slow
def test_a_model_slower_than_gemini_clis_header_timeout_is_asked_once(gemini_env: AgentEnvironment,
                                                                      run_external: Any) -> None:
    """Gemini CLI gives up on an answer whose headers take over 60 s (undici's headersTimeout) and sends the call
    again, paying twice. The relay starts a streamed Gemini answer at once and keeps it alive with newlines while
    the model works: a first answer that takes 70 s is asked for once, and the run goes on to its graded end."""
    import time

    class Slow(RecordingDriver):
        def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig
                     ) -> ModelResponse:
            if not self.offered:
                time.sleep(70)
            return super().__call__(messages, tools, config)

    driver = Slow()
    outcome = run_external("gemini-cli", driver, roles=("code",), limits=Limits(time_limit_s=900, max_steps=20))
    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid"
    journal = events(outcome.run_dir)
    assert len(driver.offered) == len(SCRIPT) + 1 == sum(e["kind"] == "model_call" for e in journal)
