"""Running an original agent, unchanged, as a rexmle agent: :class:`ExternalAgent`.

One attempt of a run: build (or reuse) the agent's own environment; write its files into the workspace; start the
model relay on a Unix socket in a harness folder; start the agent *inside the sandbox* (its environment, that
folder, and a checkout if any bound read-only) behind the in-sandbox forwarder; while it works, every model call
first syncs its node tree (a node that appeared since the last call is imported, its submission snapshotted and
its step closed; the call opens the next step); when it exits, import the rest (tree, best code, logs) and choose
the final submission (the best node by the agent's own metric, or what the agent chose at the end).

Built-in specs register as agents ``aideml``, ``rdagent`` and ``ml-master``; ``external`` runs any spec file
(``--agent external --agent-config spec=path/to/agent.yaml``). A third-party package ships its own with
``my_agent = external_agent_class(files("my_pkg") / "my-agent.yaml")`` and an entry point in ``rexmle.agents``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from rexmle_agents.external.envs import AgentEnvironment, ensure_environment
from rexmle_agents.external.spec import (
    ExternalAgentSpec,
    ExternalSpecError,
    fill,
    load_spec,
    looks_like_provider_model,
    parse_spec,
)
from rexmle_agents.external.trees import (
    DEFAULT_MAX_NODES,
    DEFAULT_MAX_TREE_BYTES,
    AideJournalReader,
    ForeignNode,
    TreeFormatError,
    TreeIncomplete,
    TreeLimitError,
    to_node,
)
from rexmle_agents.harness.agent import BaseAgent
from rexmle_agents.harness.context import Candidate, RunContext
from rexmle_agents.relay import FORWARDER, FORWARDER_NAME, SOCKET_NAME, HashingEmbedder, RelayServer, Route
from rexmle_agents.relay.tls import CA_FILE as PROVIDER_CA_FILE
from rexmle_agents.relay.tls import ProviderTLS
from rexmle_agents.safe_workspace import CopyLimits
from rexmle_agents.scaffolds.node import Node
from rexmle_agents.scaffolds.tree import Tree
from rexmle_grade.errors import BudgetExceededError, ConfigurationError, RexmleError, SandboxError, UserInputError
from rexmle_grade.io import MAX_CSV_BYTES

RELAY_INSIDE = "/run/rexmle/relay"  # where the relay folder appears inside an isolating sandbox
RELAY_PORT = 18080  # on the sandbox's own loopback
NO_KEY = "rexmle-relay-needs-no-key"
SCAFFOLD_STATE_KEY = "scaffold"  # the key the trajectory reader and the viewer read a tree from
MAX_TREE_BYTES = DEFAULT_MAX_TREE_BYTES  # the agent's tree file; beyond it the import stops with a recorded reason
MAX_TREE_NODES = DEFAULT_MAX_NODES  # nodes imported; then the import stops (the run goes on)
IMPORT_RETRY_S = 0.5  # a tree file caught being written is read again this soon
MAX_LOG_BYTES = 256 * 2**20
CLI_PROMPT_VERSION = "1"  # of prompts/cli_agent.md: journaled with every run that uses it
STOP_GRACE_S = 30.0  # after a spent budget, the agent's time to notice the 402 before it is killed
# The imported tree is journaled (as deltas) at most this often and at the end; snapshots and steps at once.
STATE_SAVE_INTERVAL_S = 10.0
# Seeds `random` in the agent's own process only: the interpreter whose program is $REXMLE_SEED_ENTRY. It takes its
# folder off PYTHONPATH and the variables out of the environment first, so no interpreter the agent starts (the
# code it writes, run in a child) is seeded: that code stays as random as it is outside rexmle.
SEEDING_SITECUSTOMIZE = """# rexmle: the run's seed for random in the agent's own process (its prompts repeat)
import os as _os
import sys as _sys


def _rexmle_seed():
    here = _os.path.dirname(_os.path.abspath(__file__))
    kept = [p for p in _os.environ.get("PYTHONPATH", "").split(_os.pathsep) if p and _os.path.abspath(p) != here]
    if kept:
        _os.environ["PYTHONPATH"] = _os.pathsep.join(kept)
    else:
        _os.environ.pop("PYTHONPATH", None)
    seed = _os.environ.pop("REXMLE_SEED", "")
    entry = _os.environ.pop("REXMLE_SEED_ENTRY", "")
    program = _os.path.basename(_sys.argv[0]) if _sys.argv and _sys.argv[0] else ""
    if seed.isdigit() and entry and program == entry:
        import random

        random.seed(int(seed))


_rexmle_seed()
del _rexmle_seed
"""
_SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)


class AgentProcessError(RexmleError):
    """The external agent's process ended without leaving a submission."""


# ---------------------------------------------------------------------------------------------------------------
# the agent class


