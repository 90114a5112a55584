"""The model relay: an HTTP server on a Unix socket that answers an agent's model calls through rexmle's backends.

The socket lies in a folder the harness owns; the sandbox sees that folder (read-only, :class:`ExtraBind`) and a
small forwarder (:mod:`rexmle_agents.relay.forwarder`) started inside it listens on ``127.0.0.1:PORT`` of the
sandbox's own network namespace. No host port is opened and the sandbox keeps no network. Every call is answered
by a :class:`~rexmle_agents.models.base.Model` of the run (retries, usage and cost in the journal, budgets,
record/replay) chosen by the alias name the agent asked for; the agent never holds an API key.

What the relay refuses is answered so that agents stop rather than retry forever (most retry 429 and 5xx): a spent
budget is ``402``, an unknown model name ``404``, a request it cannot translate ``400``. A request meant for the
internet (an HTTP proxy ``CONNECT`` or an absolute URL: the sandbox's ``HTTP(S)_PROXY`` point here) is ``403`` and
recorded.

Everything the sandbox sends is hostile, and the relay runs in the harness process, so it is bounded
(:class:`RelayLimits`): a body is refused by its ``Content-Length`` before it is read (``413``; ``411`` without
one), parsed only within a depth and a count of values, and bodies being handled at once share a byte budget; at
most ``max_connections`` connections are served at once (one thread each) and the next ones are answered ``503``
with ``Retry-After`` at once, by the accepting thread; every phase of a connection has a deadline (a client that
trickles its headers or body, or never reads its answer, loses its thread); embeddings inputs are counted. Every
request gets an answer in the dialect of its endpoint (the provider's error shape), whatever its bytes. Refusals
are journaled truncated, a bounded number per interval and then one summary; a stall (connections turned away, a
fault the in-sandbox forwarder reports) is journaled once as a warning.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import math
import os
import re
import socket
import socketserver
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from rexmle_agents.models.base import TransientModelAPIError
from rexmle_agents.models.types import GenerateConfig, Message, ModelResponse, ToolSpec
from rexmle_agents.relay import gemini
from rexmle_agents.relay.fields import backend_wire, request_fields
from rexmle_agents.relay.gemini import GEMINI, api_of_path, error_body  # the protocol module's, Gemini's paths too
from rexmle_agents.relay.protocol import (
    ANTHROPIC,
    CHAT,
    MAX_JSON_DEPTH,
    MAX_JSON_VALUES,
    PARSERS,
    RENDERERS,
    RESPONSES,
    STREAMERS,
    ProtocolError,
    RelayRequest,
    adapt_messages,
    brief,
    decode_json,
    estimated_tokens,
    render_embeddings,
    tool_choice_extra,
)
from rexmle_agents.relay.tls import ProviderTLS
from rexmle_grade.errors import BudgetExceededError, ModelAPIError, RexmleError

logger = logging.getLogger(__name__)

SOCKET_NAME = "relay.sock"
STATUS_BUDGET = 402  # not retried by the OpenAI and Anthropic SDKs (they retry 408, 409, 429 and 5xx)
API_PATHS = {"/v1/chat/completions": CHAT, "/chat/completions": CHAT, "/v1/responses": RESPONSES,
             "/responses": RESPONSES, "/v1/messages": ANTHROPIC, "/messages": ANTHROPIC,
             "/v1beta/openai/chat/completions": CHAT}  # Gemini's OpenAI-compatible endpoint (AIDE's gemini-* path)
EMBEDDINGS_PATHS = ("/v1/embeddings", "/embeddings")
# Anthropic's token counting, answered with an estimate (no model call: protocol.estimated_tokens)
COUNT_TOKENS_PATHS = ("/v1/messages/count_tokens", "/messages/count_tokens")
FORWARDER_FAULT_PATH = "/rexmle/forwarder-fault"  # the in-sandbox forwarder reports what it could not serve
RETRY_AFTER_S = 2
MAX_REQUEST_LINE = 8192
MAX_MESSAGE_CHARS = 500  # of a refusal's message, in the journal and in the answer
MAX_DATA_CHARS = 200  # of each value a refusal record carries
MAX_WARNING_KINDS = 16
REFUSED_SAMPLE = 32


@dataclass(frozen=True)
class RelayLimits:
    """The bounds of a relay; the defaults fit every agent rexmle runs with room to spare.

    ``max_body_bytes``: 16 MiB, four times the largest prompt a provider takes (a million tokens is about 4 MB of
    text; the relay passes text only, so no images ride in bodies). ``max_inflight_body_bytes``: bodies being
    read, parsed and answered at once share this budget (a request that would exceed it is a ``503`` to retry),
    so the harness holds at most about this much of agent-sent text (a few times it once parsed). Deadlines:
    ``header_timeout_s`` for the request line and headers of a connection's first request, ``idle_timeout_s``
    for a kept-alive connection's next one (SDK pools drop idle connections after 5 s), ``body_timeout_s`` for the
    body, ``write_timeout_s`` for the answer. ``max_embedding_inputs`` is OpenAI's own limit per request.

    What the sandbox can cost the harness, whatever it sends: at most ``max_connections`` + 1 threads (one per
    served connection, and the accepting one); memory of about 2.5 times ``max_inflight_body_bytes`` for bodies
    being handled (the bytes, the decoded document, the strings parsed out of it; 113 MiB measured for three
    bodies at the cap at once, ``tools/bench_relay.py``) plus a 64 KiB read buffer per connection; a connection
    held at most the sum of its phases' deadlines; a few dozen journal lines a minute of refusals.
    """

    max_body_bytes: int = 16 * 2**20
    max_inflight_body_bytes: int = 48 * 2**20
    max_header_bytes: int = 64 * 2**10
    max_json_depth: int = MAX_JSON_DEPTH
    max_json_values: int = MAX_JSON_VALUES
    max_connections: int = 128
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 15.0
    body_timeout_s: float = 10.0
    write_timeout_s: float = 60.0
    keepalive_s: float = 15.0  # an early-started stream's keep-alive newlines while the model works
    max_embedding_inputs: int = 2048
    max_embedding_chars: int = 2_000_000
    refusal_records_per_interval: int = 20
    refusal_interval_s: float = 60.0


class Generates(Protocol):
    def generate(self, messages: list[Message], tools: list[ToolSpec], config: GenerateConfig) -> ModelResponse: ...


@dataclass(frozen=True)
class Route:
    """An alias name the agent may ask for, and the run's model that answers it."""

    alias: str
    role: str
    model_string: str  # the run's model string for the role (picks the format of a forced tool choice)
    model: Generates


