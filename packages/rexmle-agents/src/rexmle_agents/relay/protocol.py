"""The three wire formats the relay speaks, translated to and from rexmle's own model vocabulary.

An agent inside the sandbox sends an OpenAI chat-completions, OpenAI responses or Anthropic messages request; it
becomes one :class:`RelayRequest` (messages, tools, settings in :mod:`rexmle_agents.models.types`), is answered by
a rexmle :class:`~rexmle_agents.models.base.Model`, and the :class:`ModelResponse` goes back in the format that was
asked for, whole or as server-sent events. Streamed answers are sent once the model has answered: the upstream
call itself goes through the backend (which may stream), so retries, accounting and replay see one complete call.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rexmle_agents.models.base import tool_call_from_json
from rexmle_agents.models.types import (
    FINISH_LENGTH,
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    GenerateConfig,
    Message,
    ModelResponse,
    ToolCall,
    ToolSpec,
)

CHAT = "chat"
RESPONSES = "responses"
ANTHROPIC = "anthropic"

_ANTHROPIC_STOP = {FINISH_STOP: "end_turn", FINISH_LENGTH: "max_tokens", FINISH_TOOL_CALLS: "tool_use"}


# The shape a request body may have. Python's json module recurses once per nesting level (a deep body is a
# RecursionError, and a structure just under that limit breaks whatever recurses over it later: pydantic, the
# journal's writer), and a body of many tiny values ("[{},{},...]") grows about 20 times in memory once parsed.
# Real requests nest a tool's JSON schema a dozen levels deep and hold a few thousand values.
MAX_JSON_DEPTH = 64
MAX_JSON_VALUES = 100_000
BRIEF_CHARS = 120  # of a value quoted in an error message
_SCAN_CHUNK = 2**18  # the shape scan's slice: its temporary copies (and a split of it) stay a few MiB

_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1, +1, -1, -1 as signed bytes
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class ProtocolError(ValueError):
    """A request the relay cannot translate; answered with HTTP 400 and this message."""


def brief(value: Any) -> str:
    """A value the agent sent, quoted in an error message: its repr, cut short (never the repr of a huge object)."""
    if isinstance(value, str):
        return repr(value[:BRIEF_CHARS]) + ("..." if len(value) > BRIEF_CHARS else "")
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)[:BRIEF_CHARS]
    return f"a {type(value).__name__}"


def json_shape_problem(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH, max_values: int = MAX_JSON_VALUES) -> str | None:
    """Why ``raw`` nests too deep or holds too many values to be parsed, or None; measured on the bytes, before
    any object exists, with C-speed byte operations on slices of ``_SCAN_CHUNK`` (no Python loop over characters,
    no copy of the whole body): escaped backslashes and quotes are dropped, the strings cut out between the
    remaining quotes, and the commas and brackets left outside them counted, the brackets' running depth taken."""
    quotes = values = depth = 0
    in_string = escaped = False
    for start in range(0, len(raw), _SCAN_CHUNK):
        chunk = raw[start + escaped:start + _SCAN_CHUNK]  # a backslash that ended the last slice escapes a byte
        chunk = chunk.replace(b"\\\\", b"")
        escaped = chunk.endswith(b"\\")
        chunk = chunk[:-1].replace(b'\\"', b"") if escaped else chunk.replace(b'\\"', b"")
        pieces = chunk.split(b'"')
        quotes += len(pieces) - 1
        if quotes > 4 * max_values:  # every string is a key or a value
            return f"the body holds more than {2 * max_values} strings; at most {2 * max_values} are accepted"
        outside = b"".join(pieces[1::2] if in_string else pieces[::2])
        in_string ^= (len(pieces) - 1) % 2 == 1
        values += outside.count(b",") + outside.count(b"[") + outside.count(b"{")
        if values + 1 > max_values:
            return f"the body holds more than {max_values} JSON values; at most {max_values} are accepted"
        steps = memoryview(outside.translate(None, _NOT_BRACKET).translate(_BRACKET_STEPS)).cast("b")
        if len(steps) and max(itertools.accumulate(steps, initial=depth)) > max_depth:
            return f"the body nests more than {max_depth} levels deep; at most {max_depth} are accepted"
        depth += sum(steps)
    return None


