"""Faults injected on the loopback server, each through the real openai and anthropic SDKs."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from rexmle_agents.models import GenerateConfig, UsageLedger, get_model
from rexmle_grade.errors import ModelAPIError

PROVIDERS = ["openai/gpt-5", "anthropic/claude-haiku-4-5"]


def make(provider: str, url: str, retry, **kwargs):
    base_url = url + "/v1" if provider.startswith("openai") else url
    return get_model(provider, api_key="sk-test", base_url=base_url, retry=retry, **kwargs)


def whole_stream(provider: str, wire, text: str):
    return wire.chat_stream([text]) if provider.startswith("openai") else wire.anthropic_stream([text])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_retry_after_longer_than_the_retry_budget_ends_the_call_at_once(provider, server, fast_retry):
    model = make(provider, server.url, replace(fast_retry, max_total_s=300))
    server.error(429, "slow down", headers={"Retry-After": "600"})
    started = time.monotonic()
    with pytest.raises(ModelAPIError) as info:
        model.generate("hi")
    assert time.monotonic() - started < 2.0  # the 600 s were never slept
    message = str(info.value)
    assert "the server asked to wait 600 s" in message
    assert "left of the retry budget" in message and "max_total_s=300" in message
    assert "stopped without waiting after 1 attempt(s)" in message and "HTTP 429" in message
    assert "try again in 600 s" in info.value.hint
    assert len(server.requests) == 1


def test_retry_after_that_outlasts_what_is_left_of_the_budget_stops_too(server, wire, fast_retry):
    model = make("openai/gpt-5", server.url, replace(fast_retry, max_total_s=1.0))
    server.error(503, headers={"retry-after-ms": "400"})  # fits the budget: waited
    server.error(429, headers={"retry-after-ms": "800"})  # 0.4 s spent, 0.8 s asked, 0.6 s left: not waited
    started = time.monotonic()
    with pytest.raises(ModelAPIError, match=r"asked to wait 0\.8 s .*stopped without waiting after 2 attempt"):
        model.generate("hi")
    assert 0.4 <= time.monotonic() - started < 1.1  # the 0.8 s wait was not slept
    assert len(server.requests) == 2


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_server_that_never_answers_ends_in_a_timeout_error(provider, stream, silent_server, fast_retry):
    model = make(provider, silent_server.url, fast_retry, timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(ModelAPIError) as info:
        model.generate("hi", config=GenerateConfig(stream=stream))
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert "timed out: 3 of 3 attempt(s) got no answer within 0.3 s; gave up after " in message
    assert "GenerateConfig.timeout_s" in info.value.hint and "max_attempts=3" in info.value.hint
    assert 0.9 <= elapsed < 3.0  # three bounded attempts, not a hang
    assert silent_server.connections == 3


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_connection_reset_mid_stream_is_retried(provider, server, wire, fast_retry, caplog):
    events = whole_stream(provider, wire, "half")
    server.sse(events[:4], reset=True)
    server.sse(whole_stream(provider, wire, "whole"))
    model = make(provider, server.url, fast_retry)
    reply = model.generate("hi", config=GenerateConfig(stream=True))
    assert reply.text == "whole"
    assert len(server.requests) == 2
    assert "attempt 1 failed" in caplog.text and "reset" in caplog.text.lower()


def test_anthropic_reply_without_usage_counts_as_unknown(server, wire, fast_retry, tmp_path, caplog):
    journal = tmp_path / "journal.jsonl"
    ledger = UsageLedger(journal=journal)
    model = make("anthropic/claude-haiku-4-5", server.url, fast_retry, ledger=ledger)
    body = wire.anthropic_message("fine")
    del body["usage"]
    server.json(body)
    server.json(wire.anthropic_message("counted", usage=(50, 20, 0, 0)))
    reply = model.generate("hi")
    assert reply.text == "fine"
    assert reply.usage_known is False and reply.usage.total_tokens == 0
    assert reply.cost_usd is None  # a priced model, but the cost of an unknown usage is unknown
    assert "reports no token usage" in caplog.text
    model.generate("again")
    totals = ledger.totals()
    assert (totals.calls, totals.unknown_usage_calls, totals.uncosted_calls) == (2, 1, 1)
    assert totals.usage.total_tokens == 70
    assert totals.cost_usd == pytest.approx((50 * 1 + 20 * 5) / 1e6)
    first, second = (json.loads(line) for line in journal.read_text().splitlines())
    assert first["usage_known"] is False and first["cost_usd"] is None
    assert second["usage_known"] is True and second["run_totals"]["unknown_usage_calls"] == 1


def test_anthropic_stream_without_usage_counts_as_unknown(server, wire, fast_retry, caplog):
    events = wire.anthropic_stream(["str", "eam"], tool_uses=[("toolu_1", "run", ['{"cmd": "ls"}'])])
    del events[0][1]["message"]["usage"]
    del events[-2][1]["usage"]
    server.sse(events)
    model = make("anthropic/claude-haiku-4-5", server.url, fast_retry, ledger=UsageLedger())
    reply = model.generate("hi", config=GenerateConfig(stream=True))
    assert reply.text == "stream" and reply.tool_calls[0].arguments == {"cmd": "ls"}
    assert reply.usage_known is False and reply.cost_usd is None
    assert model.ledger.totals().unknown_usage_calls == 1
    assert "reports no token usage" in caplog.text
