"""The relay is a bounded server: whatever the sandbox sends, the harness answers in the provider's dialect and its
threads, memory and journal stay within stated bounds.

Unit tests talk raw bytes to a :class:`RelayServer` on a temporary Unix socket (small limits, so that each attack
is quick): bodies over the cap are refused unread, deep or wide JSON is a 400, connections over the cap are turned
away at once, slow clients lose their thread at a deadline, embeddings inputs are counted, refusals are journaled
truncated and rate-limited, and hostile byte strings (a fuzz) all get a well-formed HTTP answer with a JSON error.
The forwarder is run on its own (an unreachable relay is a 503, not a dead listener). The last tests plant the
attacks from inside bubblewrap through the real external-agent path: large refused bodies, thousands of slow
connections, and a model call made while agent code holds every process the sandbox may have.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rexmle_agents.models import Model, ModelResponse, RetryPolicy, ScriptedBackend, Usage
from rexmle_agents.relay import FORWARDER, RelayLimits, RelayServer, Route
from rexmle_agents.relay.server import FORWARDER_FAULT_PATH

ALIAS = "rexmle-code"
CHAT_CALL = json.dumps({"model": ALIAS, "messages": [{"role": "user", "content": "hi"}]}).encode()


def answer(messages: Any, tools: Any, config: Any) -> ModelResponse:
    return ModelResponse(text="echo: " + messages[-1].content, usage=Usage(input_tokens=5, output_tokens=4),
                         model="scripted")


class Bounded:
    """A relay with small limits, its refusal records and warnings, and raw-socket helpers."""

    def __init__(self, **limits: Any) -> None:
        self.backend = ScriptedBackend(answer)
        self.records: list[tuple[str, dict[str, Any]]] = []
        self.warnings: list[str] = []
        self.folder = Path(tempfile.mkdtemp(prefix="rexmle-bounds-"))
        model = Model(self.backend, retry=RetryPolicy(max_attempts=1))
        self.server = RelayServer(self.folder, {ALIAS: Route(ALIAS, "code", "scripted/model", model)},
                                  record=lambda message, **data: self.records.append((message, data)),
                                  warn=self.warnings.append, limits=RelayLimits(**limits))

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(self.server.socket_path))  # blocking: a full backlog is waited for, not an error
        sock.settimeout(10)
        return sock

    def exchange(self, data: bytes, *, end: bool = True) -> tuple[int, dict[str, str], Any]:
        """Send ``data`` (then end the sending side), read until the relay closes: the first final answer."""
        with self.connect() as sock:
            try:
                sock.sendall(data)
                if end:
                    sock.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the relay answered and closed before reading it all
            return parse_response(read_all(sock))

    def post(self, path: str, body: bytes, *, headers: str = "") -> tuple[int, dict[str, str], Any]:
        return self.exchange(f"POST {path} HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(body)}\r\n{headers}Connection: close\r\n\r\n".encode() + body)


def read_all(sock: socket.socket, timeout_s: float = 10.0) -> bytes:
    sock.settimeout(timeout_s)
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def parse_response(raw: bytes) -> tuple[int, dict[str, str], Any]:
    """Status, headers and JSON body of the first final response in ``raw`` (``100 Continue`` skipped); fails the
    test if ``raw`` is not a well-formed HTTP response with a JSON body."""
    while True:
        head, separator, rest = raw.partition(b"\r\n\r\n")
        assert separator, f"no complete HTTP head in {raw[:300]!r}"
        lines = head.decode("latin-1").split("\r\n")
        version, status, *_ = lines[0].split(" ", 2)
        assert version in ("HTTP/1.0", "HTTP/1.1") and status.isdigit(), lines[0]
        pairs = (line.partition(":") for line in lines[1:])
        headers = {name.strip().lower(): value.strip() for name, _, value in pairs}
        if status != "100":
            break
        raw = rest
    length = int(headers["content-length"])
    assert headers["content-type"] == "application/json"
    assert len(rest) >= length, f"a body of {len(rest)} of {length} bytes"
    return int(status), headers, json.loads(rest[:length])


def error_message(body: Any) -> str:
    """The message of an OpenAI- or Anthropic-shaped error body (fails on any other shape)."""
    if body.get("type") == "error":
        return body["error"]["message"]
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]["message"]


@pytest.fixture
def bounded(request: pytest.FixtureRequest) -> Iterator[Bounded]:
    limits = getattr(request, "param", {})
    made = Bounded(**limits)
    with made.server:
        yield made
    shutil.rmtree(made.folder, ignore_errors=True)


def harness_status() -> tuple[int, int]:
    """This process's (the harness's) thread count and resident memory in bytes."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) * 1024


