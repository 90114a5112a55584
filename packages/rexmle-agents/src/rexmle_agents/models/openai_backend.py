"""OpenAI backends: the chat completions API and the responses API, for OpenAI, Azure OpenAI and compatible servers."""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion_usage import CompletionUsage
from openai.types.responses import Response, ResponseStreamEvent

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
from rexmle_grade.errors import ConfigurationError, ModelAPIError

logger = logging.getLogger(__name__)

_INCOMPLETE_REASONS = {"max_output_tokens": FINISH_LENGTH, "content_filter": FINISH_CONTENT_FILTER}
# A failed response with these codes may succeed on another attempt.
_TRANSIENT_RESPONSE_ERRORS = {"server_error", "rate_limit_exceeded"}


def openai_client(*, api_key: str, base_url: str | None, timeout_s: float) -> openai.OpenAI:
    """A client for OpenAI or a compatible server, with the SDK's own retries off: :class:`Model` retries."""
    return openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout_s)


def azure_client(*, api_key: str, endpoint: str, api_version: str, timeout_s: float) -> openai.AzureOpenAI:
    """A client for an Azure OpenAI resource; requests name a deployment where OpenAI's name a model."""
    return openai.AzureOpenAI(
        api_key=api_key, azure_endpoint=endpoint, api_version=api_version, max_retries=0, timeout=timeout_s
    )


class _OpenAIBackend(ABC):
    """What both OpenAI APIs share: the client (made by :func:`openai_client` or :func:`azure_client`) and errors."""

    def __init__(self, name: str, model_id: str, *, client: openai.OpenAI, key_env: str, timeout_s: float) -> None:
        self.name = name
        self.model_id = model_id
        self.key_env = key_env
        self.timeout_s = timeout_s
        self._client = client

    def generate(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig) -> ModelResponse:
        timeout_s = config.timeout_s or self.timeout_s
        with translating_sdk_errors(openai, self.name, key_env=self.key_env, timeout_s=timeout_s):
            return self._call(messages, tools, config, timeout_s)

    @abstractmethod
    def _call(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig, timeout_s: float
    ) -> ModelResponse: ...

    def _usage_missing(self) -> None:
        logger.warning("%s: the response reports no token usage; the call counts as unknown usage", self.name)


