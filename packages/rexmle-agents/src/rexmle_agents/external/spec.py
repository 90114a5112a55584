"""External agents as data: the YAML spec that says how to install, start and read back a third-party agent.

A spec (package data in ``rexmle_agents/external/specs/``, or any file given by path) names the agent, the model
roles it needs and the alias model names it is given for them, how to build its own virtual environment (pinned
requirements; never rexmle's environment), the files written into the workspace before it starts, the command and
environment that start it inside the sandbox, the services started beside it, and where its submission, best code,
node tree and logs land. Strings may use ``{placeholders}`` (see :data:`BUILTIN_PLACEHOLDERS` and the spec's own
``settings``); a literal brace is written twice. Every problem is reported with the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import string
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from rexmle_grade.errors import UnknownNameError, UserInputError

SPEC_PACKAGE = "rexmle_agents.external.specs"
SPEC_FORMAT = 1

# What the harness fills in; the spec's settings (--agent-config keys) are placeholders too, and per role ROLE:
# alias_ROLE, the model name the agent is given (the spec's alias, or its native_alias for the run's model), and
# litellm_ROLE, that name as LiteLLM knows it (anthropic/NAME for an Anthropic model, else openai/NAME: LiteLLM
# reaches the relay through ANTHROPIC_API_BASE or OPENAI_API_BASE).
BUILTIN_PLACEHOLDERS: dict[str, str] = {
    "workspace": "the workspace inside the sandbox (/workspace)",
    "data": "the task's public data, read-only (/workspace/data)",
    "submission_dir": "the harness's submission folder (/workspace/submission)",
    "agent_dir": "the agent's own folder in the workspace (/workspace/<workdir>)",
    "attempt": "the attempt number (1, then 2... after a resume): keeps each attempt's outputs apart",
    "instructions": "the harness's instructions to agents (text)",
    "instructions_file": "the file holding them (/workspace/instructions.md)",
    "description": "the task's public description (text)",
    "description_file": "the file holding it (/workspace/data/description.md)",
    "task_id": "the task id",
    "grader_id": "the task's grader id",
    "relay_url": "the model relay inside the sandbox (http://127.0.0.1:PORT)",
    "relay_port": "its port",
    "no_key": "a placeholder API key (SDKs insist on one; the relay needs none)",
    "time_limit_s": "seconds left of the run's time limit when the agent starts (an integer)",
    "exec_timeout_s": "the run's per-execution limit in seconds (an integer)",
    "max_steps": "the run's step limit, or the spec's `steps` setting, or 1000000",
    "cpus": "CPU cores of the run (an integer; the machine's when the run sets none)",
    "gpus": "GPU count of the run",
    "venv": "the agent's own virtual environment",
    "python": "its Python interpreter",
    "harness_python": "rexmle's own Python (for rexmle's helpers inside the sandbox, e.g. the validator)",
    "checkout": "the user's checkout of the agent (specs with a `source`)",
    "seed": "the run's seed",
    "cli_prompt": "the task as terminal coding agents get it (prompts/cli_agent.md: the instructions, the limits, how "
                  "to finish)",
    "cli_prompt_version": "the version of that prompt template",
}


# the providers whose models an agent may know by name (native_alias); the relay answers them all
NATIVE_PROVIDERS = ("openai", "anthropic", "google")


def looks_like_provider_model(name: str) -> bool:
    """A name AIDE (and agents like it) send to a provider's own host: gpt-*, o<digit>*, claude-*, gemini-*."""
    return name.startswith(("gpt-", "gemini-", "claude-")) or (name[:1] == "o" and name[1:2].isdigit())