class Sampler:
    """The highest thread count and RSS of this process while it runs (sampled every 20 ms)."""

    def __init__(self) -> None:
        self.threads, self.rss = harness_status()
        self.start_threads, self.start_rss = self.threads, self.rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            threads, rss = harness_status()
            self.threads, self.rss = max(self.threads, threads), max(self.rss, rss)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------------------------------------------------------
# bodies


@pytest.mark.parametrize("bounded", [{"max_body_bytes": 2**20}], indirect=True)
def test_a_body_over_the_cap_is_refused_unread_in_the_endpoints_dialect(bounded: Bounded) -> None:
    head = "POST {} HTTP/1.1\r\nHost: relay\r\nContent-Length: {}\r\n\r\n"
    started = time.monotonic()
    with Sampler() as sampler:
        for path, length in (("/v1/messages", 40 * 2**20), ("/v1/chat/completions", 2**20 + 1)):
            with bounded.connect() as sock:
                sock.sendall(head.format(path, length).encode() + b"x" * 65536)
                status, headers, body = parse_response(read_all(sock))  # answered before the body was sent,
                assert status == 413 and headers["connection"] == "close"  # and closed: nothing streams on
                assert "at most 1048576" in error_message(body)
                assert (body.get("type") == "error") == (path == "/v1/messages")  # Anthropic's shape there
    assert time.monotonic() - started < 10
    assert sampler.rss - sampler.start_rss < 30 * 2**20  # nothing of the 40 MB was read
    status, _, body = bounded.post("/v1/chat/completions", b"x" * 2**20 + b" ")
    assert status == 413
    refused = [data for _, data in bounded.records if data.get("relay") == "request_too_large"]
    assert len(refused) == 3 and all(len(json.dumps(d)) < 500 for d in refused)


def test_missing_chunked_or_bad_lengths_are_refused(bounded: Bounded) -> None:
    chunked = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: relay\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n0\r\n\r\n")
    assert bounded.exchange(chunked)[0] == 411
    assert bounded.exchange(b"POST /v1/messages HTTP/1.1\r\nHost: relay\r\n\r\n{}")[0] == 411
    for value in ("-1", "abc", "1e3", "\xb2", "99999999999999999999"):
        status, _, body = bounded.exchange(f"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {value}\r\n\r\n"
                                           .encode("latin-1"))
        assert status in (400, 413), (value, body)
    twice = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
    assert bounded.exchange(twice)[0] == 400
    short = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"model\""
    status, _, body = bounded.exchange(short)
    assert status == 400 and "ended after 8 of the 100 bytes" in error_message(body)
    assert bounded.backend.requests == []


