"""The OpenAI chat completions backend against a loopback server speaking its wire format."""

from __future__ import annotations

import logging

import pytest

from rexmle_agents.models import GenerateConfig, Message, ToolCall, ToolSpec, get_model
from rexmle_grade.errors import ModelAPIError

TOOLS = [ToolSpec(name="run", description="Run a shell command.", parameters={"type": "object"})]


@pytest.fixture
def model(server, fast_retry):
    return get_model("openai/gpt-5", api_key="sk-test", base_url=server.url + "/v1", retry=fast_retry, timeout_s=5)


def test_text_and_tool_calls_with_exact_tokens_and_cost(model, server, wire):
    server.json(
        wire.chat_completion(
            "Let me look.",
            tool_calls=[("call_1", "run", '{"cmd": "ls"}')],
            usage=(1000, 200, 400),
            finish_reason="tool_calls",
        )
    )
    reply = model.generate(
        [Message.system("You are an agent."), Message.user("List the files.")],
        tools=TOOLS,
        config=GenerateConfig(max_tokens=256, temperature=0.5),
    )
    assert reply.text == "Let me look."
    assert reply.tool_calls == (ToolCall(id="call_1", name="run", arguments={"cmd": "ls"}),)
    assert reply.finish_reason == "tool_calls"
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.cached_input_tokens) == (1000, 200, 400)
    # gpt-5: $1.25 per million uncached input, $0.125 cached, $10 output
    assert reply.cost_usd == pytest.approx((600 * 1.25 + 400 * 0.125 + 200 * 10) / 1e6)
    assert reply.model == "gpt-5-2025-08-07"
    [request] = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.body["model"] == "gpt-5"
    assert request.body["max_completion_tokens"] == 256
    assert request.body["temperature"] == 0.5
    assert request.body["messages"] == [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "List the files."},
    ]
    assert request.body["tools"][0]["function"]["name"] == "run"


def test_tool_round_trip_is_sent_in_chat_format(model, server, wire):
    server.json(wire.chat_completion("done"))
    call = ToolCall(id="call_1", name="run", arguments={"cmd": "ls"})
    model.generate(
        [
            Message.user("go"),
            Message(role="assistant", tool_calls=(call,)),
            Message.tool("call_1", "a.txt"),
        ]
    )
    sent = server.requests[0].body["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}],
    }
    assert sent[2] == {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}


def test_stream_assembles_text_tool_calls_and_usage(model, server, wire):
    server.sse(
        wire.chat_stream(
            ["Hel", "lo"],
            tool_calls=[("call_9", "run", ['{"cmd"', ': "pwd"}'])],
            usage=(321, 45, 300),
            finish_reason="tool_calls",
        )
    )
    reply = model.generate("hi", tools=TOOLS, config=GenerateConfig(stream=True))
    assert reply.text == "Hello"
    assert reply.tool_calls == (ToolCall(id="call_9", name="run", arguments={"cmd": "pwd"}),)
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.cached_input_tokens) == (321, 45, 300)
    assert reply.finish_reason == "tool_calls"
    body = server.requests[0].body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_rate_limit_is_retried_after_the_servers_retry_after(model, server, wire, caplog):
    server.error(429, "slow down", headers={"retry-after-ms": "200"})
    server.json(wire.chat_completion("ok", usage=(10, 2, 0)))
    with caplog.at_level(logging.WARNING, logger="rexmle_agents.models.base"):
        reply = model.generate("hi")
    assert reply.text == "ok"
    assert reply.usage.input_tokens == 10  # the failed attempt used nothing
    assert reply.retry_time_s >= 0.2
    assert len(server.requests) == 2
    [log] = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert "HTTP 429" in log.getMessage() and "0.20 s" in log.getMessage() and "as the server asked" in log.getMessage()


def test_retry_after_in_seconds_is_honoured(model, server, wire):
    server.error(503, headers={"Retry-After": "1"})
    server.json(wire.chat_completion("ok"))
    assert model.generate("hi").retry_time_s >= 1.0


def test_server_error_before_a_stream_is_retried(model, server, wire):
    server.error(500, "internal")
    server.sse(wire.chat_stream(["fine"]))
    reply = model.generate("hi", config=GenerateConfig(stream=True))
    assert reply.text == "fine"
    assert len(server.requests) == 2


def test_error_event_mid_stream_is_retried(model, server, wire, caplog):
    server.sse([*wire.chat_stream(["par"])[:2], (None, {"error": {"message": "overloaded", "type": "server_error"}})])
    server.sse(wire.chat_stream(["whole"]))
    with caplog.at_level(logging.WARNING):
        assert model.generate("hi", config=GenerateConfig(stream=True)).text == "whole"
    assert "the stream reported an error: overloaded" in caplog.text


