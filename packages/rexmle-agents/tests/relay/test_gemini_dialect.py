"""The relay's Gemini API dialect (Gemini CLI speaks it): a ``GenerateContentRequest`` becomes rexmle's messages,
tools and settings (function calls matched to their results by id or by name, thoughts dropped, the forced tool
choice and a response schema carried over), the answer goes back as a ``GenerateContentResponse`` whole or as
server-sent events, ``:countTokens`` is an estimate, and every refusal on a Gemini path has Google's error shape:
parsed and rendered directly, then through a real :class:`RelayServer` on its Unix socket."""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from rexmle_agents.models import Budget, Model, ModelResponse, RetryPolicy, ScriptedBackend, Usage, UsageLedger
from rexmle_agents.models.types import ToolCall
from rexmle_agents.relay import RelayServer, Route
from rexmle_agents.relay.gemini import (
    GEMINI,
    api_of_path,
    error_body,
    estimate_tokens,
    match_path,
    parse_gemini,
    render_gemini,
    stream_gemini,
)
from rexmle_agents.relay.protocol import ProtocolError
from rexmle_agents.relay.server import RelayLimits

ALIAS = "rexmle-code"
# how the Google GenAI SDK (Gemini CLI's) cuts a server-sent event stream into answers: one JSON line each
SDK_EVENT = re.compile(r"^\s*data: (.*)(?:\n\n|\r\r|\r\n\r\n)")

SHELL = {"name": "run_shell_command", "description": "Run a shell command",
         "parametersJsonSchema": {"type": "object", "properties": {"command": {"type": "string"}},
                                  "required": ["command"]}}
READ = {"name": "read_file", "description": "Read a file",
        "parameters": {"type": "OBJECT", "properties": {"file_path": {"type": "STRING"},
                                                        "lines": {"type": "ARRAY", "items": {"type": "INTEGER"}}}}}


def conversation() -> dict[str, Any]:
    """A Gemini CLI-like request: two tool rounds (the first call without an id, as the API's own answers come,
    the second with the id the relay gave), thoughts and thought signatures on the model's parts."""
    return {
        "systemInstruction": {"parts": [{"text": "You are Gemini CLI."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "<session_context>"}, {"text": "train a model"}]},
            {"role": "model", "parts": [{"text": "planning...", "thought": True},
                                        {"text": "Listing the data."},
                                        {"functionCall": {"name": "run_shell_command", "args": {"command": "ls"}},
                                         "thoughtSignature": "c2lnbmF0dXJl"}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "run_shell_command",
                                                             "response": {"output": "train test"}}}]},
            {"role": "model", "parts": [{"functionCall": {"id": "call-7", "name": "read_file",
                                                          "args": {"file_path": "/workspace/a.txt"}}},
                                        {"thoughtSignature": "c2ln"}]},
            {"role": "user", "parts": [{"functionResponse": {"id": "call-7", "name": "read_file",
                                                             "response": {"output": "hello"}}},
                                       {"text": "keep going"}]},
        ],
        "tools": [{"functionDeclarations": [SHELL, READ]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["run_shell_command"]}},
        "generationConfig": {"temperature": 0.5, "maxOutputTokens": 256, "stopSequences": ["END"], "topP": 0.9,
                             "thinkingConfig": {"includeThoughts": True},
                             "responseMimeType": "application/json",
                             "responseJsonSchema": {"type": "object",
                                                    "properties": {"model_choice": {"enum": ["flash", "pro"]}}}},
    }


