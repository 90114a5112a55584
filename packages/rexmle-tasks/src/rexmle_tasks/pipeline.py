"""Preparing a task end to end: acquire raw data (download or synthetic mirror), extract, split, prepare.

Crash safety: ``public/`` and ``private/`` are built in temporary sibling folders and swapped in only when the
whole preparation succeeded; the ``prepared.json`` marker is written last. A failed or interrupted run leaves the
previous preparation (or nothing) in place, never a half-written one.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rexmle_grade.errors import TaskDataMissingError, UserInputError
from rexmle_grade.grader import TestManifest
from rexmle_grade.settings import TaskDirs
from rexmle_tasks.base import DOWNLOADS, PrepareContext, Task, reset_dir
from rexmle_tasks.splits import Split, file_checksums, make_split

log = logging.getLogger(__name__)

PREPARED_MARKER = "prepared.json"
RAW_SOURCE_MARKER = ".rexmle-source.json"
EXTRACTED_MARKER = ".rexmle-extracted.json"
SAMPLE_SUBMISSION = "sample_submission"
DESCRIPTION = "description.md"
SPLIT_MANIFEST = "split_manifest.json"


@dataclass(frozen=True)
class PreparedInfo:
    task_id: str
    task_version: str
    synthetic: bool
    n_train: int
    n_test: int
    split_digest: str
    prepared_at: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def task_dirs(task: Task, data_root: str | Path | None = None) -> TaskDirs:
    return TaskDirs.for_task(task.id, raw_group=task.meta.raw_group, root=data_root)


def prepared_info(dirs: TaskDirs) -> PreparedInfo | None:
    marker = dirs.root / PREPARED_MARKER
    if not marker.is_file():
        return None
    return PreparedInfo(**json.loads(marker.read_text()))


def require_prepared(task: Task, dirs: TaskDirs) -> PreparedInfo:
    info = prepared_info(dirs)
    if info is None:
        raise TaskDataMissingError(
            f"task {task.id!r} is not prepared (no {dirs.root / PREPARED_MARKER})",
            hint=f"run `rexmle prepare {task.id} --synthetic` (offline) or `rexmle prepare {task.id}` (real data)",
        )
    return info


def acquire_raw(task: Task, dirs: TaskDirs, *, synthetic: bool, cases: int | None, seed: int,
                force: bool) -> None:
    """Fill ``raw/downloads`` (synthetic mirror or real download) and extract it, unless already done."""
    source = {"synthetic": synthetic, "cases": cases or task.meta.synthetic_cases, "seed": seed} if synthetic \
        else {"synthetic": False}
    marker = dirs.raw / RAW_SOURCE_MARKER
    if marker.is_file() and not force:
        existing = json.loads(marker.read_text())
        if existing != source:
            raise UserInputError(
                f"{dirs.raw} already holds {describe_source(existing)}, not {describe_source(source)}",
                hint="add --force to replace it",
            )
    elif force and dirs.raw.exists():
        shutil.rmtree(dirs.raw)
    family = task.family()
    downloads = dirs.raw / DOWNLOADS
    if not marker.is_file():
        downloads.mkdir(parents=True, exist_ok=True)
        if synthetic:
            log.info("writing a synthetic mirror of %s's download (%d cases, seed %d)", task.id, source["cases"],
                     seed)
            family.write_synthetic_download(downloads, cases=source["cases"], seed=seed)
        else:
            from rexmle_tasks.download import fetch_sources

            fetch_sources(task.meta.data_sources, downloads)
        marker.write_text(json.dumps(source) + "\n")
    if not (dirs.raw / EXTRACTED_MARKER).is_file():
        log.info("extracting %s", downloads)
        family.extract(downloads, dirs.raw)
        (dirs.raw / EXTRACTED_MARKER).write_text(json.dumps({"at": _now()}) + "\n")


def describe_source(source: dict[str, Any]) -> str:
    if source.get("synthetic"):
        return f"synthetic data ({source['cases']} cases, seed {source['seed']})"
    return "the real download"


def prepare_task(task: Task, dirs: TaskDirs, *, synthetic: bool = False, cases: int | None = None, seed: int = 0,
                 force: bool = False) -> PreparedInfo:
    """Prepare ``task`` into ``dirs`` (see module docstring). Returns the existing preparation unless ``force``."""
    existing = prepared_info(dirs)
    if existing is not None and not force:
        if existing.synthetic != synthetic:
            raise UserInputError(
                f"task {task.id!r} is already prepared from {'synthetic' if existing.synthetic else 'real'} data",
                hint="add --force to prepare it again",
            )
        return existing
    acquire_raw(task, dirs, synthetic=synthetic, cases=cases, seed=seed, force=force and task.meta.raw_group is None)
    family = task.family()
    ids = family.case_ids(dirs.raw)
    if len(ids) < 2:
        raise TaskDataMissingError(f"found {len(ids)} labelled case(s) for {task.id!r} in {dirs.raw}",
                                   hint="the download looks incomplete; re-run with --force")
    split = make_split(ids, seed=task.meta.split.seed, test_fraction=task.meta.split.test_fraction,
                       group_of=family.split_group)
    public_tmp = reset_dir(dirs.root / "public.partial")
    private_tmp = reset_dir(dirs.root / "private.partial")
    ctx = PrepareContext(raw=dirs.raw, public=public_tmp, private=private_tmp, split=split,
                         options=dict(task.meta.options))
    log.info("preparing %s: %d train / %d test cases", task.id, len(split.train), len(split.test))
    manifest = family.prepare(ctx)
    if list(manifest.ids) != list(split.test):
        raise RuntimeError(f"family {task.meta.family!r} returned test ids that differ from the split")
    manifest.write(public_tmp)
    task.grader.write_sample_submission(public_tmp, public_tmp / SAMPLE_SUBMISSION)
    from rexmle_tasks.description import render_description

    (public_tmp / DESCRIPTION).write_text(render_description(task, manifest, n_train=len(split.train)))
    write_split_manifests(task, split, public_tmp, private_tmp)
    _swap(public_tmp, dirs.public)
    _swap(private_tmp, dirs.private)
    info = PreparedInfo(task_id=task.id, task_version=task.meta.version, synthetic=synthetic,
                        n_train=len(split.train), n_test=len(split.test), split_digest=split.digest,
                        prepared_at=_now())
    (dirs.root / PREPARED_MARKER).write_text(json.dumps(info.to_json(), indent=1) + "\n")
    return info


def write_split_manifests(task: Task, split: Split, public: Path, private: Path) -> None:
    """public/split_manifest.json: ids, digest and public file checksums; private/: private file checksums."""
    common = {"task": task.id, "task_version": task.meta.version, "split_digest": split.digest}
    public_doc = {**common, "train_ids": list(split.train), "test_ids": list(split.test),
                  "sha256": file_checksums(public)}
    (public / SPLIT_MANIFEST).write_text(json.dumps(public_doc, indent=1) + "\n")
    private_doc = {**common, "sha256": file_checksums(private)}
    (private / SPLIT_MANIFEST).write_text(json.dumps(private_doc, indent=1) + "\n")


def read_manifest(dirs: TaskDirs) -> TestManifest:
    return TestManifest.read(dirs.public)


def _swap(tmp: Path, final: Path) -> None:
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