@pytest.mark.parametrize("events_sent", [0, 2])
def test_stream_cut_off_before_the_end_is_retried(model, server, wire, events_sent):
    server.sse(wire.chat_stream(["half", "way"])[:events_sent])  # closed before finish_reason and [DONE]
    server.sse(wire.chat_stream(["whole"]))
    assert model.generate("hi", config=GenerateConfig(stream=True)).text == "whole"
    assert len(server.requests) == 2


def test_timeout_is_retried(model, server, wire):
    server.json(wire.chat_completion("late"), delay_s=1.0)
    server.json(wire.chat_completion("on time"))
    reply = model.generate("hi", config=GenerateConfig(timeout_s=0.2))
    assert reply.text == "on time"
    assert reply.retry_time_s >= 0.2


def test_persistent_failure_gives_up_with_a_clear_error(model, server):
    for _ in range(3):
        server.error(502, "bad gateway")
    with pytest.raises(ModelAPIError, match=r"gave up after 3 attempt\(s\).*HTTP 502.*bad gateway") as info:
        model.generate("hi")
    assert "max_attempts=3" in info.value.hint
    assert len(server.requests) == 3


def test_retry_after_beyond_the_retry_budget_stops_at_once(model, server):
    server.error(429, headers={"retry-after": "120"})
    with pytest.raises(ModelAPIError, match=r"asked to wait 120 s .*stopped without waiting after 1 attempt\(s\)"):
        model.generate("hi")
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("status", "hint"),
    [(400, "fix the request"), (401, "OPENAI_API_KEY"), (404, "model name"), (422, "fix the request")],
)
def test_client_errors_are_not_retried(model, server, status, hint):
    server.error(status, "nope")
    with pytest.raises(ModelAPIError, match=f"HTTP {status}.*nope") as info:
        model.generate("hi")
    assert hint in info.value.hint
    assert len(server.requests) == 1


def test_malformed_json_body_is_a_permanent_error(model, server):
    server.raw('{"id": "chatcmpl-1", "choices": [')
    with pytest.raises(ModelAPIError, match="malformed response"):
        model.generate("hi")
    assert len(server.requests) == 1


def test_non_json_body_is_a_permanent_error(model, server):
    server.raw("<html>proxy error</html>", content_type="text/html")
    with pytest.raises(ModelAPIError, match=r"malformed response.*proxy error"):
        model.generate("hi")


def test_completion_without_choices_is_malformed(model, server):
    server.json({"id": "x", "object": "chat.completion", "model": "m", "choices": []})
    with pytest.raises(ModelAPIError, match="no choices"):
        model.generate("hi")


def test_malformed_stream_event_is_a_permanent_error(model, server, wire):
    server.sse([wire.chat_stream(["a"])[0], (None, "{not json")])
    with pytest.raises(ModelAPIError, match="malformed response"):
        model.generate("hi", config=GenerateConfig(stream=True))


def test_bad_tool_arguments_are_kept_for_the_agent(model, server, wire):
    server.json(wire.chat_completion(None, tool_calls=[("c1", "run", "{cmd: ls"), ("c2", "run", "[1]")]))
    first, second = model.generate("hi").tool_calls
    assert first.arguments == {} and "not valid JSON" in first.parse_error and "{cmd: ls" in first.parse_error
    assert "must be a JSON object" in second.parse_error


def test_missing_usage_counts_as_unknown_with_a_warning(model, server, wire, caplog):
    server.json(wire.chat_completion("hi", usage=None))
    with caplog.at_level(logging.WARNING):
        reply = model.generate("hi")
    assert reply.usage.total_tokens == 0 and reply.usage_known is False
    assert reply.cost_usd is None  # gpt-5 is priced, but not knowing the tokens means not knowing the cost
    assert "reports no token usage" in caplog.text


def test_openai_compatible_server_needs_no_key_and_gets_max_tokens(server, wire, fast_retry):
    server.json(wire.chat_completion("local answer", model="qwen3:8b"))
    model = get_model(f"openai-compatible/qwen3:8b@{server.url}/v1", retry=fast_retry)
    reply = model.generate("hi", config=GenerateConfig(max_tokens=64, extra={"top_k": 20}))
    assert reply.text == "local answer"
    assert reply.cost_usd is None  # no price for local models
    body = server.requests[0].body
    assert body["model"] == "qwen3:8b"
    assert body["max_tokens"] == 64 and "max_completion_tokens" not in body
    assert body["top_k"] == 20
