"""Three parts of the Anthropic dialect that Claude Code speaks, spoken by the real Anthropic SDK over the relay's
socket: ``POST /v1/messages/count_tokens`` is answered with an estimate (UTF-8 bytes of the request's text / 3)
without a model call, a cost or a budget; a mid-conversation ``system`` message (Claude Code 2.1 sends one after
the first user turn) reaches the model as a system message instead of being refused; and an image or document in a
tool result (its Read tool on a PNG or a PDF) reaches the model as a note instead of ending the session with a 400.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from rexmle_agents.models import Budget, Model, ModelResponse, RetryPolicy, ScriptedBackend, Usage, UsageLedger
from rexmle_agents.relay import RelayServer, Route

ALIAS = "rexmle-code"


def answer(messages: Any, tools: Any, config: Any) -> ModelResponse:
    return ModelResponse(text="ok", usage=Usage(input_tokens=50, output_tokens=5), model="scripted")


class Relay:
    def __init__(self, tmp: Path, *, budget: Budget | None = None) -> None:
        self.journal = tmp / "journal.jsonl"
        self.backend = ScriptedBackend(answer)
        self.ledger = UsageLedger(journal=self.journal, budget=budget)
        model = Model(self.backend, retry=RetryPolicy(max_attempts=1), ledger=self.ledger)
        self.folder = Path(tempfile.mkdtemp(prefix="rexmle-relay-test-"))
        self.records: list[tuple[str, dict[str, Any]]] = []
        self.server = RelayServer(self.folder, {ALIAS: Route(ALIAS, "code", "scripted/model", model)},
                                  record=lambda message, **data: self.records.append((message, data)))

    def http(self) -> httpx2.Client:
        return httpx2.Client(transport=httpx2.HTTPTransport(uds=str(self.server.socket_path)))

    def client(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(api_key="unused", base_url="http://relay", http_client=self.http(), max_retries=0)

    def model_calls(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        return [e for e in map(json.loads, self.journal.read_text().splitlines()) if e["kind"] == "model_call"]


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Relay]:
    made = Relay(tmp_path, budget=Budget(max_tokens=100))
    with made.server:
        yield made
    shutil.rmtree(made.folder, ignore_errors=True)


def test_count_tokens_is_an_estimate_without_a_model_call(relay: Relay) -> None:
    client = relay.client()
    text = "é" * 300  # 600 bytes of UTF-8: the estimate counts bytes, not characters
    tool = {"name": "Bash", "description": "run a command",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
    counted = client.messages.count_tokens(model=ALIAS, system="be brief",
                                           messages=[{"role": "user", "content": [{"type": "text", "text": text}]}])
    # every string of system, messages and tools (keys included): "be brief", the message's role, type and text
    text_bytes = len("be brief") + sum(len(s.encode()) for s in ("role", "user", "content", "type", "text", "text",
                                                                    text))
    assert counted.input_tokens == math.ceil(text_bytes / 3)
    with_tool = client.messages.count_tokens(model=ALIAS, system="be brief", tools=[tool],
                                             messages=[{"role": "user", "content": [{"type": "text", "text": text}]}])
    assert with_tool.input_tokens > counted.input_tokens  # the tools' text counts too
    # counting is not a model call: the backend saw nothing, the journal has no call, the budget is untouched
    assert relay.backend.requests == [] and relay.model_calls() == []
    assert relay.ledger.totals().usage.input_tokens == 0
    assert relay.server.stats.token_counts == 2 and relay.server.stats.calls == 0


def test_count_tokens_refuses_unknown_models_and_bad_bodies_in_anthropics_shape(relay: Relay) -> None:
    client = relay.client()
    with pytest.raises(anthropic.NotFoundError, match="rexmle-code"):
        client.messages.count_tokens(model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hi"}])
    with relay.http() as http:  # the SDK checks its own arguments: a raw body the relay must refuse
        reply = http.post("http://relay/v1/messages/count_tokens", json={"model": ALIAS, "messages": "hi"})
    assert reply.status_code == 400 and reply.json()["type"] == "error"
    assert "list of messages" in reply.json()["error"]["message"]
    assert relay.backend.requests == [] and relay.server.stats.token_counts == 0


def test_a_mid_conversation_system_message_reaches_the_model(relay: Relay) -> None:
    client = relay.client()
    reply = client.messages.create(model=ALIAS, max_tokens=50, system="you are an agent", messages=[
        {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        {"role": "system", "content": "Available agent types: none"},  # type: ignore[list-item]
    ])
    assert reply.content[0].text == "ok"
    sent = relay.backend.requests[-1][0]
    assert [(m.role, m.content) for m in sent] == [("system", "you are an agent"), ("user", "hello"),
                                                   ("system", "Available agent types: none")]
    # a role the dialect does not have is still refused, in Anthropic's error shape
    with pytest.raises(anthropic.BadRequestError, match="must have role user, assistant or system"):
        client.messages.create(model=ALIAS, max_tokens=50,
                               messages=[{"role": "tool", "content": "x"}])  # type: ignore[list-item]


def test_an_image_in_a_tool_result_reaches_the_model_as_a_note(relay: Relay) -> None:
    client = relay.client()
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    reply = client.messages.create(model=ALIAS, max_tokens=50, messages=[
        {"role": "user", "content": "look at it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read",
                                           "input": {"file_path": "/workspace/x.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "x.png:"},
                                                  {"type": "image", "source": png}]}]},
    ])
    assert reply.content[0].text == "ok"
    result = relay.backend.requests[-1][0][-1]
    assert (result.role, result.tool_call_id) == ("tool", "t1")
    assert result.content.startswith("x.png:[image omitted: the model relay of this run passes text only")
    assert "iVBOR" not in result.content
    # an image the user sends (not a tool's output) is still refused: nothing asked for it to be dropped
    with pytest.raises(anthropic.BadRequestError, match="block of type 'image'"):
        client.messages.create(model=ALIAS, max_tokens=50, messages=[
            {"role": "user", "content": [{"type": "image", "source": png}]}])
