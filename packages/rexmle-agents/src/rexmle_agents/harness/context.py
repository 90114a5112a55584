"""What an agent gets: :class:`RunContext`.

The context is the agent's whole interface to the world: the instructions, the workspace, models by role (called
from the harness process), :meth:`RunContext.execute` (code in the sandbox), steps, submission snapshots,
validation with public information only, persistent agent state, and the remaining budget. Every action is written
to the run journal before the call returns, so a resumed run sees everything that finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.paths import RunPaths
from rexmle_agents.harness.spec import RunSpec
from rexmle_agents.models.accounting import UsageLedger
from rexmle_agents.models.base import Model
from rexmle_agents.models.types import GenerateConfig, Message, ModelResponse, ToolSpec
from rexmle_agents.safe_workspace import Collected, CopyLimits, Workspace
from rexmle_agents.sandbox.base import SUBMISSION_DIRNAME, WORKING_DIRNAME, ExecResult, ExtraBind, Sandbox
from rexmle_grade.errors import BudgetExceededError, UserInputError

logger = logging.getLogger(__name__)

# A journal keeps at most this much of each output stream (the full logs stay in logs/).
JOURNAL_TAIL_CHARS = 4000


@dataclass(frozen=True)
class TaskInfo:
    task_id: str
    task_version: str
    grader_id: str
    title: str
    task_type: str
    dim: str
    description: str  # the task's public description.md
    public_dir: Path  # host path of the public folder (the harness reads it; sandboxed code sees data/)


@dataclass(frozen=True)
class Remaining:
    time_s: float
    steps: int | None
    tokens: int | None
    cost_usd: float | None


@dataclass
class Step:
    """One agent step; put what the step produced into ``result`` (it goes into the ``step_finished`` event)."""

    number: int
    kind: str
    info: dict[str, Any]
    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Validation:
    ok: bool
    problems: tuple[str, ...]
    n_rows: int


@dataclass(frozen=True)
class Candidate:
    """A submission collected out of the workspace into a harness folder (see :meth:`RunContext.collect_submission`),
    validated there: what a snapshot adopts, or what is discarded."""

    folder: Path  # harness-owned: run_dir/candidates/<id>/submission
    validation: Validation
    collected: Collected
    source: str  # the workspace folder it came from, relative to the workspace

    def discard(self) -> None:
        shutil.rmtree(self.folder.parent, ignore_errors=True)


class RunCancelled(BudgetExceededError):
    """The run was stopped from outside (watchdog deadline, SIGTERM, executor cancellation)."""


class _BudgetedModel:
    """A :class:`Model` whose calls first check the run's budget (time, steps, tokens, money)."""

    def __init__(self, model: Model, ctx: RunContext) -> None:
        self._model = model
        self._ctx = ctx
        self.name = model.name

    def generate(self, messages: Sequence[Message] | str, tools: Sequence[ToolSpec] = (),
                 config: GenerateConfig | None = None) -> ModelResponse:
        self._ctx.check_budget()
        return self._model.generate(messages, tools, config)


