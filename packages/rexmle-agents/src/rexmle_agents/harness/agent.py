"""The :class:`Agent` protocol — the only thing the harness knows about an agent — and the agent registry.

An agent is constructed from its configuration (a JSON object, recorded in the run spec) and then given a
:class:`~rexmle_agents.harness.context.RunContext` to :meth:`~Agent.run`. Everything it does goes through that
context: model calls (by role), code execution in the sandbox, steps, submission snapshots, validation and its own
persistent state. Agents register by name through the ``rexmle.agents`` entry-point group, whose objects are agent
classes (or factories) with the class attributes below.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from rexmle_grade.errors import ConfigurationError, UnknownNameError, UserInputError

if TYPE_CHECKING:
    from rexmle_agents.harness.context import RunContext

AGENTS_ENTRY_POINT_GROUP = "rexmle.agents"


@runtime_checkable
class Agent(Protocol):
    name: str
    version: str

    def run(self, ctx: RunContext) -> None:
        """Work on the task until done or out of budget. A resumed run calls this again with the same context
        contents: reload progress with ``ctx.load_state()`` / ``ctx.finished_steps()``."""


class AgentFactory(Protocol):
    name: ClassVar[str]
    version: ClassVar[str]
    description: ClassVar[str]
    roles: ClassVar[tuple[str, ...]]  # model roles the agent needs; () for agents that call no model

    def __call__(self, config: Mapping[str, Any]) -> Agent: ...


class BaseAgent:
    """Convenience base: validates the config against :attr:`defaults` and keeps it in ``self.config``."""

    name: ClassVar[str]
    version: ClassVar[str] = "0.1.0"
    description: ClassVar[str] = ""
    roles: ClassVar[tuple[str, ...]] = ()
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        config = dict(config or {})
        unknown = sorted(set(config) - set(self.defaults))
        if unknown:
            raise UserInputError(
                f"agent {self.name!r} has no setting(s) {', '.join(map(repr, unknown))}",
                hint="its settings: " + (", ".join(f"{k}={v!r}" for k, v in self.defaults.items()) or "none"),
            )
        self.config: dict[str, Any] = {**self.defaults, **config}

    def run(self, ctx: RunContext) -> None:  # pragma: no cover - every agent overrides it
        raise NotImplementedError


@dataclass(frozen=True)
class AgentInfo:
    name: str
    version: str
    description: str
    package: str
    roles: tuple[str, ...]
    factory: Any


_BUILTIN: dict[str, Any] = {}


def register_agent(cls: Any) -> Any:
    """Class decorator registering a built-in agent (third-party agents use the entry-point group)."""
    _BUILTIN[cls.name] = cls
    return cls


@functools.cache
def _entry_point_agents() -> tuple[dict[str, AgentInfo], dict[str, str]]:
    """The installed agents, and for each that cannot be imported, why (a broken plugin must not hide the rest)."""
    found: dict[str, AgentInfo] = {}
    broken: dict[str, str] = {}
    for ep in entry_points(group=AGENTS_ENTRY_POINT_GROUP):
        try:
            factory = ep.load()
        except (ImportError, AttributeError) as exc:
            broken[ep.name] = f"{ep.value}: {exc}"
            continue
        found[ep.name] = _info(factory, ep.dist.name if ep.dist else "?")
    return found, broken


def _info(factory: Any, package: str) -> AgentInfo:
    return AgentInfo(name=factory.name, version=getattr(factory, "version", "0"),
                     description=getattr(factory, "description", ""), package=package,
                     roles=tuple(getattr(factory, "roles", ())), factory=factory)


def all_agents() -> dict[str, AgentInfo]:
    agents = dict(_entry_point_agents()[0])
    for name, cls in _BUILTIN.items():
        agents.setdefault(name, _info(cls, "rexmle-agents"))
    return dict(sorted(agents.items()))


def get_agent_info(name: str) -> AgentInfo:
    agents = all_agents()
    broken = _entry_point_agents()[1]
    if name not in agents and name in broken:
        raise ConfigurationError(f"agent {name!r} is installed but cannot be imported ({broken[name]})",
                                 hint="reinstall the package that provides it")
    if name not in agents:
        raise UnknownNameError("agent", name, agents)
    return agents[name]


def make_agent(name: str, config: Mapping[str, Any] | None = None) -> Agent:
    return get_agent_info(name).factory(dict(config or {}))
