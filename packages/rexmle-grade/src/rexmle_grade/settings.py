"""Where rexmle keeps data: ``--data-dir`` / ``REXMLE_DATA_DIR`` / a per-user cache folder.

Layout under the data folder, per task::

    <data>/<task_id>/raw/       the download (or its synthetic mirror), untouched
    <data>/<task_id>/public/    what an agent may see: train data, test inputs, sample submission, description
    <data>/<task_id>/private/   test labels and answers: only graders read it

Tasks that share one download (the six TopCoW tasks, say) share ``<data>/<group>-shared/raw``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from importlib.metadata import distributions
from pathlib import Path

import platformdirs

DATA_DIR_ENV = "REXMLE_DATA_DIR"


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The data folder: ``override`` if given, else ``$REXMLE_DATA_DIR``, else the user cache folder."""
    if override is not None:
        return Path(override).expanduser().resolve()
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser().resolve()
    return Path(platformdirs.user_cache_dir("rexmle")) / "data"


def rexmle_versions() -> dict[str, str]:
    """{distribution name: version} of every installed rexmle package: those that plug into rexmle through an
    entry-point group ``rexmle.*`` (the four packages and any third-party plugin; not the dev workspace).
    Read once per process (scanning every installed distribution is slow, and installs do not change under it)."""
    return dict(_installed_versions())


@functools.cache
def _installed_versions() -> tuple[tuple[str, str], ...]:
    found: dict[str, str] = {}
    for dist in distributions():
        name = dist.metadata["Name"] or ""
        if any(ep.group.startswith("rexmle.") for ep in dist.entry_points):
            found.setdefault(name, dist.version)
    return tuple(sorted(found.items()))


@dataclass(frozen=True)
class TaskDirs:
    """The three folders of one task."""

    root: Path
    raw: Path
    public: Path
    private: Path

    @classmethod
    def for_task(
        cls, task_id: str, *, raw_group: str | None = None, root: str | os.PathLike[str] | None = None
    ) -> TaskDirs:
        base = data_dir(root)
        task_root = base / task_id
        raw = base / f"{raw_group}-shared" / "raw" if raw_group else task_root / "raw"
        return cls(root=task_root, raw=raw, public=task_root / "public", private=task_root / "private")