class ExternalAgent(BaseAgent):
    """An agent described by an :class:`ExternalAgentSpec`; subclasses made by :func:`external_agent_class` carry
    the spec (``spec``) and where it came from (``spec_source``)."""

    spec: ClassVar[ExternalAgentSpec]
    spec_source: ClassVar[str]
    stop_grace_s: ClassVar[float] = STOP_GRACE_S

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.checkout = self._check_checkout()
        extras = self.config.get("extras") or []
        self.extras = [extras] if isinstance(extras, str) else list(extras)
        unknown = sorted(set(self.extras) - set(self.spec.environment.extras))
        if unknown:
            raise UserInputError(f"agent {self.name!r} has no environment extra(s) {unknown}",
                                 hint="its extras: " + (", ".join(sorted(self.spec.environment.extras)) or "none"))

    def _check_checkout(self) -> Path | None:
        source = self.spec.source
        if source is None:
            return None
        given = self.config.get(source.setting)
        if not given:
            raise UserInputError(f"agent {self.name!r} runs from your checkout of it, and none was given",
                                 hint=f"clone it ({source.url or 'see the README'}) and pass --agent-config "
                                      f"{source.setting}=/path/to/checkout")
        path = Path(str(given)).expanduser().resolve()
        missing = [rel for rel in source.must_contain if not (path / rel).exists()]
        if not path.is_dir() or missing:
            found = "does not exist" if not path.exists() else ("is not a folder" if not path.is_dir()
                                                                 else f"lacks {', '.join(missing)}")
            raise UserInputError(f"{path} is not a checkout of {self.name}: it {found}",
                                 hint=f"pass the folder of a clone of {source.url or self.name} that holds "
                                      f"{', '.join(source.must_contain)}")
        return path

    # ---- one attempt ----------------------------------------------------------------------------------------
    def run(self, ctx: RunContext) -> None:
        spec = self.spec
        env = ensure_environment(spec, extras=self.extras, checkout=self.checkout, source=self.spec_source,
                                 log=ctx.log)
        ctx.log(f"{'built' if env.built else 'reused'} the environment of external agent {spec.name!r}",
                environment=str(env.path), key=env.key[:16], build_seconds=round(env.seconds, 1), built=env.built,
                python=env.python_version, spec=self.spec_source, spec_digest=spec.digest()[:16])
        attempt = 1 + sum(1 for e in ctx.journal.iter_events() if e["kind"] == "run_resumed")
        relay_dir = Path(tempfile.mkdtemp(prefix="rexmle-relay-"))  # short: a socket path has ~100 characters
        relay_dir.chmod(0o755)  # the sandbox user reaches the socket (which only it may use) and the forwarder
        try:
            sandbox = self._sandbox(ctx, env, relay_dir)
            inside = RELAY_INSIDE if sandbox.isolating else str(relay_dir)
            values = self._values(ctx, env, attempt, sandbox.workspace_path)
            for rel, text in spec.files.items():
                ctx.fs.write_text(fill(rel, values), fill(text, values))
            shutil.copyfile(FORWARDER, relay_dir / FORWARDER_NAME)
            (relay_dir / FORWARDER_NAME).chmod(0o644)
            if spec.seed_python_random:
                (relay_dir / "site").mkdir()
                (relay_dir / "site" / "sitecustomize.py").write_text(SEEDING_SITECUSTOMIZE)
            if spec.shims:
                (relay_dir / "bin").mkdir()
                for name, script in spec.shims.items():
                    (relay_dir / "bin" / name).write_text(fill(script, values))
                    (relay_dir / "bin" / name).chmod(0o755)
            tracker = Tracker(ctx, spec, values, attempt,
                              max_nodes=int(self.config.get("tree_max_nodes", MAX_TREE_NODES)),
                              max_bytes=int(self.config.get("tree_max_bytes", MAX_TREE_BYTES)))
            stopper = _Stopper(sandbox, self.stop_grace_s, ctx)
            routes = self._routes(ctx)
            # the providers' hosts are answered only for names the agent sends there (neutral names never go)
            tls = ProviderTLS(relay_dir) if spec.provider_hosts and any(map(looks_like_provider_model, routes)) \
                else None
            relay = RelayServer(relay_dir, routes, before_call=tracker.before_call, record=ctx.log,
                                after_call=tracker.after_call if spec.steps == "turn" else None,
                                warn=lambda message: ctx.journal.append("warning", message=message),
                                on_budget_exhausted=stopper.stop_later,
                                embedder=HashingEmbedder() if spec.embeddings == "local-hashing" else None,
                                socket_owner=sandbox.owner, tls=tls)
            argv = self._argv(env, values, inside, provider_ca=tls is not None)
            asker = _StopBeforeDeadline(sandbox, ctx, spec.stop_margin_s)
            try:
                with relay:  # the whole agent is one command: only the run's time limits it
                    asker.start()
                    result = ctx.execute(argv, sandbox=sandbox, until_deadline=True,
                                         label=f"agent-attempt{attempt}")
            except BaseException:
                tracker.stop_importer()
                raise
            stopper.cancel()
            asker.cancel()
        finally:
            shutil.rmtree(relay_dir, ignore_errors=True)
        tracker.finish(stopped=relay.exhausted is not None or ctx.cancelled.is_set())
        if spec.outputs.snapshot == "at_end":
            tracker.collect_final()
        tracker.import_outputs()
        ctx.log(f"{spec.name} exited", exit_code=result.exit_code, stopped_by=result.stopped_by,
                model_calls=relay.stats.calls, streamed=relay.stats.streamed, refused=relay.stats.refused,
                embeddings=relay.stats.embeddings,
                nodes=tracker.nodes_this_attempt, snapshots=tracker.snapshots)
        if relay.exhausted is not None:
            raise BudgetExceededError(relay.exhausted)
        if ctx.cancelled.is_set():
            return
        if tracker.snapshots == 0:
            status = f"status {result.exit_code}" if result.exit_code is not None else f"({result.stopped_by})"
            tail = (result.stderr_tail.strip() or result.stdout_tail.strip())[-3000:]
            raise AgentProcessError(f"{spec.name} exited with {status} without leaving a submission; the last "
                                    f"lines of its output:\n{tail}",
                                    hint=f"its full output is in {_relative(result.stdout_path, ctx)} (and "
                                         ".stderr) and its own logs in logs/agent/")
        if not result.ok:
            how = (f"exited with status {result.exit_code} ({result.stopped_by or 'no limit'})"
                   if result.exit_code is not None else f"was ended ({result.stopped_by or 'no exit status'})")
            ctx.journal.append("warning", message=f"{spec.name} {how}; its submissions so far are kept")

    # ---- pieces -------------------------------------------------------------------------------------------
    def _routes(self, ctx: RunContext) -> dict[str, Route]:
        routes = {}
        for role in self.spec.roles:
            model_string = _model_string(ctx, role)
            alias = self.spec.alias_for(role, model_string)
            if alias in routes:  # two roles, one native name: the roles' models must tell the calls apart
                raise ConfigurationError(f"roles {routes[alias].role!r} and {role!r} of {self.spec.name} would both "
                                         f"be given the model name {alias!r}",
                                         hint="put {role} in the spec's native_alias")
            routes[alias] = Route(alias=alias, role=role, model_string=model_string, model=ctx.model(role))
        return routes

    def _values(self, ctx: RunContext, env: AgentEnvironment, attempt: int, workspace: str) -> dict[str, Any]:
        spec, limits = self.spec, ctx.spec.limits
        remaining = ctx.remaining()
        step_limits = [s for s in (remaining.steps, self.config.get("steps")) if isinstance(s, int)]
        values: dict[str, Any] = {key: value for key, value in self.config.items() if key != "extras"}
        values.update({
            "workspace": workspace, "data": f"{workspace}/data", "submission_dir": f"{workspace}/submission",
            "agent_dir": f"{workspace}/{spec.workdir}", "attempt": attempt, "instructions": ctx.instructions,
            "instructions_file": f"{workspace}/instructions.md", "description": ctx.task.description,
            "description_file": f"{workspace}/data/description.md", "task_id": ctx.task.task_id,
            "grader_id": ctx.task.grader_id, "relay_url": f"http://127.0.0.1:{RELAY_PORT}", "relay_port": RELAY_PORT,
            "no_key": NO_KEY, "time_limit_s": int(remaining.time_s), "exec_timeout_s": int(limits.exec_timeout_s),
            "max_steps": min(step_limits) if step_limits else 1_000_000,
            "cpus": ctx.spec.resources.cpus or os.cpu_count() or 1, "gpus": ctx.spec.resources.gpus,
            "venv": str(env.path), "python": str(env.python), "harness_python": sys.executable,
            "seed": ctx.spec.seed, "cli_prompt_version": CLI_PROMPT_VERSION,
        })
        for role in spec.roles:
            model_string = _model_string(ctx, role)
            alias = values[f"alias_{role}"] = spec.alias_for(role, model_string)
            values[f"litellm_{role}"] = f"{'anthropic' if model_string.startswith('anthropic/') else 'openai'}/{alias}"
        values["cli_prompt"] = cli_prompt(values, ctx.hardware)
        if self.checkout is not None and spec.source is not None:
            values[spec.source.setting] = str(self.checkout)
        return values

    def _sandbox(self, ctx: RunContext, env: AgentEnvironment, relay_dir: Path) -> Any:
        """The run's sandbox plus the relay folder, the agent's environment (and the interpreter it was made
        from, when the run's Python trees do not hold it) and the checkout, all read-only."""
        from rexmle_agents.sandbox import ExtraBind
        from rexmle_agents.sandbox.environment import python_paths

        binds = [ExtraBind(relay_dir, RELAY_INSIDE), ExtraBind(env.path, str(env.path))]
        home = _venv_home(env.path)
        if home is not None and not any(home == p or home.is_relative_to(p) for p in python_paths()):
            binds.append(ExtraBind(home, str(home)))
        if self.checkout is not None:
            binds.append(ExtraBind(self.checkout, str(self.checkout)))
        return ctx.sandbox_with(binds=binds, workdir=str(PurePosixPath(self.spec.workdir)))

    def _argv(self, env: AgentEnvironment, values: dict[str, Any], inside: str, *, provider_ca: bool = False
              ) -> list[str]:
        spec = self.spec
        relay_url = values["relay_url"]
        variables = {
            "PATH": ":".join([*([f"{inside}/bin"] if spec.shims else []), *map(str, env.search_path),
                              "/usr/local/bin:/usr/bin:/bin"]),
            "VIRTUAL_ENV": str(env.path), "REXMLE_RELAY_URL": relay_url,
            # clients that honour proxy variables send internet requests to the relay, which refuses and records
            **{name: relay_url for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                                            "all_proxy")},
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        }
        if provider_ca:  # the relay's certificate authority for the providers' hosts (relay/tls.py)
            variables["SSL_CERT_FILE"] = f"{inside}/{PROVIDER_CA_FILE}"
        if spec.seed_python_random:
            variables.update(PYTHONPATH=f"{inside}/site", REXMLE_SEED=str(values["seed"]),
                             REXMLE_SEED_ENTRY=_entry_program([fill(s, values) for s in spec.command]))
        variables.update({name: fill(value, values) for name, value in spec.env.items()})
        argv = [str(env.python), f"{inside}/{FORWARDER_NAME}", "--socket", f"{inside}/{SOCKET_NAME}",
                "--port", str(RELAY_PORT)]
        for name, value in variables.items():
            argv += ["--env", f"{name}={value}"]
        for service in spec.services:
            argv += ["--service", str(service.port), json.dumps([fill(s, values) for s in service.command])]
        for command in spec.after:
            argv += ["--after", json.dumps([fill(s, values) for s in command])]
        argv += ["--", *(fill(s, values) for s in spec.command)]
        _refuse_secrets(argv)
        return argv