def test_a_conversation_parses_into_rexmles_messages_tools_and_settings() -> None:
    request = parse_gemini(conversation(), model=ALIAS, stream=True)
    assert (request.api, request.model, request.stream) == (GEMINI, ALIAS, True)
    roles = [(m.role, m.content) for m in request.messages]
    assert roles == [("system", "You are Gemini CLI."), ("user", "<session_context>\ntrain a model"),
                     ("assistant", "Listing the data."), ("tool", "train test"), ("assistant", ""),
                     ("tool", "hello"), ("user", "keep going")]
    first, second = request.messages[2].tool_calls[0], request.messages[4].tool_calls[0]
    # the id-less call got an id from its position, and the result that named only the function answers it
    assert (first.id, first.name, first.arguments) == ("gemini-call-1-2", "run_shell_command", {"command": "ls"})
    assert request.messages[3].tool_call_id == first.id
    assert (second.id, request.messages[5].tool_call_id) == ("call-7", "call-7")
    # the same conversation gives the same ids (a replay's key is made of them)
    assert parse_gemini(conversation(), model=ALIAS, stream=True) == request
    # only the allowed function is offered, and it must be called; an OpenAPI schema is offered as JSON Schema
    assert request.tool_choice == "run_shell_command"
    assert [t.name for t in request.tools] == ["run_shell_command"]
    read = parse_gemini({**conversation(), "toolConfig": None}, model=ALIAS, stream=False).tools[1]
    assert read.parameters == {"type": "object", "properties": {"file_path": {"type": "string"},
                                                                "lines": {"type": "array",
                                                                          "items": {"type": "integer"}}}}
    config = request.config
    assert (config.temperature, config.max_tokens, config.stop) == (0.5, 256, ("END",))
    schema = conversation()["generationConfig"]["responseJsonSchema"]
    assert config.extra == {"response_format": {"type": "json_schema",
                                                "json_schema": {"name": "response", "schema": schema}}}


def test_results_are_matched_to_their_calls_by_id_first_then_by_name_oldest_first() -> None:
    def call(name: str, **extra: Any) -> dict[str, Any]:
        return {"functionCall": {"name": name, "args": {}, **extra}}

    def result(name: str, output: str, **extra: Any) -> dict[str, Any]:
        return {"functionResponse": {"name": name, "response": {"output": output}, **extra}}

    body = {"contents": [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [call("ls"), call("ls"), call("cat", id="c9")]},
        # the second ls answered by its id (the one the relay made), then the other by name, then cat by its id
        {"role": "user", "parts": [result("ls", "second", id="gemini-call-1-1"), result("ls", "first"),
                                   result("cat", "cat", id="c9")]},
    ]}
    messages = parse_gemini(body, model=ALIAS, stream=False).messages
    assert [(m.tool_call_id, m.content) for m in messages[2:]] == [("gemini-call-1-1", "second"),
                                                                   ("gemini-call-1-0", "first"), ("c9", "cat")]
    # a call answered twice is refused: the second result has nothing left to answer
    body["contents"][2]["parts"].append(result("cat", "again", id="c9"))
    with pytest.raises(ProtocolError, match="no earlier functionCall"):
        parse_gemini(body, model=ALIAS, stream=False)


@pytest.mark.parametrize(("calling", "choice", "offered"), [
    ({"mode": "AUTO"}, None, ["run_shell_command", "read_file"]),
    ({"mode": "NONE"}, "none", ["run_shell_command", "read_file"]),
    ({"mode": "ANY"}, "required", ["run_shell_command", "read_file"]),
    ({"mode": "ANY", "allowedFunctionNames": ["read_file"]}, "read_file", ["read_file"]),
    ({"mode": "ANY", "allowedFunctionNames": ["read_file", "run_shell_command"]}, "required",
     ["run_shell_command", "read_file"]),
])
def test_the_function_calling_mode_is_the_tool_choice(calling: dict[str, Any], choice: str | None,
                                                      offered: list[str]) -> None:
    body = {**conversation(), "toolConfig": {"functionCallingConfig": calling}}
    request = parse_gemini(body, model=ALIAS, stream=False)
    assert request.tool_choice == choice and [t.name for t in request.tools] == offered


