"""Anthropic backend: the messages API, plain or streamed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import anthropic
from anthropic.types import Message as AnthropicMessage

from rexmle_agents.models.base import TransientModelAPIError, malformed_response, translating_sdk_errors
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
        with translating_sdk_errors(anthropic, self.name, key_env=KEY_ENV, timeout_s=timeout_s):
            if config.stream:
                # The SDK's stream helper assembles text, tool-use input (sent as JSON pieces) and usage.
                with self._client.messages.stream(**request) as stream:
                    seen = {event.type for event in stream}
                    # message_delta brings the stop reason and the final usage: without it the stream broke off
                    if "message_delta" not in seen:
                        raise TransientModelAPIError(f"{self.name}: the stream broke off before the model finished")
                    message = stream.get_final_message()
            else:
                message = self._client.messages.create(**request)
            if not isinstance(message, AnthropicMessage):  # the SDK hands back the text of a non-JSON body
                raise malformed_response(self.name, f"expected a JSON message, got {str(message)[:200]!r}")
            return self._convert(message)

    def _convert(self, message: AnthropicMessage) -> ModelResponse:
        text = "".join(block.text for block in message.content if block.type == "text")
        calls = tuple(
            ToolCall(id=block.id, name=block.name, arguments=block.input)
            if isinstance(block.input, dict)
            else ToolCall(id=block.id, name=block.name, parse_error=f"tool input is not an object: {block.input!r}")
            for block in message.content
            if block.type == "tool_use"
        )
        usage = message.usage
        read = usage.cache_read_input_tokens or 0
        write = usage.cache_creation_input_tokens or 0
        return ModelResponse(
            text=text,
            tool_calls=calls,
            # Anthropic's input_tokens leaves out cache reads and writes; ours counts every prompt token.
            usage=Usage(
                input_tokens=(usage.input_tokens or 0) + read + write,
                output_tokens=usage.output_tokens or 0,
                cached_input_tokens=read,
                cache_write_input_tokens=write,
            ),
            model=message.model or self.model_id,
            finish_reason=_STOP_REASONS.get(message.stop_reason or "end_turn", message.stop_reason or FINISH_STOP),
            id=message.id,
        )


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
