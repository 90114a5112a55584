"""A loopback HTTP server that speaks the OpenAI and Anthropic wire formats, scripted reply by reply.

Tests queue replies (JSON bodies, server-sent-event streams, error statuses, malformed bodies, slow answers) and
point the real ``openai`` / ``anthropic`` clients at ``server.url``. Every request is kept for assertions.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rexmle_agents.models import RetryPolicy

# Tiny waits keep retry tests fast; the logic is the same as with production waits.
FAST_RETRY = RetryPolicy(max_attempts=3, max_total_s=5.0, initial_backoff_s=0.01, max_backoff_s=0.05, jitter_s=0.01)


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    events: Sequence[str] | None = None  # server-sent-event frames, written one by one
    delay_s: float = 0.0  # wait before answering (to trigger client timeouts)
    reset: bool = False  # after the events, reset the connection (TCP RST) instead of closing it cleanly


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeServer:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # --- scripting -------------------------------------------------------------------------------------------------
    def json(self, body: Any, *, status: int = 200, headers: dict[str, str] | None = None, delay_s: float = 0.0):
        self.replies.append(Reply(status, json.dumps(body).encode(), headers=headers or {}, delay_s=delay_s))

    def raw(self, text: str, *, status: int = 200, content_type: str = "application/json") -> None:
        self.replies.append(Reply(status, text.encode(), content_type=content_type))

    def error(self, status: int, message: str = "boom", *, headers: dict[str, str] | None = None) -> None:
        self.json({"error": {"message": message, "type": "test_error"}}, status=status, headers=headers)

    def sse(self, events: Sequence[tuple[str | None, Any]], *, reset: bool = False) -> None:
        """Queue a stream; each event is (event name or None, data: a JSON-able object or a raw string).

        ``reset`` ends the stream with a connection reset, as a dropped proxy or network does mid-answer.
        """
        frames = []
        for name, data in events:
            payload = data if isinstance(data, str) else json.dumps(data)
            frames.append((f"event: {name}\n" if name else "") + f"data: {payload}\n\n")
        self.replies.append(Reply(content_type="text/event-stream", events=frames, reset=reset))

    def take(self) -> Reply:
        with self._lock:
            if not self.replies:
                # 418: a permanent client error, so a test that makes an unscripted call fails at once
                return Reply(418, b'{"error": {"message": "no reply scripted"}}')
            return self.replies.popleft()

    def record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)


def _handler_for(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: every response ends by closing the connection, so streams need no chunked encoding.
        protocol_version = "HTTP/1.0"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            body = json.loads(raw) if raw else {}
            server.record(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            reply = server.take()
            time.sleep(reply.delay_s)
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                if reply.events is None:
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                    return
                self.end_headers()
                for frame in reply.events:
                    self.wfile.write(frame.encode())
                    self.wfile.flush()
                if reply.reset:
                    time.sleep(0.05)  # let the client read the events first, so the reset hits it mid-stream
                    # linger on with a zero timeout: close() sends RST instead of FIN
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test); nothing to answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class SilentServer:
    """Accepts connections and reads requests but never answers, like a hung server or a black-holing proxy."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)  # accept() wakes up now and then to notice stop()
        self._stopped = threading.Event()
        self._held: list[socket.socket] = []
        self.connections = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"http://{host}:{port}"

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            self._held.append(connection)  # kept open, never written to

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()
        self._listener.close()
        for connection in self._held:
            connection.close()


