"""The one JSON encoder of what the harness writes about a run (journal events, usage records, cassette entries;
``status.json``, ``grade.json`` and the other run-folder files go through :func:`clean_json` too), and durable
appends to JSON-lines files.

Much of what is written comes from the agent (plans, code, outputs, tool-call arguments, relayed request bodies)
and some of it JSON cannot hold: a NaN or infinite float (``json.dumps`` would write the non-standard ``NaN``),
a lone surrogate (UTF-8 cannot encode it, so the write raised), nesting thousands of levels deep (the encoder
and every reader run out of recursion). :func:`clean_json` repairs each such value where it stands and notes it, so
a bad value costs that one field, never the record, the run or its grade:

* a non-finite float becomes ``null``; its note is ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``;
* a string with lone surrogates keeps them as the escape text ``\\udXXX``;
* a container deeper than :data:`MAX_DEPTH` (or one that holds itself) becomes a marker string.

The notes go under the record's :data:`REPAIRED_KEY`, a mapping of dotted path to note (``{"metrics.dice":
"NaN"}``); the output is strict JSON (``allow_nan=False``), one line, UTF-8.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
import os
import uuid
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

from pydantic import BaseModel

REPAIRED_KEY = "repaired"
# Far above the harness's own records (a scaffold state is ~6 levels, a cassette's tool arguments ~10 plus what
# the agent nested) and far below the ~1000 levels at which Python's json reader runs out of recursion.
MAX_DEPTH = 64
MAX_NOTES = 50  # an agent that sends a million NaNs gets a count, not a million notes
MAX_PATH_CHARS = 200
DEPTH_MARKER = f"<nested deeper than {MAX_DEPTH} levels: cut by rexmle>"
CYCLE_MARKER = "<a container that holds itself: cut by rexmle>"
MORE_NOTES_KEY = "..."


def clean_json(value: Any, *, keep_nonfinite: bool = False) -> tuple[Any, dict[str, str]]:
    """``value`` as plain JSON data that strict JSON can hold, and the notes of what was repaired (path -> note).
    ``keep_nonfinite``: NaN and infinite floats stay (for typed records whose float fields read ``NaN`` back, such
    as ``grade.json``'s metrics); the rest is repaired all the same.

    Raises ``TypeError`` only for an object no JSON form is known for (a harness bug, never agent data: what the
    agent sends arrives as JSON text or strings)."""
    cleaner = _Cleaner(keep_nonfinite=keep_nonfinite)
    return cleaner.clean(value, (), 0), cleaner.notes()


def dumps_strict(value: Any) -> str:
    """Strict JSON text of ``value`` (one line) after :func:`clean_json`; a mapping gets the notes under
    :data:`REPAIRED_KEY` (other values are written repaired, without notes)."""
    clean, notes = clean_json(value)
    if notes and isinstance(clean, dict):
        clean[REPAIRED_KEY] = notes
    return json.dumps(clean, ensure_ascii=False, allow_nan=False)


def append_jsonl(path: Path, record: BaseModel | Mapping[str, Any]) -> None:
    """Append ``record`` as one strict JSON line (:func:`dumps_strict`) and force it to disk, so a crash loses at
    most the line being written. Readers of the file must accept the optional :data:`REPAIRED_KEY`."""
    line = (dumps_strict(record) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    # One write() of one line on an O_APPEND file: concurrent writers do not interleave within a line.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


class _Cleaner:
    def __init__(self, *, keep_nonfinite: bool) -> None:
        self._keep_nonfinite = keep_nonfinite
        self._notes: dict[str, str] = {}
        self._more = 0
        self._open: set[int] = set()  # the containers on the current path (a cycle comes back to one of them)

    def notes(self) -> dict[str, str]:
        if self._more:
            return {**self._notes, MORE_NOTES_KEY: f"{self._more} further value(s) repaired"}
        return self._notes

    def _note(self, path: tuple[str, ...], note: str) -> None:
        if len(self._notes) < MAX_NOTES:
            where = ".".join(path) or "(the record)"
            self._notes[where[:MAX_PATH_CHARS]] = note
        else:
            self._more += 1

    def clean(self, value: Any, path: tuple[str, ...], depth: int) -> Any:
        if value is None or isinstance(value, (bool, int)):
            return value
        if isinstance(value, float):
            if math.isfinite(value) or self._keep_nonfinite:
                return float(value)  # a float subclass (numpy.float64) as the plain float it equals
            self._note(path, "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity"))
            return None
        if isinstance(value, str):
            return self._text(value, path)
        if isinstance(value, BaseModel):
            return self.clean(value.model_dump(mode="python"), path, depth)
        if isinstance(value, (dict, list, tuple, set, frozenset)):
            return self._container(value, path, depth)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self.clean(dataclasses.asdict(value), path, depth)
        return self._scalar(value, path)

    def _text(self, text: str, path: tuple[str, ...]) -> str:
        if text.isascii():
            return text
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            self._note(path, "lone surrogates kept as \\u escapes")
            return text.encode("utf-8", "backslashreplace").decode("utf-8")
        return text

    def _container(self, value: Any, path: tuple[str, ...], depth: int) -> Any:
        if depth >= MAX_DEPTH:
            self._note(path, f"nested deeper than {MAX_DEPTH} levels: cut")
            return DEPTH_MARKER
        if id(value) in self._open:
            self._note(path, "a container that holds itself: cut")
            return CYCLE_MARKER
        self._open.add(id(value))
        try:
            if isinstance(value, dict):
                out = {}
                for key, item in value.items():
                    name = self._key(key, path)
                    out[name] = self.clean(item, (*path, name), depth + 1)
                return out
            return [self.clean(item, (*path, str(i)), depth + 1) for i, item in enumerate(value)]
        finally:
            self._open.discard(id(value))

    def _key(self, key: Any, path: tuple[str, ...]) -> str:
        if isinstance(key, str):
            return self._text(key, path)
        if isinstance(key, bool) or key is None:
            return json.dumps(key)  # what json.dumps makes of such a key: true, false, null
        if isinstance(key, int):
            return str(key)
        if isinstance(key, float):
            return repr(key) if math.isfinite(key) else json.dumps(key)
        if isinstance(key, enum.Enum):
            return str(key.value)
        raise TypeError(f"cannot write a mapping key of type {type(key).__name__} as JSON")

    def _scalar(self, value: Any, path: tuple[str, ...]) -> Any:
        if isinstance(value, enum.Enum):
            return self.clean(value.value, path, 0)
        if isinstance(value, (PurePath, uuid.UUID)):
            return self._text(str(value), path)
        if isinstance(value, (dt.datetime, dt.date, dt.time)):
            return value.isoformat()
        if isinstance(value, dt.timedelta):
            return value.total_seconds()
        raise TypeError(f"cannot journal a {type(value).__name__}: no JSON form is known for it")
