"""The azure provider: Azure OpenAI deployments through the openai SDK's Azure client, against a loopback server."""

from __future__ import annotations

import logging

import pytest

from rexmle_agents.models import Budget, GenerateConfig, ToolCall, ToolSpec, UsageLedger, get_model, load_prices
from rexmle_grade.errors import ConfigurationError, ModelAPIError

TOOLS = [ToolSpec(name="run", description="Run a shell command.", parameters={"type": "object"})]
VERSION = "2025-04-01-preview"


@pytest.fixture
def azure_env(monkeypatch, server):
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", server.url)
    monkeypatch.setenv("OPENAI_API_VERSION", VERSION)
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "az-key")


@pytest.fixture
def model(azure_env, fast_retry):
    return get_model("azure/my-gpt5", retry=fast_retry, ledger=UsageLedger())


def test_chat_goes_to_the_deployment_with_key_and_version(model, server, wire):
    server.json(
        wire.chat_completion(
            "Looking.",
            tool_calls=[("call_1", "run", '{"cmd": "ls"}')],
            usage=(900, 30, 100),
            finish_reason="tool_calls",
        )
    )
    reply = model.generate("List files.", tools=TOOLS, config=GenerateConfig(max_tokens=64))
    assert reply.tool_calls == (ToolCall(id="call_1", name="run", arguments={"cmd": "ls"}),)
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.cached_input_tokens) == (900, 30, 100)
    # priced as the model the deployment answered as (gpt-5-2025-08-07 -> openai/gpt-5's list price)
    assert reply.cost_usd == pytest.approx((800 * 1.25 + 100 * 0.125 + 30 * 10.0) / 1e6)
    assert model.ledger.totals().uncosted_calls == 0 and model.ledger.totals().unknown_usage_calls == 0
    [request] = server.requests
    assert request.path == f"/openai/deployments/my-gpt5/chat/completions?api-version={VERSION}"
    assert request.headers["api-key"] == "az-key"
    assert request.body["max_completion_tokens"] == 64


def test_stream(model, server, wire):
    server.sse(wire.chat_stream(["Hel", "lo"], tool_calls=[("c9", "run", ['{"a"', ": 1}"])], usage=(11, 7, 0)))
    reply = model.generate("hi", tools=TOOLS, config=GenerateConfig(stream=True))
    assert reply.text == "Hello" and reply.tool_calls[0].arguments == {"a": 1}
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (11, 7)


def test_rate_limit_then_success(model, server, wire, caplog):
    server.error(
        429, "Requests to the ChatCompletions_Create Operation have exceeded", headers={"retry-after-ms": "150"}
    )
    server.json(wire.chat_completion("ok"))
    with caplog.at_level(logging.WARNING, logger="rexmle_agents.models.base"):
        reply = model.generate("hi")
    assert reply.text == "ok" and reply.retry_time_s >= 0.15
    assert "HTTP 429" in caplog.text


def test_bad_key_names_the_azure_variable(model, server):
    server.error(401, "Access denied due to invalid subscription key")
    with pytest.raises(ModelAPIError, match="HTTP 401") as info:
        model.generate("hi")
    assert "AZURE_OPENAI_API_KEY" in info.value.hint


def test_responses_api(azure_env, server, wire, fast_retry):
    server.json(wire.response("answer", usage=(40, 8, 0)))
    reply = get_model("azure/my-gpt5", api="responses", retry=fast_retry).generate("hi")
    assert reply.text == "answer" and reply.usage.output_tokens == 8
    assert server.requests[0].path == f"/openai/responses?api-version={VERSION}"
    assert server.requests[0].body["model"] == "my-gpt5"


def test_record_and_replay(azure_env, server, wire, fast_retry, tmp_path):
    cassette = tmp_path / "azure.jsonl"
    server.json(wire.chat_completion("recorded", usage=(5, 3, 0)))
    recorded = get_model("azure/dep", retry=fast_retry, record_to=cassette).generate("hi")
    server.stop()
    replayed = get_model("azure/dep", replay_from=cassette).generate("hi")
    assert replayed.model_dump(exclude={"retry_time_s"}) == recorded.model_dump(exclude={"retry_time_s"})


def test_api_version_may_come_from_the_azure_variable(monkeypatch, server, wire, fast_retry):
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", server.url)
    monkeypatch.setenv("AZURE_OPENAI_API_VERSION", "2024-10-21")
    server.json(wire.chat_completion("ok"))
    get_model("azure/dep", api_key="k", retry=fast_retry).generate("hi")
    assert server.requests[0].path.endswith("?api-version=2024-10-21")


@pytest.mark.parametrize(
    ("env", "missing"),
    [
        ({"OPENAI_API_VERSION": VERSION}, "AZURE_OPENAI_ENDPOINT is not set"),
        ({"AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com"}, "neither OPENAI_API_VERSION nor AZURE_OPENAI_API"),
        ({"AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com", "OPENAI_API_VERSION": VERSION}, None),
    ],
)
def test_missing_settings_are_named(monkeypatch, env, missing):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=missing or "AZURE_OPENAI_API_KEY is not set"):
        get_model("azure/dep", api_key=None if missing is None else "k")


def test_a_deployment_serving_an_unpriced_model_is_counted_in_tokens(model, server, wire):
    server.json(wire.chat_completion("ok", model="my-finetune-2025"))
    assert model.generate("hi").cost_usd is None
    assert model.ledger.totals().uncosted_calls == 1


def test_a_money_budget_needs_a_price_for_the_model_the_deployment_serves(azure_env, server, wire, fast_retry):
    model = get_model("azure/dep", retry=fast_retry, ledger=UsageLedger(budget=Budget(max_cost_usd=1.0)))
    server.json(wire.chat_completion("ok", model="gpt-4o-2024-08-06"))
    assert model.generate("hi").cost_usd == pytest.approx((100 * 2.5 + 20 * 10.0) / 1e6)
    server.json(wire.chat_completion("ok", model="my-finetune-2025"))
    with pytest.raises(ConfigurationError, match="answered as model 'my-finetune-2025', which has no price"):
        model.generate("hi")
    assert model.ledger.totals().calls == 2 and model.ledger.totals().uncosted_calls == 1  # its tokens still count


def test_a_priced_deployment_uses_its_own_entry(azure_env, server, wire, fast_retry, tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text("as_of: 2026-01-01\nsources: [contract]\nmodels:\n  azure/dep: {input: 2.0, output: 20.0}\n")
    server.json(wire.chat_completion("ok", usage=(1000, 100, 0)))
    reply = get_model("azure/dep", retry=fast_retry, prices=load_prices(path)).generate("hi")
    assert reply.cost_usd == pytest.approx((1000 * 2.0 + 100 * 20.0) / 1e6)