class OpenAIChatBackend(_OpenAIBackend):
    """The chat completions API (``/chat/completions``), which OpenAI-compatible servers also speak.

    ``max_tokens_field`` names the length limit: OpenAI's current models take ``max_completion_tokens``, while
    many compatible servers only know the older ``max_tokens``.

    Some servers attach an ``extra_content`` object to a tool call that must come back with that call in later
    turns (Gemini's thought signatures); the backend keeps them by call id and sends them back. They live in
    this object only: a conversation continued by another process sends its older calls without them.
    """

    def __init__(self, name: str, model_id: str, *, max_tokens_field: str = "max_completion_tokens", **kwargs: Any):
        super().__init__(name, model_id, **kwargs)
        self.max_tokens_field = max_tokens_field
        self._tool_call_extras: dict[str, dict[str, Any]] = {}

    def _call(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig, timeout_s: float
    ) -> ModelResponse:
        request: dict[str, Any] = {
            "model": self.model_id,
            "messages": [_chat_message(m, self._tool_call_extras) for m in messages],
            "timeout": timeout_s,
        }
        if tools:
            request["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
        if config.temperature is not None:
            request["temperature"] = config.temperature
        if config.max_tokens is not None:
            request[self.max_tokens_field] = config.max_tokens
        if config.stop:
            request["stop"] = list(config.stop)
        if config.extra:
            request["extra_body"] = config.extra
        if config.stream:
            with self._client.chat.completions.create(
                **request, stream=True, stream_options={"include_usage": True}
            ) as stream:
                return self._from_chunks(stream)
        completion = self._client.chat.completions.create(**request)
        if not isinstance(completion, ChatCompletion):  # the SDK hands back the text of a non-JSON body
            raise malformed_response(self.name, f"expected a JSON chat completion, got {str(completion)[:200]!r}")
        if not completion.choices:
            raise malformed_response(self.name, "the chat completion has no choices")
        message = completion.choices[0].message
        calls = []
        for c in message.tool_calls or ():
            if c.type == "function":
                self._keep_extra(c.id, _extra_content(c))
                calls.append(tool_call_from_json(c.id, c.function.name, c.function.arguments or ""))
        usage = self._usage(completion.usage)
        return ModelResponse(
            text=message.content or message.refusal or "",
            tool_calls=tuple(calls),
            usage=Usage() if usage is None else usage,
            usage_known=usage is not None,
            model=completion.model or self.model_id,
            finish_reason=completion.choices[0].finish_reason or FINISH_STOP,
            id=completion.id,
        )

    def _from_chunks(self, chunks: Iterable[ChatCompletionChunk]) -> ModelResponse:
        """Assemble a streamed completion: text deltas, tool calls (arguments arrive in pieces) and final usage."""
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        extras: dict[int, dict[str, Any]] = {}
        usage: CompletionUsage | None = None
        finish_reason: str | None = None
        response_id, model = None, self.model_id
        for chunk in chunks:
            response_id, model = chunk.id or response_id, chunk.model or model
            usage = chunk.usage or usage  # with include_usage, the last chunk carries usage and no choices
            for choice in chunk.choices or ():
                if choice.index != 0:
                    continue
                delta = choice.delta
                if delta.content:
                    text.append(delta.content)
                for piece in delta.tool_calls or ():
                    call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
                    call["id"] = piece.id or call["id"]
                    if (extra := _extra_content(piece)) is not None:
                        extras[piece.index] = extra
                    if piece.function is not None:
                        # the name arrives whole in one chunk; only the arguments are split
                        call["name"] = piece.function.name or call["name"]
                        call["arguments"] += piece.function.arguments or ""
                finish_reason = choice.finish_reason or finish_reason
        if finish_reason is None:  # a complete stream always says why it ended
            raise TransientModelAPIError(f"{self.name}: the stream broke off before the model finished")
        for index, extra in extras.items():
            self._keep_extra(calls[index]["id"], extra)
        known = self._usage(usage)
        return ModelResponse(
            text="".join(text),
            tool_calls=tuple(tool_call_from_json(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())),
            usage=Usage() if known is None else known,
            usage_known=known is not None,
            model=model,
            finish_reason=finish_reason,
            id=response_id,
        )

    def _keep_extra(self, call_id: str, extra: dict[str, Any] | None) -> None:
        if extra is not None and call_id:
            self._tool_call_extras[call_id] = extra

    def _usage(self, usage: CompletionUsage | None) -> Usage | None:
        """Our usage from the completion's, or None (unknown) when the server sent none."""
        if usage is None:
            return self._usage_missing()
        details = usage.prompt_tokens_details
        return Usage(
            input_tokens=usage.prompt_tokens or 0,
            output_tokens=usage.completion_tokens or 0,
            cached_input_tokens=(details and details.cached_tokens) or 0,
            cache_write_input_tokens=(details and getattr(details, "cache_write_tokens", None)) or 0,
        )


class OpenAIResponsesBackend(_OpenAIBackend):
    """The responses API (``/responses``), stateless: every call sends the whole conversation (``store=False``)."""

    def _call(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig, timeout_s: float
    ) -> ModelResponse:
        if config.stop:
            raise ConfigurationError(
                f"{self.name}: the OpenAI responses API has no stop sequences, but the config sets {config.stop}",
                hint="use the chat completions API (api='chat') or leave GenerateConfig.stop empty",
            )
        request: dict[str, Any] = {
            "model": self.model_id,
            "input": [item for m in messages for item in _responses_items(m)],
            "store": False,
            "timeout": timeout_s,
        }
        if tools:
            request["tools"] = [
                # strict schemas would reject ordinary JSON schemas (optional properties, free-form objects)
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": False,
                }
                for t in tools
            ]
        if config.temperature is not None:
            request["temperature"] = config.temperature
        if config.max_tokens is not None:
            request["max_output_tokens"] = config.max_tokens
        if config.extra:
            request["extra_body"] = config.extra
        if config.stream:
            with self._client.responses.create(**request, stream=True) as stream:
                response = self._final_response(stream)
        else:
            response = self._client.responses.create(**request)
        if not isinstance(response, Response):  # the SDK hands back the text of a non-JSON body
            raise malformed_response(self.name, f"expected a JSON response object, got {str(response)[:200]!r}")
        return self._convert(response)

    def _final_response(self, events: Iterable[ResponseStreamEvent]) -> Response:
        """The stream's closing event repeats the whole response, so the deltas before it need no assembly."""
        for event in events:
            if event.type in ("response.completed", "response.incomplete", "response.failed"):
                return event.response
            if event.type == "error":
                raise TransientModelAPIError(f"{self.name}: the stream reported an error: {event.message}")
        raise TransientModelAPIError(f"{self.name}: the stream broke off before the response was complete")

    def _convert(self, response: Response) -> ModelResponse:
        if response.status == "failed":
            error = response.error
            message = f"{self.name}: the response failed" + (f": {error.code}: {error.message}" if error else "")
            if error is not None and error.code in _TRANSIENT_RESPONSE_ERRORS:
                raise TransientModelAPIError(message)
            raise ModelAPIError(message)
        text: list[str] = []
        calls: list[ToolCall] = []
        for item in response.output or ():
            if item.type == "message":
                text.extend(p.text if p.type == "output_text" else p.refusal for p in item.content)
            elif item.type == "function_call":
                calls.append(tool_call_from_json(item.call_id, item.name, item.arguments))
        if calls:
            finish_reason = FINISH_TOOL_CALLS
        elif response.status == "incomplete":
            reason = response.incomplete_details.reason if response.incomplete_details else None
            finish_reason = _INCOMPLETE_REASONS.get(reason or "", reason or "incomplete")
        else:
            finish_reason = FINISH_STOP
        usage = response.usage
        if usage is None:
            self._usage_missing()
        details = usage.input_tokens_details if usage else None
        return ModelResponse(
            text="".join(text),
            tool_calls=tuple(calls),
            usage=Usage()
            if usage is None
            else Usage(
                input_tokens=usage.input_tokens or 0,
                output_tokens=usage.output_tokens or 0,
                cached_input_tokens=(details and details.cached_tokens) or 0,
                cache_write_input_tokens=(details and getattr(details, "cache_write_tokens", None)) or 0,
            ),
            usage_known=usage is not None,
            model=response.model or self.model_id,
            finish_reason=finish_reason,
            id=response.id,
        )


def _extra_content(item: Any) -> dict[str, Any] | None:
    """The ``extra_content`` object a server added to a tool call (the SDK keeps unknown fields as extras)."""
    value = (getattr(item, "model_extra", None) or {}).get("extra_content")
    return value if isinstance(value, dict) else None


def _chat_message(message: Message, tool_call_extras: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role != "assistant" or not message.tool_calls:
        return {"role": message.role, "content": message.content}
    return {
        "role": "assistant",
        "content": message.content or None,
        "tool_calls": [_chat_tool_call(c, tool_call_extras.get(c.id)) for c in message.tool_calls],
    }


def _chat_tool_call(call: ToolCall, extra: dict[str, Any] | None) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
    }
    if extra is not None:
        wire["extra_content"] = extra
    return wire


def _responses_items(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        return [{"type": "function_call_output", "call_id": message.tool_call_id, "output": message.content}]
    items: list[dict[str, Any]] = []
    if message.content or not message.tool_calls:
        items.append({"role": message.role, "content": message.content})
    items.extend(
        {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": json.dumps(c.arguments)}
        for c in message.tool_calls
    )
    return items
