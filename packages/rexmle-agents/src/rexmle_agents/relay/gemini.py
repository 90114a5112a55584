"""The Gemini API dialect of the relay (``POST /v1beta/models/{model}:generateContent``, ``:streamGenerateContent``
and ``:countTokens``), translated to and from rexmle's own model vocabulary like the dialects of
:mod:`rexmle_agents.relay.protocol`.

Unlike those, the Gemini API names the model and the kind of call in the URL path, not the body, so its parser is
bound to the path's model and method by the server. A conversation is a list of ``contents`` (role ``user`` or
``model``) made of parts: text, ``functionCall`` (the model's tool call) and ``functionResponse`` (its result, in a
user content). Thoughts and thought signatures are the provider's own state and are dropped; a call without an id
(the API gives none) gets one made from its position, so the same conversation always gives the same ids (replay
keys depend on them), and a result is matched to its call by id, else by name (the oldest unanswered call of that
name). A streamed answer is server-sent events, each ``data:`` line a whole ``GenerateContentResponse``.

Errors have Google's shape, ``{"error": {"code", "message", "status"}}``; this module's :func:`error_body` and
:func:`api_of_path` extend the protocol module's so that the server answers every request to a Gemini path, its
refusals included, in that shape.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import unquote

from rexmle_agents.models.types import FINISH_LENGTH, GenerateConfig, Message, ModelResponse, ToolCall, ToolSpec
from rexmle_agents.relay import protocol
from rexmle_agents.relay.protocol import ProtocolError, RelayRequest, brief, estimated_tokens, sse

GEMINI = "gemini"
GENERATE = "generateContent"
STREAM = "streamGenerateContent"
COUNT_TOKENS = "countTokens"

# /v1beta/models/{model}:{method} (the SDKs also speak v1 and v1alpha); any method, so that an unknown one is
# refused in Google's error shape
_PATH = re.compile(r"/v1(?:alpha|beta)?/models/([^/:]+):([A-Za-z]+)")
_METHODS = (GENERATE, STREAM, COUNT_TOKENS)

# Google's canonical status names of the HTTP codes the relay answers with. A spent budget is 402, which Google
# never sends: it is given FAILED_PRECONDITION rather than RESOURCE_EXHAUSTED, which clients read as a quota (429)
# to wait out.
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 402: "FAILED_PRECONDITION", 403: "PERMISSION_DENIED",
           404: "NOT_FOUND", 405: "UNIMPLEMENTED", 408: "DEADLINE_EXCEEDED", 409: "ABORTED", 411: "INVALID_ARGUMENT",
           413: "INVALID_ARGUMENT", 414: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 431: "INVALID_ARGUMENT",
           499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}

_FINISH = {FINISH_LENGTH: "MAX_TOKENS", "content_filter": "SAFETY"}

# the OpenAPI type names of Gemini's ``parameters`` schemas (``"OBJECT"``), as JSON Schema writes them
_SCHEMA_TYPES = {"TYPE_UNSPECIFIED", "STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"}

_MEDIA_NOTE = ("[{kind} omitted: the model relay of this run passes text only; inspect the file with code "
               "instead]")


def match_path(path: str) -> tuple[str, str] | None:
    """``(model, method)`` of a Gemini API path served here, or None (also for a Gemini path of another method)."""
    found = _PATH.fullmatch(path.rstrip("/"))
    if found is None or found.group(2) not in _METHODS:
        return None
    return unquote(found.group(1)), found.group(2)


def api_of_path(path: str) -> str:
    """:func:`rexmle_agents.relay.protocol.api_of_path`, knowing the Gemini API's paths too."""
    return GEMINI if _PATH.fullmatch(path.rstrip("/")) else protocol.api_of_path(path)


