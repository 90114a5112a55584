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
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import re
import socketserver
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from rexmle_agents.models.base import TransientModelAPIError
from rexmle_agents.models.types import GenerateConfig, Message, ModelResponse, ToolSpec
from rexmle_agents.relay.protocol import (
    ANTHROPIC,
    CHAT,
    PARSERS,
    RENDERERS,
    RESPONSES,
    STREAMERS,
    ProtocolError,
    adapt_messages,
    error_body,
    render_embeddings,
    tool_choice_extra,
)
from rexmle_grade.errors import BudgetExceededError, ModelAPIError, RexmleError

logger = logging.getLogger(__name__)

SOCKET_NAME = "relay.sock"
MAX_BODY_BYTES = 64 * 2**20
STATUS_BUDGET = 402  # not retried by the OpenAI and Anthropic SDKs (they retry 408, 409, 429 and 5xx)
API_PATHS = {"/v1/chat/completions": CHAT, "/chat/completions": CHAT, "/v1/responses": RESPONSES,
             "/responses": RESPONSES, "/v1/messages": ANTHROPIC, "/messages": ANTHROPIC}
EMBEDDINGS_PATHS = ("/v1/embeddings", "/embeddings")


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


@dataclass
class RelayStats:
    calls: int = 0
    streamed: int = 0
    refused: list[dict[str, Any]] = field(default_factory=list)
    embeddings: int = 0