def _no_constants(name: str) -> Any:
    raise ProtocolError(f"{name} is not a JSON number")


def decode_json(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH, max_values: int = MAX_JSON_VALUES) -> Any:
    """A request body parsed within the bounds above; bad UTF-8, NaN/Infinity and lone surrogates (which no
    provider accepts and the journal cannot write) are a :class:`ProtocolError`."""
    problem = json_shape_problem(raw, max_depth=max_depth, max_values=max_values)
    if problem is not None:
        raise ProtocolError(problem)
    try:
        value = json.loads(raw, parse_constant=_no_constants)
    except RecursionError:  # not reached within the depth bound; kept so that no body can raise it
        raise ProtocolError("the body nests too deep") from None
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"the body is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"the body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(value):
        raise ProtocolError("the body holds a lone UTF-16 surrogate (\\udXXX without its pair)")
    return value


def json_strings(value: Any) -> Iterator[str]:
    """Every string of a parsed JSON value (object keys included), by a loop, not recursion: the depth is bounded
    but the walk need not rely on it."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


# The count-tokens endpoints (Anthropic's count_tokens, Gemini's countTokens) are answered with this estimate, no
# model call: a conservative count (English text runs about 4 bytes a token) so that an agent sizing its context
# by it errs on the safe side.
COUNT_TOKENS_BYTES_PER_TOKEN = 3


def estimated_tokens(value: Any) -> int:
    """The count-tokens estimate of every string in ``value`` (a parsed JSON value): UTF-8 bytes / 3, at least 1."""
    size = sum(len(text.encode("utf-8", errors="replace")) for text in json_strings(value))
    return max(1, math.ceil(size / COUNT_TOKENS_BYTES_PER_TOKEN))


def _has_lone_surrogate(value: Any) -> bool:
    return any(_LONE_SURROGATE.search(text) for text in json_strings(value))


def _tool_call(call_id: str, name: str, arguments: str) -> ToolCall:
    """A tool call whose arguments are JSON text inside the body: held to the body's bounds before parsing."""
    problem = json_shape_problem(arguments.encode("utf-8", "surrogatepass"))
    if problem is not None:
        raise ProtocolError(f"a tool call's arguments: {problem}")
    return tool_call_from_json(call_id, name, arguments)


@dataclass(frozen=True)
class RelayRequest:
    api: str  # CHAT, RESPONSES or ANTHROPIC
    model: str  # the name the agent asked for (an alias)
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    config: GenerateConfig
    stream: bool
    tool_choice: str | None = None  # "required", "none", or the name of one tool the model must call
    include_usage: bool = False  # chat streams: the client asked for a closing usage chunk


# ---------------------------------------------------------------------------------------------------------------
# parsing requests


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _media_noted(content: Any) -> Any:
    """An Anthropic tool result's parts with images and documents (Claude Code's Read of a PNG or a PDF) replaced by
    a note: the relay passes text only, and refusing the call would end the agent's session."""
    if not isinstance(content, list):
        return content
    return [{"type": "text", "text": f"[{part['type']} omitted: the model relay of this run passes text only; "
                                     "inspect the file with code instead]"}
            if isinstance(part, dict) and part.get("type") in ("image", "document") else part for part in content]


