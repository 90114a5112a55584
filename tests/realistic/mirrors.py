"""What every realistic-mirror test file checks the same way: a mirror prepared again with the same secret and
seed is the same, file for file, and another secret draws another release."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rexmle_tasks.splits import tree_digest

PARTS = ("raw", "public", "private")


def _parts(mirror: Any) -> dict[str, Path]:
    """A prepared task's three folders, from its data folder (``root/raw``...) or its ``TaskDirs``."""
    if isinstance(mirror, Path):
        return {part: mirror / part for part in PARTS}
    return {part: getattr(mirror, part) for part in PARTS}


def assert_reproducible(first: Any, again: Any, other: Any, label: object = None) -> None:
    """``again`` (same secret and seed as ``first``) equals it in all three folders; ``other`` (another secret)
    differs in its raw release."""
    first_parts, again_parts, other_parts = _parts(first), _parts(again), _parts(other)
    for part in PARTS:
        assert tree_digest(again_parts[part]) == tree_digest(first_parts[part]), (label, part)
    assert tree_digest(other_parts["raw"]) != tree_digest(first_parts["raw"]), label
