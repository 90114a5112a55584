"""What the five terminal-agent tests (Claude Code, Codex CLI, Gemini CLI, mini-swe-agent, OpenHands) check the same
way: the agent's cached environment (or a skip naming why its registry cannot serve it), a :class:`CliDriver` that
also keeps what each call offered, the run's journal and transcript, and the assertions every agent must pass: every
model call journalled with its usage, the script's code ran and its network probe was the only thing refused, no key
in the run folder, a spent budget answered 402 once, and a recorded run replaying offline graded the same. What only
one agent does stays in its own test file.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import jsonschema
import pytest

from rexmle_agents.external.envs import AgentEnvironment, EnvironmentBuildError, ensure_environment
from rexmle_agents.external.spec import load_spec
from rexmle_agents.harness.runner import RunOutcome
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import ModelResponse
from rexmle_agents.models.types import GenerateConfig, Message, ToolSpec
from rexmle_agents.results.schemas import load_schema

from .cli_driver import SCRIPT, CliDriver

Registry = Literal["npm", "pypi"]
Event = dict[str, Any]

# the scripted driver's usage on every call (see CliDriver.usage)
INPUT_TOKENS, OUTPUT_TOKENS = 400, 60


def registry_unreachable(registry: Registry, packages: Sequence[str], python: Path | None = None) -> str | None:
    """Why the registry cannot serve the packages (a reason to skip), or None. For PyPI, ``python`` is the
    interpreter the environment is made from when it is not this one: the probe asks for wheels of its version."""
    if registry == "npm":
        npm = shutil.which("npm")
        if npm is None:
            return "npm is not installed"
        try:
            done = subprocess.run([npm, "view", *packages, "version"], capture_output=True, text=True, timeout=60,
                                  check=False)
        except subprocess.TimeoutExpired:
            return "the npm registry did not answer in 60 s"
        return None if done.returncode == 0 else (f"the npm registry did not serve {' '.join(packages)}: "
                                                  f"{done.stderr.strip()[-300:]}")
    wheels_for = [] if python is None else ["--python-version", ".".join(map(str, _version(python))),
                                            "--only-binary=:all:"]
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *wheels_for, "--dest",
                               "/tmp/rexmle-pip-probe", *packages], capture_output=True, text=True, timeout=120,
                              check=False)
    except subprocess.TimeoutExpired:
        return "the package index did not answer in 120 s"
    return None if done.returncode == 0 else (f"the package index did not serve {' '.join(packages)}: "
                                              f"{done.stderr[-300:]}")


def _version(python: Path) -> tuple[int, int]:
    done = subprocess.run([str(python), "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                          text=True, check=True)
    major, minor = done.stdout.split()
    return int(major), int(minor)


def agent_environment(name: str, label: str, *, registry: Registry, packages: Sequence[str],
                      python: Path | None = None) -> AgentEnvironment:
    """The agent's environment from its bundled spec, built once into the agent-environment cache; the test is
    skipped (with the reason) only where the build failed because the registry cannot serve the packages."""
    try:
        return ensure_environment(load_spec(name), source=name)
    except EnvironmentBuildError:
        reason = registry_unreachable(registry, packages, python)
        if reason is not None:
            pytest.skip(f"{label} cannot be installed here: {reason}")
        raise


class RecordingDriver(CliDriver):
    """The scripted model, also keeping the tool names each call offered and the first user prompt."""

    def __init__(self, finish_command: str | None = None) -> None:
        super().__init__(python=sys.executable, finish_command=finish_command)
        self.offered: list[list[str]] = []
        self.first_prompt = ""

    def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig
                 ) -> ModelResponse:
        self.offered.append([t.name for t in tools])
        self.first_prompt = self.first_prompt or "\n".join(m.content for m in messages if m.role == "user")
        return super().__call__(messages, tools, config)


def journal_events(run_dir: Path) -> list[Event]:
    return [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]


def transcript_lines(run_dir: Path) -> list[Event]:
    """The agent's streamed JSON output, as the run kept it."""
    path = run_dir / "logs" / "agent" / "attempt-1" / "transcript.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def model_calls(journal: Sequence[Event]) -> int:
    return sum(e["kind"] == "model_call" for e in journal)


def relay_refusals(journal: Sequence[Event], kind: str | None = None) -> list[Event]:
    """The relay's log events (``kind``: only those of that kind, such as "budget_exhausted")."""
    return [e for e in journal if e["kind"] == "log" and e.get("relay") and (kind is None or e["relay"] == kind)]


def exec_argv(journal: Sequence[Event]) -> list[str]:
    """The agent's command line, as the harness started it."""
    return next(e for e in journal if e["kind"] == "exec_started")["argv"]