def _text(content: Any, what: str) -> str:
    """Text content: a string, or a list of text parts (other part kinds, such as images, are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
                continue
            part = _obj(part, f"a part of {what}")
            if part.get("type") in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif part.get("type") == "refusal":
                texts.append(str(part.get("refusal") or ""))
            else:
                raise ProtocolError(f"{what} has a part of type {brief(part.get('type'))}; the relay passes text only")
        return "".join(texts)
    raise ProtocolError(f"{what} must be a string or a list of text parts")


def _config(body: Mapping[str, Any], *, max_tokens_keys: tuple[str, ...], stop_key: str | None) -> GenerateConfig:
    max_tokens = next((body[k] for k in max_tokens_keys if body.get(k) is not None), None)
    stop = body.get(stop_key) if stop_key else None
    temperature = body.get("temperature")
    try:
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        return GenerateConfig(temperature=None if temperature is None else float(temperature),
                              max_tokens=None if max_tokens is None else int(max_tokens), stop=stops)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"bad generation settings: {str(exc)[:300]}") from None


def _require_model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ProtocolError("the request names no model")
    return model


def _openai_tool_choice(choice: Any) -> str | None:
    if choice is None or choice == "auto":
        return None
    if choice in ("none", "required"):
        return str(choice)
    if isinstance(choice, dict):
        function = choice.get("function")
        name = choice.get("name") or (function.get("name") if isinstance(function, dict) else None)
        if isinstance(name, str) and name:
            return name
    raise ProtocolError(f"unsupported tool_choice {brief(choice)}")


def parse_chat(body: Mapping[str, Any]) -> RelayRequest:
    """An OpenAI ``POST /v1/chat/completions`` body."""
    model = _require_model(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ProtocolError("messages must be a non-empty list")
    messages = []
    for index, item in enumerate(raw):
        item = _obj(item, f"messages[{index}]")
        role = item.get("role")
        where = f"messages[{index}].content"
        if role in ("system", "developer"):
            messages.append(Message.system(_text(item.get("content"), where)))
        elif role == "user":
            messages.append(Message.user(_text(item.get("content"), where)))
        elif role == "assistant":
            calls = []
            for call in item.get("tool_calls") or []:
                call = _obj(call, f"messages[{index}].tool_calls[]")
                function = _obj(call.get("function"), "a tool call's function")
                calls.append(_tool_call(str(call.get("id") or ""), str(function.get("name") or ""),
                                                 str(function.get("arguments") or "")))
            messages.append(Message(role="assistant", content=_text(item.get("content"), where),
                                    tool_calls=tuple(calls)))
        elif role == "tool":
            if not item.get("tool_call_id"):
                raise ProtocolError(f"messages[{index}] is a tool message without tool_call_id")
            messages.append(Message.tool(str(item["tool_call_id"]), _text(item.get("content"), where)))
        else:
            raise ProtocolError(f"messages[{index}] has role {brief(role)}; expected system, developer, user, "
                                "assistant or tool")
    tools = []
    for tool in body.get("tools") or []:
        tool = _obj(tool, "a tool")
        if tool.get("type", "function") != "function":
            raise ProtocolError(f"tool type {brief(tool.get('type'))} is not supported; only functions are")
        function = _obj(tool.get("function"), "a tool's function")
        tools.append(ToolSpec(name=str(function.get("name") or ""), description=str(function.get("description") or ""),
                              parameters=function.get("parameters") or {"type": "object", "properties": {}}))
    options = body.get("stream_options") or {}
    return RelayRequest(api=CHAT, model=model, messages=tuple(messages), tools=tuple(tools),
                        config=_config(body, max_tokens_keys=("max_completion_tokens", "max_tokens"), stop_key="stop"),
                        stream=bool(body.get("stream")), tool_choice=_openai_tool_choice(body.get("tool_choice")),
                        include_usage=bool(isinstance(options, dict) and options.get("include_usage")))


def parse_responses(body: Mapping[str, Any]) -> RelayRequest:
    """An OpenAI ``POST /v1/responses`` body (stateless: ``previous_response_id`` is refused)."""
    model = _require_model(body)
    if body.get("previous_response_id"):
        raise ProtocolError("previous_response_id is not supported: send the whole conversation as input")
    messages: list[Message] = []
    if body.get("instructions"):
        messages.append(Message.system(_text(body["instructions"], "instructions")))
    raw = body.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise ProtocolError("input must be a string or a non-empty list of items")
    pending_calls: list[ToolCall] = []
    pending_text = ""

    def flush() -> None:
        nonlocal pending_calls, pending_text
        if pending_calls or pending_text:
            messages.append(Message(role="assistant", content=pending_text, tool_calls=tuple(pending_calls)))
        pending_calls, pending_text = [], ""

    for index, item in enumerate(items):
        item = _obj(item, f"input[{index}]")
        kind = item.get("type", "message")
        if kind == "function_call":
            pending_calls.append(_tool_call(str(item.get("call_id") or ""), str(item.get("name") or ""),
                                                     str(item.get("arguments") or "")))
            continue
        if kind == "reasoning":
            continue
        if kind == "message" and item.get("role") == "assistant":
            flush()
            pending_text = _text(item.get("content"), f"input[{index}].content")
            continue
        flush()
        if kind == "function_call_output":
            messages.append(Message.tool(str(item.get("call_id") or ""), _text(item.get("output"), "an output")))
        elif kind == "message" and item.get("role") in ("system", "developer"):
            messages.append(Message.system(_text(item.get("content"), f"input[{index}].content")))
        elif kind == "message" and item.get("role") == "user":
            messages.append(Message.user(_text(item.get("content"), f"input[{index}].content")))
        else:
            raise ProtocolError(f"input[{index}] of type {brief(kind)} (role {brief(item.get('role'))}) is not "
                                "supported")
    flush()
    tools = []
    for tool in body.get("tools") or []:
        tool = _obj(tool, "a tool")
        if tool.get("type") != "function":
            raise ProtocolError(f"tool type {brief(tool.get('type'))} is not supported; only functions are")
        tools.append(ToolSpec(name=str(tool.get("name") or ""), description=str(tool.get("description") or ""),
                              parameters=tool.get("parameters") or {"type": "object", "properties": {}}))
    return RelayRequest(api=RESPONSES, model=model, messages=tuple(messages), tools=tuple(tools),
                        config=_config(body, max_tokens_keys=("max_output_tokens",), stop_key=None),
                        stream=bool(body.get("stream")), tool_choice=_openai_tool_choice(body.get("tool_choice")))


def parse_anthropic(body: Mapping[str, Any]) -> RelayRequest:
    """An Anthropic ``POST /v1/messages`` body."""
    model = _require_model(body)
    messages: list[Message] = []
    if body.get("system"):
        messages.append(Message.system(_text(body["system"], "system")))
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ProtocolError("messages must be a non-empty list")
    for index, item in enumerate(raw):
        item = _obj(item, f"messages[{index}]")
        role = item.get("role")
        content = item.get("content")
        if role == "system":  # a mid-conversation system message (beta mid-conversation-system; Claude Code 2.1)
            messages.append(Message.system(_text(content, f"messages[{index}]")))
            continue
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if role not in ("user", "assistant") or not isinstance(blocks, list):
            raise ProtocolError(f"messages[{index}] must have role user, assistant or system and string or list "
                                "content")
        texts, calls = [], []
        for block in blocks:
            block = _obj(block, f"a block of messages[{index}]")
            kind = block.get("type")
            if kind == "text":
                texts.append(str(block.get("text") or ""))
            elif kind == "tool_use" and role == "assistant":
                arguments = block.get("input")
                calls.append(ToolCall(id=str(block.get("id") or ""), name=str(block.get("name") or ""),
                                      arguments=arguments if isinstance(arguments, dict) else {}))
            elif kind == "tool_result" and role == "user":
                messages.append(Message.tool(str(block.get("tool_use_id") or ""),
                                             _text(_media_noted(block.get("content")), "a tool result")))
            elif kind in ("thinking", "redacted_thinking"):
                continue
            else:
                raise ProtocolError(f"messages[{index}] has a block of type {brief(kind)}; the relay passes text and "
                                    "tool calls only")
        if role == "assistant":
            messages.append(Message(role="assistant", content="".join(texts), tool_calls=tuple(calls)))
        elif texts:
            messages.append(Message.user("".join(texts)))
    tools = []
    for tool in body.get("tools") or []:
        tool = _obj(tool, "a tool")
        tools.append(ToolSpec(name=str(tool.get("name") or ""), description=str(tool.get("description") or ""),
                              parameters=tool.get("input_schema") or {"type": "object", "properties": {}}))
    choice = body.get("tool_choice")
    forced = None
    if isinstance(choice, dict) and choice.get("type") == "tool":
        forced = str(choice.get("name") or "")
    elif isinstance(choice, dict) and choice.get("type") == "any":
        forced = "required"
    elif isinstance(choice, dict) and choice.get("type") == "none":
        forced = "none"
    return RelayRequest(api=ANTHROPIC, model=model, messages=tuple(messages), tools=tuple(tools),
                        config=_config(body, max_tokens_keys=("max_tokens",), stop_key="stop_sequences"),
                        stream=bool(body.get("stream")), tool_choice=forced)


PARSERS = {CHAT: parse_chat, RESPONSES: parse_responses, ANTHROPIC: parse_anthropic}


def tool_choice_extra(tool_choice: str | None, model_string: str) -> dict[str, Any]:
    """The forced tool choice in the request format of the backend that answers (``GenerateConfig.extra``): the
    Anthropic messages API, or OpenAI-style chat completions (every other provider the harness builds)."""
    if tool_choice is None:
        return {}
    if model_string.startswith("anthropic/"):
        if tool_choice == "required":
            return {"tool_choice": {"type": "any"}}
        if tool_choice == "none":
            return {"tool_choice": {"type": "none"}}
        return {"tool_choice": {"type": "tool", "name": tool_choice}}
    if tool_choice in ("required", "none"):
        return {"tool_choice": tool_choice}
    return {"tool_choice": {"type": "function", "function": {"name": tool_choice}}}


def adapt_messages(messages: tuple[Message, ...], model_string: str) -> list[Message]:
    """The conversation as the answering provider accepts it: Anthropic's messages API needs a user turn, so a
    request made of system text only (AIDE's prompts are) sends it as the user turn, as AIDE's own Anthropic
    backend does."""
    if model_string.startswith("anthropic/") and all(m.role == "system" for m in messages):
        return [Message.user("\n\n".join(m.content for m in messages))]
    return list(messages)


# ---------------------------------------------------------------------------------------------------------------
# rendering answers


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _arguments(call: ToolCall) -> str:
    return json.dumps(call.arguments)


def _chat_usage(response: ModelResponse) -> dict[str, Any]:
    usage = response.usage
    return {"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens, "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens}}


def _chat_finish(response: ModelResponse) -> str:
    if response.tool_calls:
        return FINISH_TOOL_CALLS
    return response.finish_reason if response.finish_reason in (FINISH_STOP, FINISH_LENGTH, "content_filter") \
        else FINISH_STOP


def render_chat(request: RelayRequest, response: ModelResponse) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": response.text or None}
    if response.tool_calls:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": _arguments(c)}}
                                 for c in response.tool_calls]
    choice = {"index": 0, "message": message, "finish_reason": _chat_finish(response), "logprobs": None}
    return {"id": response.id or _new_id("chatcmpl-"), "object": "chat.completion", "created": int(time.time()),
            "model": request.model, "choices": [choice], "usage": _chat_usage(response)}


def stream_chat(request: RelayRequest, response: ModelResponse) -> Iterator[bytes]:
    ident, created = response.id or _new_id("chatcmpl-"), int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        body = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": request.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return sse(body)

    yield chunk({"role": "assistant", "content": ""})
    if response.text:
        yield chunk({"content": response.text})
    for index, call in enumerate(response.tool_calls):
        yield chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                     "function": {"name": call.name, "arguments": _arguments(call)}}]})
    yield chunk({}, _chat_finish(response))
    if request.include_usage:
        yield sse({"id": ident, "object": "chat.completion.chunk", "created": created, "model": request.model,
                   "choices": [], "usage": _chat_usage(response)})
    yield b"data: [DONE]\n\n"


def _responses_output(response: ModelResponse) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = []
    if response.text or not response.tool_calls:
        output.append({"type": "message", "id": _new_id("msg_"), "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": response.text, "annotations": []}]})
    output.extend({"type": "function_call", "id": _new_id("fc_"), "call_id": c.id, "name": c.name,
                   "arguments": _arguments(c), "status": "completed"} for c in response.tool_calls)
    return output


def render_responses(request: RelayRequest, response: ModelResponse, *, output: list[dict[str, Any]] | None = None,
                     status: str | None = None) -> dict[str, Any]:
    usage = response.usage
    truncated = response.finish_reason == FINISH_LENGTH
    return {
        "id": response.id or _new_id("resp_"), "object": "response", "created_at": int(time.time()),
        "model": request.model, "status": status or ("incomplete" if truncated else "completed"),
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None, "error": None,
        "output": _responses_output(response) if output is None else output, "parallel_tool_calls": True,
        "tool_choice": "auto", "tools": [], "temperature": request.config.temperature, "top_p": None,
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                  "total_tokens": usage.total_tokens,
                  "input_tokens_details": {"cached_tokens": usage.cached_input_tokens},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


def stream_responses(request: RelayRequest, response: ModelResponse) -> Iterator[bytes]:
    final = render_responses(request, response)
    sequence = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal sequence
        body = {"type": kind, "sequence_number": sequence, **fields}
        sequence += 1
        return sse(body, event=kind)

    started = {**final, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                        part=part)
            if text:
                yield event("response.output_text.delta", item_id=item["id"], output_index=index, content_index=0,
                            delta=text, logprobs=[])
            yield event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                        text=text, logprobs=[])
            yield event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                        part={**part, "text": text})
        else:
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "arguments": ""})
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                        delta=item["arguments"])
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                        arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)


def _anthropic_content(response: ModelResponse) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = []
    if response.text or not response.tool_calls:
        content.append({"type": "text", "text": response.text})
    content.extend({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in response.tool_calls)
    return content


def _anthropic_stop(response: ModelResponse) -> str:
    if response.tool_calls:
        return "tool_use"
    return _ANTHROPIC_STOP.get(response.finish_reason, "end_turn")


def render_anthropic(request: RelayRequest, response: ModelResponse) -> dict[str, Any]:
    usage = response.usage
    return {"id": response.id or _new_id("msg_"), "type": "message", "role": "assistant", "model": request.model,
            "content": _anthropic_content(response), "stop_reason": _anthropic_stop(response), "stop_sequence": None,
            "usage": {"input_tokens": usage.input_tokens - usage.cached_input_tokens - usage.cache_write_input_tokens,
                      "output_tokens": usage.output_tokens,
                      "cache_read_input_tokens": usage.cached_input_tokens,
                      "cache_creation_input_tokens": usage.cache_write_input_tokens}}


def stream_anthropic(request: RelayRequest, response: ModelResponse) -> Iterator[bytes]:
    final = render_anthropic(request, response)
    start = {**final, "content": [], "stop_reason": None, "usage": {**final["usage"], "output_tokens": 0}}
    yield sse({"type": "message_start", "message": start}, event="message_start")
    for index, block in enumerate(final["content"]):
        if block["type"] == "text":
            yield sse({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
                      event="content_block_start")
            if block["text"]:
                yield sse({"type": "content_block_delta", "index": index,
                           "delta": {"type": "text_delta", "text": block["text"]}}, event="content_block_delta")
        else:
            yield sse({"type": "content_block_start", "index": index,
                       "content_block": {**block, "input": {}}}, event="content_block_start")
            yield sse({"type": "content_block_delta", "index": index,
                       "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}},
                      event="content_block_delta")
        yield sse({"type": "content_block_stop", "index": index}, event="content_block_stop")
    yield sse({"type": "message_delta", "delta": {"stop_reason": final["stop_reason"], "stop_sequence": None},
               "usage": {"output_tokens": final["usage"]["output_tokens"]}}, event="message_delta")
    yield sse({"type": "message_stop"}, event="message_stop")


RENDERERS = {CHAT: render_chat, RESPONSES: render_responses, ANTHROPIC: render_anthropic}
STREAMERS = {CHAT: stream_chat, RESPONSES: stream_responses, ANTHROPIC: stream_anthropic}


def sse(body: Mapping[str, Any], *, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


def api_of_path(path: str) -> str:
    """The dialect to answer a request in, from its path alone (for requests refused before they are read)."""
    return ANTHROPIC if path.rstrip("/").endswith(("/messages", "/messages/count_tokens")) else CHAT


def error_body(api: str, status: int, kind: str, message: str) -> dict[str, Any]:
    """An error in the shape the agent's SDK parses (OpenAI's ``error`` object, or Anthropic's)."""
    if api == ANTHROPIC:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": kind}}


def render_embeddings(model: str, vectors: list[list[float]], tokens: int) -> dict[str, Any]:
    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