TURN_TEXT = 4000  # characters of a turn's text, of each tool call's arguments and of each tool output journaled
TURN_ITEMS = 32  # tool calls and tool outputs journaled per turn


def _clip(text: str, limit: int, *, tail: bool = False) -> str:
    text = str(text or "")
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return f"[{cut} characters cut]" + text[-limit:] if tail else text[:limit] + f"[{cut} characters cut]"


def _bounded_arguments(call: Any) -> dict[str, Any]:
    """A tool call's arguments for the journal: strings clipped, the whole at most about :data:`TURN_TEXT` per
    value (a file the agent writes through a tool can be megabytes)."""
    if call.parse_error:
        return {"parse_error": _clip(call.parse_error, TURN_TEXT)}
    bounded: dict[str, Any] = {}
    for key, value in list(call.arguments.items())[:TURN_ITEMS]:
        text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
        bounded[_clip(str(key), 200)] = _clip(text, TURN_TEXT) if not isinstance(value, (int, float, bool)) \
            or isinstance(value, str) else value
    return bounded


def cli_prompt(values: Mapping[str, Any], hardware: Mapping[str, Any]) -> str:
    """The task as the terminal coding agents get it (``prompts/cli_agent.md``, version :data:`CLI_PROMPT_VERSION`):
    the harness's instructions plus what a non-interactive agent must know to finish, from the run's own limits."""
    from string import Template

    from rexmle_agents.harness.instructions import human_duration

    gpus = int(hardware.get("gpus") or 0)
    line = (f"{hardware.get('cpus') or values['cpus']} CPU core(s), {hardware.get('memory_gb')} GB memory and "
            + (f"{gpus} GPU(s)" if gpus else "no GPU (train on the CPU)"))
    text = resources.files("rexmle_agents.prompts").joinpath("cli_agent.md").read_text("utf-8")
    text = text.split("-->", 1)[1].lstrip("\n") if text.startswith("<!--") else text
    return Template(text).substitute(
        agent_dir=values["agent_dir"], instructions_file=values["instructions_file"],
        instructions=str(values["instructions"]).strip(), time_limit=human_duration(float(values["time_limit_s"])),
        time_limit_s=values["time_limit_s"], hardware_line=line, submission_dir=values["submission_dir"],
        validate_command=f"{values['harness_python']} -m rexmle_agents.validate",
        python=values["harness_python"])