class Wire:
    """Bodies and streams in the providers' wire formats, as their APIs document them."""

    @staticmethod
    def chat_completion(
        text: str | None = "",
        *,
        tool_calls: Sequence[tuple[str, str, str]] = (),
        usage: tuple[int, int, int] | None = (100, 20, 0),
        finish_reason: str = "stop",
        model: str = "gpt-5-2025-08-07",
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if tool_calls:
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in tool_calls
            ]
        body: dict[str, Any] = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        }
        if usage is not None:
            body["usage"] = Wire._chat_usage(*usage)
        return body

    @staticmethod
    def _chat_usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    @staticmethod
    def chat_stream(
        pieces: Sequence[str],
        *,
        tool_calls: Sequence[tuple[str, str, Sequence[str]]] = (),
        usage: tuple[int, int, int] | None = (100, 20, 0),
        finish_reason: str = "stop",
    ) -> list[tuple[str | None, Any]]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[None, dict[str, Any]]:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return None, {
                "id": "chatcmpl-s",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [choice],
            }

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": p}) for p in pieces]
        for index, (call_id, name, arg_pieces) in enumerate(tool_calls):
            head = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
            events.append(chunk({"tool_calls": [head]}))
            events += [chunk({"tool_calls": [{"index": index, "function": {"arguments": a}}]}) for a in arg_pieces]
        events.append(chunk({}, finish_reason))
        if usage is not None:
            events.append(
                (
                    None,
                    {
                        "id": "chatcmpl-s",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": "m",
                        "choices": [],
                        "usage": Wire._chat_usage(*usage),
                    },
                )
            )
        events.append((None, "[DONE]"))
        return events

    @staticmethod
    def response(
        text: str = "",
        *,
        function_calls: Sequence[tuple[str, str, str]] = (),
        usage: tuple[int, int, int] = (100, 20, 0),
        status: str = "completed",
        incomplete_reason: str | None = None,
        error: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if text:
            output.append(
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            )
        output += [
            {"type": "function_call", "id": f"fc_{i}", "call_id": i, "name": n, "arguments": a, "status": "completed"}
            for i, n, a in function_calls
        ]
        prompt, completion, cached = usage
        return {
            "id": "resp_1",
            "object": "response",
            "created_at": 1,
            "model": "gpt-5-2025-08-07",
            "status": status,
            "error": error,
            "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion,
            },
        }

    @staticmethod
    def response_stream(final: dict[str, Any], pieces: Sequence[str]) -> list[tuple[str | None, Any]]:
        started = {**final, "status": "in_progress", "output": []}
        events: list[tuple[str | None, Any]] = [
            ("response.created", {"type": "response.created", "sequence_number": 0, "response": started})
        ]
        events += [
            (
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "sequence_number": n + 1,
                    "item_id": "msg_1",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": p,
                    "logprobs": [],
                },
            )
            for n, p in enumerate(pieces)
        ]
        done = "response.completed" if final["status"] == "completed" else f"response.{final['status']}"
        events.append((done, {"type": done, "sequence_number": len(pieces) + 1, "response": final}))
        return events

    @staticmethod
    def anthropic_message(
        text: str = "",
        *,
        tool_uses: Sequence[tuple[str, str, dict[str, Any]]] = (),
        usage: tuple[int, int, int, int] = (50, 20, 0, 0),
        stop_reason: str = "end_turn",
    ) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        content += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in tool_uses]
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": Wire._anthropic_usage(*usage),
        }

    @staticmethod
    def _anthropic_usage(uncached: int, output: int, read: int, write: int) -> dict[str, int]:
        return {
            "input_tokens": uncached,
            "output_tokens": output,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": write,
        }

    @staticmethod
    def anthropic_stream(
        pieces: Sequence[str],
        *,
        tool_uses: Sequence[tuple[str, str, Sequence[str]]] = (),
        usage: tuple[int, int, int, int] = (50, 20, 0, 0),
        stop_reason: str = "end_turn",
    ) -> list[tuple[str | None, Any]]:
        uncached, output, read, write = usage
        start = Wire.anthropic_message(usage=(uncached, 1, read, write), stop_reason=stop_reason)
        events: list[tuple[str | None, Any]] = [
            ("message_start", {"type": "message_start", "message": {**start, "stop_reason": None}}),
            ("ping", {"type": "ping"}),
        ]

        def block(index: int, start_block: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
            events.append(
                ("content_block_start", {"type": "content_block_start", "index": index, "content_block": start_block})
            )
            events.extend(
                ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas
            )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))

        block(0, {"type": "text", "text": ""}, [{"type": "text_delta", "text": p} for p in pieces])
        for n, (tool_id, name, json_pieces) in enumerate(tool_uses, start=1):
            block(
                n,
                {"type": "tool_use", "id": tool_id, "name": name, "input": {}},
                [{"type": "input_json_delta", "partial_json": p} for p in json_pieces],
            )
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": output},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return events


@pytest.fixture
def wire() -> type[Wire]:
    return Wire


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    yield fake
    fake.stop()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    silent = SilentServer()
    yield silent
    silent.stop()


@pytest.fixture
def fast_retry() -> RetryPolicy:
    return FAST_RETRY


@pytest.fixture(autouse=True)
def _no_real_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never see the developer's keys or endpoints, so no test can reach a real provider."""
    for name in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "OPENAI_COMPATIBLE_API_KEY",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "ANTHROPIC_BASE_URL",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "AZURE_OPENAI_API_KEY",
        "AZURE_OPENAI_AD_TOKEN",
        "AZURE_OPENAI_ENDPOINT",
        "OPENAI_API_VERSION",
        "AZURE_OPENAI_API_VERSION",
    ):
        monkeypatch.delenv(name, raising=False)
