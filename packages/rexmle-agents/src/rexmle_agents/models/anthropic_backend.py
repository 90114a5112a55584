"""Anthropic backend: the messages API, plain or streamed."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import anthropic
import httpx2
from anthropic.types import Message as AnthropicMessage
from anthropic.types import RawMessageStreamEvent
from anthropic.types import Usage as AnthropicUsage

from rexmle_agents.models.base import (
    TransientModelAPIError,
    malformed_response,
    tool_call_from_json,
    translating_sdk_errors,
)
from rexmle_agents.models.types import (
    FINISH_CONTENT_FILTER,
    FINISH_LENGTH,
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    GenerateConfig,
    Message,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
)

logger = logging.getLogger(__name__)

KEY_ENV = "ANTHROPIC_API_KEY"
# The messages API requires a length limit; this one is used when the config sets none.
DEFAULT_MAX_TOKENS = 8192

_STOP_REASONS = {
    "end_turn": FINISH_STOP,
    "stop_sequence": FINISH_STOP,
    "max_tokens": FINISH_LENGTH,
    "tool_use": FINISH_TOOL_CALLS,
    "refusal": FINISH_CONTENT_FILTER,
}


class AnthropicBackend:
    """Claude models through the messages API; system messages become the ``system`` parameter."""

    def __init__(self, name: str, model_id: str, *, api_key: str, base_url: str | None, timeout_s: float) -> None:
        self.name = name
        self.model_id = model_id
        self.timeout_s = timeout_s
        self._warned_temperature = False
        # The explicit key keeps the SDK from falling back to profiles on disk; retries are Model's job.
        self._client = anthropic.Anthropic(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout_s)

    def generate(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig) -> ModelResponse:
        timeout_s = config.timeout_s or self.timeout_s
        system, turns = _anthropic_turns(messages)
        request: dict[str, Any] = {
            "model": self.model_id,
            "max_tokens": config.max_tokens or DEFAULT_MAX_TOKENS,
            "messages": turns,
            "timeout": timeout_s,
        }
        if system:
            request["system"] = system
        if tools:
            request["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
            ]
        if config.temperature is not None and not self._warned_temperature:
            # The messages API (as of the pinned SDK) takes no temperature; GenerateConfig.extra can still send one.
            logger.warning("%s: the Anthropic messages API has no temperature setting; it is ignored", self.name)
            self._warned_temperature = True
        if config.stop:
            request["stop_sequences"] = list(config.stop)
        if config.extra:
            request["extra_body"] = config.extra
        # The SDK wraps its HTTP library's errors while it sends a request but not while it reads a stream's
        # events (as of anthropic 2.12), so a connection reset mid-stream arrives as httpx2's own ReadError.
        with translating_sdk_errors(anthropic, self.name, key_env=KEY_ENV, timeout_s=timeout_s, transport=httpx2):
            if config.stream:
                # Raw events, assembled here: the SDK's stream helper fails with AttributeError on a stream
                # without usage, which must count as unknown usage instead.
                with self._client.messages.create(**request, stream=True) as events:
                    return self._from_events(events)
            message = self._client.messages.create(**request)
            if not isinstance(message, AnthropicMessage):  # the SDK hands back the text of a non-JSON body
                raise malformed_response(self.name, f"expected a JSON message, got {str(message)[:200]!r}")
            return self._convert(message)

    def _convert(self, message: AnthropicMessage) -> ModelResponse:
        text = "".join(block.text for block in message.content if block.type == "text")
        calls = tuple(
            _tool_call(block.id, block.name, block.input) for block in message.content if block.type == "tool_use"
        )
        # The SDK builds the message without validation, so a body without ``usage`` arrives with usage None.
        usage = self._usage(getattr(message, "usage", None))
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=Usage() if usage is None else usage,
            usage_known=usage is not None,
            model=message.model or self.model_id,
            finish_reason=_STOP_REASONS.get(message.stop_reason or "end_turn", message.stop_reason or FINISH_STOP),
            id=message.id,
        )

    def _from_events(self, events: Iterable[RawMessageStreamEvent]) -> ModelResponse:
        """Assemble a streamed message: text deltas, tool-use input (JSON in pieces), stop reason and usage.

        ``message_start`` brings the input counts and ``message_delta`` the final output count (and, from newer
        servers, final input counts); the usage is known only when both arrived with one.
        """
        message_id, model = None, self.model_id
        text: list[str] = []
        tools: dict[int, dict[str, Any]] = {}
        stop_reason: str | None = None
        start_usage: Any = None
        final_usage: Any = None
        for event in events:
            if event.type == "message_start":
                message_id = event.message.id or message_id
                model = event.message.model or model
                start_usage = getattr(event.message, "usage", None)
            elif event.type == "content_block_start":
                block = event.content_block
                if block.type == "text":
                    text.append(block.text or "")
                elif block.type == "tool_use":
                    tools[event.index] = {"id": block.id, "name": block.name, "json": "", "input": block.input}
            elif event.type == "content_block_delta":
                if event.delta.type == "text_delta":
                    text.append(event.delta.text)
                elif event.delta.type == "input_json_delta" and event.index in tools:
                    tools[event.index]["json"] += event.delta.partial_json
            elif event.type == "message_delta":
                stop_reason = event.delta.stop_reason or stop_reason
                final_usage = getattr(event, "usage", None)
        if stop_reason is None:  # message_delta brings the stop reason: without it the stream broke off
            raise TransientModelAPIError(f"{self.name}: the stream broke off before the model finished")
        usage = _stream_usage(start_usage, final_usage)
        if usage is None:
            self._usage(None)  # logs the warning
        calls = tuple(
            tool_call_from_json(t["id"], t["name"], t["json"])
            if t["json"].strip()
            else _tool_call(t["id"], t["name"], t["input"])
            for _, t in sorted(tools.items())
        )
        return ModelResponse(
            text="".join(text),
            tool_calls=calls,
            usage=Usage() if usage is None else usage,
            usage_known=usage is not None,
            model=model,
            finish_reason=_STOP_REASONS.get(stop_reason, stop_reason),
            id=message_id,
        )

    def _usage(self, usage: AnthropicUsage | None) -> Usage | None:
        if usage is None:
            logger.warning("%s: the response reports no token usage; the call counts as unknown usage", self.name)
            return None
        read = usage.cache_read_input_tokens or 0
        write = usage.cache_creation_input_tokens or 0
        # Anthropic's input_tokens leaves out cache reads and writes; ours counts every prompt token.
        return Usage(
            input_tokens=(usage.input_tokens or 0) + read + write,
            output_tokens=usage.output_tokens or 0,
            cached_input_tokens=read,
            cache_write_input_tokens=write,
        )


def _stream_usage(start: Any, final: Any) -> Usage | None:
    """Usage from ``message_start``'s counts updated by ``message_delta``'s; None unless both carried usage."""
    if start is None or final is None:
        return None

    def latest(field: str) -> int:
        value = getattr(final, field, None)
        return (getattr(start, field, None) or 0) if value is None else value

    read, write = latest("cache_read_input_tokens"), latest("cache_creation_input_tokens")
    return Usage(
        input_tokens=latest("input_tokens") + read + write,
        output_tokens=latest("output_tokens"),
        cached_input_tokens=read,
        cache_write_input_tokens=write,
    )


def _tool_call(call_id: str, name: str, tool_input: object) -> ToolCall:
    if isinstance(tool_input, dict):
        return ToolCall(id=call_id, name=name, arguments=tool_input)
    return ToolCall(id=call_id, name=name, parse_error=f"tool input is not an object: {tool_input!r}")


def _anthropic_turns(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """Split out the system prompt; tool results become user turns, and consecutive same-role turns merge, so
    the results of one assistant turn's tool calls travel together in the next user turn as the API requires."""
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        blocks: list[dict[str, Any]] = []
        if message.role == "tool":
            blocks.append({"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content})
        elif message.content:
            blocks.append({"type": "text", "text": message.content})
        blocks.extend(
            {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in message.tool_calls
        )
        role = "assistant" if message.role == "assistant" else "user"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        elif blocks:
            turns.append({"role": role, "content": blocks})
    return system, turns