def error_body(api: str, status: int, kind: str, message: str) -> dict[str, Any]:
    """:func:`rexmle_agents.relay.protocol.error_body`, in Google's shape for the Gemini dialect (the relay's kind
    of refusal, such as ``budget_exhausted``, is said in the message)."""
    if api != GEMINI:
        return protocol.error_body(api, status, kind, message)
    return {"error": {"code": status, "message": f"{message} ({kind})",
                      "status": _STATUS.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")}}


# ---------------------------------------------------------------------------------------------------------------
# parsing requests


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProtocolError(f"{what} must be a list, got {type(value).__name__}")
    return value


def _response_text(response: Any) -> str:
    """A function's result as the model reads it: Gemini CLI sends ``{"output": text}`` (or ``{"error": text}``);
    anything else is its JSON."""
    if isinstance(response, dict) and len(response) == 1:
        (key, value), = response.items()
        if key in ("output", "content", "result") and isinstance(value, str):
            return value
        if key == "error" and isinstance(value, str):
            return f"Error: {value}"
    return json.dumps(response, ensure_ascii=False)


def _media(part: Mapping[str, Any]) -> str | None:
    """The note that stands for an image, audio or document part (Gemini CLI's read_file of a PNG or a PDF):
    refusing the call would end the agent's session."""
    for key in ("inlineData", "fileData"):
        data = part.get(key)
        if isinstance(data, dict):
            mime = data.get("mimeType")
            return _MEDIA_NOTE.format(kind=mime if isinstance(mime, str) and mime else "a file")
    return None


def _system_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    content = _obj(value, "systemInstruction")
    texts = []
    for part in _list(content.get("parts"), "systemInstruction.parts"):
        part = _obj(part, "a part of systemInstruction")
        if isinstance(part.get("text"), str) and not part.get("thought"):
            texts.append(part["text"])
    return "\n\n".join(texts)


class _Calls:
    """The function calls of the conversation so far that await their results, to match each result to its call."""

    def __init__(self) -> None:
        self.by_name: dict[str, deque[str]] = {}
        self.names: dict[str, str] = {}  # id -> name of the calls not answered yet

    def add(self, call_id: str, name: str) -> None:
        self.by_name.setdefault(name, deque()).append(call_id)
        self.names[call_id] = name

    def answer(self, call_id: str | None, name: str, where: str) -> str:
        if not (call_id and call_id in self.names):
            pending = self.by_name.get(name)
            if not pending:
                raise ProtocolError(f"{where} answers a call of {brief(name)} (id {brief(call_id)}) that no "
                                    "earlier functionCall of the model made")
            call_id = pending[0]
        self.by_name[self.names.pop(call_id)].remove(call_id)
        return call_id


def _contents(raw: Any) -> list[Message]:
    contents = _list(raw, "contents")
    if not contents:
        raise ProtocolError("contents must be a non-empty list")
    messages: list[Message] = []
    calls = _Calls()
    for index, content in enumerate(contents):
        content = _obj(content, f"contents[{index}]")
        role = content.get("role") or "user"
        if role not in ("user", "model", "function"):  # "function": the older API's role of function results
            raise ProtocolError(f"contents[{index}] has role {brief(role)}; expected user or model")
        texts: list[str] = []
        tool_calls: list[ToolCall] = []
        results: list[Message] = []
        for position, part in enumerate(_list(content.get("parts"), f"contents[{index}].parts")):
            where = f"contents[{index}].parts[{position}]"
            part = _obj(part, where)
            if part.get("thought"):
                continue
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif "functionCall" in part:
                if role != "model":
                    raise ProtocolError(f"{where} is a functionCall in a {brief(role)} content; only the model "
                                        "calls functions")
                call = _obj(part["functionCall"], f"{where}.functionCall")
                name = call.get("name")
                if not isinstance(name, str) or not name:
                    raise ProtocolError(f"{where}.functionCall names no function")
                arguments = call.get("args")
                call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else \
                    f"gemini-call-{index}-{position}"
                tool_calls.append(ToolCall(id=call_id, name=name,
                                           arguments=_obj(arguments, f"{where}.functionCall.args")
                                           if arguments is not None else {}))
                calls.add(call_id, name)
            elif "functionResponse" in part:
                if role == "model":
                    raise ProtocolError(f"{where} is a functionResponse in a model content; function results "
                                        "come in a user content")
                result = _obj(part["functionResponse"], f"{where}.functionResponse")
                name = result.get("name")
                call_id = result.get("id") if isinstance(result.get("id"), str) else None
                text = _response_text(result.get("response"))
                notes = [note for note in map(_media, (p for p in _list(result.get("parts"), f"{where}.parts")
                                                       if isinstance(p, dict))) if note]
                results.append(Message.tool(calls.answer(call_id, str(name or ""), where),
                                            "\n".join([text, *notes])))
            elif (note := _media(part)) is not None:
                texts.append(note)
            elif any(key in part for key in ("executableCode", "codeExecutionResult", "toolCall", "toolResponse")):
                raise ProtocolError(f"{where} is a {next(iter(part))} part; the relay passes text and function "
                                    "calls only")
            # else: a part that carries only provider state (a thoughtSignature, videoMetadata): nothing to pass
        if role == "model":
            if texts or tool_calls:
                messages.append(Message(role="assistant", content="".join(texts), tool_calls=tuple(tool_calls)))
            continue
        messages.extend(results)  # the results answer the model's last turn, before any new user text
        if texts:
            messages.append(Message.user("\n".join(texts)))
    return messages


def _json_schema(schema: Any) -> Any:
    """A schema in the API's OpenAPI subset (types written ``"OBJECT"``) as JSON Schema writes it (a JSON Schema is
    left as it is); the body's depth is bounded, so the recursion is."""
    if isinstance(schema, list):
        return [_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str) and value.upper() in _SCHEMA_TYPES:
            converted[key] = "string" if value.upper() == "TYPE_UNSPECIFIED" else value.lower()
        elif key == "properties" and isinstance(value, dict):
            converted[key] = {name: _json_schema(item) for name, item in value.items()}
        else:
            converted[key] = _json_schema(value)
    return converted


def _tools(raw: Any) -> list[ToolSpec]:
    tools = []
    for index, tool in enumerate(_list(raw, "tools")):
        tool = _obj(tool, f"tools[{index}]")
        others = sorted(key for key in tool if key != "functionDeclarations")
        if others:
            raise ProtocolError(f"tools[{index}] is a {brief(others[0])} tool; the relay serves functionDeclarations "
                                "only (switch the agent's built-in web tools off)")
        for position, declaration in enumerate(_list(tool.get("functionDeclarations"),
                                                     f"tools[{index}].functionDeclarations")):
            declaration = _obj(declaration, f"tools[{index}].functionDeclarations[{position}]")
            schema = declaration.get("parametersJsonSchema")
            if schema is None:
                schema = declaration.get("parameters")
            parameters = {"type": "object", "properties": {}} if schema is None else \
                _json_schema(_obj(schema, f"the parameters of {brief(declaration.get('name'))}"))
            tools.append(ToolSpec(name=str(declaration.get("name") or ""),
                                  description=str(declaration.get("description") or ""), parameters=parameters))
    return tools


def _tool_choice(tool_config: Any, tools: list[ToolSpec]) -> tuple[str | None, list[ToolSpec]]:
    """``toolConfig.functionCallingConfig`` as a tool choice, and the tools it allows."""
    if tool_config is None:
        return None, tools
    calling = _obj(_obj(tool_config, "toolConfig").get("functionCallingConfig") or {}, "functionCallingConfig")
    mode = str(calling.get("mode") or "AUTO").upper()
    allowed = [str(name) for name in _list(calling.get("allowedFunctionNames"), "allowedFunctionNames")]
    if mode in ("AUTO", "VALIDATED", "MODE_UNSPECIFIED"):
        return None, tools
    if mode == "NONE":
        return "none", tools
    if mode != "ANY":
        raise ProtocolError(f"functionCallingConfig.mode {brief(calling.get('mode'))} is not one of AUTO, ANY, NONE "
                            "or VALIDATED")
    if not allowed:
        return "required", tools
    unknown = sorted(set(allowed) - {tool.name for tool in tools})
    if unknown:
        raise ProtocolError(f"allowedFunctionNames names {brief(unknown[0])}, which no functionDeclaration declares")
    kept = [tool for tool in tools if tool.name in allowed]
    return (allowed[0] if len(set(allowed)) == 1 else "required"), kept


def _response_format(generation: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON answer the request asks for, as the OpenAI-style ``response_format`` that the run's backends send as
    they are given it (``GenerateConfig.extra``): OpenAI's API and Gemini's OpenAI-compatible endpoint take it,
    where Gemini's own field names would be refused as unknown arguments."""
    schema = generation.get("responseJsonSchema")
    if schema is None:
        schema = generation.get("responseSchema")
    if schema is not None:
        # Gemini CLI's router writes the API's type names ("OBJECT") in its responseJsonSchema too
        schema = _json_schema(_obj(schema, "generationConfig.responseJsonSchema (or responseSchema)"))
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}}
    if generation.get("responseMimeType") == "application/json":
        return {"response_format": {"type": "json_object"}}
    return {}


def _config(generation: Any) -> GenerateConfig:
    generation = _obj(generation if generation is not None else {}, "generationConfig")
    temperature, max_tokens = generation.get("temperature"), generation.get("maxOutputTokens")
    stop = generation.get("stopSequences")
    try:
        return GenerateConfig(temperature=None if temperature is None else float(temperature),
                              max_tokens=None if max_tokens is None else int(max_tokens),
                              stop=tuple(str(s) for s in _list(stop, "stopSequences")),
                              extra=_response_format(generation))
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"bad generationConfig: {str(exc)[:300]}") from None


