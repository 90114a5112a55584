"""The original agents get the run's real models as they would natively (issue 34, items 2, 3 and 7).

AIDE (aideml 0.2.2, unchanged, inside bubblewrap) picks its backend by the model's name: given each paper model's
own name (plus the role), it sends o-series and GPT models to the responses API at api.openai.com (no temperature
for o-series), Gemini models to Google's host with the system prompt moved into the user turn, and Claude models to
the Anthropic API with 4,096 output tokens; the relay answers those hosts inside the sandbox. The scripted models
behind the relay see what arrived. rdagent's LiteLLM is given names it knows, so it takes its schema path; its time
settings agree with each other and with what the paper ran.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from rexmle_agents.external.envs import AgentEnvironment
from rexmle_agents.external.spec import ExternalSpecError, load_spec, parse_spec
from rexmle_agents.harness.runner import build_spec, execute_run
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import Model, ModelResponse, RetryPolicy, ScriptedBackend, ToolCall, Usage
from rexmle_agents.plans import expand, load_plan
from rexmle_agents.relay import FORWARDER, RelayServer, Route
from rexmle_agents.relay.tls import CA_FILE, ProviderTLS

TASK = "ldct-iqa"  # the fixtures' synthetic task (conftest.py)
PAPER_MODELS = ("openai/gpt-5", "anthropic/claude-sonnet-4-5", "google/gemini-3-pro-preview")
CODE = '''
import pandas as pd
ids = pd.read_csv("./input/sample_submission/submission.csv", dtype=str)["image_id"]
pd.DataFrame({"image_id": ids, "quality_score": [1.0] * len(ids)}).to_csv("./working/submission.csv", index=False)
print("validation metric: 0.5")
'''


class Seen:
    """A scripted AIDE model that keeps what each call brought (roles of the messages, temperature, max_tokens)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, messages: Any, tools: Any, config: Any) -> ModelResponse:
        self.calls.append({"roles": [m.role for m in messages], "temperature": config.temperature,
                           "max_tokens": config.max_tokens, "review": bool(tools)})
        if tools:
            review = {"is_bug": False, "summary": "fine", "metric": 0.5, "lower_is_better": False}
            return ModelResponse(tool_calls=(ToolCall(id="call_r", name="submit_review", arguments=review),),
                                 usage=Usage(input_tokens=10, output_tokens=5), finish_reason="tool_calls")
        return ModelResponse(text=f"A constant.\n\n```python\n{CODE}\n```", usage=Usage(input_tokens=10,
                                                                                        output_tokens=5))


def run_aide(data_root: Path, tmp_path: Path, models: dict[str, str], monkeypatch: pytest.MonkeyPatch
             ) -> tuple[Any, dict[str, Seen]]:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):  # the run checks they are set; the
        monkeypatch.setenv(name, f"sk-rexmle-test-{name.lower()}-0123456789")  # models here are scripted
    seen = {role: Seen() for role in models}
    spec = build_spec(TASK, agent="aideml", agent_config={"steps": 1, "num_drafts": 1, "debug_prob": 0.0},
                      models=models, seed=0, limits=Limits(time_limit_s=300), sandbox="bwrap", data_root=data_root,
                      group="test")
    outcome = execute_run(spec, tmp_path / "runs", grace_s=5.0,
                          models={role: Model(ScriptedBackend(seen[role]), retry=RetryPolicy(max_attempts=1))
                                  for role in models})
    return outcome, seen


