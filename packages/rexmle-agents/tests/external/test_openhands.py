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
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from rexmle_agents.external.envs import AgentEnvironment, EnvironmentBuildError, base_interpreter, ensure_environment
from rexmle_agents.external.spec import load_spec
from rexmle_agents.harness.spec import Limits
from rexmle_agents.results.schemas import load_schema
from rexmle_grade.errors import ConfigurationError

from .cli_driver import FINAL_TEXT, SCRIPT, CliDriver

PACKAGES = ("openhands-sdk==1.58.2", "openhands-tools==1.58.2")


def _index_unreachable(python: Path) -> str | None:
    """Why the package index cannot serve the SDK for that interpreter (a reason to skip), or None."""
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--python-version",
                               ".".join(map(str, _version(python))), "--only-binary=:all:", "--dest",
                               "/tmp/rexmle-pip-probe", *PACKAGES], capture_output=True, text=True, timeout=120,
                              check=False)
    except subprocess.TimeoutExpired:
        return "the package index did not answer in 120 s"
    return None if done.returncode == 0 else f"the package index did not serve {PACKAGES}: {done.stderr[-300:]}"


def _version(python: Path) -> tuple[int, int]:
    done = subprocess.run([str(python), "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                          text=True, check=True)
    major, minor = done.stdout.split()
    return int(major), int(minor)


@pytest.fixture(scope="module")
def openhands_env() -> AgentEnvironment:
    """The SDK's environment (litellm, fastmcp, browser-use's packages...): a few minutes to build on 2 cores, then
    reused from the agent-environment cache."""
    spec = load_spec("openhands")
    try:
        python = base_interpreter(spec)
    except ConfigurationError as exc:
        pytest.skip(f"OpenHands needs Python >= 3.12 for its own environment and none is installed here: "
                    f"{exc.message}")
    try:
        return ensure_environment(spec, source="openhands")
    except EnvironmentBuildError:
        reason = _index_unreachable(python)
        if reason is not None:
            pytest.skip(f"OpenHands cannot be installed here: {reason}")
        raise


def events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]


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
    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid", outcome.grade
    run_dir = outcome.run_dir
    journal = events(run_dir)
    # its environment was made from a Python 3.12 (pyenv's, on this kind of machine), not from rexmle's
    built = next(e for e in journal if e["kind"] == "log" and e.get("spec") == "openhands")
    assert built["python"].startswith("3.12.")

    # the whole script ran through OpenHands' terminal tool, and the conversation finished on the final text
    assert model.turns == len(SCRIPT) + 1, (model.turns, model.side_calls)
    # the run's step limit is the conversation's iteration limit (the runner's seventh argument)
    argv = next(e for e in journal if e["kind"] == "exec_started")["argv"]
    runner = next(i for i, a in enumerate(argv) if a.endswith("/run_openhands.py"))
    assert argv[runner + 7] == "20"

    # every model call went through the relay into the journal, with its usage
    calls = [e for e in journal if e["kind"] == "model_call"]
    assert len(calls) == model.turns + model.side_calls
    assert all(c["usage"]["input_tokens"] == 400 and c["usage"]["output_tokens"] == 60 for c in calls)
    schema = load_schema("journal-event")
    checker = jsonschema.validators.validator_for(schema)(schema)
    for event in journal:
        assert not list(checker.iter_errors(event)), event["kind"]

    # the conversation's events are kept: every command went to its terminal tool, whose outputs show what
    # OpenHands saw, and the conversation ended on the final text
    persisted = conversation_events(run_dir)
    actions = [e for e in persisted if e["kind"] == "ActionEvent"]
    assert [e["tool_name"] for e in actions] == ["terminal"] * len(SCRIPT)
    last = persisted[-1]
    assert last["kind"] == "MessageEvent" and last["source"] == "agent"
    assert last["llm_message"]["content"][0]["text"] == FINAL_TEXT
    outputs = json.dumps([e["observation"]["content"] for e in persisted if e["kind"] == "ObservationEvent"])
    assert re.search(r"trained: mean score [0-9.]+ over \d+ slices; wrote \d+ predictions", outputs)
    # its terminal is a tmux session wherever tmux is installed (a plain subprocess otherwise)
    if shutil.which("tmux"):
        stderr = next((run_dir / "logs" / "exec").glob("*agent-attempt1.stderr")).read_text()
        assert "TmuxPanePool initialized" in stderr
    # the code's network attempt was refused, through the relay's proxy variables; that probe is the only request
    # for the internet (no skills fetched, no tracing, no price table)
    assert "network refused" in outputs and "NETWORK REACHED" not in outputs
    refused = [e for e in journal if e["kind"] == "log" and e.get("relay")]
    assert [(e["relay"], e["target"]) for e in refused] == [("network_refused", "pypi.org:443")]

    # no key inside: the agent was given the placeholder, and the real key is nowhere in the run folder
    for path in run_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert secret.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_openhands_stops_at_a_spent_budget(openhands_env: AgentEnvironment, run_external: Any) -> None:
    """The token budget runs out after the training script ran (three calls of 460 tokens against 1300): the next
    call is answered 402, which OpenHands does not retry (it retries 408/409/429 and 5xx); the conversation ends in
    error, and the submission the script wrote is graded, the run naming the limit."""
    model = CliDriver(python=sys.executable)
    outcome = run_external("openhands", model, roles=("code",),
                           limits=Limits(time_limit_s=600, max_steps=20, max_tokens=1300))
    assert (outcome.state, outcome.limit) == ("finished", "tokens"), outcome.reason
    journal = events(outcome.run_dir)
    assert sum(e["kind"] == "model_call" for e in journal) == 3 and model.turns == 3
    refused = [e for e in journal if e["kind"] == "log" and e.get("relay") == "budget_exhausted"]
    assert len(refused) == 1 and refused[0]["status"] == 402
    exec_finished = next(e for e in journal if e["kind"] == "exec_finished")
    assert exec_finished["stopped_by"] is None  # it exited by itself, before the harness's grace period ended
    assert outcome.grade is not None and outcome.grade.status == "valid"


@pytest.mark.slow
def test_a_recorded_openhands_run_replays(openhands_env: AgentEnvironment, data_root: Path, tmp_path: Path) -> None:
    """OpenHands' calls are recorded through the relay like any model call; the same run asks the same questions
    again and replays from the cassette offline, graded the same."""
    from rexmle_agents.harness.runner import build_spec, execute_run
    from rexmle_agents.models import Model, RecordingBackend, ReplayBackend, RetryPolicy, ScriptedBackend

    cassette = tmp_path / "cassette.jsonl"
    spec = build_spec("ldct-iqa", agent="openhands", models={"code": "scripted/model"}, seed=3,
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
    assert sum(e["kind"] == "model_call" for e in replayed) == recorded
    assert not [e for e in replayed if e["kind"] == "log" and e.get("relay") == "upstream_error"]


@pytest.mark.slow
def test_the_step_limit_is_the_conversations_iteration_limit(openhands_env: AgentEnvironment,
                                                             run_external: Any) -> None:
    model = CliDriver(python=sys.executable)
    outcome = run_external("openhands", model, roles=("code",), limits=Limits(time_limit_s=600, max_steps=2))
    assert model.turns == 2
    errors = [e for e in conversation_events(outcome.run_dir) if e["kind"] == "ConversationErrorEvent"]
    assert [e["code"] for e in errors] == ["MaxIterationsReached"]
    assert outcome.state == "failed" and "without leaving a submission" in str(outcome.reason)
