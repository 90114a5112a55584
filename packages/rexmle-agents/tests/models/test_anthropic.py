"""The Anthropic messages backend against a loopback server speaking its wire format."""

from __future__ import annotations

import pytest

from rexmle_agents.models import GenerateConfig, Message, ToolCall, ToolSpec, get_model
from rexmle_grade.errors import ModelAPIError


@pytest.fixture
def model(server, fast_retry):
    return get_model("anthropic/claude-haiku-4-5", api_key="sk-ant-test", base_url=server.url, retry=fast_retry)


def test_text_tool_use_and_cache_tokens(model, server, wire, caplog):
    server.json(
        wire.anthropic_message(
            "Running it.",
            tool_uses=[("toolu_1", "run", {"cmd": "ls"})],
            usage=(500, 80, 3000, 200),
            stop_reason="tool_use",
        )
    )
    reply = model.generate(
        [Message.system("You are an agent."), Message.user("List files.")],
        tools=[ToolSpec(name="run", description="Run a command.", parameters={"type": "object"})],
        config=GenerateConfig(max_tokens=1024, temperature=0.2, stop=("END",)),
    )
    assert reply.text == "Running it."
    assert reply.tool_calls == (ToolCall(id="toolu_1", name="run", arguments={"cmd": "ls"}),)
    assert reply.finish_reason == "tool_calls"
    usage = reply.usage
    assert (usage.input_tokens, usage.cached_input_tokens, usage.cache_write_input_tokens) == (3700, 3000, 200)
    assert usage.output_tokens == 80
    # claude-haiku-4-5: $1 uncached input, $0.10 cache read, $1.25 cache write, $5 output, per million
    assert reply.cost_usd == pytest.approx((500 * 1 + 3000 * 0.10 + 200 * 1.25 + 80 * 5) / 1e6)
    [request] = server.requests
    assert request.path == "/v1/messages"
    assert request.headers["authorization"] == "Bearer sk-ant-test"
    assert request.body["system"] == "You are an agent."
    assert request.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "List files."}]}]
    assert request.body["tools"] == [
        {"name": "run", "description": "Run a command.", "input_schema": {"type": "object"}}
    ]
    assert request.body["max_tokens"] == 1024
    assert "temperature" not in request.body  # the messages API has none; the drop is logged
    assert "no temperature setting" in caplog.text
    assert request.body["stop_sequences"] == ["END"]


def test_tool_results_of_one_turn_travel_together(model, server, wire):
    server.json(wire.anthropic_message("ok"))
    calls = (ToolCall(id="t1", name="run", arguments={"cmd": "a"}), ToolCall(id="t2", name="run", arguments={}))
    model.generate(
        [
            Message.user("go"),
            Message(role="assistant", content="Both.", tool_calls=calls),
            Message.tool("t1", "out a"),
            Message.tool("t2", "out b"),
            Message.user("and now?"),
        ]
    )
    turns = server.requests[0].body["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert turns[1]["content"] == [
        {"type": "text", "text": "Both."},
        {"type": "tool_use", "id": "t1", "name": "run", "input": {"cmd": "a"}},
        {"type": "tool_use", "id": "t2", "name": "run", "input": {}},
    ]
    assert turns[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "out a"},
        {"type": "tool_result", "tool_use_id": "t2", "content": "out b"},
        {"type": "text", "text": "and now?"},
    ]


def test_default_max_tokens_is_sent(model, server, wire):
    server.json(wire.anthropic_message("ok"))
    model.generate("hi")
    assert server.requests[0].body["max_tokens"] == 8192


def test_stream_assembles_text_tool_input_and_usage(model, server, wire):
    server.sse(
        wire.anthropic_stream(
            ["Hel", "lo"],
            tool_uses=[("toolu_2", "run", ['{"cmd":', ' "pwd"}'])],
            usage=(12, 34, 100, 0),
            stop_reason="tool_use",
        )
    )
    reply = model.generate("hi", config=GenerateConfig(stream=True))
    assert reply.text == "Hello"
    assert reply.tool_calls == (ToolCall(id="toolu_2", name="run", arguments={"cmd": "pwd"}),)
    assert (reply.usage.input_tokens, reply.usage.cached_input_tokens, reply.usage.output_tokens) == (112, 100, 34)
    assert reply.finish_reason == "tool_calls"
    assert server.requests[0].body["stream"] is True


def test_overloaded_is_retried(model, server, wire):
    server.json({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, status=529)
    server.json(wire.anthropic_message("fine"))
    assert model.generate("hi").text == "fine"
    assert len(server.requests) == 2


def test_error_event_mid_stream_is_retried(model, server, wire):
    events = wire.anthropic_stream(["par"])[:3]
    server.sse([*events, ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})])
    server.sse(wire.anthropic_stream(["whole"]))
    assert model.generate("hi", config=GenerateConfig(stream=True)).text == "whole"
    assert len(server.requests) == 2


@pytest.mark.parametrize("events_sent", [0, 5])
def test_stream_cut_off_before_the_end_is_retried(model, server, wire, events_sent):
    server.sse(wire.anthropic_stream(["half"])[:events_sent])
    server.sse(wire.anthropic_stream(["whole"]))
    assert model.generate("hi", config=GenerateConfig(stream=True)).text == "whole"


def test_rate_limit_honours_retry_after(model, server, wire):
    server.json(
        {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}},
        status=429,
        headers={"retry-after-ms": "150"},
    )
    server.json(wire.anthropic_message("ok"))
    assert model.generate("hi").retry_time_s >= 0.15


def test_bad_key_is_permanent_and_names_the_variable(model, server):
    server.json(
        {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}, status=401
    )
    with pytest.raises(ModelAPIError, match=r"HTTP 401.*invalid x-api-key") as info:
        model.generate("hi")
    assert "ANTHROPIC_API_KEY" in info.value.hint
    assert len(server.requests) == 1


def test_malformed_body_is_a_permanent_error(model, server):
    server.raw('{"id": "msg_1", "content": [{"type": "text", "te')
    with pytest.raises(ModelAPIError, match="malformed response"):
        model.generate("hi")
    assert len(server.requests) == 1
