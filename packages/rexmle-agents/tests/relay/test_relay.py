"""The model relay, spoken to by the real OpenAI and Anthropic SDKs: the three APIs, plain and streamed, tool calls;
a spent budget answered with a 402 that the SDKs do not retry; an upstream fault retried by rexmle's Model; every
call in the journal; unknown names, bad requests and internet requests refused and recorded. The last test runs
the forwarder and a client inside bubblewrap: no host port is opened and no key is inside."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from rexmle_agents.models import (
    Budget,
    Model,
    ModelResponse,
    RetryPolicy,
    ScriptedBackend,
    ToolCall,
    TransientModelAPIError,
    Usage,
    UsageLedger,
)
from rexmle_agents.relay import FORWARDER, RelayServer, Route

ALIAS = "rexmle-code"
TOOL = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


def answer(messages: Any, tools: Any, config: Any) -> ModelResponse:
    if tools:
        call = ToolCall(id="call_1", name=tools[0].name, arguments={"x": 1})
        return ModelResponse(tool_calls=(call,), usage=Usage(input_tokens=7, output_tokens=3),
                             finish_reason="tool_calls", model="scripted")
    return ModelResponse(text="echo: " + messages[-1].content, usage=Usage(input_tokens=5, output_tokens=4),
                         model="scripted")


class Relay:
    def __init__(self, tmp: Path, backend: Any, *, budget: Budget | None = None,
                 retry: RetryPolicy | None = None) -> None:
        self.journal = tmp / "journal.jsonl"
        self.backend = backend
        self.ledger = UsageLedger(journal=self.journal, budget=budget)
        self.model = Model(backend, retry=retry or RetryPolicy(max_attempts=1), ledger=self.ledger)
        self.records: list[tuple[str, dict[str, Any]]] = []
        self.exhausted: list[str] = []
        self.folder = Path(tempfile.mkdtemp(prefix="rexmle-relay-test-"))
        self.server = RelayServer(self.folder, {ALIAS: Route(ALIAS, "code", "scripted/model", self.model)},
                                  record=lambda message, **data: self.records.append((message, data)),
                                  on_budget_exhausted=self.exhausted.append)

    def http(self) -> httpx2.Client:
        return httpx2.Client(transport=httpx2.HTTPTransport(uds=str(self.server.socket_path)))

    def openai(self, retries: int = 2) -> openai.OpenAI:
        return openai.OpenAI(api_key="unused", base_url="http://relay/v1", http_client=self.http(),
                             max_retries=retries)

    def anthropic(self, retries: int = 2) -> anthropic.Anthropic:
        return anthropic.Anthropic(api_key="unused", base_url="http://relay", http_client=self.http(),
                                   max_retries=retries)

    def model_calls(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        return [e for e in map(json.loads, self.journal.read_text().splitlines()) if e["kind"] == "model_call"]


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Relay]:
    made = Relay(tmp_path, ScriptedBackend(answer))
    with made.server:
        yield made
    shutil.rmtree(made.folder, ignore_errors=True)


def test_openai_chat_plain_streamed_and_tools(relay: Relay) -> None:
    client = relay.openai()
    reply = client.chat.completions.create(model=ALIAS, messages=[{"role": "system", "content": "be brief"},
                                                                  {"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "echo: hi"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (5, 4)
    chunks = list(client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "there"}],
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: there"
    assert chunks[-1].usage.total_tokens == 9
    forced = client.chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": "call it"}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": TOOL}}],
        tool_choice={"type": "function", "function": {"name": "f"}})
    call = forced.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("f", {"x": 1})
    assert forced.choices[0].finish_reason == "tool_calls"
    # the forced choice reached the backend in the chat format of the run's provider
    assert relay.backend.requests[-1][2].extra == {"tool_choice": {"type": "function", "function": {"name": "f"}}}
    # a conversation with the tool's answer comes back as rexmle messages
    client.chat.completions.create(model=ALIAS, messages=[
        {"role": "user", "content": "call it"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                               "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"}])
    sent = relay.backend.requests[-1][0]
    assert [m.role for m in sent] == ["user", "assistant", "tool"] and sent[1].tool_calls[0].arguments == {"x": 1}
    assert len(relay.model_calls()) == 4  # every call is a model_call event of the journal


def test_openai_responses_plain_streamed_and_tools(relay: Relay) -> None:
    client = relay.openai()
    reply = client.responses.create(model=ALIAS, instructions="be brief", input="hi")
    assert reply.output_text == "echo: hi" and reply.usage.total_tokens == 9
    with client.responses.stream(model=ALIAS, input=[{"role": "user", "content": "streamed"}]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "echo: streamed"
    called = client.responses.create(model=ALIAS, input="call it",
                                     tools=[{"type": "function", "name": "f", "parameters": TOOL}])
    call = next(item for item in called.output if item.type == "function_call")
    assert (call.name, json.loads(call.arguments), call.call_id) == ("f", {"x": 1}, "call_1")
    assert len(relay.model_calls()) == 3


def test_anthropic_messages_plain_streamed_and_tools(relay: Relay) -> None:
    client = relay.anthropic()
    reply = client.messages.create(model=ALIAS, max_tokens=50, system="be brief",
                                   messages=[{"role": "user", "content": "hi"}])
    assert reply.content[0].text == "echo: hi" and reply.stop_reason == "end_turn"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (5, 4)
    with client.messages.stream(model=ALIAS, max_tokens=50, messages=[{"role": "user", "content": "s"}]) as stream:
        assert stream.get_final_text() == "echo: s"
    called = client.messages.create(model=ALIAS, max_tokens=50, messages=[{"role": "user", "content": "call"}],
                                    tools=[{"name": "f", "input_schema": TOOL}], tool_choice={"type": "tool",
                                                                                             "name": "f"})
    assert called.stop_reason == "tool_use" and called.content[0].input == {"x": 1}
    assert len(relay.model_calls()) == 3


def test_a_spent_budget_is_a_402_that_clients_do_not_retry(tmp_path: Path) -> None:
    made = Relay(tmp_path, ScriptedBackend(answer), budget=Budget(max_tokens=9))
    with made.server:
        client = made.openai(retries=5)
        assert client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "a"}])
        with pytest.raises(openai.APIStatusError) as caught:  # the first call used the 9 tokens
            client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "b"}])
        assert caught.value.status_code == 402 and "token budget spent" in caught.value.message
        with pytest.raises(anthropic.APIStatusError) as again:
            made.anthropic(retries=5).messages.create(model=ALIAS, max_tokens=5,
                                                      messages=[{"role": "user", "content": "d"}])
        assert again.value.status_code == 402
    assert len(made.backend.requests) == 1  # nothing was retried, nothing more reached the model
    assert len(made.exhausted) == 1 and "token budget" in made.exhausted[0]
    refused = [data for _, data in made.records if data.get("relay") == "budget_exhausted"]
    assert len(refused) == 2 and all(d["status"] == 402 for d in refused)


def test_an_upstream_fault_is_retried_by_the_model(tmp_path: Path) -> None:
    fault = TransientModelAPIError("scripted: HTTP 503 from the provider", retry_after_s=0.01)
    made = Relay(tmp_path, ScriptedBackend([fault, "recovered"]),
                 retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01, jitter_s=0.0))
    with made.server:
        reply = made.openai(retries=0).chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "x"}])
    assert reply.choices[0].message.content == "recovered"
    assert len(made.backend.requests) == 2
    calls = made.model_calls()
    assert len(calls) == 1 and calls[0]["retry_time_s"] > 0


def test_a_fault_that_outlasts_the_retries_is_a_503(tmp_path: Path) -> None:
    fault = TransientModelAPIError("scripted: HTTP 500 from the provider", retry_after_s=0.0)
    made = Relay(tmp_path, ScriptedBackend([fault, fault]), retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.0))
    with made.server, pytest.raises(openai.InternalServerError) as caught:
        made.openai(retries=0).chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 503 and "gave up after 2 attempt(s)" in caught.value.message


def test_a_recorded_conversation_replays_through_the_relay(tmp_path: Path) -> None:
    """Calls through the relay are recorded like any model call and replay offline: a recorded run's agent gets
    the same answers (streamed or not: the cassette key ignores streaming)."""
    from rexmle_agents.models import RecordingBackend, ReplayBackend

    cassette = tmp_path / "cassette.jsonl"
    request = {"model": ALIAS, "messages": [{"role": "user", "content": "remember me"}],
               "tools": [{"type": "function", "function": {"name": "f", "parameters": TOOL}}]}
    recording = Relay(tmp_path / "a", RecordingBackend(ScriptedBackend(answer), cassette))
    (tmp_path / "a").mkdir()
    with recording.server:
        first = recording.openai().chat.completions.create(**request)
    (tmp_path / "b").mkdir()
    replaying = Relay(tmp_path / "b", ReplayBackend(cassette, "scripted/model"))
    with replaying.server:
        again = list(replaying.openai().chat.completions.create(**request, stream=True))
        with pytest.raises(openai.BadRequestError, match="has no response for this request"):
            replaying.openai().chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "new"}])
    call = next(c.choices[0].delta.tool_calls[0] for c in again if c.choices and c.choices[0].delta.tool_calls)
    assert call.function.arguments == first.choices[0].message.tool_calls[0].function.arguments
    assert len(replaying.model_calls()) == 1


def test_unknown_names_bad_requests_and_internet_requests_are_refused_and_recorded(relay: Relay) -> None:
    client = relay.openai(retries=0)
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert "rexmle-code" in unknown.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    http = relay.http()
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(str(relay.server.socket_path))
    raw.sendall(b"CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n\r\n")
    assert raw.recv(4096).startswith(b"HTTP/1.1 403")
    raw.close()
    assert http.get("http://relay/v1/models").json()["data"][0]["id"] == ALIAS
    kinds = [data.get("relay") for _, data in relay.records]
    assert kinds.count("model_not_found") == 1 and kinds.count("invalid_request_error") == 1
    assert any(data.get("target") == "api.openai.com:443" for _, data in relay.records)
    assert relay.backend.requests == []


def _listening_inodes() -> dict[int, int]:
    """Listening TCP sockets of this network namespace: inode -> port."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                found[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
    return found


