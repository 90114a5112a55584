"""The OpenAI responses API backend against a loopback server speaking its wire format."""

from __future__ import annotations

import pytest

from rexmle_agents.models import GenerateConfig, Message, ToolCall, ToolSpec, get_model
from rexmle_grade.errors import ConfigurationError, ModelAPIError


@pytest.fixture
def model(server, fast_retry):
    return get_model(
        "openai/gpt-5-mini", api="responses", api_key="sk-test", base_url=server.url + "/v1", retry=fast_retry
    )


def test_text_function_calls_and_exact_usage(model, server, wire):
    server.json(
        wire.response("Checking.", function_calls=[("call_1", "run", '{"cmd": "ls"}')], usage=(2000, 300, 1500))
    )
    reply = model.generate(
        [Message.system("Be brief."), Message.user("go")],
        tools=[ToolSpec(name="run", parameters={"type": "object", "properties": {"cmd": {"type": "string"}}})],
        config=GenerateConfig(max_tokens=512),
    )
    assert reply.text == "Checking."
    assert reply.tool_calls == (ToolCall(id="call_1", name="run", arguments={"cmd": "ls"}),)
    assert reply.finish_reason == "tool_calls"
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.cached_input_tokens) == (2000, 300, 1500)
    # gpt-5-mini: $0.25 per million uncached input, $0.025 cached, $2 output
    assert reply.cost_usd == pytest.approx((500 * 0.25 + 1500 * 0.025 + 300 * 2.0) / 1e6)
    [request] = server.requests
    assert request.path == "/v1/responses"
    assert request.body["store"] is False
    assert request.body["max_output_tokens"] == 512
    assert request.body["input"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "go"}]
    tool = request.body["tools"][0]
    assert (tool["type"], tool["name"], tool["strict"]) == ("function", "run", False)


def test_tool_round_trip_is_sent_as_items(model, server, wire):
    server.json(wire.response("ok"))
    call = ToolCall(id="call_1", name="run", arguments={"cmd": "ls"})
    model.generate(
        [
            Message.user("go"),
            Message(role="assistant", content="Looking.", tool_calls=(call,)),
            Message.tool("call_1", "a.txt"),
        ]
    )
    assert server.requests[0].body["input"][1:] == [
        {"role": "assistant", "content": "Looking."},
        {"type": "function_call", "call_id": "call_1", "name": "run", "arguments": '{"cmd": "ls"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
    ]


def test_stream_takes_the_completed_response(model, server, wire):
    final = wire.response("Hello there", usage=(40, 5, 0))
    server.sse(wire.response_stream(final, ["Hello", " there"]))
    reply = model.generate("hi", config=GenerateConfig(stream=True))
    assert reply.text == "Hello there"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (40, 5)
    assert server.requests[0].body["stream"] is True


def test_stream_cut_off_before_completion_is_retried(model, server, wire):
    final = wire.response("whole")
    server.sse(wire.response_stream(final, ["wh"])[:-1])
    server.sse(wire.response_stream(final, ["whole"]))
    assert model.generate("hi", config=GenerateConfig(stream=True)).text == "whole"
    assert len(server.requests) == 2


def test_incomplete_response_reports_length(model, server, wire):
    server.json(wire.response("trunc", status="incomplete", incomplete_reason="max_output_tokens"))
    assert model.generate("hi").finish_reason == "length"


def test_failed_response_with_server_error_is_retried(model, server, wire):
    server.json(wire.response(status="failed", error={"code": "server_error", "message": "oops"}))
    server.json(wire.response("recovered"))
    assert model.generate("hi").text == "recovered"


def test_failed_response_with_a_prompt_error_is_permanent(model, server, wire):
    server.json(wire.response(status="failed", error={"code": "invalid_prompt", "message": "not allowed"}))
    with pytest.raises(ModelAPIError, match="invalid_prompt: not allowed"):
        model.generate("hi")
    assert len(server.requests) == 1


def test_stop_sequences_are_refused_before_any_request(model, server):
    with pytest.raises(ConfigurationError, match="no stop sequences"):
        model.generate("hi", config=GenerateConfig(stop=("END",)))
    assert server.requests == []


def test_missing_usage_counts_as_unknown(model, server, wire):
    body = wire.response("fine")
    body["usage"] = None
    server.json(body)
    reply = model.generate("hi")
    assert reply.text == "fine" and reply.usage_known is False and reply.cost_usd is None
