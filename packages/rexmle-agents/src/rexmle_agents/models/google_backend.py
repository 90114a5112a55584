"""Google Gemini through the Gemini API's OpenAI-compatible endpoint.

Why this endpoint and not the ``google-genai`` SDK: both carry what exact accounting and tool calls need, and the
endpoint needs nothing new.

- Usage: the endpoint reports ``prompt_tokens`` (cache hits included, with ``prompt_tokens_details.cached_tokens``)
  and ``total_tokens``, which counts the model's thinking tokens; thinking is billed as output. Whether
  ``completion_tokens`` already includes the thinking tokens has varied between Gemini-to-OpenAI translations, so
  :class:`GeminiChatBackend` takes the output as ``total_tokens - prompt_tokens`` whenever that is larger: exact
  under either convention, and never an undercount of billed output.
- Tool calls: arguments arrive as JSON text as from OpenAI (parsed, and kept as ``parse_error`` when broken), and
  Gemini's thought signatures arrive as ``extra_content`` on the tool call; :class:`OpenAIChatBackend` sends them
  back with the call, which Gemini 3 requires for function calling.
- Everything else is shared with the OpenAI backends and tested against the real ``openai`` SDK: error
  classification, Retry-After, streaming (``stream_options.include_usage``), timeouts and record/replay.
- ``google-genai`` would add a dependency whose every release after 1.20.0 requires ``tenacity<9.2``, while the
  project pins ``tenacity==9.2.1``: only that mid-2025 release would install.
"""

from __future__ import annotations

from typing import Any

from openai.types.completion_usage import CompletionUsage

from rexmle_agents.models.openai_backend import OpenAIChatBackend
from rexmle_agents.models.types import Usage

KEY_ENV = "GEMINI_API_KEY"
BASE_URL = "https://generativelanguage.googleapis.com/v1beta/openai/"


class GeminiChatBackend(OpenAIChatBackend):
    """Gemini models through the chat completions API of the Gemini API's OpenAI-compatible endpoint."""

    def __init__(self, name: str, model_id: str, **kwargs: Any) -> None:
        # max_tokens is the length limit every OpenAI-compatible server shares; max_completion_tokens is OpenAI's.
        super().__init__(name, model_id, max_tokens_field="max_tokens", **kwargs)

    def _usage(self, usage: CompletionUsage | None) -> Usage | None:
        counted = super()._usage(usage)
        if counted is None or usage is None or not usage.total_tokens:
            return counted
        billed_output = usage.total_tokens - counted.input_tokens
        if billed_output <= counted.output_tokens:
            return counted
        return counted.model_copy(update={"output_tokens": billed_output})