def _own_socket_inodes() -> set[int]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


CLIENT = r'''
import json, os, socket, sys, urllib.request
import openai
client = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
    model="rexmle-code", messages=[{"role": "user", "content": "inside"}], stream=True) if c.choices)
try:
    urllib.request.urlopen("https://api.openai.com/v1/models", timeout=5)
    proxied = "reached"
except Exception as exc:
    proxied = type(exc).__name__ + ": " + str(exc)
try:
    socket.create_connection(("1.1.1.1", 443), timeout=3)
    direct = "reached"
except OSError as exc:
    direct = type(exc).__name__
print(json.dumps({"text": text, "proxied": proxied, "direct": direct, "env": dict(os.environ)}))
'''


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_inside_bubblewrap_no_host_port_no_key_no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rexmle_agents.sandbox import ExtraBind, SandboxSpec, get_sandbox

    secret = "sk-rexmle-test-secret-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    seen_during_call: list[dict[int, int]] = []

    def answer_and_look(messages: Any, tools: Any, config: Any) -> ModelResponse:
        seen_during_call.append(_listening_inodes())  # while the sandbox's forwarder is up and serving
        return answer(messages, tools, config)

    made = Relay(tmp_path, ScriptedBackend(answer_and_look))
    workspace, data = tmp_path / "ws", tmp_path / "data"
    for folder in (workspace, data, made.folder):  # the sandbox user reaches them when the harness is root
        folder.mkdir(exist_ok=True)
        folder.chmod(0o755)
    shutil.copyfile(FORWARDER, made.folder / "forwarder.py")
    (made.folder / "forwarder.py").chmod(0o644)
    (workspace / "client.py").write_text(CLIENT)
    before = _listening_inodes()
    spec = SandboxSpec(workspace=workspace, data=data,
                       binds=(ExtraBind(made.folder, "/run/rexmle/relay"),))
    sandbox = get_sandbox("bwrap", spec)
    made.server.socket_owner = sandbox.owner
    port = 18080
    relay_url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "/run/rexmle/relay/forwarder.py", "--socket", "/run/rexmle/relay/relay.sock",
            "--port", str(port), "--env", f"OPENAI_BASE_URL={relay_url}/v1", "--env", "OPENAI_API_KEY=placeholder",
            "--env", f"HTTPS_PROXY={relay_url}", "--env", "NO_PROXY=127.0.0.1,localhost",
            "--", sys.executable, "/workspace/client.py"]
    with made.server:
        result = sandbox.run(argv, timeout_s=120, log_dir=tmp_path / "logs")
    shutil.rmtree(made.folder, ignore_errors=True)
    assert result.ok, result.stderr_tail
    report = json.loads(result.stdout_tail.strip().splitlines()[-1])
    assert report["text"] == "echo: inside"
    assert "403" in report["proxied"] and report["direct"] != "reached"
    assert report["env"]["OPENAI_API_KEY"] == "placeholder" and secret not in json.dumps(report["env"])
    assert any(data.get("target") == "api.openai.com:443" for _, data in made.records)
    assert len(made.model_calls()) == 1
    # while the sandbox served a call, the host had no new listener on the relay's port and this process none at all
    assert seen_during_call
    during = seen_during_call[0]
    new = set(during) - set(before)
    assert port not in {during[inode] for inode in new}
    assert not _own_socket_inodes() & set(during)