class RelayServer:
    """Serve ``routes`` on ``folder/relay.sock`` until :meth:`close`.

    ``before_call`` runs before every model call (an external agent syncs its node tree and opens a step there;
    it may raise :class:`BudgetExceededError`). ``record(message, **data)`` journals what the relay refused.
    ``on_budget_exhausted(reason)`` is called once, the first time a call is refused for a spent budget.
    ``socket_owner`` (uid, gid) gives the socket to the sandbox's user, the only one besides root who may use it.
    """

    def __init__(self, folder: Path, routes: Mapping[str, Route], *,
                 before_call: Callable[[], None] | None = None,
                 record: Callable[..., None] | None = None,
                 on_budget_exhausted: Callable[[str], None] | None = None,
                 embedder: HashingEmbedder | None = None,
                 socket_owner: tuple[int, int] | None = None) -> None:
        self.folder = Path(folder)
        self.socket_path = self.folder / SOCKET_NAME
        self.routes = dict(routes)
        self.before_call = before_call
        self.record = record or (lambda message, **data: logger.info("relay: %s %s", message, data))
        self.on_budget_exhausted = on_budget_exhausted
        self.embedder = embedder
        self.socket_owner = socket_owner
        self.stats = RelayStats()
        self.exhausted: str | None = None
        self._lock = threading.Lock()
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
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> RelayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- answering ------------------------------------------------------------------------------------------
    def refuse(self, status: int, api: str, kind: str, message: str, **data: Any) -> Reply:
        with self._lock:
            self.stats.refused.append({"status": status, "kind": kind, "message": message, **data})
        self.record(f"relay refused a request ({status} {kind}): {message}", relay=kind, status=status, **data)
        return Reply(status, error_body(api, status, kind, f"rexmle relay: {message}"))

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

    def answer(self, api: str, body: Any) -> Reply:
        try:
            if not isinstance(body, dict):
                raise ProtocolError("the request body must be a JSON object")
            request = PARSERS[api](body)
        except (ProtocolError, ValueError) as exc:
            return self.refuse(400, api, "invalid_request_error", str(exc))
        route = self.routes.get(request.model)
        if route is None:
            known = ", ".join(sorted(self.routes)) or "none"
            return self.refuse(404, api, "model_not_found", f"model {request.model!r} is not served here (the relay "
                               f"serves {known}: give the agent one of these names)", model=request.model)
        if self.exhausted is not None:
            return self._budget_spent(api, self.exhausted)
        config = request.config
        extra = tool_choice_extra(request.tool_choice, route.model_string)
        if extra:
            config = config.model_copy(update={"extra": {**config.extra, **extra}})
        try:
            if self.before_call is not None:
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
        if request.stream:
            return Reply(200, stream=STREAMERS[api](request, response))
        return Reply(200, RENDERERS[api](request, response))

    def embed(self, body: Any) -> Reply:
        if self.embedder is None:
            return self.refuse(404, CHAT, "model_not_found", "this run serves no embeddings model")
        raw = body.get("input") if isinstance(body, dict) else None
        texts = [raw] if isinstance(raw, str) else raw
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return self.refuse(400, CHAT, "invalid_request_error",
                               "embeddings input must be a string or a list of strings (token ids are not supported)")
        if self.exhausted is not None:
            return self._budget_spent(CHAT, self.exhausted)
        vectors, tokens = self.embedder(texts)
        with self._lock:
            self.stats.embeddings += len(texts)
        return Reply(200, render_embeddings(str(body.get("model") or self.embedder.name), vectors, tokens))

    def models(self) -> Reply:
        data = [{"id": alias, "object": "model", "owned_by": "rexmle-relay"} for alias in sorted(self.routes)]
        return Reply(200, {"object": "list", "data": data})


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    relay: RelayServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _UnixHTTPServer

    def address_string(self) -> str:  # a Unix socket has no client address
        return "sandbox"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("relay: " + format, *args)

    # ---- requests -----------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        if self._refused_as_network():
            return
        path = urlsplit(self.path).path.rstrip("/")
        if path in ("/health", "/v1/health"):
            self._send(Reply(200, {"status": "ok"}))
        elif path in ("/v1/models", "/models"):
            self._send(self.server.relay.models())
        else:
            self._send(self.server.relay.refuse(404, CHAT, "not_found", f"no endpoint GET {path}", path=path))

    def do_POST(self) -> None:
        if self._refused_as_network():
            return
        relay = self.server.relay
        path = urlsplit(self.path).path.rstrip("/")
        api = API_PATHS.get(path)
        if api is None and path not in EMBEDDINGS_PATHS:
            self._send(relay.refuse(404, CHAT, "not_found", f"no endpoint POST {path} (served: "
                                    f"{', '.join(sorted({*API_PATHS, *EMBEDDINGS_PATHS}))})", path=path))
            return
        body = self._read_json(api or CHAT)
        if isinstance(body, Reply):
            self._send(body)
            return
        self._send(relay.embed(body) if api is None else relay.answer(api, body))

    def do_CONNECT(self) -> None:
        self._refused_as_network()

    def do_PUT(self) -> None:
        if not self._refused_as_network():
            self._send(self.server.relay.refuse(405, CHAT, "method_not_allowed", "PUT is not served"))

    do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_PUT

    # ---- helpers ------------------------------------------------------------------------------------------
    def _refused_as_network(self) -> bool:
        """A proxy request (CONNECT, or an absolute URL): the agent tried to reach the internet."""
        target = self.path if self.command == "CONNECT" else None
        if target is None and self.path.startswith(("http://", "https://")):
            target = urlsplit(self.path).netloc or self.path
        if target is None:
            return False
        reply = self.server.relay.refuse(403, CHAT, "network_refused", f"the sandbox has no network; {self.command} "
                                         f"{target} was refused", target=target, method=self.command)
        self.close_connection = True
        self._send(reply)
        return True

    def _read_json(self, api: str) -> Any:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            return self.server.relay.refuse(413 if length > 0 else 411, api, "invalid_request_error",
                                            f"a request body of 0 to {MAX_BODY_BYTES} bytes with a Content-Length "
                                            "is expected")
        raw = self.rfile.read(length)
        try:
            return json.loads(raw or b"null")
        except ValueError as exc:
            return self.server.relay.refuse(400, api, "invalid_request_error", f"the body is not JSON: {exc}")

    def _send(self, reply: Reply) -> None:
        try:
            if reply.stream is not None:
                self.send_response(reply.status)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in reply.stream:
                    self.wfile.write(chunk)
                self.wfile.flush()
                self.close_connection = True
                return
            payload = json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the agent went away mid-answer
            self.close_connection = True
