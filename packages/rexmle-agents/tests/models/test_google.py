"""The google provider: Gemini through its OpenAI-compatible endpoint, against a loopback server."""

from __future__ import annotations

import logging

import pytest

from rexmle_agents.models import GenerateConfig, Message, ToolCall, ToolSpec, UsageLedger, get_model
from rexmle_agents.models.google_backend import BASE_URL
from rexmle_grade.errors import ConfigurationError

TOOLS = [ToolSpec(name="run", description="Run a shell command.", parameters={"type": "object"})]
SIGNATURE = {"google": {"thought_signature": "c2lnbmF0dXJl"}}


@pytest.fixture
def model(server, fast_retry):
    return get_model(
        "google/gemini-2.5-pro", api_key="gm-test", base_url=server.url + "/v1beta/openai", retry=fast_retry
    )


def with_thinking(body: dict, *, reasoning: int, folded: bool) -> dict:
    """Usage as Gemini reports it: total_tokens counts the thinking, completion_tokens may or may not."""
    usage = body["usage"]
    if folded:
        usage["completion_tokens"] += reasoning
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"] + (0 if folded else reasoning)
    usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return body


@pytest.mark.parametrize("folded", [False, True])
def test_tool_call_and_usage_with_thinking_tokens(model, server, wire, folded):
    body = wire.chat_completion(
        "Looking.",
        tool_calls=[("call_a", "run", '{"cmd": "ls"}')],
        usage=(1000, 50, 200),
        finish_reason="tool_calls",
        model="gemini-2.5-pro",
    )
    server.json(with_thinking(body, reasoning=300, folded=folded))
    reply = model.generate(
        [Message.system("You are an agent."), Message.user("List files.")],
        tools=TOOLS,
        config=GenerateConfig(max_tokens=512),
    )
    assert reply.text == "Looking."
    assert reply.tool_calls == (ToolCall(id="call_a", name="run", arguments={"cmd": "ls"}),)
    assert reply.finish_reason == "tool_calls"
    # thinking is billed as output whether or not completion_tokens already counted it
    usage = reply.usage
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (1000, 200, 350)
    assert reply.usage_known
    [request] = server.requests
    assert request.path == "/v1beta/openai/chat/completions"
    assert request.headers["authorization"] == "Bearer gm-test"
    assert request.body["model"] == "gemini-2.5-pro"
    assert request.body["max_tokens"] == 512 and "max_completion_tokens" not in request.body
    assert request.body["tools"][0]["function"]["name"] == "run"


def test_thought_signatures_go_back_with_their_tool_calls(model, server, wire):
    body = wire.chat_completion(None, tool_calls=[("call_a", "run", '{"cmd": "ls"}'), ("call_b", "run", "{}")])
    body["choices"][0]["message"]["tool_calls"][0]["extra_content"] = SIGNATURE
    server.json(body)
    server.json(wire.chat_completion("done"))
    first = model.generate("go", tools=TOOLS)
    model.generate([Message.user("go"), first.message, Message.tool("call_a", "a.txt"), Message.tool("call_b", "")])
    sent = server.requests[1].body["messages"][1]["tool_calls"]
    assert sent[0]["extra_content"] == SIGNATURE
    assert "extra_content" not in sent[1]  # only the calls that came with one


def test_stream_assembles_tool_calls_signatures_and_usage(model, server, wire):
    events = wire.chat_stream(["Hel", "lo"], tool_calls=[("call_s", "run", ['{"cmd"', ': "pwd"}'])], usage=(70, 9, 0))
    head = next(
        e for _, e in events if isinstance(e, dict) and e["choices"] and "tool_calls" in e["choices"][0]["delta"]
    )
    head["choices"][0]["delta"]["tool_calls"][0]["extra_content"] = SIGNATURE
    events[-2][1]["usage"]["total_tokens"] = 70 + 9 + 40  # 40 thinking tokens not in completion_tokens
    server.sse(events)
    server.json(wire.chat_completion("next"))
    reply = model.generate("hi", tools=TOOLS, config=GenerateConfig(stream=True))
    assert reply.text == "Hello"
    assert reply.tool_calls == (ToolCall(id="call_s", name="run", arguments={"cmd": "pwd"}),)
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (70, 49)
    assert server.requests[0].body["stream_options"] == {"include_usage": True}
    model.generate([Message.user("hi"), reply.message, Message.tool("call_s", "/")])
    assert server.requests[1].body["messages"][1]["tool_calls"][0]["extra_content"] == SIGNATURE


def test_rate_limit_then_success(model, server, wire, caplog):
    server.json(
        [{"error": {"code": 429, "message": "Resource has been exhausted", "status": "RESOURCE_EXHAUSTED"}}],
        status=429,
        headers={"retry-after": "0.2"},
    )
    server.json(wire.chat_completion("ok", usage=(10, 2, 0)))
    with caplog.at_level(logging.WARNING, logger="rexmle_agents.models.base"):
        reply = model.generate("hi")
    assert reply.text == "ok" and reply.retry_time_s >= 0.2
    assert len(server.requests) == 2
    assert "HTTP 429" in caplog.text and "as the server asked" in caplog.text


def test_missing_usage_is_unknown(model, server, wire):
    server.json(wire.chat_completion("hi", usage=None))
    ledger = UsageLedger()
    model.ledger = ledger
    assert model.generate("hi").usage_known is False
    assert ledger.totals().unknown_usage_calls == 1


def test_record_and_replay(server, wire, fast_retry, tmp_path):
    cassette = tmp_path / "gemini.jsonl"
    server.json(wire.chat_completion("recorded", tool_calls=[("c", "run", "{}")], usage=(5, 3, 0)))
    url = server.url + "/v1beta/openai"
    live = get_model("google/gemini-2.5-flash", api_key="k", base_url=url, retry=fast_retry, record_to=cassette)
    recorded = live.generate("hi", tools=TOOLS)
    server.stop()
    replayed = get_model("google/gemini-2.5-flash", replay_from=cassette).generate("hi", tools=TOOLS)
    assert replayed.model_dump(exclude={"retry_time_s"}) == recorded.model_dump(exclude={"retry_time_s"})


def test_default_endpoint_and_key_from_the_environment(monkeypatch):
    with pytest.raises(ConfigurationError, match="GEMINI_API_KEY is not set"):
        get_model("google/gemini-2.5-pro")
    monkeypatch.setenv("GEMINI_API_KEY", "gm-env")
    backend = get_model("google/gemini-2.5-pro").backend
    assert str(backend._client.base_url) == BASE_URL
    assert backend._client.api_key == "gm-env"