@pytest.mark.parametrize("key", ["responseSchema", "responseJsonSchema"])
def test_a_response_schema_in_the_apis_own_schema_dialect_is_passed_on_as_json_schema(key: str) -> None:
    """Gemini CLI's router writes OpenAPI type names even in its responseJsonSchema (seen from 0.61.0)."""
    schema = {"type": "OBJECT", "properties": {"complexity_reasoning": {"type": "STRING"},
                                               "complexity_score": {"type": "INTEGER"}},
              "required": ["complexity_reasoning", "complexity_score"]}
    body = {"contents": [{"role": "user", "parts": [{"text": "route"}]}],
            "generationConfig": {"responseMimeType": "application/json", key: schema}}
    extra = parse_gemini(body, model=ALIAS, stream=False).config.extra
    assert extra["response_format"]["json_schema"]["schema"] == {
        "type": "object", "properties": {"complexity_reasoning": {"type": "string"},
                                         "complexity_score": {"type": "integer"}},
        "required": ["complexity_reasoning", "complexity_score"]}
    body["generationConfig"] = {"responseMimeType": "application/json"}
    assert parse_gemini(body, model=ALIAS, stream=False).config.extra == {"response_format": {"type": "json_object"}}


@pytest.mark.parametrize(("body", "expected"), [
    ({"contents": []}, "non-empty list"),
    ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "expected user or model"),
    ({"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {}}}]}]},
     "that no earlier functionCall of the model made"),
    ({"contents": [{"role": "user", "parts": [{"functionCall": {"name": "ls"}}]}]}, "only the model calls"),
    ({"contents": [{"role": "user", "parts": [{"text": "x"}]}], "tools": [{"googleSearch": {}}]},
     "'googleSearch' tool"),
    ({"contents": [{"role": "user", "parts": [{"executableCode": {"code": "1"}}]}]}, "executableCode part"),
    ({"contents": [{"role": "user", "parts": [{"text": "x"}]}], "cachedContent": "cachedContents/1"},
     "cachedContent is not supported"),
    ({"contents": [{"role": "user", "parts": [{"text": "x"}]}],
      "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["nope"]}}}, "'nope'"),
])
def test_what_the_dialect_cannot_translate_is_refused_with_the_reason(body: dict[str, Any], expected: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(expected)):
        parse_gemini(body, model=ALIAS, stream=False)


def test_media_parts_reach_the_model_as_a_note() -> None:
    png = {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}
    body = {"contents": [{"role": "user", "parts": [{"text": "look:"}, png]},
                         {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {}}}]},
                         {"role": "user", "parts": [{"functionResponse": {"name": "read_file",
                                                                          "response": {"output": "read x.png"},
                                                                          "parts": [png]}}]}]}
    messages = parse_gemini(body, model=ALIAS, stream=False).messages
    assert messages[0].content.startswith("look:\n[image/png omitted: the model relay of this run passes text only")
    assert messages[2].role == "tool" and messages[2].content.startswith("read x.png\n[image/png omitted")
    assert not any("iVBOR" in m.content for m in messages)


def answer_with_calls() -> ModelResponse:
    return ModelResponse(text="Running it.", usage=Usage(input_tokens=120, output_tokens=30, cached_input_tokens=20),
                         tool_calls=(ToolCall(id="call_0", name="run_shell_command", arguments={"command": "ls"}),),
                         finish_reason="tool_calls", id="resp-1")


def test_an_answer_renders_as_a_generate_content_response_that_parses_back() -> None:
    request = parse_gemini(conversation(), model=ALIAS, stream=False)
    rendered = render_gemini(request, answer_with_calls())
    candidate = rendered["candidates"][0]
    assert candidate["content"] == {"role": "model", "parts": [
        {"text": "Running it."}, {"functionCall": {"id": "call_0", "name": "run_shell_command",
                                                   "args": {"command": "ls"}}}]}
    assert candidate["finishReason"] == "STOP"  # Gemini ends a turn of function calls with STOP too
    assert rendered["usageMetadata"] == {"promptTokenCount": 120, "candidatesTokenCount": 30, "totalTokenCount": 150,
                                         "cachedContentTokenCount": 20}
    assert (rendered["modelVersion"], rendered["responseId"]) == (ALIAS, "resp-1")
    # the answer, sent back as the conversation's next model turn, is the same assistant message (its ids kept)
    history = {"contents": [{"role": "user", "parts": [{"text": "go"}]}, candidate["content"],
                            {"role": "user", "parts": [{"functionResponse": {
                                "id": "call_0", "name": "run_shell_command", "response": {"output": "a b"}}}]}]}
    parsed = parse_gemini(history, model=ALIAS, stream=False).messages
    assert parsed[1] == answer_with_calls().message and parsed[2].tool_call_id == "call_0"
    truncated = render_gemini(request, ModelResponse(text="cut", finish_reason="length"))
    assert truncated["candidates"][0]["finishReason"] == "MAX_TOKENS"


