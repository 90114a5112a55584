"""Durable appends to JSON-lines files (run journals, cassettes)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel


def append_jsonl(path: Path, record: BaseModel) -> None:
    """Append ``record`` as one JSON line and force it to disk, so a crash loses at most the line being written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # One write() of one line on an O_APPEND file: concurrent writers do not interleave within a line.
    with path.open("a", encoding="utf-8") as handle:
        handle.write(record.model_dump_json() + "\n")
        handle.flush()
        os.fsync(handle.fileno())