def _model_string(ctx: RunContext, role: str) -> str:
    """The role's model as a provider/name string; a replayed recording counts as the model it recorded, so the agent
    is given the name (and takes the path) it had when it was recorded."""
    from rexmle_agents.harness.runner import REPLAY_PREFIX

    models = ctx.spec.models
    model_string = models.get(role) or models.get("default") or next(iter(models.values()), "")
    if model_string.startswith(REPLAY_PREFIX):
        model_string = str(getattr(ctx.model(role), "name", "") or model_string)
    return model_string


def _entry_program(command: list[str]) -> str:
    """What ``sys.argv[0]`` ends with in the agent's own interpreter: the console script (``aide``), or the script
    a Python interpreter is given."""
    program = PurePosixPath(command[0]).name
    if program.startswith("python") and len(command) > 1 and not command[1].startswith("-"):
        return PurePosixPath(command[1]).name
    return program


def _venv_home(venv: Path) -> Path | None:
    """The installation prefix of the interpreter a virtual environment was made from (its ``pyvenv.cfg`` home)."""
    config = venv / "pyvenv.cfg"
    if not config.is_file():
        return None
    for line in config.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return Path(value.strip()).resolve().parent
    return None


def _refuse_secrets(argv: list[str]) -> None:
    """No value of the harness's secret-looking variables (API keys, tokens) may reach the agent's command line."""
    secrets = {name: value for name, value in os.environ.items() if _SECRET_NAME.search(name) and len(value) >= 8}
    leaked = sorted(name for name, value in secrets.items() if any(value in part for part in argv))
    if leaked:
        raise SandboxError(f"the external agent's command would carry the value of {', '.join(leaked)}; agents "
                           "reach models through the relay and never hold a key",
                           hint="remove the key from the spec's env/command (the relay needs none)")


def _relative(path: Path | None, ctx: RunContext) -> str:
    return "logs/exec/" if path is None else str(path.relative_to(ctx.paths.run_dir))


