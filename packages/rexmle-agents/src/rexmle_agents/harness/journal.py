"""The run journal: an append-only JSON-lines file, each event forced to disk before the harness goes on.

Every event is one JSON object with at least ``kind`` and ``time`` (Unix seconds). The harness writes run, step,
execution, snapshot, validation, state and budget events; the usage ledger writes ``model_call`` records to the same
file. A harness killed mid-write leaves at most one torn last line, which :meth:`Journal.events` skips (and
:meth:`Journal.repair` truncates before the next append), so a resumed run reads exactly the events that finished.

Every line is strict JSON written by the one encoder of run files (:func:`rexmle_agents.models._jsonl.dumps_strict`):
what JSON cannot hold (a NaN metric, a lone surrogate in a plan, nesting thousands of levels deep in a relayed
request) is repaired in its field and noted under the event's ``repaired`` key, so agent data never makes an append
raise. Journals written before that (with ``NaN`` tokens) are still read.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rexmle_agents.models._jsonl import dumps_strict
from rexmle_grade.errors import RexmleError


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def append(self, kind: str, *, step: int | None = None, **data: Any) -> dict[str, Any]:
        event: dict[str, Any] = {"kind": kind, "time": time.time()}
        if step is not None:
            event["step"] = step
        event.update(data)
        line = dumps_strict(event) + "\n"
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
        return event

    def repair(self) -> int:
        """Cut a torn last line (a crash mid-write) so appends start on a fresh line; returns bytes removed."""
        if not self.path.exists():
            return 0
        with self.path.open("rb+") as handle:
            data = handle.read()
            if not data or data.endswith(b"\n"):
                return 0
            keep = data.rfind(b"\n") + 1
            handle.truncate(keep)
            return len(data) - keep

    def events(self) -> list[dict[str, Any]]:
        return list(self.iter_events())

    def iter_events(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with self.path.open("rb") as handle:
            lines = handle.read().split(b"\n")
        last = len(lines) - 1
        for number, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                event = json.loads(raw)
            except ValueError as exc:
                if number == last:  # the torn line of a crash: it never finished, so it never happened
                    return
                raise RexmleError(
                    f"{self.path} line {number + 1} is not a journal event ({exc})",
                    hint="the journal was edited or corrupted; restore it or start the run afresh in a new folder",
                ) from exc
            if not isinstance(event, dict) or "kind" not in event:
                raise RexmleError(f"{self.path} line {number + 1} has no 'kind': not a rexmle journal")
            yield event