def parse_gemini(body: Mapping[str, Any], *, model: str, stream: bool) -> RelayRequest:
    """A ``GenerateContentRequest`` body for ``model`` (from the URL path), streamed for ``:streamGenerateContent``."""
    messages = _contents(body.get("contents"))
    if body.get("systemInstruction") is not None:
        messages.insert(0, Message.system(_system_text(body["systemInstruction"])))
    if body.get("cachedContent"):
        raise ProtocolError("cachedContent is not supported: send the whole conversation as contents")
    tool_choice, tools = _tool_choice(body.get("toolConfig"), _tools(body.get("tools")))
    return RelayRequest(api=GEMINI, model=model, messages=tuple(messages), tools=tuple(tools),
                        config=_config(body.get("generationConfig")), stream=stream, tool_choice=tool_choice)


def estimate_tokens(body: Any) -> int:
    """``:countTokens``, answered with an estimate (UTF-8 bytes of the request's text / 3): no model call, no cost.
    The body holds ``contents``, or a whole ``generateContentRequest``."""
    body = _obj(body, "the body")
    request = body.get("generateContentRequest")
    request = _obj(request, "generateContentRequest") if request is not None else body
    if not isinstance(request.get("contents"), list):
        raise ProtocolError("a countTokens body holds a list of contents (or a generateContentRequest with one)")
    return estimated_tokens([request.get("contents"), request.get("systemInstruction"), request.get("tools")])