class _StopBeforeDeadline:
    """Asks the agent to stop ``margin_s`` before the run's deadline (SIGTERM to the in-sandbox forwarder, which
    passes it on and then runs the spec's `after` steps): an agent whose answer is exported only when it ends
    (R&D-Agent) still leaves it before the sandbox is ended at the deadline."""

    def __init__(self, sandbox: Any, ctx: RunContext, margin_s: float) -> None:
        self.sandbox = sandbox
        self.ctx = ctx
        self.margin_s = margin_s
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        if self.margin_s <= 0:
            return
        self._timer = threading.Timer(max(0.0, self.ctx.remaining().time_s - self.margin_s), self._ask)
        self._timer.daemon = True
        self._timer.start()

    def _ask(self) -> None:
        asked = self.sandbox.interrupt_all()
        self.ctx.log(f"asked the agent to stop {self.margin_s:g} s before the run's deadline, so that its own "
                     "export runs in time", signalled=asked, margin_s=self.margin_s)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


class _Stopper:
    """Kills the agent a grace period after its budget is spent (it was told with a 402; some agents retry)."""

    def __init__(self, sandbox: Any, grace_s: float, ctx: RunContext) -> None:
        self.sandbox = sandbox
        self.grace_s = grace_s
        self.ctx = ctx
        self._timer: threading.Timer | None = None

    def stop_later(self, reason: str) -> None:
        self.ctx.journal.append("warning", message=f"{reason}: the agent is stopped in {self.grace_s:g} s if it has "
                                "not exited by then")
        self._timer = threading.Timer(self.grace_s, self.sandbox.kill_all)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


# ---------------------------------------------------------------------------------------------------------------
# steps, snapshots and the imported tree


@dataclass
class _Boundary:
    """A change of the agent's tree file seen before a model call: a node was saved. The submission on disk then
    is that node's, if the node wrote one (its fingerprint changed): collected at once, on the relay's thread,
    before the call is answered, because the next node's code needs that answer to exist."""

    version: tuple[int, int, int]  # (inode, size, mtime_ns) of the tree file
    seen_at: float  # Unix seconds
    step: int | None  # the harness step it closed: the node's step
    candidate: Candidate | None
    note: str  # why there is no candidate


