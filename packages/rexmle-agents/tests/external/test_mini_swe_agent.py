"""mini-SWE-agent 2.4.6 (PyPI, unchanged, in its own cached environment) run end to end inside bubblewrap on the
synthetic LDCT-IQA task with its `mini` command, every model call answered through the relay's OpenAI chat
completions dialect (LiteLLM inside) by the scripted :class:`CliDriver`: the submission it writes is graded, each
call is in the journal with its usage, it ends on its own completion marker, the network attempt of the code it runs
is refused and nothing else of it reaches for the internet (LiteLLM's price table stays local), no key reaches it, a
spent budget stops it with a 402 it does not retry, and a recorded run replays offline.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from rexmle_agents.external.envs import AgentEnvironment, EnvironmentBuildError, ensure_environment
from rexmle_agents.external.spec import load_spec
from rexmle_agents.harness.spec import Limits
from rexmle_agents.results.schemas import load_schema

from .cli_driver import SCRIPT, CliDriver

PACKAGE = "mini-swe-agent==2.4.6"
# minisweagent/config/mini.yaml tells the model to end with this command; environments/local.py ends the session
# when a command's output starts with the marker
FINISH = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _index_unreachable() -> str | None:
    """Why the package index cannot serve mini-swe-agent (a reason to skip), or None."""
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--dest", "/tmp/rexmle-pip-probe",
                               PACKAGE], capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return "the package index did not answer in 120 s"
    return None if done.returncode == 0 else f"the package index did not serve {PACKAGE}: {done.stderr[-300:]}"


@pytest.fixture(scope="module")
def mini_env() -> AgentEnvironment:
    """mini-swe-agent's environment (litellm, datasets, textual...): about 2 min to build on 2 cores, then reused
    from the agent-environment cache."""
    try:
        return ensure_environment(load_spec("mini-swe-agent"), source="mini-swe-agent")
    except EnvironmentBuildError:
        reason = _index_unreachable()
        if reason is not None:
            pytest.skip(f"mini-swe-agent cannot be installed here: {reason}")
        raise


def events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]


def trajectory(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "logs" / "agent" / "attempt-1" / "trajectory.json").read_text())


def driver() -> CliDriver:
    return CliDriver(python=sys.executable, finish_command=FINISH)


def test_mini_swe_agent_end_to_end(mini_env: AgentEnvironment, run_external: Any, monkeypatch: Any) -> None:
    secret = "sk-rexmle-test-secret-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    model = driver()
    outcome = run_external("mini-swe-agent", model, roles=("code",), limits=Limits(time_limit_s=600, max_steps=20))
    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid", outcome.grade
    run_dir = outcome.run_dir
    journal = events(run_dir)

    # the whole script ran through mini's `bash` tool, then its completion marker ended the session: no side calls
    assert (model.turns, model.side_calls) == (len(SCRIPT) + 1, 0)
    assert model.commands[-1] == FINISH
    # the run's step limit is mini's step limit, its per-execution limit each command's timeout
    argv = next(e for e in journal if e["kind"] == "exec_started")["argv"]
    assert "agent.step_limit=20" in argv
    assert f"environment.timeout={int(Limits(time_limit_s=600).exec_timeout_s)}" in argv

    # every model call went through the relay into the journal, with its usage
    calls = [e for e in journal if e["kind"] == "model_call"]
    assert len(calls) == model.turns
    assert all(c["usage"]["input_tokens"] == 400 and c["usage"]["output_tokens"] == 60 for c in calls)
    schema = load_schema("journal-event")
    checker = jsonschema.validators.validator_for(schema)(schema)
    for event in journal:
        assert not list(checker.iter_errors(event)), event["kind"]

    # the trajectory is kept: it ended on the marker, and shows the commands' outputs as mini saw them
    saved = trajectory(run_dir)
    assert saved["info"]["exit_status"] == "Submitted" and saved["info"]["mini_version"] == "2.4.6"
    assert saved["info"]["config"]["model"]["model_name"] == "openai/rexmle-code"
    outputs = json.dumps([m["content"] for m in saved["messages"] if m["role"] == "tool"])
    assert re.search(r"trained: mean score [0-9.]+ over \d+ slices; wrote \d+ predictions", outputs)
    # the code's network attempt was refused, through the relay's proxy variables; that probe is the only request
    # for the internet, so LiteLLM fetched no price table
    assert "network refused" in outputs and "NETWORK REACHED" not in outputs
    refused = [e for e in journal if e["kind"] == "log" and e.get("relay")]
    assert [(e["relay"], e["target"]) for e in refused] == [("network_refused", "pypi.org:443")]

    # no key inside: the agent was given the placeholder, and the real key is nowhere in the run folder
    for path in run_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert secret.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_mini_swe_agent_stops_at_a_spent_budget(mini_env: AgentEnvironment, run_external: Any) -> None:
    """The token budget runs out after the training script ran (three calls of 460 tokens against 1300): the next
    call is answered 402, which mini asks once (MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1; its default would ask ten
    times over about five minutes); it stops, and the submission the script wrote is graded, the run naming the
    limit."""
    model = driver()
    outcome = run_external("mini-swe-agent", model, roles=("code",),
                           limits=Limits(time_limit_s=600, max_steps=20, max_tokens=1300))
    assert (outcome.state, outcome.limit) == ("finished", "tokens"), outcome.reason
    journal = events(outcome.run_dir)
    assert sum(e["kind"] == "model_call" for e in journal) == 3 and model.turns == 3
    refused = [e for e in journal if e["kind"] == "log" and e.get("relay") == "budget_exhausted"]
    assert len(refused) == 1 and refused[0]["status"] == 402
    exec_finished = next(e for e in journal if e["kind"] == "exec_finished")
    assert exec_finished["stopped_by"] is None  # it exited by itself, before the harness's grace period ended
    saved = trajectory(outcome.run_dir)
    assert saved["info"]["exit_status"] != "Submitted" and "402" in json.dumps(saved["messages"][-1])
    assert outcome.grade is not None and outcome.grade.status == "valid"


@pytest.mark.slow
def test_a_recorded_mini_swe_agent_run_replays(mini_env: AgentEnvironment, data_root: Path, tmp_path: Path) -> None:
    """mini's calls are recorded through the relay like any model call; the same run asks the same questions again
    and replays from the cassette offline, graded the same."""
    from rexmle_agents.harness.runner import build_spec, execute_run
    from rexmle_agents.models import Model, RecordingBackend, ReplayBackend, RetryPolicy, ScriptedBackend

    cassette = tmp_path / "cassette.jsonl"
    spec = build_spec("ldct-iqa", agent="mini-swe-agent", models={"code": "scripted/model"}, seed=3,
                      limits=Limits(time_limit_s=600, max_steps=20), sandbox="bwrap", data_root=data_root,
                      group="test")
    recorder = Model(RecordingBackend(ScriptedBackend(driver()), cassette), retry=RetryPolicy(max_attempts=1))
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
    assert trajectory(second.run_dir)["info"]["exit_status"] == "Submitted"


@pytest.mark.slow
def test_the_step_limit_is_mini_swe_agents_step_limit(mini_env: AgentEnvironment, run_external: Any) -> None:
    model = driver()
    outcome = run_external("mini-swe-agent", model, roles=("code",), limits=Limits(time_limit_s=600, max_steps=2))
    assert model.turns == 2
    assert trajectory(outcome.run_dir)["info"]["exit_status"] == "LimitsExceeded"
    assert outcome.state == "failed" and "without leaving a submission" in str(outcome.reason)