class HashingEmbedder:
    """A local, deterministic stand-in for an embeddings model (no call, no cost): each word and word pair is
    hashed into ``dim`` signed buckets and the vector normalised. Texts that share words get similar vectors; it is
    not a semantic model, and results of agents that lean on embeddings are not comparable with a real one."""

    name = "rexmle-local-hashing"

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim

    def __call__(self, texts: list[str]) -> tuple[list[list[float]], int]:
        vectors, tokens = [], 0
        for text in texts:
            words = re.findall(r"\w+", text.lower())
            tokens += len(words)
            vector = [0.0] * self.dim
            for feature in [*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))]:
                digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
                bucket = int.from_bytes(digest[:4], "little") % self.dim
                vector[bucket] += 1.0 if digest[4] & 1 else -1.0
            norm = math.sqrt(sum(v * v for v in vector)) or 1.0
            vectors.append([v / norm for v in vector])
        return vectors, tokens


@dataclass
class Reply:
    status: int
    body: dict[str, Any] | None = None
    stream: Iterator[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class RelayStats:
    """Counts of one relay's life; ``refused_sample`` keeps the latest few refusals (truncated), not all."""

    calls: int = 0
    streamed: int = 0
    refused: int = 0
    turned_away: int = 0  # connections answered 503 before they were read (over the connection cap)
    refused_sample: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=REFUSED_SAMPLE))
    embeddings: int = 0
    token_counts: int = 0  # count_tokens requests answered (estimates, not model calls)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def _clip_data(data: Mapping[str, Any]) -> dict[str, Any]:
    clipped: dict[str, Any] = {}
    for key, value in itertools.islice(data.items(), 8):
        clipped[key] = value if value is None or isinstance(value, (bool, int, float)) else _clip(str(value),
                                                                                                  MAX_DATA_CHARS)
    return clipped


class _RefusalJournal:
    """Journals refusals, at most ``per_interval`` records per ``interval_s``; the rest are counted and told in one
    summary record when the interval ends (or the relay closes). A sandbox that sends ten thousand bad requests
    costs the journal a few dozen lines."""

    def __init__(self, record: Callable[..., None], per_interval: int, interval_s: float) -> None:
        self.record = record
        self.per_interval = per_interval
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._window_start = time.monotonic()
        self._in_window = 0
        self._suppressed: Counter[str] = Counter()

    def note(self, status: int, kind: str, message: str, data: dict[str, Any]) -> None:
        with self._lock:
            summary = self._roll(time.monotonic())
            journal = self._in_window < self.per_interval
            if journal:
                self._in_window += 1
            else:
                self._suppressed[kind] += 1
        if summary is not None:
            self.record(*summary[0], **summary[1])
        if journal:
            self.record(f"relay refused a request ({status} {kind}): {message}", relay=kind, status=status, **data)

    def flush(self, *, force: bool = False) -> None:
        with self._lock:
            summary = self._roll(time.monotonic(), force=force)
        if summary is not None:
            self.record(*summary[0], **summary[1])

    def _roll(self, now: float, *, force: bool = False) -> tuple[tuple[str], dict[str, Any]] | None:
        if not force and now - self._window_start < self.interval_s:
            return None
        summary = None
        if self._suppressed:
            total = sum(self._suppressed.values())
            summary = ((f"relay refused {total} more request(s) in {now - self._window_start:.0f} s without "
                        f"journaling each (at most {self.per_interval} records per {self.interval_s:g} s)",),
                       {"relay": "refusals_suppressed", "suppressed": total, "by_kind": dict(self._suppressed)})
        self._window_start, self._in_window, self._suppressed = now, 0, Counter()
        return summary