def sdk_events(stream: bytes) -> list[dict[str, Any]]:
    """The answers a Google GenAI SDK reads from a stream, cut the way it cuts them."""
    buffer, answers = stream.decode(), []
    while (found := SDK_EVENT.match(buffer)) is not None:
        answers.append(json.loads(found.group(1)))
        buffer = buffer[found.end():]
    assert buffer == ""  # nothing the SDK would leave unread
    return answers


def test_a_streamed_answer_is_text_then_calls_with_the_finish_reason_and_usage_last() -> None:
    request = parse_gemini(conversation(), model=ALIAS, stream=True)
    events = sdk_events(b"".join(stream_gemini(request, answer_with_calls())))
    assert [e["candidates"][0]["content"]["parts"] for e in events] == [
        [{"text": "Running it."}],
        [{"functionCall": {"id": "call_0", "name": "run_shell_command", "args": {"command": "ls"}}}]]
    assert "finishReason" not in events[0]["candidates"][0] and "usageMetadata" not in events[0]
    assert events[-1]["candidates"][0]["finishReason"] == "STOP"
    assert events[-1]["usageMetadata"]["totalTokenCount"] == 150
    text_only = sdk_events(b"".join(stream_gemini(request, ModelResponse(text="Done.", usage=Usage(input_tokens=1)))))
    assert len(text_only) == 1 and text_only[0]["candidates"][0]["content"]["parts"] == [{"text": "Done."}]
    assert text_only[0]["candidates"][0]["finishReason"] == "STOP"


def test_paths_and_error_shapes() -> None:
    assert match_path("/v1beta/models/rexmle-code:streamGenerateContent") == (ALIAS, "streamGenerateContent")
    assert match_path("/v1/models/rexmle%2Dcode:countTokens/") == (ALIAS, "countTokens")
    assert match_path("/v1beta/models/rexmle-code:embedContent") is None  # not served, but still Gemini's
    assert api_of_path("/v1beta/models/rexmle-code:embedContent") == GEMINI
    assert api_of_path("/v1/messages") == "anthropic" and api_of_path("/v1/chat/completions") == "chat"
    assert error_body(GEMINI, 402, "budget_exhausted", "spent") == {
        "error": {"code": 402, "message": "spent (budget_exhausted)", "status": "FAILED_PRECONDITION"}}
    assert error_body("chat", 402, "budget_exhausted", "spent")["error"]["type"] == "budget_exhausted"
    counted = estimate_tokens({"generateContentRequest": {"contents": [{"parts": [{"text": "é" * 300}]}]}})
    assert counted == math.ceil((len("parts") + len("text") + 600) / 3)


# ---------------------------------------------------------------------------------------------------------------
# through the relay