class ExternalSpecError(UserInputError):
    """An external-agent spec that cannot be used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnvironmentSpec(_Strict):
    """The agent's own virtual environment, cached under a key that hashes everything below."""

    python: str | None = None  # "3.11" or an interpreter path; default: the harness's interpreter version
    requirements: tuple[str, ...] = ()  # installed with their dependencies (pin them: name==version)
    no_deps: tuple[str, ...] = ()  # installed afterwards without dependencies (an agent with a sprawling list)
    extras: dict[str, tuple[str, ...]] = Field(default_factory=dict)  # optional groups, --agent-config extras=NAME
    pip_args: tuple[str, ...] = ()
    # npm packages (pinned: name@version) installed into the environment's own prefix; their executables come first
    # on the agent's PATH (agents written in JavaScript, or shipped as native binaries through npm)
    npm: tuple[str, ...] = ()
    # a Node.js runtime from the npm registry (node-linux-<arch>@VERSION) for packages that need a newer Node.js than
    # the system's; None: the system's `node`, if any
    node: str | None = Field(default=None, pattern=r"^\d+\.\d+\.\d+$")

    @field_validator("npm")
    @classmethod
    def _pinned_npm(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for package in value:
            name, at, version = package.rpartition("@") if package.count("@") > (package[0] == "@") else ("", "", "")
            if not at or not name or not version:
                raise ValueError(f"npm package {package!r} is not pinned: write NAME@VERSION (e.g. "
                                 "@openai/codex@0.171.0)")
        return value


class SourceSpec(_Strict):
    """An agent that is not packaged: the user's checkout, named by the agent setting ``setting``."""

    setting: str = "checkout"
    must_contain: tuple[str, ...] = Field(min_length=1)  # relative paths that identify a checkout of this agent
    requirements_file: str | None = None  # inside the checkout, installed into the environment (hashed with it)
    url: str = ""  # where to get it


class ServiceSpec(_Strict):
    """A program started inside the sandbox before the agent and stopped after it (e.g. a validator)."""

    name: str
    port: int = Field(gt=0, lt=65536)
    command: tuple[str, ...] = Field(min_length=1)


class TreeSpec(_Strict):
    format: Literal["aide-journal"]  # AIDE's journal.json (also written by ML-Master versions that save it)
    path: str


class OutputsSpec(_Strict):
    submission: str  # folder (relative to the workspace) with submission.csv and the files it names
    # per_node: snapshot the folder after every node of the tree (AIDE overwrites it with each node); at_end: once
    snapshot: Literal["per_node", "at_end"] = "at_end"
    tree: TreeSpec | None = None
    best_code: str | None = None  # the agent's own best solution (a file relative to the workspace)
    logs: tuple[str, ...] = ()  # folders or files copied into the run's logs/agent/

    @model_validator(mode="after")
    def _tree_for_nodes(self) -> OutputsSpec:
        if self.snapshot == "per_node" and self.tree is None:
            raise ValueError("snapshot: per_node needs a tree to say when a node is done")
        return self


class ExternalAgentSpec(_Strict):
    format: Literal[1] = SPEC_FORMAT
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    version: str
    description: str
    homepage: str = ""
    roles: tuple[str, ...] = Field(min_length=1)
    # Answer the providers' own host names (relay/tls.py: api.openai.com, generativelanguage.googleapis.com,
    # api.anthropic.com) for agents that send a model there whatever base URL is set (AIDE's gpt-*, o*, gemini-*)
    provider_hosts: bool = False
    aliases: dict[str, str] = Field(min_length=1)  # alias model name the agent is given -> the run's model role
    # The name a role's model is given when it is an OpenAI, Anthropic or Google model: a template of "{model}" (its
    # name without the provider, e.g. gpt-5) and "{role}", so that the agent takes its own path for that model
    # (AIDE picks the API, the temperature, the prompt layout and max_tokens by name prefix; LiteLLM, which rdagent
    # uses, looks up structured-output support by name). None: the neutral alias above, whatever the model.
    native_alias: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)  # --agent-config keys and defaults (placeholders too)
    environment: EnvironmentSpec
    source: SourceSpec | None = None
    workdir: str = "agent"  # the agent's folder in the workspace; the process starts there
    files: dict[str, str] = Field(default_factory=dict)  # workspace-relative path -> text, written before it starts
    command: tuple[str, ...] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    services: tuple[ServiceSpec, ...] = ()
    after: tuple[tuple[str, ...], ...] = ()  # commands run inside the sandbox once the agent has exited
    shims: dict[str, str] = Field(default_factory=dict)  # executables (name -> script) put first on PATH
    embeddings: Literal["none", "local-hashing"] = "none"  # what the relay's /v1/embeddings answers with
    # seed Python's `random` with the run's seed in the agent's own process (a sitecustomize on PYTHONPATH that
    # only the command's program applies, and takes off the path of everything it starts): an agent that shuffles
    # its prompts (AIDE) then asks the same questions again, so a recorded run replays
    seed_python_random: bool = False
    # what one harness step is when the agent has no node tree: its whole attempt, or each model call (a terminal
    # coding agent's turn: the model's answer, the tool calls it made and, from the next call, their outputs)
    steps: Literal["attempt", "turn"] = "attempt"
    # seconds before the run's deadline at which the agent is asked to stop (SIGTERM, passed on by the relay's
    # forwarder), so that its `after` steps (the export of its own answer) finish before the sandbox is ended;
    # 0: the agent runs until the deadline and is killed there
    stop_margin_s: float = Field(default=0.0, ge=0.0)
    outputs: OutputsSpec

    @field_validator("aliases")
    @classmethod
    def _alias_names(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if info.data.get("provider_hosts"):  # the relay answers the providers' hosts: such a name reaches it
            return value
        for alias in value:
            if looks_like_provider_model(alias):
                raise ValueError(f"alias {alias!r} looks like a provider's model name; agents such as AIDE send "
                                 "those to the provider's own URL: choose a neutral name (e.g. rexmle-code), or "
                                 "set provider_hosts: true so that the relay answers those hosts")
        return value

    @field_validator("native_alias")
    @classmethod
    def _native_template(cls, value: str | None) -> str | None:
        if value is not None:
            names = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
            if "model" not in names or not names <= {"model", "role"}:
                raise ValueError(f"native_alias {value!r} must contain {{model}} and may contain {{role}}, nothing "
                                 "else")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ExternalAgentSpec:
        unknown_roles = sorted(set(self.aliases.values()) - set(self.roles))
        if unknown_roles:
            raise ValueError(f"aliases map to role(s) {unknown_roles} that are not among roles {list(self.roles)}")
        env = self.environment
        if not (env.requirements or env.no_deps or env.npm or (self.source and self.source.requirements_file)):
            raise ValueError("environment lists no requirement (requirements, no_deps, npm or "
                             "source.requirements_file)")
        clash = sorted(set(self.settings) & {*BUILTIN_PLACEHOLDERS, "extras"})
        if clash:
            raise ValueError(f"settings {clash} clash with names the harness fills in")
        if self.source is not None and self.source.setting in self.settings:
            raise ValueError(f"source.setting {self.source.setting!r} must not also be in settings")
        for rel in [self.workdir, *self.files, self.outputs.submission, *self.outputs.logs]:
            if rel.startswith("/") or ".." in Path(rel).parts:
                raise ValueError(f"{rel!r} must be a path relative to the workspace, without '..'")
        return self

    # ---- what the spec is ---------------------------------------------------------------------------------
    def placeholders(self) -> set[str]:
        names = {*BUILTIN_PLACEHOLDERS, *self.settings}
        names.update(f"alias_{role}" for role in self.roles)
        names.update(f"litellm_{role}" for role in self.roles)
        if self.source is not None:
            names.add(self.source.setting)
        return names

    def templates(self) -> list[tuple[str, str]]:
        """(field, template) for every string the harness fills in."""
        found = [(f"command[{i}]", s) for i, s in enumerate(self.command)]
        found += [(f"env.{k}", v) for k, v in self.env.items()]
        found += [(f"files.{k} (path)", k) for k in self.files]
        found += [(f"files.{k}", v) for k, v in self.files.items()]
        found += [(f"services[{i}].command[{j}]", s) for i, svc in enumerate(self.services)
                  for j, s in enumerate(svc.command)]
        found += [(f"after[{i}][{j}]", s) for i, cmd in enumerate(self.after) for j, s in enumerate(cmd)]
        found += [("outputs.submission", self.outputs.submission)]
        found += [(f"outputs.logs[{i}]", s) for i, s in enumerate(self.outputs.logs)]
        if self.outputs.tree is not None:
            found.append(("outputs.tree.path", self.outputs.tree.path))
        if self.outputs.best_code is not None:
            found.append(("outputs.best_code", self.outputs.best_code))
        return found

    def alias_for(self, role: str, model_string: str = "") -> str:
        """The name the agent is given for a role whose model is ``model_string`` (see ``native_alias``)."""
        provider, _, name = model_string.partition("/")
        if self.native_alias is not None and provider in NATIVE_PROVIDERS and name:
            return self.native_alias.format(model=name, role=role)
        return next(alias for alias, r in self.aliases.items() if r == role)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def fill(template: str, values: dict[str, Any]) -> str:
    return template.format_map(values)


def _check_templates(spec: ExternalAgentSpec, where: str) -> None:
    known = spec.placeholders()
    formatter = string.Formatter()
    for field, template in spec.templates():
        try:
            names = [name for _, name, _, _ in formatter.parse(template) if name is not None]
        except ValueError as exc:
            raise ExternalSpecError(f"{where}: field {field}: {exc} (write a literal brace as {{{{ or }}}})") from None
        for name in names:
            if name not in known:
                raise ExternalSpecError(f"{where}: field {field}: unknown placeholder {{{name}}}",
                                        hint="known: " + ", ".join(sorted(known)))


def parse_spec(raw: Any, where: str) -> ExternalAgentSpec:
    if not isinstance(raw, dict):
        raise ExternalSpecError(f"{where}: an external-agent spec must be a YAML mapping, got {type(raw).__name__}")
    try:
        spec = ExternalAgentSpec.model_validate(raw)
    except ValidationError as exc:
        problems = [f"field {'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
                    for err in exc.errors()]
        raise ExternalSpecError(f"{where}: invalid external-agent spec: " + "; ".join(problems),
                                hint="see the built-in specs in rexmle_agents/external/specs/ for the format") from None
    _check_templates(spec, where)
    return spec


def load_spec_file(path: Path) -> ExternalAgentSpec:
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ExternalSpecError(f"cannot read the external-agent spec {path}: {exc.strerror or exc}",
                                hint="pass the path of a YAML spec file") from None
    return _load_text(text, str(path))


def _load_text(text: str, where: str) -> ExternalAgentSpec:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ExternalSpecError(f"{where} is not valid YAML: {exc}") from None
    return parse_spec(raw, where)


def builtin_spec_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files(SPEC_PACKAGE).iterdir()
                  if p.name.endswith(".yaml"))


def load_builtin_spec(name: str) -> ExternalAgentSpec:
    names = builtin_spec_names()
    if name not in names:
        raise UnknownNameError("built-in external agent", name, names)
    text = resources.files(SPEC_PACKAGE).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    return _load_text(text, f"{SPEC_PACKAGE}/{name}.yaml")


def load_spec(source: str | Path) -> ExternalAgentSpec:
    """A built-in spec by name, or a spec file by path (anything with a slash or ending in .yaml/.yml)."""
    text = str(source)
    if isinstance(source, Path) or "/" in text or text.endswith((".yaml", ".yml")):
        return load_spec_file(Path(text))
    return load_builtin_spec(text)