class RelayServer:
    """Serve ``routes`` on ``folder/relay.sock`` until :meth:`close`.

    ``before_call`` runs before every model call (an external agent syncs its node tree and opens a step there;
    it may raise :class:`BudgetExceededError`). ``record(message, **data)`` journals what the relay refused
    (rate-limited, truncated); ``warn(message)`` journals a stall once per kind (defaults to ``record``).
    ``on_budget_exhausted(reason)`` is called once, the first time a call is refused for a spent budget.
    ``after_call(request, response)`` runs after every answered call (a terminal agent's turn is journaled there).
    ``socket_owner`` (uid, gid) gives the socket to the sandbox's user, the only one besides root who may use it.
    """

    def __init__(self, folder: Path, routes: Mapping[str, Route], *,
                 before_call: Callable[[], None] | None = None,
                 after_call: Callable[[RelayRequest, ModelResponse], None] | None = None,
                 record: Callable[..., None] | None = None,
                 warn: Callable[[str], None] | None = None,
                 on_budget_exhausted: Callable[[str], None] | None = None,
                 embedder: HashingEmbedder | None = None,
                 socket_owner: tuple[int, int] | None = None,
                 limits: RelayLimits | None = None,
                 tls: ProviderTLS | None = None) -> None:
        self.folder = Path(folder)
        self.socket_path = self.folder / SOCKET_NAME
        self.routes = dict(routes)
        self.before_call = before_call
        self.after_call = after_call
        self.record = record or (lambda message, **data: logger.info("relay: %s %s", message, data))
        self.warn = warn or (lambda message: self.record(message, relay="warning"))
        self.on_budget_exhausted = on_budget_exhausted
        self.embedder = embedder
        self.socket_owner = socket_owner
        self.limits = limits or RelayLimits()
        self.tls = tls  # answers CONNECTs to the providers' own hosts (relay/tls.py); None: every CONNECT is refused
        self.stats = RelayStats()
        self.exhausted: str | None = None
        self.warned: set[str] = set()
        self._refusals = _RefusalJournal(self.record, self.limits.refusal_records_per_interval,
                                         self.limits.refusal_interval_s)
        self._lock = threading.Lock()
        self._body_bytes = 0  # of requests being read, parsed or answered now
        self._server: _UnixHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifetime -------------------------------------------------------------------------------------------
    def start(self) -> RelayServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o755)  # the sandbox user must reach the socket; only its owner may connect to it
        if self.socket_path.exists() or self.socket_path.is_symlink():
            self.socket_path.unlink()
        server = _UnixHTTPServer(str(self.socket_path), _Handler)
        server.relay = self
        os.chmod(self.socket_path, 0o600)
        if self.socket_owner is not None:
            os.chown(self.socket_path, *self.socket_owner)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="rexmle-relay", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._refusals.flush(force=True)
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> RelayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connections(self) -> int:
        """Connections being served now (each holds one thread)."""
        return self._server.active if self._server is not None else 0

    # ---- answering ------------------------------------------------------------------------------------------
    def refuse(self, status: int, api: str, kind: str, message: str, *, retry_after: int | None = None,
               **data: Any) -> Reply:
        message = _clip(message, MAX_MESSAGE_CHARS)
        data = _clip_data(data)
        with self._lock:
            self.stats.refused += 1
            self.stats.refused_sample.append({"status": status, "kind": kind, "message": message, **data})
        self._refusals.note(status, kind, message, data)
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        return Reply(status, error_body(api, status, kind, f"rexmle relay: {message}"), headers=headers)

    def warn_once(self, kind: str, message: str) -> None:
        """Journal a stall of the relay (a warning the run's status shows), once per kind."""
        with self._lock:
            if kind in self.warned or len(self.warned) >= MAX_WARNING_KINDS:
                return
            self.warned.add(kind)
        self.warn(_clip(message, MAX_MESSAGE_CHARS))

    def reserve_body(self, length: int) -> bool:
        with self._lock:
            if self._body_bytes and self._body_bytes + length > self.limits.max_inflight_body_bytes:
                return False
            self._body_bytes += length
            return True

    def release_body(self, length: int) -> None:
        with self._lock:
            self._body_bytes -= length

    def decode(self, api: str, raw: bytes) -> Any:
        """The parsed body, or the refusal (a :class:`Reply`) of a body that is not bounded JSON."""
        try:
            return decode_json(raw, max_depth=self.limits.max_json_depth, max_values=self.limits.max_json_values)
        except ProtocolError as exc:
            return self.refuse(400, api, "invalid_request_error", str(exc))

    def _budget_spent(self, api: str, reason: str) -> Reply:
        first = False
        with self._lock:
            if self.exhausted is None:
                self.exhausted, first = reason, True
        reply = self.refuse(STATUS_BUDGET, api, "budget_exhausted", f"{reason}; the run's model budget is spent, "
                            "no further model calls are answered")
        if first and self.on_budget_exhausted is not None:
            self.on_budget_exhausted(reason)
        return reply

    def answer(self, api: str, body: Any, parse: Callable[[Any], RelayRequest] | None = None) -> Reply:
        """A model call; ``parse`` is the dialect's parser bound to the URL when the body does not say it all."""
        try:
            if not isinstance(body, dict):
                raise ProtocolError("the request body must be a JSON object")
            request = (parse or PARSERS[api])(body)
        except (ProtocolError, ValueError) as exc:
            return self.refuse(400, api, "invalid_request_error", str(exc))
        except (TypeError, AttributeError, KeyError, IndexError) as exc:
            # the parsers walk JSON the agent wrote: a shape they did not foresee is the request's fault
            return self.refuse(400, api, "invalid_request_error", f"the body is not a {api} request the relay "
                               f"understands ({type(exc).__name__}: {exc})")
        route = self.routes.get(request.model)
        if route is None:
            known = ", ".join(sorted(self.routes)) or "none"
            return self.refuse(404, api, "model_not_found", f"model {brief(request.model)} is not served here (the "
                               f"relay serves {known}: give the agent one of these names)", model=request.model)
        if self.exhausted is not None:
            return self._budget_spent(api, self.exhausted)
        config = request.config
        try:  # the fields beyond the conversation: forwarded, refused (400) or dropped with a warning (relay/fields.py)
            fields = request_fields(api, body, backend_wire(route.model))
        except ProtocolError as exc:
            return self.refuse(400, api, "invalid_request_error", str(exc), model=request.model)
        for name, reason in fields.dropped.items():
            self.warn_once(f"field-dropped:{name}", f"the relay did not send the request field {name} of the agent's "
                           f"calls to {request.model}: {reason}")
        extra = {**fields.extra, **tool_choice_extra(request.tool_choice, route.model_string)}
        if extra:
            config = config.model_copy(update={"extra": {**config.extra, **extra}})
        if api == GEMINI and request.stream:
            # Gemini CLI gives up on an answer whose headers take over 60 s (undici's headers timeout) and sends the
            # call again, paying twice: its stream starts at once and the call is made while it is open. A budget
            # already spent is still refused first, as an HTTP 402.
            try:
                if self.before_call is not None:
                    self.before_call()
                ledger = getattr(route.model, "ledger", None)
                if ledger is not None:
                    ledger.check_budget()
            except BudgetExceededError as exc:
                return self._budget_spent(api, exc.message)
            return Reply(200, stream=self._early_stream(api, request, route, config))
        return self._call(api, request, route, config)

    def _early_stream(self, api: str, request: RelayRequest, route: Route, config: GenerateConfig
                      ) -> Iterator[bytes]:
        """An SSE answer whose headers are already sent: a bare newline every ``keepalive_s`` while the model works
        (the client's timeout between body chunks is longer; the Gemini SDK skips whitespace before an event but
        would stall on an SSE comment line), then the answer's events, or an error event in the dialect's shape
        (the Gemini SDK raises it with its code)."""
        done = threading.Event()
        outcome: list[Reply] = []

        def call() -> None:
            try:
                outcome.append(self._call(api, request, route, config, prepared=True))
            finally:
                done.set()

        threading.Thread(target=call, name="rexmle-relay-call", daemon=True).start()
        while not done.wait(self.limits.keepalive_s):
            yield b"\n"
        reply = outcome[0]
        if reply.stream is not None:
            yield from reply.stream
        else:
            yield f"data: {json.dumps(reply.body, separators=(',', ':'))}\n\n".encode()

    def _call(self, api: str, request: RelayRequest, route: Route, config: GenerateConfig, *,
              prepared: bool = False) -> Reply:
        """The model call; ``prepared``: ``before_call`` already ran for it."""
        try:
            if self.before_call is not None and not prepared:
                self.before_call()
            messages = adapt_messages(request.messages, route.model_string)
            response = route.model.generate(messages, list(request.tools), config)
        except BudgetExceededError as exc:
            return self._budget_spent(api, exc.message)
        except ModelAPIError as exc:
            transient = isinstance(exc, TransientModelAPIError) or isinstance(exc.__cause__, TransientModelAPIError)
            status, kind = (503, "upstream_unavailable") if transient else (400, "upstream_error")
            return self.refuse(status, api, kind, exc.message, model=request.model)
        except RexmleError as exc:
            return self.refuse(400, api, "invalid_request_error", exc.message, model=request.model)
        with self._lock:
            self.stats.calls += 1
            self.stats.streamed += request.stream
        if self.after_call is not None:
            self.after_call(request, response)
        if request.stream:
            return Reply(200, stream=(gemini.stream_gemini if api == GEMINI else STREAMERS[api])(request, response))
        return Reply(200, (gemini.render_gemini if api == GEMINI else RENDERERS[api])(request, response))

    def answer_gemini(self, model: str, method: str, body: Any) -> Reply:
        """A Gemini API call, whose model and method (generate, stream, count tokens) come from its URL path;
        ``countTokens`` is answered with an estimate, as Anthropic's count_tokens is."""
        if method != gemini.COUNT_TOKENS:
            return self.answer(GEMINI, body, lambda parsed: gemini.parse_gemini(parsed, model=model,
                                                                               stream=method == gemini.STREAM))
        if model not in self.routes:
            known = ", ".join(sorted(self.routes)) or "none"
            return self.refuse(404, GEMINI, "model_not_found", f"model {brief(model)} is not served here (the "
                               f"relay serves {known}: give the agent one of these names)", model=model)
        try:
            tokens = gemini.estimate_tokens(body)
        except ProtocolError as exc:
            return self.refuse(400, GEMINI, "invalid_request_error", str(exc))
        with self._lock:
            self.stats.token_counts += 1
        return Reply(200, {"totalTokens": tokens})

    def embed(self, body: Any) -> Reply:
        if self.embedder is None:
            return self.refuse(404, CHAT, "model_not_found", "this run serves no embeddings model")
        raw = body.get("input") if isinstance(body, dict) else None
        texts = [raw] if isinstance(raw, str) else raw
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return self.refuse(400, CHAT, "invalid_request_error",
                               "embeddings input must be a string or a list of strings (token ids are not supported)")
        limits = self.limits
        characters = sum(map(len, texts))
        if len(texts) > limits.max_embedding_inputs or characters > limits.max_embedding_chars:
            return self.refuse(400, CHAT, "invalid_request_error", f"an embeddings request of {len(texts)} "
                               f"input(s), {characters} characters; at most {limits.max_embedding_inputs} inputs "
                               f"and {limits.max_embedding_chars} characters per request: send them in batches")
        if self.exhausted is not None:
            return self._budget_spent(CHAT, self.exhausted)
        vectors, tokens = self.embedder(texts)
        with self._lock:
            self.stats.embeddings += len(texts)
        model = body.get("model")
        return Reply(200, render_embeddings(model[:200] if isinstance(model, str) and model else self.embedder.name,
                                            vectors, tokens))

    def count_tokens(self, body: Any) -> Reply:
        """Anthropic's ``POST /v1/messages/count_tokens``, answered with an estimate: no model call, no cost, no
        budget. Claude Code asks it before it keeps a large file or tool output in the conversation, and when the
        endpoint fails it counts with a one-token model call instead, which a run would pay for."""
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return self.refuse(400, ANTHROPIC, "invalid_request_error",
                               "a count_tokens body is a JSON object with a list of messages")
        model = body.get("model")
        if not isinstance(model, str) or model not in self.routes:
            known = ", ".join(sorted(self.routes)) or "none"
            return self.refuse(404, ANTHROPIC, "model_not_found", f"model {brief(model)} is not served here (the "
                               f"relay serves {known}: give the agent one of these names)", model=model)
        tokens = estimated_tokens([body.get("system"), body["messages"], body.get("tools")])
        with self._lock:
            self.stats.token_counts += 1
        return Reply(200, {"input_tokens": tokens})

    def models(self) -> Reply:
        data = [{"id": alias, "object": "model", "owned_by": "rexmle-relay"} for alias in sorted(self.routes)]
        return Reply(200, {"object": "list", "data": data})

    def forwarder_fault(self, body: Any) -> Reply:
        """The in-sandbox forwarder could not serve a connection (no thread, no file descriptor, relay refused):
        the agent's calls may be failing, so the run says so. Anything in the sandbox may post this; it is
        journaled once per kind, truncated."""
        kind = body.get("kind") if isinstance(body, dict) else None
        detail = body.get("detail") if isinstance(body, dict) else None
        if not isinstance(kind, str) or not kind:
            return self.refuse(400, CHAT, "invalid_request_error", "a forwarder fault names its kind")
        self.warn_once(f"forwarder:{kind[:40]}", f"relay stalled: the in-sandbox forwarder could not serve the "
                       f"agent's model calls ({kind[:40]}: {str(detail or '')[:300]}); they were answered 503 or "
                       "closed")
        return Reply(200, {"status": "recorded"})

    def turn_away(self, connection: socket.socket, reason: str) -> None:
        """Answer a connection that will not be served (over the cap, or no thread for it) at once, from the
        accepting thread: never blocks (a small answer into an empty socket buffer), never reads the request."""
        try:
            connection.setblocking(False)
            try:
                head = connection.recv(1024, socket.MSG_PEEK)
            except OSError:  # nothing sent yet
                head = b""
            words = head.split(b"\r\n", 1)[0].split()
            api = api_of_path(words[1].decode("latin-1")) if len(words) > 1 else CHAT
            with self._lock:
                self.stats.turned_away += 1
            self.warn_once("overloaded", f"relay stalled: {reason}; the agent's calls were answered 503 to retry "
                           f"(at most {self.limits.max_connections} connections are served at once)")
            reply = self.refuse(503, api, "overloaded", f"{reason}; retry after {RETRY_AFTER_S} s",
                                retry_after=RETRY_AFTER_S)
            connection.send(_response_bytes(reply, close=True))
            connection.shutdown(socket.SHUT_WR)
        except OSError:  # the client went away, or its buffer is full: it gets a closed connection
            pass
        finally:
            connection.close()


