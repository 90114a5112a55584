"""Record and replay model calls, and scripted backends for tests.

A cassette is a JSON-lines file of :class:`CassetteEntry`: the request (normalised), its key and the response.
:class:`RecordingBackend` writes one entry per successful call; :class:`ReplayBackend` serves them offline, so a
recorded run can be repeated exactly without keys or network. Identical requests are served in recorded order.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from rexmle_agents.models._jsonl import append_jsonl, clean_json
from rexmle_agents.models.base import ModelBackend
from rexmle_agents.models.types import GenerateConfig, Message, ModelResponse, ToolSpec
from rexmle_grade.errors import ModelAPIError, UserInputError

# Settings that change how a call is made but not what it answers; a streamed recording replays unstreamed.
_TRANSPORT_FIELDS = {"timeout_s", "stream"}


def normalised_request(
    model: str, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig
) -> dict[str, Any]:
    # python mode (made JSON when hashed and when written, with notes of what was repaired): pydantic's JSON mode
    # stops at ~255 levels, and tool arguments a model or an agent nested deeper must not make the call raise
    return {
        "model": model,
        "messages": [m.model_dump(mode="python") for m in messages],
        "tools": [t.model_dump(mode="python") for t in tools],
        "config": config.model_dump(mode="python", exclude=_TRANSPORT_FIELDS),
    }


# Lines an agent's tool framing writes differently on every run of the same command (Codex CLI heads each command
# output with a random chunk id and the wall time): left out of the key only, so such a recorded run replays
_VOLATILE_TOOL_LINES = re.compile(r"(?m)^(?:Chunk ID: [0-9a-f]+|Wall time: [0-9.]+ seconds)$")


def _stable_tool_outputs(request: dict[str, Any]) -> dict[str, Any]:
    messages = [{**m, "content": _VOLATILE_TOOL_LINES.sub("", m["content"])}
                if isinstance(m, dict) and m.get("role") == "tool" and isinstance(m.get("content"), str) else m
                for m in request.get("messages") or ()]
    return {**request, "messages": messages} if "messages" in request else request


def request_key(request: dict[str, Any]) -> str:
    """A stable hash of a normalised request (canonical JSON: sorted keys, no whitespace), taken after the run
    files' repairs (:func:`clean_json`: a lone surrogate or a NaN in relayed agent text cannot make it raise)."""
    canonical = json.dumps(clean_json(_stable_tool_outputs(request))[0], sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class CassetteEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    request: dict[str, Any]
    response: ModelResponse
    repaired: dict[str, str] | None = None  # what JSON could not hold, repaired when written (see append_jsonl)


class RecordingBackend:
    """Passes calls to ``backend`` and appends each answered call to the cassette at ``path``."""

    def __init__(self, backend: ModelBackend, path: Path) -> None:
        self.backend = backend
        self.name = backend.name
        self.path = path

    def generate(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig) -> ModelResponse:
        response = self.backend.generate(messages, tools, config)
        request = normalised_request(self.name, messages, tools, config)
        append_jsonl(self.path, CassetteEntry(key=request_key(request), request=request, response=response))
        return response


class ReplayBackend:
    """Serves the responses recorded in the cassette at ``path`` for model ``name``; never touches the network."""

    def __init__(self, path: Path, name: str) -> None:
        self.name = name
        self.path = path
        self._queues: dict[str, deque[ModelResponse]] = defaultdict(deque)
        self._served: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise UserInputError(
                f"cannot read the cassette {path}: {exc}", hint="record one first with get_model(..., record_to=PATH)"
            ) from exc
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                entry = CassetteEntry.model_validate_json(line)
            except ValueError as exc:
                raise UserInputError(
                    f"line {number} of the cassette {path} is not a recorded call: {exc}",
                    hint="a cassette holds one JSON object per line, as written by RecordingBackend",
                ) from exc
            self._queues[entry.key].append(entry.response)  # keys cover the model: other models' calls never match

    def generate(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig) -> ModelResponse:
        key = request_key(normalised_request(self.name, messages, tools, config))
        with self._lock:
            queue = self._queues.get(key)
            if queue:
                self._served[key] += 1
                return queue.popleft()
            served = self._served[key]
        last = messages[-1].content[:80] if messages else ""
        seen = f"it was recorded {served} time(s), all already replayed" if served else "it was never recorded"
        raise ModelAPIError(
            f"{self.name}: the cassette {self.path} has no response for this request ({len(messages)} message(s), "
            f"last {last!r}; key {key[:12]}): {seen}",
            hint="the run has diverged from the recording (a changed prompt, tool or config); record it again",
        )


ScriptItem = ModelResponse | str | BaseException
Script = Sequence[ScriptItem] | Callable[[Sequence[Message], Sequence[ToolSpec], GenerateConfig], ScriptItem]


class ScriptedBackend:
    """A backend for tests: answers from a list (in order) or a function of the request.

    A string becomes a text response; an exception instance is raised (a :class:`TransientModelAPIError` tests
    the retries). ``requests`` keeps every call's messages, tools and config.
    """

    def __init__(self, script: Script, *, name: str = "scripted/model") -> None:
        self.name = name
        self._function = script if callable(script) else None
        self._queue: deque[ScriptItem] = deque(() if callable(script) else script)
        self._given = len(self._queue)
        self.requests: list[tuple[Sequence[Message], Sequence[ToolSpec], GenerateConfig]] = []
        self._lock = threading.Lock()

    def generate(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig) -> ModelResponse:
        with self._lock:
            self.requests.append((messages, tools, config))
            if self._function is None:
                if not self._queue:
                    raise ModelAPIError(
                        f"{self.name}: the script is used up ({self._given} response(s) for "
                        f"{len(self.requests)} calls)",
                        hint="give the ScriptedBackend as many responses as the test makes calls",
                    )
                item = self._queue.popleft()
        if self._function is not None:  # outside the lock, so concurrent calls overlap as they would for real
            item = self._function(messages, tools, config)
        if isinstance(item, BaseException):
            raise item
        return ModelResponse(text=item, model=self.name) if isinstance(item, str) else item
