"""What every operator shares: one model call by role, fenced-code parsing, and tool-call answers asked for once
more when the model forgets the tool."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from rexmle_agents.models.types import Message, ModelResponse, ToolSpec
from rexmle_agents.scaffolds.prompting import render

if TYPE_CHECKING:
    from rexmle_agents.scaffolds.engine import Workbench
    from rexmle_agents.scaffolds.node import Node

_FENCED_PYTHON = re.compile(r"```(?:python|py|python3)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


class Operator(Protocol):
    name: ClassVar[str]
    role: ClassVar[str]  # the model role it calls

    def __call__(self, bench: Workbench, node: Node) -> Any: ...


@dataclass(frozen=True)
class ParsedScript:
    plan: str
    code: str | None  # None: the answer had no ```python block


def parse_script(text: str) -> ParsedScript:
    """The plan (text before the first ```python block) and that block's code."""
    match = _FENCED_PYTHON.search(text)
    if match is None:
        return ParsedScript(plan=text.strip(), code=None)
    return ParsedScript(plan=text[: match.start()].strip(), code=match.group(1).strip("\n") + "\n")


@dataclass(frozen=True)
class ToolAnswer:
    arguments: dict[str, Any] | None  # None: no usable call after asking twice
    problem: str  # why the last answer was not usable ("" when it was)
    calls: int


def ask_for_tool(bench: Workbench, role: str, messages: list[Message], tool: ToolSpec,
                 check: Callable[[Mapping[str, Any]], str]) -> ToolAnswer:
    """Call the model with ``tool`` offered; an answer without a usable call of it is asked for once more.

    ``check`` returns what is wrong with the arguments ("" when nothing is)."""
    conversation = list(messages)
    problem = ""
    for attempt in (1, 2):
        response = bench.generate(role, conversation, tools=[tool])
        arguments, problem = _usable_call(response, tool.name, check)
        if arguments is not None:
            return ToolAnswer(arguments=arguments, problem="", calls=attempt)
        conversation.append(response.message)
        for call in response.tool_calls:  # every tool call must be answered before the next user turn
            conversation.append(Message.tool(call.id, f"not accepted: {problem}"))
        conversation.append(Message.user(render("ask_again", tool=tool.name, problem=problem)))
    return ToolAnswer(arguments=None, problem=problem, calls=2)


def _usable_call(response: ModelResponse, name: str,
                 check: Callable[[Mapping[str, Any]], str]) -> tuple[dict[str, Any] | None, str]:
    calls = [c for c in response.tool_calls if c.name == name]
    if not calls:
        others = ", ".join(c.name for c in response.tool_calls)
        return None, f"the answer called {others}, not {name}" if others else f"the answer had no call of {name}"
    call = calls[0]
    if call.parse_error:
        return None, call.parse_error
    problem = check(call.arguments)
    return (None, problem) if problem else (dict(call.arguments), "")


def check_fields(arguments: Mapping[str, Any], spec: Mapping[str, tuple[type, ...]]) -> str:
    """'' when every field in ``spec`` is present with one of its types (bool is never taken for a number)."""
    problems = []
    for key, types in spec.items():
        if key not in arguments:
            problems.append(f"{key} is missing")
            continue
        value = arguments[key]
        numeric = int in types or float in types
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types) or (
                numeric and isinstance(value, float) and value != value):
            problems.append(f"{key} must be {' or '.join(t.__name__ for t in types)}, got {value!r}")
    return "; ".join(problems)