def _response_bytes(reply: Reply, *, close: bool) -> bytes:
    """A whole JSON answer, for connections answered outside a handler."""
    payload = json.dumps(reply.body).encode()
    try:
        phrase = HTTPStatus(reply.status).phrase
    except ValueError:
        phrase = "Error"
    lines = [f"HTTP/1.1 {reply.status} {phrase}", "Content-Type: application/json",
             f"Content-Length: {len(payload)}", *(f"{k}: {v}" for k, v in reply.headers.items())]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


class _UnixHTTPServer(socketserver.UnixStreamServer):
    """One thread per connection, at most ``max_connections`` at once; the next are turned away, not queued."""

    request_queue_size = 128
    relay: RelayServer

    def __init__(self, address: str, handler: type[socketserver.BaseRequestHandler]) -> None:
        super().__init__(address, handler)
        self.active = 0
        self._active_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._active_lock:
            admitted = self.active < self.relay.limits.max_connections
            if admitted:
                self.active += 1
        if not admitted:
            self.relay.turn_away(request, f"the relay is serving its {self.active} connections")
            return
        try:
            threading.Thread(target=self._serve, args=(request, client_address), name="rexmle-relay-connection",
                             daemon=True).start()
        except RuntimeError as exc:  # "can't start new thread": the harness is out of threads or memory
            with self._active_lock:
                self.active -= 1
            self.relay.turn_away(request, f"the relay could not start a thread ({exc})")

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # a bug answering one connection must not end the others; the handler answered 500
            logger.exception("relay: a connection failed")
        finally:
            self.shutdown_request(request)
            with self._active_lock:
                self.active -= 1

    def service_actions(self) -> None:
        self.relay._refusals.flush()


