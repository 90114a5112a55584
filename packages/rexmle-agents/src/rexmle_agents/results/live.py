"""Progress of runs while they run, read from their folders (the harness may be in another process or machine).

:class:`LiveRuns` follows run folders: each :meth:`LiveRuns.poll` reads only what the journals gained since the
last poll (whole lines; a scaffold's large ``agent_state`` lines are skipped unread) and the small ``status.json``,
and keeps per run: state, steps done, time used, the best validation metric so far, tokens and cost, the baseline
that runs and, when its output says ``epoch N/M``, the epoch it is at. ``rexmle run`` shows this as a live table
and ``rexmle demo`` as a bar per run.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rexmle_agents.results.loader import JOURNAL_FILE, STATUS_FILE
from rexmle_agents.results.rows import cost_text
from rexmle_grade.text import printable

_EPOCH = re.compile(rb"epoch (\d+)/(\d+)")
_SKIP_PREFIXES = (b'{"kind": "agent_state"', b'{"kind":"agent_state"')
LOG_TAIL_BYTES = 8192


@dataclass
class LiveRun:
    run_dir: Path
    time_limit_s: float
    max_steps: int | None
    state: str = "pending"
    reason: str = ""
    steps: int = 0
    consumed_s: float = 0.0  # time used by earlier attempts
    attempt_started: float | None = None  # Unix seconds
    finished_s: float | None = None  # the run's total when it ended
    best: float | None = None
    lower_is_better: bool | None = None
    tokens: int = 0
    cost_usd: float = 0.0  # of the priced calls; uncosted_calls counts the others
    uncosted_calls: int = 0
    model_calls: int = 0
    baseline: str | None = None
    exec_name: str | None = None  # the command running now
    epoch: tuple[int, int] | None = None
    percentile: float | None = None
    _offset: int = field(default=0, repr=False)

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    def elapsed(self, now: float | None = None) -> float:
        if self.finished_s is not None:
            return self.finished_s
        if self.attempt_started is None:
            return self.consumed_s
        return self.consumed_s + max(0.0, (now or time.time()) - self.attempt_started)

    def apply(self, event: dict[str, Any]) -> None:
        kind = event.get("kind")
        if kind in ("run_started", "run_resumed"):
            self.consumed_s = float(event.get("consumed_s") or 0.0)
            self.attempt_started = _number(event.get("time"))
            self.state = "running"
        elif kind == "step_finished":
            self.steps = max(self.steps, int(event.get("step") or 0))
        elif kind == "step_started":
            baseline = (event.get("info") or {}).get("baseline")
            if baseline:
                config = (event.get("info") or {}).get("config")
                self.baseline = f"{baseline} ({config})" if config else str(baseline)
        elif kind == "exec_started":
            self.exec_name = event.get("name")
        elif kind == "exec_finished":
            self.exec_name = None
        elif kind == "snapshot" and event.get("valid") and isinstance(event.get("score"), (int, float)):
            lower = (event.get("metadata") or {}).get("lower_is_better")
            if self.lower_is_better is None:
                self.lower_is_better = bool(lower)
            score = float(event["score"])
            better = self.best is None or (score < self.best if self.lower_is_better else score > self.best)
            self.best = score if better else self.best
        elif kind == "model_call":
            totals = event.get("run_totals") or {}
            self.model_calls = int(totals.get("calls") or 0)
            usage = totals.get("usage") or {}
            self.tokens = int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
            self.cost_usd = float(totals.get("cost_usd") or 0.0)
            self.uncosted_calls = int(totals.get("uncosted_calls") or 0)
        elif kind == "run_finished":
            self.finished_s = _number(event.get("seconds"))
            self.state = str(event.get("state") or self.state)
            self.reason = str(event.get("reason") or "")
            self.exec_name = None
        elif kind == "graded":
            self.percentile = _number(event.get("percentile"))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


class LiveRuns:
    """Runs followed by folder (which need not exist yet)."""

    def __init__(self, runs: list[tuple[Path, float, int | None]]) -> None:
        self.runs = [LiveRun(run_dir=path, time_limit_s=limit, max_steps=steps) for path, limit, steps in runs]

    def poll(self) -> list[LiveRun]:
        for run in self.runs:
            _read_new_events(run)
            _read_status(run)
            run.epoch = _epoch(run) if run.exec_name else run.epoch
        return self.runs


def _read_new_events(run: LiveRun) -> None:
    """Apply the whole lines the journal gained since the last poll (the last may still be being written); a
    scaffold's ``agent_state`` lines, which can be megabytes each, are stepped over without being read."""
    path = run.run_dir / JOURNAL_FILE
    try:
        handle = path.open("rb")
    except OSError:
        return
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size <= run._offset:
            return
        with mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ) as data:
            start = run._offset
            while start < size:
                end = data.find(b"\n", start)
                if end == -1:
                    break
                if not data[start:start + 32].startswith(_SKIP_PREFIXES):
                    try:
                        event = json.loads(data[start:end])
                    except ValueError:
                        event = None
                    if isinstance(event, dict):
                        run.apply(event)
                start = end + 1
            run._offset = start


def _read_status(run: LiveRun) -> None:
    try:
        status = json.loads((run.run_dir / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(status, dict) and status.get("state"):
        run.state = str(status["state"])
        run.reason = str(status.get("reason") or run.reason)
        if run.state not in ("pending", "running") and status.get("elapsed_s") is not None:
            run.finished_s = float(status["elapsed_s"])


def _epoch(run: LiveRun) -> tuple[int, int] | None:
    """The last ``epoch N/M`` the running command printed (its full logs are logs/exec/<name>.stdout|stderr)."""
    found = run.epoch
    for suffix in ("stdout", "stderr"):
        path = run.run_dir / "logs" / "exec" / f"{run.exec_name}.{suffix}"
        try:
            with path.open("rb") as handle:
                handle.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
                tail = handle.read()
        except OSError:
            continue
        matches = _EPOCH.findall(tail)
        if matches:
            found = (int(matches[-1][0]), int(matches[-1][1]))
    return found


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    if seconds >= 60:
        return f"{seconds / 60:.1f}m"
    return f"{seconds:.0f}s"


def live_table(runs: list[LiveRun], *, title: str = "runs") -> Any:
    """A rich table: one line per run that is running or has run."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for column in ("run", "state", "steps", "time / budget", "best metric", "cost", "tokens"):
        table.add_column(column, overflow="fold")
    now = time.time()
    for run in runs:
        if run.state == "pending" and run.attempt_started is None:
            continue
        steps = f"{run.steps}/{run.max_steps}" if run.max_steps else str(run.steps)
        best = "-" if run.best is None else f"{run.best:.4g} ({'min' if run.lower_is_better else 'max'})"
        table.add_row(Text(printable(run.run_id, one_line=True)), Text(run.state), steps,
                      f"{format_seconds(run.elapsed(now))} / {format_seconds(run.time_limit_s)}", best,
                      cost_text(run.cost_usd, run.uncosted_calls), f"{run.tokens:,}")
    return table


@contextlib.contextmanager
def follow(console: Any, watch: LiveRuns, *, title: str) -> Iterator[None]:
    """Show :func:`live_table` of ``watch`` under the console's output while the block runs (on a terminal; a log
    file gets the per-run lines the caller prints)."""
    if not console.is_terminal:
        yield
        return
    from rich.live import Live

    with Live(console=console, get_renderable=lambda: live_table(watch.poll(), title=title), refresh_per_second=1,
              transient=True):
        yield