def assert_graded(outcome: RunOutcome) -> None:
    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid", outcome.grade


def assert_calls_journalled(journal: Sequence[Event], count: int) -> list[Event]:
    """Every model call went through the relay into the journal (``count`` of them), with its usage, and every
    event of the journal is valid against the published schema; returns the calls."""
    calls = [e for e in journal if e["kind"] == "model_call"]
    assert len(calls) == count
    assert all(c["usage"]["input_tokens"] == INPUT_TOKENS and c["usage"]["output_tokens"] == OUTPUT_TOKENS
               for c in calls)
    schema = load_schema("journal-event")
    checker = jsonschema.validators.validator_for(schema)(schema)
    for event in journal:
        assert not list(checker.iter_errors(event)), event["kind"]
    return calls


def assert_the_script_ran(outputs: str) -> None:
    """The commands' outputs as the agent saw them: the training script ran, and the code's network attempt was
    refused (no network in the sandbox, or the relay's proxy refusal)."""
    assert re.search(r"trained: mean score [0-9.]+ over \d+ slices; wrote \d+ predictions", outputs)
    assert "network refused" in outputs and "NETWORK REACHED" not in outputs


def assert_only_the_probe_was_refused(journal: Sequence[Event]) -> None:
    """The relay refused one request, the script's probe for the internet through the proxy variables: the agent
    itself made none (telemetry, update checks, price tables) and no model name was refused."""
    refused = [(e["relay"], e.get("target")) for e in relay_refusals(journal)]
    assert refused == [("network_refused", "pypi.org:443")], refused


def assert_no_secret_in(run_dir: Path, secret: str) -> None:
    """The agent was given a placeholder: the real key is nowhere in the run folder."""
    for path in run_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert secret.encode() not in path.read_bytes(), path


def assert_stopped_at_402(outcome: RunOutcome, driver: CliDriver, *, limit: str) -> list[Event]:
    """Three calls went through and the fourth was answered 402, once (the agent did not retry it); the run
    finished naming ``limit`` and the submission the script wrote was graded. Returns the journal."""
    assert (outcome.state, outcome.limit) == ("finished", limit), outcome.reason
    journal = journal_events(outcome.run_dir)
    assert model_calls(journal) == 3 and driver.turns == 3
    assert [e["status"] for e in relay_refusals(journal, "budget_exhausted")] == [402]
    assert outcome.grade is not None and outcome.grade.status == "valid"
    return journal


def exec_finished(journal: Sequence[Event]) -> Event:
    """The end of the agent's process; its ``stopped_by`` is None where it exited by itself."""
    return next(e for e in journal if e["kind"] == "exec_finished")


def replay_grades_the_same(agent: str, driver: CliDriver, data_root: Path, tmp_path: Path,
                           calls: int | None = len(SCRIPT) + 1) -> RunOutcome:
    """Runs the agent with its calls recorded through the relay, then again from the cassette offline (the same
    run asks the same questions: its prompts hold the date and the sandbox's paths, the same in both runs); both
    are graded the same, every recorded call is replayed (``calls`` of them, where given) and none reached past the
    cassette. Returns the replayed run."""
    from rexmle_agents.harness.runner import build_spec, execute_run
    from rexmle_agents.models import Model, RecordingBackend, ReplayBackend, RetryPolicy, ScriptedBackend

    cassette = tmp_path / "cassette.jsonl"
    spec = build_spec("ldct-iqa", agent=agent, models={"code": "scripted/model"}, seed=3,
                      limits=Limits(time_limit_s=600, max_steps=20), sandbox="bwrap", data_root=data_root,
                      group="test")
    recorder = Model(RecordingBackend(ScriptedBackend(driver), cassette), retry=RetryPolicy(max_attempts=1))
    first = execute_run(spec, tmp_path / "recorded", models={"code": recorder}, grace_s=5.0)
    player = Model(ReplayBackend(cassette, "scripted/model"), retry=RetryPolicy(max_attempts=1))
    second = execute_run(spec, tmp_path / "replayed", models={"code": player}, grace_s=5.0)
    assert (first.state, second.state) == ("finished", "finished"), second.reason
    assert first.grade is not None and second.grade is not None and first.grade.status == "valid"
    assert first.grade.score == second.grade.score
    recorded = len(cassette.read_text().splitlines())
    replayed = journal_events(second.run_dir)
    assert model_calls(replayed) == recorded
    if calls is not None:
        assert recorded == calls
    assert not relay_refusals(replayed, "upstream_error")
    return second