# ---------------------------------------------------------------------------------------------------------------
# rendering answers


def _usage(response: ModelResponse) -> dict[str, Any]:
    usage = response.usage
    metadata = {"promptTokenCount": usage.input_tokens, "candidatesTokenCount": usage.output_tokens,
                "totalTokenCount": usage.total_tokens}
    if usage.cached_input_tokens:
        metadata["cachedContentTokenCount"] = usage.cached_input_tokens
    return metadata


def _call_parts(response: ModelResponse) -> list[dict[str, Any]]:
    return [{"functionCall": {"id": call.id, "name": call.name, "args": call.arguments}}
            for call in response.tool_calls]


def _answer(request: RelayRequest, response: ModelResponse, ident: str, parts: list[dict[str, Any]],
            *, last: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    answer: dict[str, Any] = {"candidates": [candidate], "modelVersion": request.model, "responseId": ident}
    if last:  # Gemini CLI takes a stream without a finish reason for a broken one, and retries it
        candidate["finishReason"] = _FINISH.get(response.finish_reason, "STOP")
        answer["usageMetadata"] = _usage(response)
    return answer


def render_gemini(request: RelayRequest, response: ModelResponse) -> dict[str, Any]:
    text = [{"text": response.text}] if response.text or not response.tool_calls else []
    return _answer(request, response, response.id or uuid.uuid4().hex[:24], [*text, *_call_parts(response)],
                   last=True)


def stream_gemini(request: RelayRequest, response: ModelResponse) -> Iterator[bytes]:
    """The answer as ``?alt=sse`` events: its text, then its function calls with the finish reason and usage."""
    ident = response.id or uuid.uuid4().hex[:24]
    if not response.tool_calls:
        yield sse(_answer(request, response, ident, [{"text": response.text}], last=True))
        return
    if response.text:
        yield sse(_answer(request, response, ident, [{"text": response.text}], last=False))
    yield sse(_answer(request, response, ident, _call_parts(response), last=True))