def test_deep_wide_and_malformed_json_is_a_400(bounded: Bounded) -> None:
    cases = {
        "nests more than 64 levels": b"[" * 50_000 + b"]" * 50_000,
        "levels deep; at most 64": json.dumps({"model": ALIAS, "messages": [{"role": "user", "content": "x"}],
                                       "tools": [{"type": "function", "function": {
                                           "name": "f", "parameters": json.loads("[" * 62 + "]" * 62)}}]}).encode(),
        "JSON values": b"[" + b"{}," * 300_000 + b"{}]",
        "strings": b'"' * 1_000_000,
        "lone UTF-16 surrogate": b'{"model": "rexmle-code", "messages": [{"role": "user", "content": "\\ud800"}]}',
        "not UTF-8": b'{"model": "rexmle-code", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        "not a JSON number": b'{"model": "rexmle-code", "temperature": NaN, "messages": []}',
        "must be a JSON object": b"[1, 2, 3]",
        "not JSON": b"{\"model\": ",
    }
    with Sampler() as sampler:
        for expected, body in cases.items():
            status, _, reply = bounded.post("/v1/chat/completions", body)
            assert status == 400 and expected in error_message(reply), (expected, reply)
    assert sampler.threads <= sampler.start_threads + 4
    # a tool call's arguments (JSON inside a string) are held to the same bounds
    deep_arguments = {"model": ALIAS, "messages": [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"}]}
    status, _, reply = bounded.post("/v1/chat/completions", json.dumps(deep_arguments).encode())
    assert status == 400 and "a tool call's arguments" in error_message(reply)
    # shapes the parsers did not foresee are 400s too, and a valid emoji (a surrogate pair) is fine
    for odd in ({"model": ALIAS, "messages": [{"role": "user", "content": "x"}], "stop": 5},
                {"model": ALIAS, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"function": "f"}},
                {"model": ALIAS, "messages": [{"role": "assistant", "tool_calls": 7}]}):
        assert bounded.post("/v1/chat/completions", json.dumps(odd).encode())[0] == 400, odd
    status, _, reply = bounded.post("/v1/chat/completions", json.dumps(
        {"model": ALIAS, "messages": [{"role": "user", "content": "\U0001F600"}]}).encode())
    assert status == 200 and reply["choices"][0]["message"]["content"] == "echo: \U0001F600"
    assert len(bounded.backend.requests) == 1


def _reference_shape(raw: bytes) -> tuple[int, int]:
    """Commas plus containers plus one, and the deepest nesting, read one character at a time."""
    values, depth, deepest = 1, 0, 0
    in_string = escaped = False
    for char in raw.decode():
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            values, depth, deepest = values + 1, depth + 1, max(deepest, depth + 1)
        elif char in "]}":
            depth -= 1
        elif char == ",":
            values += 1
    return values, deepest


def test_the_shape_scan_agrees_with_a_character_by_character_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strings full of escaped quotes, backslashes and brackets, cut into slices at every possible place."""
    from rexmle_agents.relay import protocol

    rng = random.Random(3)
    for _ in range(150):
        texts = ["".join(rng.choice('ab\\"[]{},') for _ in range(rng.randint(0, 400)))
                 for _ in range(rng.randint(1, 4))]
        raw = json.dumps({"k": texts, "n": [[[1]]], "x": [{}] * rng.randint(0, 4)}).encode()
        values, deepest = _reference_shape(raw)
        for chunk in (1, 2, 3, 7, 64, 2**18):
            monkeypatch.setattr(protocol, "_SCAN_CHUNK", chunk)
            assert protocol.json_shape_problem(raw, max_depth=deepest, max_values=values) is None, (raw, chunk)
            assert protocol.json_shape_problem(raw, max_depth=deepest - 1) is not None, (raw, chunk)
            assert protocol.json_shape_problem(raw, max_values=values - 1) is not None, (raw, chunk)


@pytest.mark.parametrize("bounded", [{"max_embedding_inputs": 100, "max_embedding_chars": 10_000}], indirect=True)
def test_embeddings_inputs_are_bounded(bounded: Bounded) -> None:
    from rexmle_agents.relay import HashingEmbedder

    bounded.server.embedder = HashingEmbedder()
    many = json.dumps({"model": "e", "input": ["word"] * 10_000}).encode()
    status, _, reply = bounded.post("/v1/embeddings", many)
    assert status == 400 and "10000 input(s)" in error_message(reply)
    long = json.dumps({"model": "e", "input": ["word " * 5000]}).encode()
    assert bounded.post("/v1/embeddings", long)[0] == 400
    status, _, reply = bounded.post("/v1/embeddings", json.dumps({"model": "e", "input": ["a b"] * 100}).encode())
    assert status == 200 and len(reply["data"]) == 100
    assert bounded.server.stats.embeddings == 100


# ---------------------------------------------------------------------------------------------------------------
# connections and deadlines


@pytest.mark.parametrize("bounded", [{"max_connections": 8, "header_timeout_s": 2.0, "body_timeout_s": 2.0}],
                         indirect=True)
def test_connections_over_the_cap_are_turned_away_and_slow_ones_lose_their_thread(bounded: Bounded) -> None:
    with Sampler() as sampler:
        slow = []
        for index in range(200):
            sock = bounded.connect()
            # half a request: the headers never end (and a body never completes for some); a connection turned
            # away may be closed before its half request is sent (a loaded machine): its 503 is still read below
            try:
                if index % 2:
                    sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: relay\r\n")
                else:
                    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
            except (BrokenPipeError, ConnectionResetError):
                pass
            slow.append(sock)
        time.sleep(0.3)
        assert bounded.server.connections <= 8
        started = time.monotonic()
        answers = [parse_response(read_all(sock, timeout_s=5)) for sock in slow]
        waited = time.monotonic() - started
    statuses = [status for status, _, _ in answers]
    assert statuses.count(408) == 8 and statuses.count(503) == 192, statuses
    assert all(headers.get("retry-after") == "2" for status, headers, _ in answers if status == 503)
    assert waited < 8  # the held ones were cut at their 2 s deadline
    assert sampler.threads <= sampler.start_threads + 8 + 2
    for sock in slow:
        sock.close()
    assert bounded.post("/v1/chat/completions", CHAT_CALL)[0] == 200  # and the relay serves again
    assert bounded.server.stats.turned_away == 192
    assert len(bounded.warnings) == 1 and "relay stalled" in bounded.warnings[0]


@pytest.mark.parametrize("bounded", [{"header_timeout_s": 1.0}], indirect=True)
def test_a_trickling_client_is_cut_at_the_deadline(bounded: Bounded) -> None:
    with bounded.connect() as sock:
        started = time.monotonic()
        request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: relay\r\nX-Slow: " + b"a" * 100
        try:
            for byte in request:
                sock.sendall(bytes([byte]))
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, _, body = parse_response(read_all(sock))
    assert status == 408 and time.monotonic() - started < 4
    assert "deadline" in error_message(body)


@pytest.mark.parametrize("bounded", [{"header_timeout_s": 1.0, "idle_timeout_s": 1.0}], indirect=True)
def test_an_idle_connection_is_closed_without_an_answer(bounded: Bounded) -> None:
    """No request begun, nothing to answer: a kept-alive connection (or one that never spoke) is just closed, so a
    client never reads a stray 408 as the answer to its next request."""
    with bounded.connect() as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: relay\r\nContent-Length: "
                     + str(len(CHAT_CALL)).encode() + b"\r\n\r\n" + CHAT_CALL)
        first = read_all(sock, timeout_s=5)  # the answer, then the close at the idle deadline
    status, headers, _ = parse_response(first)
    assert status == 200 and first.count(b"HTTP/1.1") == 1 and "connection" not in headers
    with bounded.connect() as sock:
        started = time.monotonic()
        assert read_all(sock, timeout_s=5) == b"" and time.monotonic() - started < 4


@pytest.mark.parametrize("bounded", [{"write_timeout_s": 1.0}], indirect=True)
def test_a_client_that_never_reads_its_answer_loses_its_thread(bounded: Bounded) -> None:
    from rexmle_agents.relay import HashingEmbedder

    bounded.server.embedder = HashingEmbedder()
    body = json.dumps({"model": "e", "input": ["a b c"] * 2048}).encode()  # about 10 MB of vectors as JSON
    with bounded.connect() as sock:
        sock.sendall(f"POST /v1/embeddings HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 10
        while bounded.server.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        while bounded.server.connections and time.monotonic() < deadline:
            time.sleep(0.05)  # never reading: the relay's send blocks until its write deadline
        assert bounded.server.connections == 0


# ---------------------------------------------------------------------------------------------------------------
# journal and answers


@pytest.mark.parametrize("bounded", [{"refusal_records_per_interval": 5, "refusal_interval_s": 1.0}],
                         indirect=True)
def test_refusals_are_journaled_truncated_and_rate_limited(bounded: Bounded) -> None:
    huge_name = json.dumps({"model": "m" * 500_000, "messages": [{"role": "user", "content": "x"}]}).encode()
    huge_choice = json.dumps({"model": ALIAS, "messages": [{"role": "user", "content": "x"}],
                              "tool_choice": {"x": "y" * 500_000}}).encode()
    started = time.monotonic()
    for index in range(100):
        status, _, body = bounded.post("/v1/chat/completions", huge_name if index % 2 else huge_choice)
        assert status in (400, 404) and len(error_message(body)) < 1000
    windows = int(time.monotonic() - started) + 1
    time.sleep(1.2)  # the interval ends; the relay's loop journals the summary
    deadline = time.monotonic() + 5
    while not any(d.get("relay") == "refusals_suppressed" for _, d in bounded.records) and time.monotonic() < deadline:
        time.sleep(0.05)
    each = [d for _, d in bounded.records if d.get("relay") != "refusals_suppressed"]
    summaries = [d for _, d in bounded.records if d.get("relay") == "refusals_suppressed"]
    assert 5 <= len(each) <= 5 * windows  # five per 1 s window
    assert sum(s["suppressed"] for s in summaries) == 100 - len(each)
    assert len(json.dumps(bounded.records)) < 20_000  # from 50 MB of refused requests
    stats = bounded.server.stats
    assert stats.refused == 100 and len(stats.refused_sample) <= 32


FUZZ_BASE = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\n"
             b"Content-Length: 60\r\n\r\n" + CHAT_CALL[:60])
HOSTILE = [
    b"\x00\x01\x02\xff\r\n\r\n", b"GET", b"GET /\r\n", b"\r\n\r\n\r\n", b"GARBAGE GARBAGE GARBAGE GARBAGE\r\n\r\n",
    b"GET / HTTP/2.0\r\n\r\n", b"GET / HTTP/1.1.1\r\n\r\n", b"GET / FTP/1.1\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 9\r\n\r\n\xff\xfe\xfd\x00\x80\xc3\x28\xed\xa0",
    b"POST /v1/messages HTTP/1.1\r\nContent-Length: 12\r\n\r\n\"\\udfff\\ud8\"",
    b"POST /v1/\xff\xfe/chat HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
    "POST /v1/chat/completions\udcff HTTP/1.1\r\n\r\n".encode("utf-8", "surrogateescape"),
    b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nX-Big: " + b"b" * 100_000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 500 + b"\r\n",
    b"BREW /pot HTTP/1.1\r\n\r\n", b"DELETE /v1/models HTTP/1.1\r\n\r\n", b"HEAD / HTTP/1.1\r\n\r\n",
    b"TRACE / HTTP/1.1\r\n\r\n", b"get /health HTTP/1.1\r\n\r\n", b"POST /v1/models HTTP/1.1\r\n\r\n",
    b"CONNECT api.openai.com:443 HTTP/1.1\r\n\r\n", b"GET http://example.com/ HTTP/1.1\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /v1/responses HTTP/1.1\r\nContent-Length: 4\r\n\r\nnull",
    b"POST " + FORWARDER_FAULT_PATH.encode() + b" HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /v1/embeddings HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
    b"GET /v1/models HTTP/1.1\r\nContent-Length: 5\r\n\r\nGET / HTTP/1.1\r\n\r\n",
]


def _mutations(count: int, seed: int = 7) -> Iterator[bytes]:
    rng = random.Random(seed)
    for _ in range(count):
        data = bytearray(FUZZ_BASE)
        for _ in range(rng.randint(1, 6)):
            if not data:
                break
            move = rng.randrange(4)
            where = rng.randrange(len(data))
            if move == 0:
                data[where] = rng.randrange(256)
            elif move == 1:
                del data[where:where + rng.randint(1, 20)]
            elif move == 2:
                data[where:where] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 20)))
            else:
                data = data[:where]
        if data:
            yield bytes(data)


def test_hostile_bytes_always_get_a_json_answer(bounded: Bounded) -> None:
    for data in [*HOSTILE, *_mutations(250)]:
        status, _, body = bounded.exchange(data)
        assert 200 <= status < 600
        if status >= 400:
            error_message(body)
    assert bounded.post("/v1/chat/completions", CHAT_CALL)[0] == 200


def test_a_forwarder_fault_is_one_warning_per_kind(bounded: Bounded) -> None:
    for _ in range(5):
        body = json.dumps({"kind": "thread-start", "detail": "can't start new thread " + "x" * 10_000}).encode()
        assert bounded.post(FORWARDER_FAULT_PATH, body)[0] == 200
    assert bounded.post(FORWARDER_FAULT_PATH, json.dumps({"kind": "accept-EMFILE"}).encode())[0] == 200
    assert len(bounded.warnings) == 2 and all(len(w) < 1000 for w in bounded.warnings)
    assert "relay stalled" in bounded.warnings[0] and "thread-start" in bounded.warnings[0]


# ---------------------------------------------------------------------------------------------------------------
# the forwarder on its own


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _http(port: int, body: bytes, timeout_s: float = 10) -> tuple[int, dict[str, str], Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode() + body)
        return parse_response(read_all(sock, timeout_s))


def test_the_forwarder_answers_503_while_the_relay_is_away_and_serves_when_it_is_back() -> None:
    made = Bounded()
    port = _free_port()
    forwarder = subprocess.Popen([sys.executable, str(FORWARDER), "--socket", str(made.server.socket_path),
                                  "--port", str(port), "--", sys.executable, "-c", "import time; time.sleep(60)"],
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the forwarder never listened"
                time.sleep(0.05)
        for _ in range(3):  # no relay socket yet: answered, not hung, and the listener lives on
            status, headers, body = _http(port, CHAT_CALL)
            assert status == 503 and headers["retry-after"] == "2" and "not reachable" in error_message(body)
        with made.server:
            status, _, body = _http(port, CHAT_CALL)
            assert status == 200 and body["choices"][0]["message"]["content"] == "echo: hi"
    finally:
        os.killpg(forwarder.pid, signal.SIGKILL)  # the forwarder and its agent (a sleeper)
        _, stderr = forwarder.communicate()
        shutil.rmtree(made.folder, ignore_errors=True)
    assert stderr.count("rexmle forwarder: relay-") == 1, stderr  # one line per kind of fault


# ---------------------------------------------------------------------------------------------------------------
# planted from inside the sandbox, through the real external-agent path


ATTACK_PRELUDE = r'''
import json, os, shutil, socket, sys, time
PORT = int(os.environ["REXMLE_RELAY_URL"].rsplit(":", 1)[1])
CALL = json.dumps({"model": "rexmle-code", "messages": [{"role": "user", "content": "hi"}]}).encode()

def read_all(sock):
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)

def status_of(raw):
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.") else repr(raw[:80])

def post(body, path="/v1/chat/completions", length=None, timeout=30):
    sock = socket.create_connection(("127.0.0.1", PORT), timeout=timeout)
    try:
        head = "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (
            path, len(body) if length is None else length)
        sock.sendall(head.encode() + body)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    raw = read_all(sock)
    sock.close()
    return status_of(raw)

def finish(report):
    os.makedirs("out", exist_ok=True)
    shutil.copyfile("/workspace/data/sample_submission/submission.csv", "out/submission.csv")
    open("out/report.json", "w").write(json.dumps(report))
'''

LARGE_BODIES = ATTACK_PRELUDE + r'''
report = {"over_cap": [], "refused": []}
for _ in range(2):  # 2 x 20 MB over the 16 MiB cap
    report["over_cap"].append(post(b"x" * (20 * 2**20)))
big_name = json.dumps({"model": "m" * (4 * 2**20), "messages": [{"role": "user", "content": "x"}]}).encode()
big_choice = json.dumps({"model": "rexmle-code", "messages": [{"role": "user", "content": "x"}],
                         "tool_choice": {"x": "y" * (4 * 2**20)}}).encode()
deep = b"[" * (4 * 2**20) + b"]" * (4 * 2**20)
for body in (big_name, big_choice, deep, big_name, big_choice):
    report["refused"].append(post(body))
report["after"] = post(CALL)
finish(report)
'''

SLOW_CONNECTIONS = ATTACK_PRELUDE + r'''
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
report = {}
held = []
for index in range(2000):
    try:
        sock = socket.create_connection(("127.0.0.1", PORT), timeout=30)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{" if index % 2
                     else b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n")
        held.append(sock)
    except OSError as exc:
        report.setdefault("connect_errors", []).append(str(exc))
        break
report["opened"] = len(held)
time.sleep(1)
report["during"] = post(CALL, timeout=20)
started = time.monotonic()
statuses = {}
for sock in held:
    status = status_of(read_all(sock))
    statuses[str(status)] = statuses.get(str(status), 0) + 1
    sock.close()
report["statuses"], report["waited_s"] = statuses, time.monotonic() - started
report["after"] = post(CALL)
finish(report)
'''

EXHAUSTED_PROCESSES = ATTACK_PRELUDE + r'''
import signal
report = {}
children = []
while True:  # hold every process the sandbox may have, with sleeping children
    try:
        pid = os.fork()
    except OSError as exc:
        report["fork_error"] = str(exc)
        break
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    children.append(pid)
    if len(children) > 2000:
        break
report["children"] = len(children)
started = time.monotonic()
try:
    report["while_exhausted"] = post(CALL, timeout=20)
except OSError as exc:
    report["while_exhausted"] = "connection error: " + str(exc)
report["while_exhausted_s"] = time.monotonic() - started
for pid in children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
report["after"] = post(CALL, timeout=20)
finish(report)
'''


def _attack_spec(spec_file: Callable[..., Path], script: str) -> Path:
    return spec_file(files={"agent/attack.py": script.replace("{", "{{").replace("}", "}}")},
                     command=["{python}", "{agent_dir}/attack.py"],
                     outputs={"submission": "agent/out", "snapshot": "at_end"})


def _run_attack(data_root: Path, tmp_path: Path, spec: Path, *, max_processes: int = 1024) -> Any:
    from rexmle_agents.harness.runner import build_spec, execute_run
    from rexmle_agents.harness.spec import Limits, Resources

    run_spec = build_spec("ldct-iqa", agent="external", agent_config={"spec": str(spec)},
                          models={"code": "scripted/model"}, seed=0, limits=Limits(time_limit_s=300),
                          resources=Resources(max_processes=max_processes), sandbox="bwrap", data_root=data_root,
                          group="test")
    model = Model(ScriptedBackend(answer), retry=RetryPolicy(max_attempts=1))
    return execute_run(run_spec, tmp_path / "runs", models={"code": model}, grace_s=5.0)


def _report(outcome: Any) -> dict[str, Any]:
    return json.loads((outcome.run_dir / "workspace" / "agent" / "out" / "report.json").read_text())


needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                 reason="needs bubblewrap and root (the sandbox runs agent code as its own user)")


@needs_bwrap
def test_large_refused_bodies_from_the_sandbox_leave_harness_and_journal_small(
        aideml_env: Any, data_root: Path, spec_file: Any, tmp_path: Path) -> None:
    with Sampler() as sampler:
        outcome = _run_attack(data_root, tmp_path, _attack_spec(spec_file, LARGE_BODIES))
    report = _report(outcome)
    assert report["over_cap"] == [413, 413]
    assert report["refused"] == [404, 400, 400, 404, 400] and report["after"] == 200
    assert outcome.state == "finished", outcome.reason
    journal = outcome.run_dir / "journal.jsonl"
    assert journal.stat().st_size < 2**20  # after 40 MB of refused bodies and 28 MB of refused requests
    assert sampler.rss - sampler.start_rss < 200 * 2**20, (sampler.start_rss, sampler.rss)


@needs_bwrap
def test_thousands_of_slow_connections_from_the_sandbox_hold_few_harness_threads(
        aideml_env: Any, data_root: Path, spec_file: Any, tmp_path: Path) -> None:
    with Sampler() as sampler:
        outcome = _run_attack(data_root, tmp_path, _attack_spec(spec_file, SLOW_CONNECTIONS))
    report = _report(outcome)
    assert report["opened"] == 2000 and report["after"] == 200, report
    assert report["during"] == 503  # answered, to retry: not hung
    statuses = report["statuses"]
    assert set(statuses) <= {"408", "503"} and sum(statuses.values()) == 2000, statuses
    assert report["waited_s"] < 30
    assert outcome.state == "finished", outcome.reason
    # the relay held at most one thread per connection it serves (the run's own threads come and go beside them);
    # the rest were turned away at once, the held ones cut at the 10 s header or body deadline
    cap = RelayLimits().max_connections
    assert sampler.threads <= sampler.start_threads + cap + 16, (sampler.start_threads, sampler.threads)
    assert sampler.rss - sampler.start_rss < 200 * 2**20
    events = [json.loads(line) for line in (outcome.run_dir / "journal.jsonl").read_text().splitlines()]
    warnings = [e["message"] for e in events if e["kind"] == "warning"]
    assert any("relay stalled" in message for message in warnings), warnings
    from rich.console import Console

    from rexmle_agents.results.cli import show_run

    console = Console(record=True, width=200)
    show_run(outcome.run_dir, console)  # `rexmle runs show` says so too
    assert "warning: relay stalled" in console.export_text()
    assert (outcome.run_dir / "journal.jsonl").stat().st_size < 2**20


@needs_bwrap
def test_a_model_call_while_agent_code_holds_every_process_is_answered(
        aideml_env: Any, data_root: Path, spec_file: Any, tmp_path: Path) -> None:
    outcome = _run_attack(data_root, tmp_path, _attack_spec(spec_file, EXHAUSTED_PROCESSES), max_processes=48)
    report = _report(outcome)
    assert "fork_error" in report and report["children"] < 48, report
    # the forwarder needs no new thread or process to serve a call: it is answered, never hung
    assert report["while_exhausted"] == 200 and report["while_exhausted_s"] < 15, report
    assert report["after"] == 200
    assert outcome.state == "finished", outcome.reason
