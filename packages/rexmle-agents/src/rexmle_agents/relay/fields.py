"""The request fields beyond the conversation (sampling, output format, reasoning), decided field by field.

An agent's request may carry more than messages, tools and the settings of :class:`GenerateConfig`. Each such
field is one of:

- forwarded: passed to the answering backend in its own request format (``GenerateConfig.extra``), translated
  between dialects where the meaning is the same (chat's ``reasoning_effort`` is the responses API's
  ``reasoning.effort``; chat's ``response_format`` its ``text.format`` and the Anthropic API's
  ``output_format``);
- refused: a field that asks for an answer the relay cannot give (several choices, log-probabilities, audio...)
  is a ``400`` in the agent's dialect that names the field, unless it asks for the default (``n: 1``);
- dropped with a warning: a tuning field the answering backend has no equivalent for (a seed for the Anthropic API,
  ``top_k`` for OpenAI's) is not sent, and the run's journal says so once per field;
- ignored: fields that do not change the answer (``user``, ``metadata``, ``store``, ``stream_options``...).

The backend's request format (:func:`backend_wire`) is that of the rexmle backend behind the route: chat
completions (OpenAI, Azure, Gemini's OpenAI-compatible endpoint, compatible servers), the responses API, or
Anthropic's messages API; a scripted or replayed model gets the fields under the agent's own names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rexmle_agents.relay.gemini import GEMINI
from rexmle_agents.relay.protocol import ANTHROPIC, CHAT, RESPONSES, ProtocolError, brief

CHAT_WIRE, RESPONSES_WIRE, MESSAGES_WIRE = "chat", "responses", "messages"

# field -> the value that asks for nothing beyond one plain answer (None: absent, null, false or empty)
_REFUSED: dict[str, dict[str, Any]] = {
    CHAT: {"n": 1, "logprobs": None, "top_logprobs": 0, "logit_bias": None, "best_of": 1, "echo": None,
           "suffix": None, "audio": None, "prediction": None, "web_search_options": None, "functions": None,
           "function_call": None},
    RESPONSES: {"top_logprobs": 0, "background": None, "conversation": None, "prompt": None},
    ANTHROPIC: {"container": None, "mcp_servers": None},
    GEMINI: {"candidateCount": 1, "responseLogprobs": None, "logprobs": None},  # of generationConfig
}
# Gemini's generationConfig names (its response schema is translated by relay/gemini.py)
_GEMINI_NAMES = {"topP": "top_p", "topK": "top_k", "seed": "seed", "presencePenalty": "presence_penalty",
                 "frequencyPenalty": "frequency_penalty"}
# modalities other than text ask for audio or images, which the relay does not carry
_TEXT_ONLY = {CHAT: "modalities", RESPONSES: None, ANTHROPIC: None}


@dataclass(frozen=True)
class Fields:
    """What to send (``extra``) and which fields were not sent, with why (``dropped``: field -> reason)."""

    extra: dict[str, Any]
    dropped: dict[str, str]


def backend_wire(model: Any) -> str | None:
    """The request format of the rexmle backend behind a model (through recording wrappers), or None for backends
    that speak none (scripted, replayed)."""
    from rexmle_agents.models.anthropic_backend import AnthropicBackend
    from rexmle_agents.models.openai_backend import OpenAIChatBackend, OpenAIResponsesBackend

    backend = getattr(model, "backend", model)
    for _ in range(8):  # a recording wraps the real backend; the chain is short
        if isinstance(backend, AnthropicBackend):
            return MESSAGES_WIRE
        if isinstance(backend, OpenAIResponsesBackend):
            return RESPONSES_WIRE
        if isinstance(backend, OpenAIChatBackend):
            return CHAT_WIRE
        inner = getattr(backend, "backend", None)
        if inner is None or inner is backend:
            return None
        backend = inner
    return None


def _asks_default(value: Any, default: Any) -> bool:
    return value is None or value is False or value == default or (isinstance(value, (list, dict)) and not value)


def _refuse_unsupported(api: str, body: Mapping[str, Any]) -> None:
    if api == GEMINI:
        generation = body.get("generationConfig")
        body = generation if isinstance(generation, dict) else {}
    for name, default in _REFUSED.get(api, {}).items():
        if name in body and not _asks_default(body[name], default):
            raise ProtocolError(f"the request field {name}={brief(body[name])} is not supported by the rexmle "
                                f"relay (it returns one text answer); remove {name!r} from the request")
    modalities = _TEXT_ONLY.get(api)
    if modalities and body.get(modalities) not in (None, ["text"], ("text",), []):
        raise ProtocolError(f"the request field {modalities}={brief(body[modalities])} is not supported: the relay "
                            "answers with text only")


def _meanings(api: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's tuning fields under one vocabulary: top_p, top_k, seed, frequency_penalty, presence_penalty,
    reasoning_effort, verbosity, response_format (chat's shape), thinking (Anthropic's shape)."""
    found: dict[str, Any] = {}
    if api == CHAT:
        for name in ("top_p", "seed", "frequency_penalty", "presence_penalty", "reasoning_effort", "verbosity",
                     "response_format"):
            if body.get(name) is not None:
                found[name] = body[name]
    elif api == RESPONSES:
        if body.get("top_p") is not None:
            found["top_p"] = body["top_p"]
        reasoning = body.get("reasoning")
        if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
            found["reasoning_effort"] = reasoning["effort"]
        text = body.get("text")
        if isinstance(text, dict):
            if text.get("verbosity") is not None:
                found["verbosity"] = text["verbosity"]
            fmt = text.get("format")
            if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
                found["response_format"] = _format_as_chat(fmt)
    elif api == ANTHROPIC:
        for name in ("top_p", "top_k", "thinking"):
            if body.get(name) is not None:
                found[name] = body[name]
        fmt = body.get("output_format")  # structured outputs (LiteLLM sends a response_format for Claude so)
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            found["response_format"] = {"type": "json_schema",
                                        "json_schema": {"name": "output", "schema": fmt.get("schema") or {}}}
        elif fmt is not None:
            raise ProtocolError(f"output_format {brief(fmt)} is not supported: a json_schema format is")
    elif api == GEMINI:
        generation = body.get("generationConfig")
        for name, meaning in _GEMINI_NAMES.items():
            if isinstance(generation, dict) and generation.get(name) is not None:
                found[meaning] = generation[name]
    return found