class Relay:
    def __init__(self, tmp: Path, answer: Any, *, budget: Budget | None = None, **limits: Any) -> None:
        self.journal = tmp / "journal.jsonl"
        self.backend = ScriptedBackend(answer)
        self.ledger = UsageLedger(journal=self.journal, budget=budget)
        model = Model(self.backend, retry=RetryPolicy(max_attempts=1), ledger=self.ledger)
        self.folder = Path(tempfile.mkdtemp(prefix="rexmle-relay-test-"))
        self.records: list[tuple[str, dict[str, Any]]] = []
        self.server = RelayServer(self.folder, {ALIAS: Route(ALIAS, "code", "scripted/model", model)},
                                  record=lambda message, **data: self.records.append((message, data)),
                                  limits=RelayLimits(**limits))

    def post(self, path: str, body: Any, **kwargs: Any) -> httpx2.Response:
        transport = httpx2.HTTPTransport(uds=str(self.server.socket_path))
        with httpx2.Client(transport=transport, timeout=30) as http:
            return http.post(f"http://relay{path}", json=body, headers={"x-goog-api-key": "unused"}, **kwargs)

    def model_calls(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        return [e for e in map(json.loads, self.journal.read_text().splitlines()) if e["kind"] == "model_call"]


def scripted(messages: Any, tools: Any, config: Any) -> ModelResponse:
    if config.extra.get("response_format"):
        return ModelResponse(text='{"model_choice": "flash"}', usage=Usage(input_tokens=10, output_tokens=5))
    return answer_with_calls()


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Relay]:
    made = Relay(tmp_path, scripted, budget=Budget(max_tokens=400), max_body_bytes=200_000)
    with made.server:
        yield made
    shutil.rmtree(made.folder, ignore_errors=True)


def test_generate_content_through_the_relay_whole_and_streamed(relay: Relay) -> None:
    body = {**conversation(), "toolConfig": None, "generationConfig": {"temperature": 0.2}}
    whole = relay.post(f"/v1beta/models/{ALIAS}:generateContent", body)
    assert whole.status_code == 200, whole.text
    assert whole.json()["candidates"][0]["content"]["parts"][1]["functionCall"]["name"] == "run_shell_command"
    assert whole.json()["usageMetadata"]["promptTokenCount"] == 120
    messages, tools, config = relay.backend.requests[-1]
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "user"]
    assert [t.name for t in tools] == ["run_shell_command", "read_file"] and config.temperature == 0.2

    streamed = relay.post(f"/v1beta/models/{ALIAS}:streamGenerateContent?alt=sse", body)
    assert streamed.status_code == 200 and streamed.headers["content-type"] == "text/event-stream"
    events = sdk_events(streamed.content)
    assert events[-1]["candidates"][0]["finishReason"] == "STOP" and events[-1]["usageMetadata"]
    # a schema'd side call (Gemini CLI's router) reaches the model with its schema, and is answered as JSON text
    routed = relay.post(f"/v1beta/models/{ALIAS}:generateContent", {
        "contents": [{"role": "user", "parts": [{"text": "which model?"}]}],
        "generationConfig": {"responseMimeType": "application/json",
                             "responseJsonSchema": {"type": "object", "properties": {"model_choice": {}}}}})
    assert json.loads(routed.json()["candidates"][0]["content"]["parts"][0]["text"]) == {"model_choice": "flash"}
    # every call is journaled with its usage
    calls = relay.model_calls()
    assert [c["usage"]["input_tokens"] for c in calls] == [120, 120, 10]
    assert relay.server.stats.calls == 3 and relay.server.stats.streamed == 1


def test_count_tokens_through_the_relay_is_an_estimate_without_a_model_call(relay: Relay) -> None:
    counted = relay.post(f"/v1beta/models/{ALIAS}:countTokens",
                         {"contents": [{"role": "user", "parts": [{"text": "abc" * 100}]}]})
    assert counted.status_code == 200
    assert counted.json() == {"totalTokens": math.ceil((300 + len("roleuserpartstext")) / 3)}  # keys count too
    assert relay.backend.requests == [] and relay.model_calls() == [] and relay.server.stats.token_counts == 1
    unknown = relay.post("/v1beta/models/gemini-2.5-flash:countTokens", {"contents": []})
    assert unknown.status_code == 404 and unknown.json()["error"]["status"] == "NOT_FOUND"


def google_error(reply: httpx2.Response) -> dict[str, Any]:
    """The error of a reply, checked to have exactly Google's shape."""
    error = reply.json()["error"]
    assert set(reply.json()) == {"error"} and set(error) == {"code", "message", "status"}
    assert error["code"] == reply.status_code
    return error