class RunContext:
    """One run's interface for its agent; built by the harness, never by agents."""

    def __init__(self, *, spec: RunSpec, paths: RunPaths, task: TaskInfo, instructions: str, sandbox: Sandbox,
                 journal: Journal, ledger: UsageLedger, models: Mapping[str, Model], deadline: float,
                 steps_done: int, hardware: Mapping[str, Any], last_step: int | None = None,
                 selection_scorer: Callable[[Path], Mapping[str, Any]] | None = None) -> None:
        self.spec = spec
        self.paths = paths
        self.task = task
        self.instructions = instructions
        self.sandbox = sandbox
        self.journal = journal
        self.ledger = ledger
        self.hardware = dict(hardware)
        self._selection_scorer = selection_scorer
        self.cancelled = threading.Event()
        self.cancel_reason: str | None = None
        self._models = {role: _BudgetedModel(m, self) for role, m in models.items()}
        self._deadline = deadline  # time.monotonic() value
        self._steps_done = steps_done  # finished steps: what the step limit counts
        # the last step number used (an interrupted step keeps its number but does not count against the limit)
        self._last_step = steps_done if last_step is None else max(last_step, steps_done)
        self._step: Step | None = None
        self._exec_counter = 0
        self._lock = threading.RLock()  # re-entrant: a stop signal's handler may call kill_all while it is held
        self._variants: dict[tuple[Any, ...], Sandbox] = {}
        # the only way the harness touches the workspace: never through a path the agent's code controls
        self.fs = Workspace(paths.workspace, owner=sandbox.owner)
        self.copy_limits = CopyLimits()

    # ---- paths as the sandboxed code sees them ------------------------------------------------------------
    @property
    def workspace(self) -> str:
        return self.sandbox.workspace_path

    def inside(self, host_path: Path) -> str:
        """The path of a file under the workspace as sandboxed code sees it (lexically: links are not followed)."""
        relative = self.relative(host_path)
        return f"{self.workspace}/{relative}" if relative != "." else self.workspace

    def relative(self, host_path: Path) -> str:
        """``host_path`` relative to the workspace, refused when it is not below it."""
        try:
            return Path(host_path).relative_to(self.paths.workspace).as_posix()
        except ValueError:
            raise UserInputError(f"{host_path} is not inside the run's workspace {self.paths.workspace}") from None

    # ---- models -----------------------------------------------------------------------------------------
    @property
    def roles(self) -> list[str]:
        return sorted(self._models)

    def model(self, role: str = "default") -> _BudgetedModel:
        """The model of ``role``; falls back to the ``default`` role, then to the only model given."""
        if role in self._models:
            return self._models[role]
        if "default" in self._models:
            return self._models["default"]
        if len(self._models) == 1:
            return next(iter(self._models.values()))
        given = ", ".join(self.roles) or "none"
        raise UserInputError(f"this run has no model for role {role!r} (models given for: {given})",
                             hint=f"pass --model {role}=PROVIDER/MODEL (or --model PROVIDER/MODEL for every role)")

    # ---- budget -------------------------------------------------------------------------------------------
    def extend_deadline(self, seconds: float) -> None:
        with self._lock:
            self._deadline += seconds

    @property
    def deadline(self) -> float:
        return self._deadline

    def remaining(self) -> Remaining:
        limits = self.spec.limits
        totals = self.ledger.totals()
        return Remaining(
            time_s=max(0.0, self._deadline - time.monotonic()),
            steps=None if limits.max_steps is None else max(0, limits.max_steps - self._steps_done),
            tokens=None if limits.max_tokens is None else max(0, limits.max_tokens - totals.usage.total_tokens),
            cost_usd=None if limits.max_cost_usd is None else max(0.0, limits.max_cost_usd - totals.cost_usd),
        )

    def check_budget(self) -> None:
        """Raise :class:`BudgetExceededError` (or :class:`RunCancelled`) once any budget is spent."""
        if self.cancelled.is_set():
            raise RunCancelled(f"the run was stopped: {self.cancel_reason or 'cancelled'}")
        if time.monotonic() >= self._deadline:
            raise BudgetExceededError(f"time limit of {self.spec.limits.time_limit_s:g} s reached")
        self.ledger.check_budget()

    def _check_steps(self) -> None:
        limit = self.spec.limits.max_steps
        if limit is not None and self._steps_done >= limit:
            raise BudgetExceededError(f"step limit reached: {self._steps_done} of {limit} steps done")

    # ---- steps --------------------------------------------------------------------------------------------
    @property
    def steps_done(self) -> int:
        return self._steps_done

    @property
    def current_step(self) -> Step | None:
        return self._step

    @contextlib.contextmanager
    def step(self, kind: str, **info: Any) -> Iterator[Step]:
        """One agent step: journaled when it starts and when it ends (with ``step.result``), counted against the
        step limit. Steps do not nest."""
        self.check_budget()
        self._check_steps()
        if self._step is not None:
            raise RuntimeError(f"step {self._step.number} ({self._step.kind}) is still open: steps do not nest")
        number = self._last_step + 1
        step = Step(number=number, kind=kind, info=dict(info))
        self._step = step
        self.ledger.begin_step(number)
        self.journal.append("step_started", step=number, step_kind=kind, info=info)
        started = time.monotonic()
        status = "error"
        try:
            yield step
            status = "ok"
        except BudgetExceededError:
            status = "out_of_budget"
            raise
        finally:
            self._step = None
            self._last_step = number
            self._steps_done += 1
            usage = self.ledger.step_totals(number)
            self.journal.append("step_finished", step=number, step_kind=kind, status=status,
                                seconds=round(time.monotonic() - started, 4), result=step.result,
                                model_usage=usage.model_dump(mode="json"))

    def finished_steps(self) -> list[dict[str, Any]]:
        """The ``step_finished`` events of this run so far (all attempts), oldest first."""
        return [e for e in self.journal.iter_events() if e["kind"] == "step_finished"]

    # ---- execution in the sandbox --------------------------------------------------------------------------
    def sandbox_with(self, *, binds: Sequence[ExtraBind] = (), workdir: str | None = None) -> Sandbox:
        """The run's sandbox with further read-only (or writable) binds and another start folder (an external
        agent's own environment, a model relay's socket): same isolation, limits and user; stopped with the run."""
        key = (tuple(binds), workdir)
        with self._lock:
            variant = self._variants.get(key)
            if variant is None:
                base = self.sandbox.spec
                if workdir is not None:
                    self.fs.ensure_dir(workdir)
                spec = dataclasses.replace(base, binds=(*base.binds, *binds), workdir=workdir or base.workdir)
                variant = self.sandbox.sibling(spec)  # the run's own identity, not a new one
                self._variants[key] = variant
        return variant

    def kill_all(self) -> None:
        """Kill every command this run's sandboxes are running (the watchdog and a stop signal call it)."""
        self.sandbox.kill_all()
        with self._lock:
            variants = list(self._variants.values())
        for variant in variants:
            variant.kill_all()

    def execute(self, command: Sequence[str] | str, *, timeout_s: float | None = None,
                label: str | None = None, sandbox: Sandbox | None = None,
                until_deadline: bool = False) -> ExecResult:
        """Run a command in the sandbox (a string goes through ``/bin/sh -c``), from ``working/``; the timeout is
        the per-execution limit, cut to the time the run has left. ``sandbox``: a variant from
        :meth:`sandbox_with`. ``until_deadline``: no per-execution limit, only the run's time (a whole external
        agent is one command)."""
        self.check_budget()
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        with self._lock:
            self._exec_counter += 1
            counter = self._exec_counter
        step = self._step.number if self._step else None
        name = f"step{step or 0:04d}-exec{counter:03d}" + (f"-{label}" if label else "")
        cap = float("inf") if until_deadline else self.spec.limits.exec_timeout_s
        limit = cap if timeout_s is None else min(timeout_s, cap)
        limit = max(0.1, min(limit, self._deadline - time.monotonic()))
        self.journal.append("exec_started", step=step, name=name, argv=argv, timeout_s=round(limit, 3))
        result = (sandbox or self.sandbox).run(argv, timeout_s=limit, log_dir=self.paths.logs / "exec",
                                               log_name=name, cancel=self.cancelled)
        self.journal.append(
            "exec_finished", step=step, name=name, exit_code=result.exit_code, stopped_by=result.stopped_by,
            wall_s=round(result.wall_s, 4), cpu_s=round(result.cpu_s, 4),
            stdout_tail=result.stdout_tail[-JOURNAL_TAIL_CHARS:], stderr_tail=result.stderr_tail[-JOURNAL_TAIL_CHARS:],
        )
        return result

    def run_python(self, code: str, *, filename: str | None = None, timeout_s: float | None = None,
                   label: str | None = None) -> ExecResult:
        """Write ``code`` to ``working/<filename>`` and run it with the environment's Python in the sandbox; the
        code itself is journaled."""
        step = self._step.number if self._step else 0
        filename = filename or f"step_{step:04d}.py"
        if "/" in filename or filename.startswith("."):
            raise UserInputError(f"script name {filename!r} must be a plain file name inside working/")
        self.fs.write_text(f"{WORKING_DIRNAME}/{filename}", code)  # a fresh file: never through a planted link
        self.journal.append("code_written", step=self._step.number if self._step else None, file=filename,
                            code=code)
        return self.execute(["python", filename], timeout_s=timeout_s, label=label)

    # ---- submissions --------------------------------------------------------------------------------------
    def collect_submission(self, source: Path | None = None) -> Candidate:
        """Copy a submission folder of the workspace (default: ``submission/``) into a harness folder, safely
        (:meth:`Workspace.collect_submission`: only ``submission.csv`` and the regular files it names, links and
        special files refused, sizes bounded), and validate the copy with public information only. What was
        refused is journaled with its reasons and listed among the validation's problems."""
        from rexmle_grade.grader import get_grader

        rel = self.relative(source) if source is not None else SUBMISSION_DIRNAME
        grader = get_grader(self.task.grader_id)
        dest = self.paths.run_dir / "candidates" / uuid.uuid4().hex[:12] / SUBMISSION_DIRNAME
        collected = self.fs.collect_submission(rel, dest, file_columns=[c.name for c in grader.schema.file_columns],
                                               limits=self.copy_limits)
        if collected.folder is None:
            dest.mkdir(parents=True, exist_ok=True)
        if collected.n_refused:
            self.journal.append("collect_refused", step=self._step.number if self._step else None, source=rel,
                                reasons=list(collected.refused), n_refused=collected.n_refused)
        validation = self._validate_folder(dest, refused=collected.refused, source=rel)
        return Candidate(folder=dest, validation=validation, collected=collected, source=rel)

    def validate(self, submission_dir: Path | None = None) -> Validation:
        """Check a submission of the workspace (default: ``submission/``) as graders would, on a safe copy."""
        candidate = self.collect_submission(submission_dir)
        candidate.discard()
        return candidate.validation

    def _validate_folder(self, folder: Path, *, refused: tuple[str, ...] = (), source: str) -> Validation:
        from rexmle_grade.grader import get_grader
        from rexmle_grade.validation import validate_submission

        report = validate_submission(get_grader(self.task.grader_id), folder, self.task.public_dir, deep=True)
        problems = (*(f"refused by the harness: {r}" for r in refused), *report.problems)
        outcome = Validation(ok=report.ok and not refused, problems=problems, n_rows=report.n_rows)
        self.journal.append("validation", step=self._step.number if self._step else None, folder=source,
                            ok=outcome.ok, problems=list(outcome.problems[:20]), n_problems=len(outcome.problems))
        return outcome

    def snapshot_submission(self, label: str, *, source: Path | None = None, candidate: Candidate | None = None,
                            code: str | None = None, score: float | None = None,
                            metadata: Mapping[str, Any] | None = None) -> str:
        """Keep a submission as a candidate for the final one, with the code that made it: ``candidate`` (already
        collected), else the workspace folder ``source`` (default ``submission/``), collected now. Journals it with
        its validation; returns the snapshot id."""
        candidate = candidate or self.collect_submission(source)
        with self._lock:
            self.paths.snapshots.mkdir(parents=True, exist_ok=True)
            number = sum(1 for _ in self.paths.snapshots.iterdir()) + 1
        step = self._step.number if self._step else 0
        snapshot_id = f"{number:04d}-step{step:04d}"
        dest = self.paths.snapshots / snapshot_id
        partial = dest.with_name(dest.name + ".partial")
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir()
        candidate.folder.rename(partial / SUBMISSION_DIRNAME)
        candidate.discard()
        if code is not None:
            (partial / "solution.py").write_text(code, encoding="utf-8", errors="backslashreplace")  # lone surrogates
        partial.rename(dest)
        validation = candidate.validation
        selection = None
        if self._selection_scorer is not None and validation.ok:
            selection = dict(self._selection_scorer(dest / SUBMISSION_DIRNAME))
        self.journal.append("snapshot", step=step or None, snapshot=snapshot_id, label=label, score=score,
                            valid=validation.ok, has_code=code is not None, metadata=dict(metadata or {}),
                            selection=selection, files=candidate.collected.files, bytes=candidate.collected.bytes,
                            refused=list(candidate.collected.refused))
        return snapshot_id

    def select_final(self, snapshot_id: str, *, reason: str = "") -> None:
        """Choose the snapshot the run submits (the last choice wins; without one, the latest valid snapshot).
        With a selection split (``--selection-cases``) the harness chooses by the held-out score instead and
        records this choice beside it."""
        if not (self.paths.snapshots / snapshot_id).is_dir():
            raise UserInputError(f"no snapshot {snapshot_id!r} in {self.paths.snapshots}")
        self.journal.append("final_selected", step=self._step.number if self._step else None,
                            snapshot=snapshot_id, reason=reason)

    # ---- agent state --------------------------------------------------------------------------------------
    def save_state(self, state: Any, *, key: str = "agent") -> None:
        """Persist JSON-serialisable agent state (a search tree, a knowledge log) in the journal."""
        self.journal.append("agent_state", step=self._step.number if self._step else None, key=key, state=state)

    def load_state(self, key: str = "agent") -> Any:
        """The last state saved under ``key`` (also by an earlier attempt of this run), or None."""
        states = self.load_states(key)
        return states[-1] if states else None

    def load_states(self, key: str = "agent") -> list[Any]:
        """Every state saved under ``key``, oldest first (for agents that save deltas: the scaffolds' tree)."""
        return [e["state"] for e in self.journal.iter_events() if e["kind"] == "agent_state" and e.get("key") == key]

    def log(self, message: str, **data: Any) -> None:
        logger.info("%s: %s", self.spec.run_id, message)
        self.journal.append("log", step=self._step.number if self._step else None, message=message, **data)