def _format_as_chat(fmt: Mapping[str, Any]) -> dict[str, Any]:
    """A responses-API ``text.format`` as chat's ``response_format``."""
    if fmt.get("type") == "json_schema":
        schema = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return dict(fmt)


def _format_as_anthropic(fmt: Any) -> dict[str, Any]:
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("json_schema"), dict):
        raise ProtocolError(f"response_format {brief(fmt)} cannot be honoured by the Anthropic API behind this name: "
                            "only a json_schema format has an equivalent (output_format); remove it")
    return {"type": "json_schema", "schema": fmt["json_schema"].get("schema") or {}}


def _format_as_responses(fmt: Any) -> dict[str, Any]:
    if not isinstance(fmt, dict):
        raise ProtocolError(f"response_format must be an object, got {brief(fmt)}")
    if fmt.get("type") == "json_schema":
        inner = fmt.get("json_schema")
        if not isinstance(inner, dict):
            raise ProtocolError("response_format of type json_schema needs a json_schema object")
        return {"type": "json_schema", **inner}
    return dict(fmt)


# the names each request format takes a meaning under (None: it has no equivalent)
_WIRE_NAMES: dict[str, dict[str, str | None]] = {
    CHAT_WIRE: {"top_p": "top_p", "seed": "seed", "frequency_penalty": "frequency_penalty",
                "presence_penalty": "presence_penalty", "reasoning_effort": "reasoning_effort",
                "verbosity": "verbosity", "response_format": "response_format", "top_k": None, "thinking": None},
    RESPONSES_WIRE: {"top_p": "top_p", "seed": None, "frequency_penalty": None, "presence_penalty": None,
                     "reasoning_effort": "reasoning", "verbosity": "text", "response_format": "text",
                     "top_k": None, "thinking": None},
    MESSAGES_WIRE: {"top_p": "top_p", "top_k": "top_k", "thinking": "thinking", "seed": None,
                    "frequency_penalty": None, "presence_penalty": None, "reasoning_effort": None,
                    "verbosity": None, "response_format": "output_format"},
}


def request_fields(api: str, body: Mapping[str, Any], wire: str | None) -> Fields:
    """The extra request fields for the backend of format ``wire`` (see the module's docstring); raises
    :class:`ProtocolError` (a 400 naming the field) for what cannot be honoured."""
    _refuse_unsupported(api, body)
    meanings = _meanings(api, body)
    if wire is None:  # no request format to translate to: the agent's own field names
        own = {RESPONSES: {"reasoning_effort": "reasoning", "verbosity": "text", "response_format": "text"},
               ANTHROPIC: {"response_format": "output_format"}}.get(api, {})
        if api == GEMINI:
            return Fields(meanings, {})
        return Fields({own.get(k, k): body[own.get(k, k)] for k in meanings}, {})
    names = _WIRE_NAMES[wire]
    extra: dict[str, Any] = {}
    dropped: dict[str, str] = {}
    for meaning, value in meanings.items():
        target = names.get(meaning)
        if target is None:  # tuning only (a response format always has a target, or is refused as it is translated)
            dropped[meaning] = f"the {wire} API of the model behind this name has no equivalent"
        elif wire == RESPONSES_WIRE and meaning == "reasoning_effort":
            extra["reasoning"] = {**extra.get("reasoning", {}), "effort": value}
        elif wire == RESPONSES_WIRE and meaning in ("verbosity", "response_format"):
            text = dict(extra.get("text", {}))
            text["verbosity" if meaning == "verbosity" else "format"] = \
                value if meaning == "verbosity" else _format_as_responses(value)
            extra["text"] = text
        elif wire == MESSAGES_WIRE and meaning == "response_format":
            extra["output_format"] = _format_as_anthropic(value)
        else:
            extra[target] = value
    return Fields(extra, dropped)
