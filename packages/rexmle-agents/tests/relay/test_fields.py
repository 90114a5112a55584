"""The request fields beyond the conversation (relay/fields.py), seen where they land: the provider's wire.

The real OpenAI and Anthropic SDKs talk to the relay; the relay's route is a real rexmle backend (chat completions,
responses API, Anthropic messages) pointed at a loopback server that keeps every request it gets. A field the
backend's API takes arrives there (translated between the OpenAI dialects); a field asking for what the relay cannot
return is a 400 naming it; a tuning field without an equivalent is not sent and the run is warned once.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from rexmle_agents.models import Model, RetryPolicy
from rexmle_agents.models.anthropic_backend import AnthropicBackend
from rexmle_agents.models.openai_backend import OpenAIChatBackend, OpenAIResponsesBackend
from rexmle_agents.relay import RelayServer, Route

_spec = importlib.util.spec_from_file_location("_rexmle_model_fakes", Path(__file__).parent.parent / "models"
                                               / "conftest.py")
assert _spec is not None and _spec.loader is not None  # a file of this test suite
_fakes = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _fakes  # dataclasses look their module up
_spec.loader.exec_module(_fakes)
FakeServer, Wire = _fakes.FakeServer, _fakes.Wire

ALIAS = "rexmle-code"
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
          "additionalProperties": False}
CHAT_FORMAT = {"type": "json_schema", "json_schema": {"name": "Answer", "schema": SCHEMA, "strict": True}}
ANTHROPIC_REPLY = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                   "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": None,
                   "usage": {"input_tokens": 5, "output_tokens": 2}}


class Setup:
    def __init__(self, wire: str) -> None:
        self.upstream = FakeServer()
        client = openai.OpenAI(api_key="test", base_url=self.upstream.url + "/v1", max_retries=0)
        if wire == "chat":
            backend: Any = OpenAIChatBackend("openai/gpt-5", "gpt-5", client=client, key_env="OPENAI_API_KEY",
                                             timeout_s=10)
            model_string = "openai/gpt-5"
        elif wire == "responses":
            backend = OpenAIResponsesBackend("openai/gpt-5", "gpt-5", client=client, key_env="OPENAI_API_KEY",
                                             timeout_s=10)
            model_string = "openai/gpt-5"
        else:
            backend = AnthropicBackend("anthropic/claude-sonnet-4-5", "claude-test", api_key="test",
                                       base_url=self.upstream.url, timeout_s=10)
            model_string = "anthropic/claude-sonnet-4-5"
        self.warnings: list[str] = []
        self.folder = Path(tempfile.mkdtemp(prefix="rexmle-fields-"))
        model = Model(backend, retry=RetryPolicy(max_attempts=1))
        self.relay = RelayServer(self.folder, {ALIAS: Route(ALIAS, "code", model_string, model)},
                                 warn=self.warnings.append, record=lambda message, **data: None)

    def http(self) -> httpx2.Client:
        return httpx2.Client(transport=httpx2.HTTPTransport(uds=str(self.relay.socket_path)))

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(api_key="unused", base_url="http://relay/v1", http_client=self.http(), max_retries=0)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(api_key="unused", base_url="http://relay", http_client=self.http(), max_retries=0)

    def sent(self) -> dict[str, Any]:
        assert self.upstream.requests, "the backend sent nothing upstream"
        return self.upstream.requests[-1].body


def _serving(wire: str) -> Iterator[Setup]:
    made = Setup(wire)
    with made.relay:
        yield made
    made.upstream.stop()
    shutil.rmtree(made.folder, ignore_errors=True)


@pytest.fixture(params=["chat", "responses", "messages"])
def setup(request: pytest.FixtureRequest) -> Iterator[Setup]:
    yield from _serving(request.param)


@pytest.fixture
def chat_setup() -> Iterator[Setup]:
    yield from _serving("chat")


@pytest.fixture
def messages_setup() -> Iterator[Setup]:
    yield from _serving("messages")


def _reply(setup: Setup) -> None:
    if isinstance(setup.relay.routes[ALIAS].model.backend, AnthropicBackend):
        setup.upstream.json(ANTHROPIC_REPLY)
    elif isinstance(setup.relay.routes[ALIAS].model.backend, OpenAIResponsesBackend):
        setup.upstream.json(Wire.response('{"answer": "ok"}'))
    else:
        setup.upstream.json(Wire.chat_completion('{"answer": "ok"}'))


def _wire(setup: Setup) -> str:
    backend = setup.relay.routes[ALIAS].model.backend
    return "messages" if isinstance(backend, AnthropicBackend) else (
        "responses" if isinstance(backend, OpenAIResponsesBackend) else "chat")


def test_chat_fields_arrive_in_the_backends_own_format(setup: Setup) -> None:
    """top_p, seed, reasoning_effort, response_format from a chat-completions client (rdagent's LiteLLM, AIDE's
    OpenAI backend): sent under the chat API's names, as the responses API's reasoning/text objects, and to the
    Anthropic API as top_p and output_format."""
    _reply(setup)
    fields: dict[str, Any] = {"top_p": 0.9, "seed": 7, "reasoning_effort": "high", "response_format": CHAT_FORMAT}
    setup.openai().chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "hi"}], **fields)
    sent = setup.sent()
    assert sent["top_p"] == 0.9
    if _wire(setup) == "chat":
        assert (sent["seed"], sent["reasoning_effort"], sent["response_format"]) == (7, "high", CHAT_FORMAT)
    elif _wire(setup) == "responses":
        assert sent["reasoning"] == {"effort": "high"}
        assert sent["text"]["format"] == {"type": "json_schema", "name": "Answer", "schema": SCHEMA, "strict": True}
        assert "seed" not in sent
        assert any("seed" in w for w in setup.warnings)  # not sent, and the run is told
    else:
        assert sent["output_format"] == {"type": "json_schema", "schema": SCHEMA}
        assert "seed" not in sent and "reasoning_effort" not in sent
        assert any("seed" in w for w in setup.warnings) and any("reasoning_effort" in w for w in setup.warnings)


@pytest.mark.parametrize("setup", ["chat", "responses"], indirect=True)
def test_responses_fields_arrive_in_the_backends_own_format(setup: Setup) -> None:
    """The responses API's reasoning.effort and text.format (AIDE's OpenAI path, Codex)."""
    _reply(setup)
    setup.openai().responses.create(model=ALIAS, input="hi", top_p=0.5, reasoning={"effort": "low"},
                                    text={"format": {"type": "json_schema", "name": "Answer", "schema": SCHEMA,
                                                     "strict": True}})
    sent = setup.sent()
    assert sent["top_p"] == 0.5
    if _wire(setup) == "chat":
        assert sent["reasoning_effort"] == "low" and sent["response_format"] == CHAT_FORMAT
    else:
        assert sent["reasoning"] == {"effort": "low"}
        assert sent["text"]["format"]["schema"] == SCHEMA


def test_anthropic_fields_arrive_and_have_no_openai_twin(setup: Setup) -> None:
    _reply(setup)
    setup.anthropic().messages.create(model=ALIAS, max_tokens=50, messages=[{"role": "user", "content": "hi"}],
                                      extra_body={"top_p": 0.8, "top_k": 20})  # this SDK has no arguments for them
    sent = setup.sent()
    assert sent["top_p"] == 0.8
    if _wire(setup) == "messages":
        assert sent["top_k"] == 20
    else:
        assert "top_k" not in sent and any("top_k" in w for w in setup.warnings)


@pytest.mark.parametrize("field,value", [("n", 2), ("logprobs", True), ("top_logprobs", 3),
                                         ("logit_bias", {"50256": -100})])
def test_fields_the_relay_cannot_honour_are_a_400_naming_them(chat_setup: Setup, field: str, value: Any) -> None:
    setup = chat_setup
    with pytest.raises(openai.BadRequestError) as caught:
        setup.openai().chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "hi"}],
                                               **{field: value})
    assert field in str(caught.value)
    assert not setup.upstream.requests  # nothing was sent upstream
    _reply(setup)  # their defaults ask for nothing more: answered
    extra = {"n": 1, "logprobs": False, "top_logprobs": 0, "logit_bias": {}}[field]
    setup.openai().chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "hi"}],
                                           **{field: extra})
    assert setup.upstream.requests


def test_a_response_format_the_anthropic_api_cannot_honour_is_a_400(messages_setup: Setup) -> None:
    setup = messages_setup
    with pytest.raises(openai.BadRequestError) as caught:
        setup.openai().chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "hi"}],
                                               response_format={"type": "json_object"})
    assert "response_format" in str(caught.value)
    assert not setup.upstream.requests


@pytest.mark.parametrize("setup", ["chat", "messages"], indirect=True)
def test_an_anthropic_output_format_arrives(setup: Setup) -> None:
    """LiteLLM asks Claude for rdagent's schema with the messages API's output_format (structured outputs)."""
    _reply(setup)
    setup.anthropic().messages.create(model=ALIAS, max_tokens=50, messages=[{"role": "user", "content": "hi"}],
                                      extra_body={"output_format": {"type": "json_schema", "schema": SCHEMA}})
    sent = setup.sent()
    if _wire(setup) == "messages":
        assert sent["output_format"] == {"type": "json_schema", "schema": SCHEMA}
    else:
        assert sent["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA}}


def test_gemini_generation_fields_arrive_and_extra_candidates_are_refused(chat_setup: Setup) -> None:
    setup = chat_setup
    _reply(setup)
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "generationConfig": {"topP": 0.7, "seed": 11, "candidateCount": 1}}
    with setup.http() as client:
        answered = client.post(f"http://relay/v1beta/models/{ALIAS}:generateContent", json=body)
        assert answered.status_code == 200, answered.text
        assert (setup.sent()["top_p"], setup.sent()["seed"]) == (0.7, 11)
        body["generationConfig"]["candidateCount"] = 2
        refused = client.post(f"http://relay/v1beta/models/{ALIAS}:generateContent", json=body)
    assert refused.status_code == 400 and "candidateCount" in refused.text
    assert len(setup.upstream.requests) == 1