class _HeadersTooLarge(Exception):
    pass


class _Phase:
    """The deadline of what a connection does now, and the header bytes it may still send."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.header_budget: int | None = None
        self.received = 0  # bytes read in this phase

    def start(self, seconds: float | None, *, header_budget: int | None = None) -> None:
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.header_budget = header_budget
        self.received = 0


class _ConnectionIO(io.RawIOBase):
    """The connection, read and written under the current phase's deadline: each ``recv``/``send`` waits at most
    until the deadline, so a client trickling one byte at a time cannot stretch a phase."""

    def __init__(self, connection: socket.socket, phase: _Phase) -> None:
        self.connection = connection
        self.phase = phase

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def _arm(self) -> None:
        deadline = self.phase.deadline
        if deadline is None:
            self.connection.settimeout(None)
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the phase's deadline passed")
        self.connection.settimeout(remaining)

    def readinto(self, buffer: Any) -> int:
        self._arm()
        count = self.connection.recv_into(buffer)
        self.phase.received += count
        if self.phase.header_budget is not None:
            self.phase.header_budget -= count
            if self.phase.header_budget < 0:
                raise _HeadersTooLarge
        return count

    def write(self, data: Any) -> int:
        self._arm()
        self.connection.sendall(data)
        return len(data)


_KINDS = {400: "invalid_request_error", 404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
          411: "length_required", 413: "request_too_large", 414: "request_too_large", 431: "request_too_large",
          500: "internal_error", 501: "method_not_allowed", 505: "invalid_request_error"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"  # so that even an unparsable request line gets a status line back
    server: _UnixHTTPServer

    def address_string(self) -> str:  # a Unix socket has no client address
        return "sandbox"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("relay: " + format, *args)

    # ---- the connection ---------------------------------------------------------------------------------
    def setup(self) -> None:
        self.connection = self.request
        self.phase = _Phase()
        raw = _ConnectionIO(self.connection, self.phase)
        self.rfile = io.BufferedReader(raw, buffer_size=65536)
        self.wfile = raw
        self.served = 0
        self.answered = False
        self.reserved = 0

    def finish(self) -> None:
        pass  # the server shuts the socket down; nothing is buffered for writing

    def handle_one_request(self) -> None:
        limits = self.server.relay.limits
        self.command, self.path, self.request_version = None, "", self.default_request_version
        self.requestline = ""
        self.answered = False
        self.phase.start(limits.idle_timeout_s if self.served else limits.header_timeout_s,
                         header_budget=limits.max_header_bytes)
        try:
            self.raw_requestline = self.rfile.readline(MAX_REQUEST_LINE + 1)
            if not self.raw_requestline:
                self.close_connection = True
                return
            self.served += 1
            if len(self.raw_requestline) > MAX_REQUEST_LINE:
                self.send_error(414, f"a request line of more than {MAX_REQUEST_LINE} bytes")
                return
            if not self.raw_requestline.strip():
                self.send_error(400, "an empty request line")
                return
            if not self.parse_request():
                return
            self.phase.start(None)
            method = getattr(self, f"do_{self.command}", None)
            if method is None:
                self.send_error(405, f"{self.command[:20]} is not served")
                return
            method()
        except TimeoutError:
            if self.phase.header_budget is not None and not self.phase.received:
                self.close_connection = True  # an idle connection, no request begun: closed without an answer
                return
            self._fail(408, "the request did not arrive before its deadline (headers "
                       f"{limits.header_timeout_s:g} s, body {limits.body_timeout_s:g} s)")
        except _HeadersTooLarge:
            self._fail(431, f"request headers over {limits.max_header_bytes} bytes")
        except OSError:  # the client went away
            self.close_connection = True
        except Exception as exc:  # a bug of the relay: the agent still gets an answer, the log the traceback
            logger.exception("relay: answering %s %s failed", self.command, self.path[:200])
            self._fail(500, f"the relay failed on this request ({type(exc).__name__}); this is a rexmle bug")
        finally:
            if self.reserved:
                self.server.relay.release_body(self.reserved)
                self.reserved = 0

    def _fail(self, status: int, message: str) -> None:
        self.close_connection = True
        if not self.answered:
            self.send_error(status, message)  # _send gives up quietly on a client that went away

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every error, the base class's own (bad request line, headers) included, as the provider's JSON."""
        self.close_connection = True
        text = message or HTTPStatus(code).phrase
        self._send(self.server.relay.refuse(code, self._api(), _KINDS.get(code, "invalid_request_error"), text,
                                            path=self.path))

    def _api(self) -> str:
        return api_of_path(urlsplit(self.path or "").path) if self.path else CHAT

    # ---- requests -----------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        if self._refused_as_network():
            return
        if self.headers.get("Content-Length", "0").strip() not in ("", "0") or "Transfer-Encoding" in self.headers:
            self.close_connection = True  # a body the relay does not read must not be taken for the next request
        path = urlsplit(self.path).path.rstrip("/")
        if path in ("/health", "/v1/health"):
            self._send(Reply(200, {"status": "ok"}))
        elif path in ("/v1/models", "/models"):
            self._send(self.server.relay.models())
        else:
            self._send(self.server.relay.refuse(404, CHAT, "not_found", f"no endpoint GET {path[:200]}", path=path))

    def do_POST(self) -> None:
        if self._refused_as_network():
            return
        relay = self.server.relay
        path = urlsplit(self.path).path.rstrip("/")
        gemini_call = gemini.match_path(path)
        if gemini_call is not None:
            body = self._read_json(GEMINI)
            self._send(body if isinstance(body, Reply) else relay.answer_gemini(*gemini_call, body))
            return
        counting = path in COUNT_TOKENS_PATHS
        api = ANTHROPIC if counting else API_PATHS.get(path)
        if api is None and path not in (*EMBEDDINGS_PATHS, FORWARDER_FAULT_PATH):
            self.close_connection = True
            served = ", ".join(sorted({*API_PATHS, *EMBEDDINGS_PATHS, *COUNT_TOKENS_PATHS}))
            self._send(relay.refuse(404, api_of_path(path), "not_found", f"no endpoint POST {path[:200]} (served: "
                                    f"{served})", path=path))
            return
        body = self._read_json(api or CHAT)
        if isinstance(body, Reply):
            self._send(body)
        elif path == FORWARDER_FAULT_PATH:
            self._send(relay.forwarder_fault(body))
        elif counting:
            self._send(relay.count_tokens(body))
        else:
            self._send(relay.embed(body) if api is None else relay.answer(api, body))

    def do_CONNECT(self) -> None:
        tls = self.server.relay.tls
        if tls is not None and tls.serves(self.path):
            self._serve_tls(tls)
        else:
            self._refused_as_network()

    def _serve_tls(self, tls: ProviderTLS) -> None:
        """A provider's host reached through the proxy: TLS with the relay's certificate for it, then the requests
        inside served by a handler of their own (same endpoints and limits); this connection ends with them."""
        import ssl

        self.close_connection = True
        self.send_response_only(200, "Connection established")
        self.end_headers()
        try:
            inner = tls.context.wrap_socket(self.connection, server_side=True, do_handshake_on_connect=False)
            inner.settimeout(self.server.relay.limits.header_timeout_s)
            inner.do_handshake()
        except (ssl.SSLError, OSError) as exc:
            self.server.relay.refuse(400, CHAT, "tls_failed", f"TLS for {self.path[:200]} failed: {exc}",
                                     target=self.path)
            return
        type(self)(inner, self.client_address, self.server)

    def do_PUT(self) -> None:
        self.close_connection = True  # its body (if any) is not read; a HEAD's answer must not be followed
        if not self._refused_as_network():
            self._send(self.server.relay.refuse(405, self._api(), "method_not_allowed",
                                                f"{self.command} is not served"))

    do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = do_PUT

    # ---- helpers ------------------------------------------------------------------------------------------
    def _refused_as_network(self) -> bool:
        """A proxy request (CONNECT, or an absolute URL): the agent tried to reach the internet."""
        target = self.path if self.command == "CONNECT" else None
        if target is None and self.path.startswith(("http://", "https://")):
            target = urlsplit(self.path).netloc or self.path
        if target is None:
            return False
        reply = self.server.relay.refuse(403, CHAT, "network_refused", f"the sandbox has no network; {self.command} "
                                         f"{target[:200]} was refused", target=target, method=self.command)
        self.close_connection = True
        self._send(reply)
        return True

    def _read_json(self, api: str) -> Any:
        """The body, read only when its declared length fits the limits (else refused unread, and the connection
        closed rather than drained)."""
        relay, limits = self.server.relay, self.server.relay.limits
        lengths = self.headers.get_all("Content-Length") or []
        if "Transfer-Encoding" in self.headers or not lengths:
            self.close_connection = True
            return relay.refuse(411, api, "length_required", "a request body with a Content-Length is expected "
                                "(chunked bodies are not accepted)")
        if len(set(lengths)) > 1 or not re.fullmatch(r"[0-9]{1,15}", lengths[0].strip()):
            self.close_connection = True
            return relay.refuse(400, api, "invalid_request_error", f"a bad Content-Length {brief(lengths[0])}")
        length = int(lengths[0])
        if length > limits.max_body_bytes:
            self.close_connection = True
            return relay.refuse(413, api, "request_too_large", f"a request body of {length} bytes; at most "
                                f"{limits.max_body_bytes} are accepted (shorten the prompt)", bytes=length)
        if not relay.reserve_body(length):
            self.close_connection = True
            return relay.refuse(503, api, "overloaded", f"the relay is handling {limits.max_inflight_body_bytes} "
                                f"bytes of requests already; retry after {RETRY_AFTER_S} s", retry_after=RETRY_AFTER_S)
        self.reserved = length
        self.phase.start(limits.body_timeout_s)
        raw = self.rfile.read(length)
        self.phase.start(None)
        if len(raw) < length:
            self.close_connection = True
            return relay.refuse(400, api, "invalid_request_error", f"the body ended after {len(raw)} of the "
                                f"{length} bytes its Content-Length announced")
        return relay.decode(api, raw)

    def _send(self, reply: Reply) -> None:
        self.answered = True
        self.phase.start(self.server.relay.limits.write_timeout_s)
        try:
            if reply.stream is not None:
                self.send_response(reply.status)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in reply.stream:
                    self.phase.start(self.server.relay.limits.write_timeout_s)  # each chunk its own deadline
                    self.wfile.write(chunk)
                    self.wfile.flush()
                self.close_connection = True
                return
            payload = json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # the agent went away mid-answer, or did not read it before the deadline
            self.close_connection = True
