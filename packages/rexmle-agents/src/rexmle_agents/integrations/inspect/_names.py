"""How rexmle's objects get their ``rexmle/`` names in Inspect's registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

PACKAGE = "rexmle"  # the entry point's name: `inspect eval rexmle/<task>` loads it

F = TypeVar("F", bound=Callable[..., object])


def published(function: F, name: str) -> F:
    """``function`` named so that Inspect registers it as ``rexmle/<name>``.

    Inspect prefixes a registered object's name with the top-level module it is defined in (``rexmle_agents``),
    and finds an entry point by that prefix. The benchmark's name is ``rexmle``: the function is given a module
    name no module has, so Inspect takes the full name it is registered with as given."""
    function.__module__ = f"{PACKAGE}.inspect"
    function.__name__ = function.__qualname__ = name.replace("-", "_")
    return function


def qualified(name: str) -> str:
    return f"{PACKAGE}/{name}"
