"""The provider-neutral vocabulary agents speak to every model backend.

All types are frozen pydantic models: they are hashed into replay keys, written to cassettes and journals as JSON,
and read back unchanged, so they must round-trip through ``model_dump(mode="json")`` / ``model_validate``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Role = Literal["system", "user", "assistant", "tool"]

# Normalised reasons a generation ended; a provider's own reason passes through when it has no equivalent here.
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_TOOL_CALLS = "tool_calls"
FINISH_CONTENT_FILTER = "content_filter"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolCall(_Frozen):
    """One function call the model asked for."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    # Set when the model sent arguments that are not a JSON object; the agent can show it to the model.
    parse_error: str | None = None


class ToolSpec(_Frozen):
    """A function the model may call; ``parameters`` is a JSON schema for its arguments object."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Message(_Frozen):
    """One conversation turn. ``tool`` messages answer the assistant tool call named by ``tool_call_id``."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _check_role_fields(self) -> Message:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        if self.role != "tool" and self.tool_call_id is not None:
            raise ValueError(f"only tool messages carry a tool_call_id, not {self.role} messages")
        if self.role != "assistant" and self.tool_calls:
            raise ValueError(f"only assistant messages carry tool_calls, not {self.role} messages")
        return self

    @classmethod
    def system(cls, content: str) -> Message:
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls(role="user", content=content)

    @classmethod
    def tool(cls, tool_call_id: str, content: str) -> Message:
        return cls(role="tool", content=content, tool_call_id=tool_call_id)


class Usage(_Frozen):
    """Token counts of one or more calls.

    ``input_tokens`` counts every prompt token, including those read from or written to the provider's prompt
    cache (OpenAI reports it that way; the Anthropic backend adds its cache counts in), so totals compare across
    providers. ``cached_input_tokens`` and ``cache_write_input_tokens`` are the parts priced differently.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            cache_write_input_tokens=self.cache_write_input_tokens + other.cache_write_input_tokens,
        )


class ModelResponse(_Frozen):
    """What one generation produced.

    Backends fill the content fields; :class:`~rexmle_agents.models.base.Model` adds ``cost_usd`` (None when the
    model has no price or the usage is unknown) and ``retry_time_s`` (time lost to failed attempts and back-off,
    which the harness keeps apart from the agent's own time budget).

    ``usage_known`` is False when the provider reported no token usage for the call: ``usage`` then holds zeros
    that stand for "unknown", not for a free call, and the ledger counts the call among ``unknown_usage_calls``.
    """

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    # Defaults to True so cassettes recorded before the field existed read back unchanged.
    usage_known: bool = True
    model: str = ""
    finish_reason: str = FINISH_STOP
    id: str | None = None
    cost_usd: float | None = None
    retry_time_s: float = 0.0

    @property
    def message(self) -> Message:
        """The assistant turn to append to the conversation."""
        return Message(role="assistant", content=self.text, tool_calls=self.tool_calls)


class GenerateConfig(_Frozen):
    """Per-call generation settings; ``None`` leaves a setting to the provider (or the backend's default)."""

    temperature: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    # Seconds one attempt may take before it counts as a timeout (and is retried).
    timeout_s: float | None = None
    stream: bool = False
    # Provider-specific request fields sent as-is (reasoning_effort, thinking, vLLM sampling options...).
    extra: dict[str, Any] = Field(default_factory=dict)
