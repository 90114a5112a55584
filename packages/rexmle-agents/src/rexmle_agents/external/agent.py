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
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from rexmle_agents.external.envs import AgentEnvironment, ensure_environment
from rexmle_agents.external.spec import ExternalAgentSpec, ExternalSpecError, fill, load_spec, parse_spec
from rexmle_agents.external.trees import ForeignNode, TreeFormatError, parse_aide_journal, to_node
from rexmle_agents.harness.agent import BaseAgent
from rexmle_agents.harness.context import RunContext
from rexmle_agents.relay import FORWARDER, FORWARDER_NAME, SOCKET_NAME, HashingEmbedder, RelayServer, Route
from rexmle_agents.safe_workspace import CopyLimits
from rexmle_agents.scaffolds.node import Node
from rexmle_agents.scaffolds.tree import Tree
from rexmle_grade.errors import BudgetExceededError, ConfigurationError, RexmleError, SandboxError, UserInputError

RELAY_INSIDE = "/run/rexmle/relay"  # where the relay folder appears inside an isolating sandbox
RELAY_PORT = 18080  # on the sandbox's own loopback
NO_KEY = "rexmle-relay-needs-no-key"
SCAFFOLD_STATE_KEY = "scaffold"  # the key the trajectory reader and the viewer read a tree from
MAX_TREE_BYTES = 512 * 2**20
MAX_LOG_BYTES = 256 * 2**20
STOP_GRACE_S = 30.0  # after a spent budget, the agent's time to notice the 402 before it is killed
# The whole tree is journaled at most this often (and at the end): a 2000-node tree saved after every node would
# grow the journal quadratically. Snapshots and steps are journaled at once regardless.
STATE_SAVE_INTERVAL_S = 60.0
SEEDING_SITECUSTOMIZE = """# rexmle: the run's seed for Python's random module, so that the agent's prompts repeat
import os as _os
import random as _random

if _os.environ.get("REXMLE_SEED", "").isdigit():
    _random.seed(int(_os.environ["REXMLE_SEED"]))
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
            tracker = Tracker(ctx, spec, values, attempt)
            stopper = _Stopper(sandbox, self.stop_grace_s, ctx)
            relay = RelayServer(relay_dir, self._routes(ctx), before_call=tracker.before_call, record=ctx.log,
                                on_budget_exhausted=stopper.stop_later,
                                embedder=HashingEmbedder() if spec.embeddings == "local-hashing" else None,
                                socket_owner=sandbox.owner)
            argv = self._argv(env, values, inside)
            with relay:  # the whole agent is one command: only the run's time limits it
                result = ctx.execute(argv, sandbox=sandbox, until_deadline=True, label=f"agent-attempt{attempt}")
            stopper.cancel()
        finally:
            shutil.rmtree(relay_dir, ignore_errors=True)
        tracker.finish(stopped=relay.exhausted is not None or ctx.cancelled.is_set())
        if spec.outputs.snapshot == "at_end":
            tracker.collect_final()
        tracker.import_outputs()
        ctx.log(f"{spec.name} exited", exit_code=result.exit_code, stopped_by=result.stopped_by,
                model_calls=relay.stats.calls, streamed=relay.stats.streamed, refused=len(relay.stats.refused),
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
            ctx.journal.append("warning", message=f"{spec.name} exited with status {result.exit_code} "
                               f"({result.stopped_by or 'no limit'}); its submissions so far are kept")

    # ---- pieces -------------------------------------------------------------------------------------------
    def _routes(self, ctx: RunContext) -> dict[str, Route]:
        models = ctx.spec.models
        routes = {}
        for alias, role in self.spec.aliases.items():
            model_string = models.get(role) or models.get("default") or next(iter(models.values()), "")
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
            "seed": ctx.spec.seed,
        })
        values.update({f"alias_{role}": spec.alias_for(role) for role in spec.roles})
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

    def _argv(self, env: AgentEnvironment, values: dict[str, Any], inside: str) -> list[str]:
        spec = self.spec
        relay_url = values["relay_url"]
        variables = {
            "PATH": ":".join([*([f"{inside}/bin"] if spec.shims else []), str(env.bin),
                              "/usr/local/bin:/usr/bin:/bin"]),
            "VIRTUAL_ENV": str(env.path), "REXMLE_RELAY_URL": relay_url,
            # clients that honour proxy variables send internet requests to the relay, which refuses and records
            **{name: relay_url for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                                            "all_proxy")},
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        }
        if spec.seed_python_random:
            variables.update(PYTHONPATH=f"{inside}/site", REXMLE_SEED=str(values["seed"]))
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


class Tracker:
    """What one attempt of an external agent produced, kept in the run's format as it happens.

    Called before every model call (from the relay's threads) and once at the end. A harness step is open from
    the first call after a node until the next node appears in the agent's tree, so the step's model usage and
    time are the node's; agents without a tree have one step per attempt.
    """

    def __init__(self, ctx: RunContext, spec: ExternalAgentSpec, values: dict[str, Any], attempt: int) -> None:
        self.ctx = ctx
        self.spec = spec
        self.values = values
        self.attempt = attempt
        self.lock = threading.RLock()
        outputs = spec.outputs
        self.submission_rel = fill(outputs.submission, values)
        self.tree_rel = fill(outputs.tree.path, values) if outputs.tree is not None else None
        self.tree = Tree.from_states(ctx.load_states(SCAFFOLD_STATE_KEY))  # earlier attempts' nodes stay
        self.ids: dict[str, int] = {}  # the agent's node key -> node id, this attempt
        self.nodes_this_attempt = 0
        self.snapshots = sum(1 for e in ctx.journal.iter_events() if e["kind"] == "snapshot")
        self.selected: str | None = None
        self._step_cm: Any = None
        self._step: Any = None
        self._tree_seen: tuple[int, int] | None = None  # (mtime, size) of the tree file last parsed
        self._saved_at = 0.0
        self._unsaved = False

    # ---- from the relay -------------------------------------------------------------------------------------
    def before_call(self) -> None:
        with self.lock:
            self.sync()
            if self._step_cm is None:
                kind = "node" if self.tree_rel is not None else "agent"
                cm = self.ctx.step(kind, agent=self.spec.name, attempt=self.attempt)
                self._step = cm.__enter__()  # a spent budget (steps, time, tokens, money) raises here: 402
                self._step_cm = cm

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

    # ---- the agent's tree -----------------------------------------------------------------------------------
    def _read_tree(self) -> list[ForeignNode] | None:
        if self.tree_rel is None:
            return None
        info = self.ctx.fs.stat(self.tree_rel)
        if info is None or (info.st_mtime_ns, info.st_size) == self._tree_seen:
            return None  # unchanged since the last call: nothing new
        data = self.ctx.fs.read_bytes(self.tree_rel, max_bytes=MAX_TREE_BYTES)
        if data is None:
            return None
        try:
            nodes = parse_aide_journal(data)
        except TreeFormatError:  # being rewritten right now: read again at the next call
            return None
        self._tree_seen = (info.st_mtime_ns, info.st_size)
        return nodes

    def sync(self, *, save: bool = False) -> None:
        nodes = self._read_tree()
        fresh = [n for n in nodes or [] if n.key not in self.ids]
        for position, node in enumerate(fresh):
            newest = position == len(fresh) - 1
            snapshot, valid = None, False
            # only the newest node's submission is on disk: the agent overwrites it with every node
            if self.spec.outputs.snapshot == "per_node" and newest and not node.is_buggy:
                snapshot, valid = self._snapshot(node)
            step = self._step.number if self._step is not None else None
            converted = self._add(node, step=step, snapshot=snapshot, valid=valid)
            self._close_step(converted.journal_record())
        if fresh:
            self._select_best()
            self._unsaved = True
        if self._unsaved and (save or time.monotonic() - self._saved_at >= STATE_SAVE_INTERVAL_S):
            self.ctx.save_state(self.tree.to_state(), key=SCAFFOLD_STATE_KEY)
            self._saved_at, self._unsaved = time.monotonic(), False

    def _add(self, node: ForeignNode, *, step: int | None, snapshot: str | None, valid: bool) -> Node:
        node_id = max(self.tree.nodes, default=-1) + 1
        parent_id = self.ids.get(node.parent) if node.parent is not None else None
        parent = self.tree.nodes.get(parent_id) if parent_id is not None else None
        converted = to_node(node, node_id=node_id, parent_id=parent_id, parent=parent, step=step, snapshot=snapshot,
                            snapshot_valid=valid)
        self.tree.nodes[node_id] = converted
        if parent is not None:
            parent.children.append(node_id)
        self.ids[node.key] = node_id
        self.nodes_this_attempt += 1
        return converted

    def _snapshot(self, node: ForeignNode) -> tuple[str | None, bool]:
        csv_rel = f"{self.submission_rel}/submission.csv"
        info = self.ctx.fs.stat(csv_rel)
        if info is None:
            return None, False
        if node.created is not None and info.st_mtime < node.created - 1.0:
            self.ctx.log(f"node {node.index} of {self.spec.name} left no submission of its own (submission.csv "
                         "predates it)", agent_node=node.key)
            return None, False
        candidate = self.ctx.collect_submission(self.ctx.paths.workspace / self.submission_rel)
        node_id = max(self.tree.nodes, default=-1) + 1
        snapshot = self.ctx.snapshot_submission(
            f"node{node_id}", candidate=candidate, code=node.code, score=None if node.is_buggy else node.metric,
            metadata={"node": node_id, "agent_node": node.key, "attempt": self.attempt,
                      "lower_is_better": None if node.maximize is None else not node.maximize})
        self.snapshots += 1
        return snapshot, candidate.validation.ok

    def _select_best(self) -> None:
        best = self.tree.best()
        if best is None or best.snapshot_id is None or best.snapshot_id == self.selected:
            return
        direction = "lower" if best.lower_is_better else "higher"
        self.ctx.select_final(best.snapshot_id, reason=f"node {best.id}: the agent's best validation metric "
                              f"{best.metric:.6g} ({direction} is better) of {len(self.tree.good)} valid node(s)")
        self.selected = best.snapshot_id

    # ---- the end ----------------------------------------------------------------------------------------
    def finish(self, *, stopped: bool) -> None:
        with self.lock:
            self.sync(save=True)
            note = {"node": None, "summary": "the agent stopped before this step made a node" if stopped
                    else "model calls after the agent's last node"}
            self._close_step(note)
            if self.tree_rel is not None:
                self.ctx.journal.append("scaffold_summary",
                                        nodes=[n.journal_record() for n in self.tree if n.done])

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