class Tracker:
    """What one attempt of an external agent produced, kept in the run's format as it happens.

    Before every model call (on the relay's threads) only cheap bookkeeping runs: a ``stat`` of the tree file and,
    when it changed, the submission's fingerprint, its copy if the fingerprint changed, and the step's end. A
    background importer parses the new nodes (:class:`AideJournalReader`: only what was appended), pairs each
    boundary with the node it belongs to, adopts the copies of good nodes as snapshots, keeps the best selected
    and journals the tree as deltas; no model call waits for it. A harness step is open from the first call after
    a node until the tree file changes again, so the step's model usage and time are the node's; agents without a
    tree have one step per attempt.
    """

    def __init__(self, ctx: RunContext, spec: ExternalAgentSpec, values: dict[str, Any], attempt: int, *,
                 max_nodes: int = MAX_TREE_NODES, max_bytes: int = MAX_TREE_BYTES) -> None:
        self.ctx = ctx
        self.spec = spec
        self.values = values
        self.attempt = attempt
        self.max_nodes = max_nodes
        self.lock = threading.RLock()  # the relay's threads: steps and boundaries
        outputs = spec.outputs
        self.submission_rel = fill(outputs.submission, values)
        self.tree_rel = fill(outputs.tree.path, values) if outputs.tree is not None else None
        self.per_node = outputs.snapshot == "per_node"
        self.tree = Tree.from_states(ctx.load_states(SCAFFOLD_STATE_KEY))  # earlier attempts' nodes stay
        self.ids: dict[str, int] = {}  # the agent's node key -> node id, this attempt
        self.nodes_this_attempt = 0
        self.snapshots = sum(1 for e in ctx.journal.iter_events() if e["kind"] == "snapshot")
        self.selected: str | None = None
        self.import_stopped: str | None = None
        self.longest_wait_s = 0.0  # the longest before-call bookkeeping: what a model call waited for
        self.reader = AideJournalReader(max_bytes=max_bytes) if self.tree_rel is not None else None
        self._step_cm: Any = None
        self._step: Any = None
        self._tree_version: tuple[int, int, int] | None = None
        self._fingerprint = self._submission_fingerprint()
        self._boundaries: list[_Boundary] = []
        self._next_id = max(self.tree.nodes, default=-1) + 1
        self._best = self.tree.best()
        self._valid = sum(1 for n in self.tree.nodes.values() if n.is_valid)
        self._owners: dict[tuple[int, int, int], str] = {}  # a tree version -> its newest node's key
        self._paired: set[int] = set()
        self._created: dict[int, float | None] = {}  # this attempt's nodes: when the agent made them
        self._keys: dict[int, str] = {}  # node id -> the agent's key
        self._dirty: set[int] = set()
        self._full_at: int | None = None  # tree size at the last full state saved (None: none this attempt)
        self._saved_at = 0.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._importer: threading.Thread | None = None
        if self.reader is not None:
            self._importer = threading.Thread(target=self._import_loop, name="rexmle-tree-import", daemon=True)
            self._importer.start()

    # ---- from the relay -------------------------------------------------------------------------------------
    def before_call(self) -> None:
        started = time.monotonic()
        with self.lock:
            self._mark_boundary()
            if self._step_cm is None:
                kind = "node" if self.tree_rel is not None else "turn" if self.spec.steps == "turn" else "agent"
                cm = self.ctx.step(kind, agent=self.spec.name, attempt=self.attempt)
                self._step = cm.__enter__()  # a spent budget (steps, time, tokens, money) raises here: 402
                self._step_cm = cm
        self.longest_wait_s = max(self.longest_wait_s, time.monotonic() - started)

    def after_call(self, request: Any, response: Any) -> None:
        """A terminal agent's turn (``steps: turn``): the model's answer and the tool calls it asked for, with the
        outputs of the previous turn's calls that this request carried back, journaled as one ``agent_turn`` event
        (every field bounded) in the call's step, which then ends."""
        last_answer = max((i for i, m in enumerate(request.messages) if m.role == "assistant"), default=-1)
        results = [{"id": _clip(m.tool_call_id or "", 200), "output": _clip(m.content, TURN_TEXT, tail=True)}
                   for m in request.messages[last_answer + 1:] if m.role == "tool"]
        calls = [{"id": _clip(call.id, 200), "name": _clip(call.name, 200), "arguments": _bounded_arguments(call)}
                 for call in response.tool_calls[:TURN_ITEMS]]
        with self.lock:
            step = self._step.number if self._step is not None else None
            self.ctx.journal.append("agent_turn", step=step, model=_clip(request.model, 200),
                                    text=_clip(response.text, TURN_TEXT), tool_calls=calls,
                                    tool_results=results[:TURN_ITEMS])
            self._close_step({"tool_calls": [c["name"] for c in calls], "finish_reason": response.finish_reason})

    def _close_step(self, result: dict[str, Any], error: BaseException | None = None) -> int | None:
        if self._step_cm is None:
            return None
        number = self._step.number
        self._step.result = result
        cm, self._step_cm, self._step = self._step_cm, None, None
        if error is None:
            cm.__exit__(None, None, None)
        else:
            cm.__exit__(type(error), error, error.__traceback__)
        return number

    def _mark_boundary(self) -> None:
        """If the tree file changed since the last call, a node was saved: take its submission and end its step."""
        if self.tree_rel is None:
            return
        info = self.ctx.fs.stat(self.tree_rel)
        if info is None or not stat.S_ISREG(info.st_mode):
            return
        version = (info.st_ino, info.st_size, info.st_mtime_ns)
        if version == self._tree_version:
            return
        self._tree_version = version
        candidate, note = None, ""
        if self.per_node and self.import_stopped is None:
            fingerprint = self._submission_fingerprint()
            if fingerprint is None:
                note = "no submission.csv"
            elif fingerprint == self._fingerprint:
                note = "submission.csv unchanged since the previous node: not this node's"
            else:
                candidate = self.ctx.collect_submission(self.ctx.paths.workspace / self.submission_rel)
            self._fingerprint = fingerprint
        step = self._close_step({"agent_tree_bytes": info.st_size,
                                 "submission": "collected" if candidate is not None else (note or "not collected")})
        self._boundaries.append(_Boundary(version, time.time(), step, candidate, note))
        self._wake.set()

    def _submission_fingerprint(self) -> tuple[Any, ...] | None:
        """Who wrote ``submission.csv`` last, exactly: its identity, size, modification and change times (the
        change time cannot be set back by the agent) and a digest of its content."""
        rel = f"{self.submission_rel}/submission.csv"
        info = self.ctx.fs.stat(rel)
        if info is None or not stat.S_ISREG(info.st_mode):
            return None
        data = self.ctx.fs.read_bytes(rel, max_bytes=MAX_CSV_BYTES)
        digest = hashlib.sha256(data).hexdigest() if data is not None else None
        return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, digest

    # ---- the importer ---------------------------------------------------------------------------------------
    def _import_loop(self) -> None:
        retry = False
        try:
            while not self._stop.is_set():
                self._wake.wait(timeout=IMPORT_RETRY_S if retry else None)
                self._wake.clear()
                if self._stop.is_set():
                    break
                retry = self._import_pass()
        except Exception as exc:  # re-raised by finish(): a bug must not pass as a quiet end of the import
            self._failure = exc
            self._stop_import(f"the tree importer failed: {type(exc).__name__}: {exc}")

    def _import_pass(self, *, final: bool = False) -> bool:
        """Import what is new; True when the file was being written and should be read again soon."""
        with self.lock:
            boundaries = list(self._boundaries)
        retry, read = False, None
        if self.import_stopped is None and self.reader is not None and self.tree_rel is not None:
            try:
                read = self.reader.read(self.ctx.fs, self.tree_rel)
            except TreeLimitError as exc:
                self._stop_import(str(exc))
            except TreeIncomplete:
                retry = True
            except TreeFormatError as exc:
                retry = True
                if final:
                    self.ctx.log(f"the tree of {self.spec.name} could not be read at the end: {exc}")
            if read is not None:
                for note in read.skipped:
                    self.ctx.log(f"{self.spec.name}'s tree: {note}")
                for node in read.nodes:
                    if len(self.tree.nodes) >= self.max_nodes:
                        self._stop_import(f"the tree has {len(self.tree.nodes)} nodes, the import's cap ("
                                          "--agent-config tree_max_nodes=N raises it); the run goes on, choosing "
                                          "among the nodes imported")
                        break
                    self._add(node)
                if read.newest is not None:
                    self._owners[read.version] = read.newest
                    if len(self._owners) > 64:
                        self._owners.pop(next(iter(self._owners)))
        if read is None and not final:  # not read this time: only what an earlier read settles
            boundaries = [b for b in boundaries if b.version in self._owners]
        for boundary in boundaries:
            self._pair(boundary, later_read=read is not None)
        with self.lock:
            done = {id(b) for b in boundaries}
            self._boundaries = [b for b in self._boundaries if id(b) not in done]
        self._save(force=final)
        return retry

    def _stop_import(self, reason: str) -> None:
        if self.import_stopped is not None:
            return
        self.import_stopped = reason
        self.ctx.journal.append("warning", message=f"import of {self.spec.name}'s tree stopped: {reason}")

    def _add(self, node: ForeignNode) -> Node:
        node_id = self._next_id
        self._next_id += 1
        parent_id = self.ids.get(node.parent) if node.parent is not None else None
        parent = self.tree.nodes.get(parent_id) if parent_id is not None else None
        converted = to_node(node, node_id=node_id, parent_id=parent_id, parent=parent, step=None, snapshot=None,
                            snapshot_valid=False)
        self.tree.nodes[node_id] = converted
        if parent is not None:
            parent.children.append(node_id)
            self._dirty.add(parent.id)
        self.ids[node.key] = node_id
        self._dirty.add(node_id)
        self.nodes_this_attempt += 1
        self._created[node_id] = node.created
        self._keys[node_id] = node.key
        return converted

    def _owner(self, boundary: _Boundary, *, later_read: bool) -> Node | None:
        """The node a boundary belongs to: the newest node of the tree version it saw, or, when the importer only
        read a later version (``later_read``), the newest node the agent created before the boundary (AIDE makes a
        node after the call that the boundary preceded)."""
        key = self._owners.get(boundary.version)
        if key is not None:
            node_id = self.ids.get(key)
            return None if node_id is None else self.tree.nodes[node_id]
        if not later_read:
            return None
        for node_id in reversed(self._created):  # newest first; the match is among the last few
            created = self._created[node_id]
            if created is not None and created <= boundary.seen_at:
                return self.tree.nodes[node_id]
        return None

    def _pair(self, boundary: _Boundary, *, later_read: bool) -> None:
        node = self._owner(boundary, later_read=later_read) if self.import_stopped is None else None
        candidate = boundary.candidate
        if node is None or node.id in self._paired:
            if candidate is not None:
                candidate.discard()
            return
        self._paired.add(node.id)
        node.step = boundary.step
        self._dirty.add(node.id)
        if candidate is None:
            if boundary.note and self.per_node and not node.is_buggy:
                self.ctx.log(f"node {node.id} of {self.spec.name} left no submission of its own ({boundary.note})",
                             node=node.id)
            return
        if node.is_buggy:
            candidate.discard()
            return
        key = self._keys.get(node.id)
        snapshot = self.ctx.snapshot_submission(
            f"node{node.id}", candidate=candidate, code=node.code, score=node.metric,
            metadata={"node": node.id, "agent_node": key, "attempt": self.attempt, "node_step": boundary.step,
                      "lower_is_better": node.lower_is_better})
        self.snapshots += 1
        node.snapshot_id, node.submission_valid = snapshot, candidate.validation.ok
        if node.is_valid:
            self._valid += 1
            if self._best is None or (node.score is not None and self._best.score is not None
                                      and node.score > self._best.score):
                self._best = node
                self._select(node)

    def _select(self, best: Node) -> None:
        direction = "lower" if best.lower_is_better else "higher"
        self.ctx.select_final(best.snapshot_id or "", reason=f"node {best.id}: the agent's best validation metric "
                              f"{best.metric:.6g} ({direction} is better) of {self._valid} valid node(s)")
        self.selected = best.snapshot_id

    def _save(self, *, force: bool = False) -> None:
        """Journal what changed: a delta of the changed nodes, a full state when the tree has doubled since the last
        one (so the states written stay linear in the tree's size, and a resume folds a bounded number of deltas)."""
        if not self._dirty or (not force and time.monotonic() - self._saved_at < STATE_SAVE_INTERVAL_S):
            return
        if self._full_at is None or len(self.tree.nodes) >= 2 * max(self._full_at, 16):
            self.ctx.save_state(self.tree.to_state(), key=SCAFFOLD_STATE_KEY)
            self._full_at = len(self.tree.nodes)
        else:
            records = [self.tree.nodes[i].to_dict() for i in sorted(self._dirty)]
            self.ctx.save_state(Tree.delta(records, len(self.tree.knowledge), []), key=SCAFFOLD_STATE_KEY)
        self._dirty.clear()
        self._saved_at = time.monotonic()

    # ---- the end ----------------------------------------------------------------------------------------
    def stop_importer(self) -> None:
        """End the background importer (idempotent; :meth:`finish` then imports the rest itself)."""
        self._stop.set()
        self._wake.set()
        if self._importer is not None:
            self._importer.join()

    def finish(self, *, stopped: bool) -> None:
        with self.lock:
            self._mark_boundary()  # the last node, saved just before the agent exited
        if self._importer is not None:
            self.stop_importer()
            if self._failure is not None:
                raise self._failure
            self._import_pass(final=True)
        with self.lock:
            note = {"node": None, "summary": "the agent stopped before this step made a node" if stopped
                    else "model calls after the agent's last node"}
            self._close_step(note)
        if self.tree_rel is not None:
            self.ctx.journal.append("scaffold_summary", nodes=[n.journal_record() for n in self.tree if n.done])
            reader = self.reader
            self.ctx.log(f"imported {self.nodes_this_attempt} node(s) of {self.spec.name}'s tree",
                         nodes=self.nodes_this_attempt, tree_bytes_read=reader.bytes_read if reader else 0,
                         rereads=reader.rereads if reader else 0, longest_call_wait_s=round(self.longest_wait_s, 4),
                         import_stopped=self.import_stopped)

    def collect_final(self) -> None:
        """The agent's own final answer (agents that choose it themselves at the end)."""
        if self.ctx.fs.stat(f"{self.submission_rel}/submission.csv") is None:
            self.ctx.log(f"{self.spec.name} left no submission.csv in {self.submission_rel}")
            return
        code = self._best_code()
        snapshot = self.ctx.snapshot_submission(f"{self.spec.name} final answer (attempt {self.attempt})",
                                                source=self.ctx.paths.workspace / self.submission_rel, code=code,
                                                metadata={"attempt": self.attempt, "agent_choice": True})
        self.snapshots += 1
        self.ctx.select_final(snapshot, reason=f"the submission {self.spec.name} chose itself")

    def _best_code(self) -> str | None:
        rel = self.spec.outputs.best_code
        if rel is None:
            return None
        data = self.ctx.fs.read_bytes(fill(rel, self.values), max_bytes=16 * 2**20)
        return None if data is None else data.decode("utf-8", errors="replace")

    def import_outputs(self) -> None:
        """The agent's own logs into ``logs/agent/`` (regular files only, bounded), its best code beside them."""
        dest = self.ctx.paths.logs / "agent" / f"attempt-{self.attempt}"
        copied, skipped = 0, []
        for template in self.spec.outputs.logs:
            rel = fill(template, self.values)
            info = self.ctx.fs.stat(rel)
            into = dest / PurePosixPath(rel).name if info is not None and stat.S_ISDIR(info.st_mode) else dest
            report = self.ctx.fs.copy_out(rel, into, limits=CopyLimits(max_total_bytes=MAX_LOG_BYTES,
                                                                          max_file_bytes=MAX_LOG_BYTES, max_depth=12))
            copied += report.files
            skipped += list(report.refused)
        code = self._best_code()
        if code is not None:
            dest.mkdir(parents=True, exist_ok=True)
            (dest / "best_solution.py").write_text(code)
        self.ctx.log(f"imported {copied} log file(s) of {self.spec.name}", folder=str(dest.relative_to(
            self.ctx.paths.run_dir)), files=copied, skipped=skipped[:20], best_code=code is not None)