def test_refusals_on_gemini_paths_have_googles_error_shape(relay: Relay) -> None:
    simple = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    unknown = relay.post("/v1beta/models/gemini-2.5-pro:generateContent", simple)
    assert google_error(unknown)["status"] == "NOT_FOUND" and "rexmle-code" in unknown.json()["error"]["message"]
    bad = relay.post(f"/v1beta/models/{ALIAS}:generateContent", {"contents": "hi"})
    assert google_error(bad)["status"] == "INVALID_ARGUMENT" and "contents must be a list" in bad.text
    not_json = relay.post(f"/v1beta/models/{ALIAS}:generateContent", None, content=b"{nope")
    assert google_error(not_json)["status"] == "INVALID_ARGUMENT" and "not JSON" in not_json.text
    other = relay.post(f"/v1beta/models/{ALIAS}:embedContent", simple)
    assert google_error(other)["status"] == "NOT_FOUND"
    too_big = relay.post(f"/v1beta/models/{ALIAS}:generateContent",
                         {"contents": [{"role": "user", "parts": [{"text": "x" * 300_000}]}]})
    assert too_big.status_code == 413 and google_error(too_big)["status"] == "INVALID_ARGUMENT"
    assert relay.backend.requests == []

    # a spent budget: 402 (which Gemini CLI does not retry), not RESOURCE_EXHAUSTED (a quota it waits out)
    for _ in range(3):
        relay.post(f"/v1beta/models/{ALIAS}:generateContent", simple)
    spent = relay.post(f"/v1beta/models/{ALIAS}:streamGenerateContent?alt=sse", simple)
    assert spent.status_code == 402 and google_error(spent)["status"] == "FAILED_PRECONDITION"
    assert "budget_exhausted" in spent.json()["error"]["message"]
    assert len(relay.model_calls()) == 3  # 3 x 150 tokens spent the 400


def test_a_streamed_call_starts_at_once_and_keeps_alive_while_the_model_works(tmp_path: Path) -> None:
    """Gemini CLI drops an answer whose headers take over 60 s and sends the call again (paid twice): a streamed
    Gemini call gets its headers before the model has answered, keep-alive comments while it works, then the
    answer's events (the keep-alives are bare newlines: the SDK skips whitespace before `data:`, and would stall on
    an SSE comment line); a spent budget is still an HTTP 402 before anything starts."""
    import socket
    import time

    def slow(messages: Any, tools: Any, config: Any) -> ModelResponse:
        time.sleep(1.5)
        return answer_with_calls()

    made = Relay(tmp_path, slow, budget=Budget(max_tokens=150), keepalive_s=0.3)
    body = json.dumps(conversation()).encode()
    with made.server:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(made.server.socket_path))
        started = time.monotonic()
        client.sendall(f"POST /v1beta/models/{ALIAS}:streamGenerateContent?alt=sse HTTP/1.1\r\nHost: relay\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        first = client.recv(65536)
        headers_after = time.monotonic() - started
        received = first
        while chunk := client.recv(65536):
            received += chunk
        client.close()
        assert first.startswith(b"HTTP/1.1 200") and headers_after < 1.2  # before the model's 1.5 s were over
        _, _, stream = received.partition(b"\r\n\r\n")
        assert stream.startswith(b"\n\n")  # keep-alives came while the model worked
        events = sdk_events(stream)
        assert events[-1]["candidates"][0]["finishReason"] == "STOP"
        assert len(made.model_calls()) == 1 and made.server.stats.calls == 1
        # the budget is spent now (120 + 30 tokens of 150): the next call is refused before its stream starts
        refused = made.post(f"/v1beta/models/{ALIAS}:streamGenerateContent?alt=sse", conversation())
        assert refused.status_code == 402 and google_error(refused)["status"] == "FAILED_PRECONDITION"
    shutil.rmtree(made.folder, ignore_errors=True)