def test_aide_sends_o_series_to_openai_and_gemini_its_own_way(aideml_env: AgentEnvironment, data_root: Path,
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """o3 as the code model (AIDE's own default family: it failed at the first call through a neutral name), a
    Gemini model as the feedback model."""
    outcome, seen = run_aide(data_root, tmp_path, {"code": "openai/o3", "feedback": "google/gemini-3-pro-preview"},
                             monkeypatch)
    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid"
    code, feedback = seen["code"].calls, seen["feedback"].calls
    assert len(code) == 1 and len(feedback) == 1 and feedback[0]["review"]
    assert code[0]["temperature"] is None  # AIDE drops the temperature for o-series models (its responses path)
    assert feedback[0]["roles"] == ["user"]  # its Gemini backend sends the system-only prompt as the user turn
    assert feedback[0]["temperature"] == 0.5  # and keeps its feedback temperature
    calls = [json.loads(line) for line in (outcome.run_dir / "journal.jsonl").read_text().splitlines()]
    assert not [e for e in calls if e["kind"] == "log" and "relay refused" in str(e.get("message"))]


def test_aide_asks_claude_for_its_own_limits_and_gpt_through_responses(aideml_env: AgentEnvironment,
                                                                      data_root: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    outcome, seen = run_aide(data_root, tmp_path, {"code": "anthropic/claude-sonnet-4-5", "feedback": "openai/gpt-5"},
                             monkeypatch)
    assert outcome.state == "finished", outcome.reason
    code, feedback = seen["code"].calls, seen["feedback"].calls
    assert len(code) == 1 and len(feedback) == 1
    assert code[0]["max_tokens"] == 4096  # AIDE's Anthropic backend's own default
    assert code[0]["roles"] == ["user"] and code[0]["temperature"] == 0.5
    assert feedback[0]["temperature"] == 0.5 and feedback[0]["review"]  # a GPT model keeps its temperature


def test_a_recorded_o_series_run_replays_under_the_same_names(aideml_env: AgentEnvironment, data_root: Path,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--model replay:CASSETTE` counts as the model it recorded: AIDE is given the same names, takes the same path
    (responses API, no temperature) and asks the same questions, so the replay finds every answer."""
    from rexmle_agents.models import RecordingBackend

    monkeypatch.setenv("OPENAI_API_KEY", "sk-rexmle-test-openai-0123456789")
    cassette = tmp_path / "cassette.jsonl"
    config = {"steps": 1, "num_drafts": 1, "debug_prob": 0.0}
    recorded = build_spec(TASK, agent="aideml", agent_config=config,
                          models={"code": "openai/o3", "feedback": "openai/o3"}, seed=1,
                          limits=Limits(time_limit_s=300), sandbox="bwrap", data_root=data_root, group="test")
    recorder = Model(RecordingBackend(ScriptedBackend(Seen(), name="openai/o3"), cassette),
                     retry=RetryPolicy(max_attempts=1))
    first = execute_run(recorded, tmp_path / "recorded", models={"code": recorder, "feedback": recorder}, grace_s=5.0)
    replay = f"replay:{cassette}"
    replayed = build_spec(TASK, agent="aideml", agent_config=config, models={"code": replay, "feedback": replay},
                          seed=1, limits=Limits(time_limit_s=300), sandbox="bwrap", data_root=data_root, group="test")
    second = execute_run(replayed, tmp_path / "replayed", grace_s=5.0)
    assert (first.state, second.state) == ("finished", "finished"), second.reason
    journal = [json.loads(line) for line in (second.run_dir / "journal.jsonl").read_text().splitlines()]
    assert sum(e["kind"] == "model_call" for e in journal) == 2
    assert first.grade is not None and second.grade is not None and first.grade.score == second.grade.score


def test_native_names_per_model_family() -> None:
    aide, rdagent = load_spec("aideml"), load_spec("rdagent")
    assert [aide.alias_for("code", m) for m in PAPER_MODELS] == [
        "gpt-5-rexmle-code", "claude-sonnet-4-5-rexmle-code", "gemini-3-pro-preview-rexmle-code"]
    assert aide.alias_for("feedback", "ollama/llama3") == "rexmle-feedback"  # no family AIDE knows: neutral
    assert [rdagent.alias_for("code", m) for m in PAPER_MODELS] == ["gpt-5", "claude-sonnet-4-5",
                                                                   "gemini-3-pro-preview"]
    assert rdagent.env["CHAT_MODEL"] == "{litellm_code}"


def test_provider_names_as_aliases_need_the_relay_to_answer_the_providers_hosts(aideml_raw: dict[str, Any]) -> None:
    raw = {**aideml_raw, "aliases": {"gpt-5": "code", "rexmle-feedback": "feedback"}}
    with pytest.raises(ExternalSpecError, match="looks like a provider's model name"):
        parse_spec({**raw, "provider_hosts": False}, "test")
    assert parse_spec(raw, "test").alias_for("code") == "gpt-5"
    with pytest.raises(ExternalSpecError, match="native_alias"):
        parse_spec({**raw, "native_alias": "{role}-only"}, "test")


def _litellm_python() -> Path | None:
    """An agent environment of the cache that holds LiteLLM (rdagent's, or another agent's)."""
    from rexmle_agents.external.envs import cache_root

    for python in sorted(cache_root().glob("env-*/bin/python")):
        if list(python.parent.parent.glob("lib/python3*/site-packages/litellm")):
            return python
    return None


def test_rdagents_litellm_knows_the_paper_models_and_takes_the_schema_path() -> None:
    """rdagent asks litellm.supports_response_schema(chat_model): true for the names the spec gives the paper's
    models, false for the neutral alias (its fallback prompts)."""
    python = _litellm_python()
    if python is None:
        pytest.skip("no agent environment with LiteLLM is cached (build rdagent's: ensure_environment)")
    names = ["openai/gpt-5", "anthropic/claude-sonnet-4-5", "openai/gemini-3-pro-preview", "openai/rexmle-code"]
    script = ("import json, sys, litellm; print(json.dumps([litellm.supports_response_schema(model=m) "
              "for m in sys.argv[1:]]))")
    done = subprocess.run([str(python), "-c", script, *names], capture_output=True, text=True, timeout=300,
                          env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": "/usr/bin:/bin"}, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, True, True, False]


def test_rdagents_time_settings_agree_and_follow_the_paper() -> None:
    env = load_spec("rdagent").env
    assert env["DS_FULL_TIMEOUT"] == env["DS_FULL_RECOMMEND_TIMEOUT"] == "{exec_timeout_s}"
    plan = load_plan("original-main")
    requests = expand(plan, select_tasks=lambda selector: ["ldct-iqa", "ravir"], read_config=lambda ref: {})
    rdagent = {r.options.exec_timeout for r in requests if r.agent == "rdagent"}
    aide = {r.options.exec_timeout for r in requests if r.agent == "aideml"}
    assert rdagent == {"1h"}  # rdagent's own full_timeout (3600 s), as the paper ran it
    assert aide == {"9h"}


def test_the_relay_answers_a_providers_host_through_the_proxy_and_nothing_else(tmp_path: Path) -> None:
    """The real OpenAI SDK, given no base URL at all, reaches the relay through HTTPS_PROXY (the forwarder's port)
    and trusts it through SSL_CERT_FILE; another host is still refused."""
    seen = Seen()
    folder = Path(tempfile.mkdtemp(prefix="rexmle-tls-"))
    try:
        tls = ProviderTLS(folder)
        assert not any(p.suffix == ".key" for p in folder.iterdir())  # no key where the sandbox can read
        model = Model(ScriptedBackend(seen), retry=RetryPolicy(max_attempts=1))
        relay = RelayServer(folder, {"gpt-5-x": Route("gpt-5-x", "code", "openai/gpt-5", model)}, tls=tls,
                            record=lambda message, **data: None)
        client = ("import openai, sys\n"
                  "c = openai.OpenAI(max_retries=0)\n"
                  "r = c.responses.create(model='gpt-5-x', input='hi', reasoning={'effort': 'low'})\n"
                  "print('ANSWER', r.output_text)\n"
                  "import httpx2\n"
                  "try:\n"
                  "    httpx2.get('https://example.com/', timeout=10)\n"
                  "except Exception as exc:\n"
                  "    print('REFUSED', type(exc).__name__)\n")
        port = 18000 + (hash(str(tmp_path)) % 1000)
        proxy = f"http://127.0.0.1:{port}"
        with relay:
            done = subprocess.run(
                [sys.executable, str(FORWARDER), "--socket", str(relay.socket_path), "--port", str(port),
                 "--env", f"HTTPS_PROXY={proxy}", "--env", f"SSL_CERT_FILE={folder / CA_FILE}",
                 "--env", "OPENAI_API_KEY=unused", "--env", "NO_PROXY=127.0.0.1", "--",
                 sys.executable, "-c", client], capture_output=True, text=True, timeout=120, check=False)
        assert "ANSWER" in done.stdout, done.stdout + done.stderr
        assert "REFUSED" in done.stdout
        assert len(seen.calls) == 1
        assert relay.stats.refused == 1
        ssl.create_default_context(cafile=str(folder / CA_FILE))  # a certificate the client could load
    finally:
        shutil.rmtree(folder, ignore_errors=True)



@pytest.mark.slow
def test_rdagent_takes_its_schema_path_with_a_paper_model(data_root: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """rdagent with GPT-5 (given as openai/gpt-5): its JSON calls carry their response_format, its proposal calls
    the pydantic schema (json_schema), both reaching the model; under the neutral name LiteLLM knows nothing and
    rdagent dropped them all."""
    from rexmle_agents.external.envs import ensure_environment

    ensure_environment(load_spec("rdagent"), source="rdagent")  # ~8 min once, then cached
    monkeypatch.setenv("OPENAI_API_KEY", "sk-rexmle-test-openai-0123456789")
    formats: list[Any] = []
    scenario = {"Task Type": "Regression", "Data Type": "Image", "Brief Description": "CT quality scores",
                "Dataset Description": "tif slices", "Submission Specifications": "image_id,quality_score",
                "Submission channel number to each sample": 1, "Metric Evaluation": "correlations",
                "Metric Name": "score", "Metric Direction": True, "Longer time limit required": False}

    def answer(messages: Any, tools: Any, config: Any) -> ModelResponse:
        formats.append(config.extra.get("response_format"))
        text = json.dumps(scenario) if len(formats) == 1 else "not the JSON rdagent wants"
        return ModelResponse(text=text, usage=Usage(input_tokens=10, output_tokens=10))

    spec = build_spec(TASK, agent="rdagent", models={"code": "openai/gpt-5"}, seed=0,
                      agent_config={"chat_temperature": 1.0},  # LiteLLM refuses another for GPT-5
                      limits=Limits(time_limit_s=600), sandbox="bwrap", data_root=data_root, group="test")
    outcome = execute_run(spec, tmp_path / "runs", grace_s=5.0,
                          models={"code": Model(ScriptedBackend(answer, name="openai/gpt-5"),
                                                retry=RetryPolicy(max_attempts=1))})
    assert formats, outcome.reason
    assert formats[0] == {"type": "json_object"}, formats
    schemas = [f for f in formats[1:] if isinstance(f, dict) and f.get("type") == "json_schema"]
    assert schemas, formats