# ---------------------------------------------------------------------------------------------------------------
# making agent classes from specs


def external_agent_class(source: str | Path | Traversable, *, spec: ExternalAgentSpec | None = None) -> type:
    """An agent class for a spec: a built-in name, a file path, or a package resource (third-party packages)."""
    if spec is None:
        if isinstance(source, (str, Path)):
            spec = load_spec(source)
        else:
            spec = parse_spec(_yaml(source.read_text(encoding="utf-8"), str(source)), str(source))
    settings = dict(spec.settings)
    settings["extras"] = []
    if spec.outputs.tree is not None:  # the import's bounds, raised per run with --agent-config
        settings.update(tree_max_nodes=MAX_TREE_NODES, tree_max_bytes=MAX_TREE_BYTES)
    if spec.source is not None:
        settings[spec.source.setting] = None
    attributes = {"name": spec.name, "version": spec.version, "description": spec.description,
                  "roles": tuple(spec.roles), "defaults": settings, "spec": spec, "spec_source": str(source)}
    class_name = "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]", spec.name)) + "ExternalAgent"
    return type(class_name, (ExternalAgent,), attributes)


def _yaml(text: str, where: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ExternalSpecError(f"{where} is not valid YAML: {exc}") from None


class SpecFileAgent:
    """``--agent external --agent-config spec=path/to/agent.yaml [--agent-config KEY=VALUE ...]``: any spec file,
    its settings as the spec declares them."""

    name: ClassVar[str] = "external"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "any original agent described by a spec file (--agent-config spec=PATH.yaml)"
    roles: ClassVar[tuple[str, ...]] = ()

    def __new__(cls, config: Mapping[str, Any] | None = None) -> Any:  # type: ignore[misc]
        config = dict(config or {})
        path = config.pop("spec", None)
        if not path:
            raise UserInputError("agent 'external' needs the spec file of the agent to run",
                                 hint="pass --agent-config spec=path/to/agent.yaml (see rexmle_agents/external/specs/)")
        agent_class = external_agent_class(Path(str(path)).expanduser().resolve())
        agent = agent_class(config)
        agent.config["spec"] = str(path)
        return agent


def _builtin(name: str) -> type:
    try:
        return external_agent_class(name)
    except RexmleError as exc:  # a broken built-in spec is a bug; say so where the agent is looked up
        raise ConfigurationError(f"the built-in external agent spec {name!r} is invalid: {exc.message}") from None


AidemlAgent = _builtin("aideml")
RdAgent = _builtin("rdagent")
MlMasterAgent = _builtin("ml-master")
ClaudeCodeAgent = _builtin("claude-code")
CodexAgent = _builtin("codex")
MiniSweAgent = _builtin("mini-swe-agent")
OpenHandsAgent = _builtin("openhands")
GeminiCliAgent = _builtin("gemini-cli")
