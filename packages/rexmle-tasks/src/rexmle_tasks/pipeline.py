"""Preparing a task end to end: acquire raw data (download or synthetic mirror), extract, split, prepare.

Crash safety: ``public/`` and ``private/`` are built in temporary sibling folders (removed again if preparation
fails) and swapped in only when the whole preparation succeeded; the ``prepared.json`` marker is removed before the
swap and written last. A failed or interrupted run leaves the previous preparation (or nothing) in place, never a
half-written one.

``force``: a prepared task is prepared again from ``raw/``. ``raw/`` itself is replaced only when it holds another
source than the one asked for (real vs synthetic, or other synthetic cases/seed/secret), so forcing never throws away
a matching multi-gigabyte download, also not one shared by a group of tasks.

Synthetic secret: the mirror's generators are seeded from ``--seed`` *and* a secret of 32 random bytes drawn when the
mirror is written (:func:`generator_seed`), kept beside the raw data (``raw/.rexmle-synthetic-secret``) and in
``private/synthetic-secret`` (both mode 0600), never in ``public/``, the package or the environment. Without it the
installed generators plus the public seed would regenerate the test labels inside an agent's sandbox. The same
secret and seed give byte-identical data; tests and reproducibility checks pin the secret with ``secret=`` or the
``REXMLE_SYNTHETIC_SECRET`` environment variable (any non-empty text; never set it for real runs).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rexmle_grade.errors import TaskDataMissingError, UserInputError
from rexmle_grade.grader import TestManifest
from rexmle_grade.settings import TaskDirs
from rexmle_tasks.base import DIFFICULTIES, DOWNLOADS, PrepareContext, Task, TaskFamily, reset_dir
from rexmle_tasks.splits import Split, file_checksums, make_split

log = logging.getLogger(__name__)

PREPARED_MARKER = "prepared.json"
RAW_SOURCE_MARKER = ".rexmle-source.json"
EXTRACTED_MARKER = ".rexmle-extracted.json"
SAMPLE_SUBMISSION = "sample_submission"
DESCRIPTION = "description.md"
SPLIT_MANIFEST = "split_manifest.json"
SYNTHETIC_SECRET = "synthetic-secret"  # in private/
RAW_SECRET = ".rexmle-synthetic-secret"  # in raw/, beside the mirror it seeded
SYNTHETIC_SECRET_ENV = "REXMLE_SYNTHETIC_SECRET"
SECRET_BYTES = 32


@dataclass(frozen=True)
class PreparedInfo:
    task_id: str
    task_version: str
    synthetic: bool
    n_train: int
    n_test: int
    split_digest: str
    prepared_at: str
    cases: int | None = None  # synthetic data only: labelled cases and seed of the mirror
    seed: int | None = None
    difficulty: str | None = None  # synthetic data only, and only when not "easy" (older records have none)

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        if data["difficulty"] is None:
            del data["difficulty"]
        return data

    @property
    def source(self) -> dict[str, Any]:
        if not self.synthetic:
            return {"synthetic": False}
        return {"synthetic": True, "cases": self.cases, "seed": self.seed,
                **({"difficulty": self.difficulty} if self.difficulty not in (None, "easy") else {})}


def task_dirs(task: Task, data_root: str | Path | None = None) -> TaskDirs:
    return TaskDirs.for_task(task.id, raw_group=task.meta.raw_group, root=data_root)


#: the type(s) each field of prepared.json must have (JSON has no separate int and float for the optional ones)
_PREPARED_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "task_id": (str,), "task_version": (str,), "synthetic": (bool,), "n_train": (int,), "n_test": (int,),
    "split_digest": (str,), "prepared_at": (str,), "cases": (int, type(None)), "seed": (int, type(None)),
    "difficulty": (str, type(None)),
}
_PREPARED_OPTIONAL = frozenset({"cases", "seed", "difficulty"})


def prepared_info(dirs: TaskDirs) -> PreparedInfo | None:
    """The record of a prepared task (None: not prepared); a malformed record is a TaskDataMissingError whose
    one-line message says what is wrong and how to prepare again."""
    marker = dirs.root / PREPARED_MARKER
    if not marker.is_file():
        return None
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _malformed(dirs, marker, f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _malformed(dirs, marker, f"a JSON {type(data).__name__}, not an object")
    missing = sorted(set(_PREPARED_FIELD_TYPES) - _PREPARED_OPTIONAL - set(data))
    unknown = sorted(set(data) - set(_PREPARED_FIELD_TYPES))
    if missing or unknown:
        raise _malformed(dirs, marker, f"missing keys {missing}, unknown keys {unknown}")
    wrong = [f"{key}={data[key]!r}" for key, types in _PREPARED_FIELD_TYPES.items()
             if key in data and not _has_type(data[key], types)]
    if wrong:
        raise _malformed(dirs, marker, f"values of the wrong type: {', '.join(wrong)}")
    return PreparedInfo(**data)


def _has_type(value: Any, types: tuple[type, ...]) -> bool:
    """isinstance, except that a JSON true/false is no integer"""
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))


def _malformed(dirs: TaskDirs, marker: Path, problem: str) -> TaskDataMissingError:
    # one line, fix included: the CLI prints it as the whole error
    text = " ".join(problem.split())
    return TaskDataMissingError(f"{marker} is malformed ({text}); prepare the task again with "
                                f"`rexmle prepare {dirs.root.name} --force`")


def require_prepared(task: Task, dirs: TaskDirs) -> PreparedInfo:
    info = prepared_info(dirs)
    if info is None:
        raise TaskDataMissingError(
            f"task {task.id!r} is not prepared (no {dirs.root / PREPARED_MARKER})",
            hint=f"run `rexmle prepare {task.id} --synthetic` (offline) or `rexmle prepare {task.id}` (real data)",
        )
    return info


def requested_source(task: Task, *, synthetic: bool, cases: int | None, seed: int,
                     difficulty: str = "easy") -> dict[str, Any]:
    """The raw-data source a prepare call asks for (as recorded in raw/ and compared with what is there). The
    ``easy`` difficulty is left out, so that mirrors written before difficulties existed still match."""
    if not synthetic:
        return {"synthetic": False}
    default = task.meta.realistic_cases if difficulty == "realistic" else None
    return {"synthetic": True, "cases": cases or default or task.meta.synthetic_cases, "seed": seed,
            **({"difficulty": difficulty} if difficulty != "easy" else {})}


def check_difficulty(task: Task, difficulty: str, *, synthetic: bool) -> None:
    """A difficulty other than ``easy`` needs synthetic data and a family whose mirror has it."""
    if difficulty not in DIFFICULTIES:
        raise UserInputError(f"unknown synthetic difficulty {difficulty!r}",
                             hint=f"use one of {', '.join(DIFFICULTIES)}")
    if difficulty == "easy":
        return
    if not synthetic:
        raise UserInputError("--difficulty applies to synthetic data only", hint="add --synthetic")
    offered = task.family().synthetic_difficulties
    if difficulty not in offered:
        raise UserInputError(f"the synthetic mirror of {task.id!r} has no {difficulty!r} difficulty (it has: "
                             f"{', '.join(offered)})", hint="prepare it with --difficulty easy")


def pinned_secret(secret: bytes | str | None = None) -> bytes | None:
    """The synthetic secret a caller pinned: ``secret``, else ``$REXMLE_SYNTHETIC_SECRET``, else None (draw one)."""
    if secret is None:
        secret = os.environ.get(SYNTHETIC_SECRET_ENV) or None
    if isinstance(secret, str):
        secret = secret.encode()
    if secret is not None and not secret:
        raise UserInputError("the synthetic secret is empty", hint=f"unset {SYNTHETIC_SECRET_ENV} or give it a value")
    return secret


def generator_seed(secret: bytes, seed: int) -> int:
    """The seed handed to a family's synthetic generators: 256 bits of sha256 over the secret and ``--seed``."""
    digest = hashlib.sha256(b"rexmle-synthetic\0" + secret + b"\0" + str(seed).encode()).digest()
    return int.from_bytes(digest, "big")


def read_secret(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def write_secret(path: Path, secret: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(secret)
    os.chmod(path, 0o600)  # an existing file keeps its mode on O_CREAT


def acquire_raw(task: Task, dirs: TaskDirs, *, synthetic: bool, cases: int | None, seed: int,
                force: bool, difficulty: str = "easy", secret: bytes | str | None = None) -> None:
    """Fill ``raw/downloads`` (synthetic mirror or real download) and extract it, unless already done.

    ``raw/`` holding another source is an error, or with ``force`` is wiped and acquired again. A synthetic mirror
    written without a secret, or with another one than a pinned ``secret``, counts as another source.
    """
    source = requested_source(task, synthetic=synthetic, cases=cases, seed=seed, difficulty=difficulty)
    pinned = pinned_secret(secret) if synthetic else None
    marker = dirs.raw / RAW_SOURCE_MARKER
    if marker.is_file():
        existing = json.loads(marker.read_text())
        stored = read_secret(dirs.raw / RAW_SECRET)
        if existing == source and synthetic and (stored is None or (pinned is not None and stored != pinned)):
            if not force:
                made = "without a secret (forgeable from the public seed)" if stored is None else "with another secret"
                raise UserInputError(f"{dirs.raw} holds {describe_source(source)} made {made}",
                                     hint="add --force to write the mirror again")
            log.warning("replacing the synthetic mirror in %s (its secret is missing or not the pinned one)", dirs.raw)
            shutil.rmtree(dirs.raw)
        elif existing != source:
            if not force:
                raise UserInputError(
                    f"{dirs.raw} already holds {describe_source(existing)}, not {describe_source(source)}",
                    hint="add --force to replace it",
                )
            log.warning("replacing %s in %s by %s", describe_source(existing), dirs.raw, describe_source(source))
            shutil.rmtree(dirs.raw)
    family = task.family()
    downloads = dirs.raw / DOWNLOADS
    if not marker.is_file():
        if synthetic:
            log.info("writing a synthetic mirror of %s's download (%d cases, seed %d, %s)", task.id,
                     source["cases"], seed, difficulty)
            # written aside and moved in whole, so an interrupted run never leaves synthetic archives (with the
            # real names) where a later real download would take them for its own
            partial = reset_dir(dirs.raw / f"{DOWNLOADS}.partial")
            extra = {"difficulty": difficulty} if difficulty != "easy" else {}
            drawn = pinned or secrets.token_bytes(SECRET_BYTES)
            family.write_synthetic_download(partial, cases=source["cases"], seed=generator_seed(drawn, seed), **extra)
            write_secret(dirs.raw / RAW_SECRET, drawn)
            if downloads.exists():
                shutil.rmtree(downloads)
            partial.rename(downloads)
        else:
            from rexmle_tasks.download import fetch_sources

            fetch_sources(task.meta.data_sources, downloads)  # resumes whatever an interrupted run left
        marker.write_text(json.dumps(source) + "\n")
    if not (dirs.raw / EXTRACTED_MARKER).is_file():
        log.info("extracting %s", downloads)
        family.extract(downloads, dirs.raw)
        (dirs.raw / EXTRACTED_MARKER).write_text(json.dumps({"at": _now()}) + "\n")


def describe_source(source: dict[str, Any]) -> str:
    if source.get("synthetic"):
        level = f", {source['difficulty']}" if source.get("difficulty") else ""
        return f"synthetic data ({source['cases']} cases, seed {source['seed']}{level})"
    return "the real download"


def prepare_task(task: Task, dirs: TaskDirs, *, synthetic: bool = False, cases: int | None = None, seed: int = 0,
                 force: bool = False, difficulty: str = "easy", secret: bytes | str | None = None) -> PreparedInfo:
    """Prepare ``task`` into ``dirs`` (see module docstring). Returns the existing preparation unless ``force``.
    ``difficulty``: of the synthetic mirror (:data:`rexmle_tasks.base.DIFFICULTIES`). ``secret``: pins the
    synthetic secret (tests and reproducibility checks only; default ``$REXMLE_SYNTHETIC_SECRET``, else drawn)."""
    check_difficulty(task, difficulty, synthetic=synthetic)
    existing = prepared_info(dirs)
    source = requested_source(task, synthetic=synthetic, cases=cases, seed=seed, difficulty=difficulty)
    if existing is not None and not force:
        if existing.source != source:
            raise UserInputError(
                f"task {task.id!r} is already prepared from {describe_source(existing.source)}, not "
                f"{describe_source(source)}",
                hint="add --force to prepare it again",
            )
        pinned = pinned_secret(secret) if synthetic else None
        if pinned is not None and read_secret(dirs.private / SYNTHETIC_SECRET) != pinned:
            raise UserInputError(f"task {task.id!r} is already prepared from synthetic data made with another secret",
                                 hint="add --force to prepare it again")
        return existing
    acquire_raw(task, dirs, synthetic=synthetic, cases=cases, seed=seed, force=force, difficulty=difficulty,
                secret=secret)
    family = task.family()
    ids = family.case_ids(dirs.raw)
    if len(ids) < 2:
        raise TaskDataMissingError(f"found {len(ids)} labelled case(s) for {task.id!r} in {dirs.raw}",
                                   hint="the download looks incomplete; re-run with --force")
    split = family.fixed_split(dirs.raw) or make_split(
        ids, seed=task.meta.split.seed, test_fraction=task.meta.split.test_fraction, group_of=family.split_group)
    public_tmp = reset_dir(dirs.root / "public.partial")
    private_tmp = reset_dir(dirs.root / "private.partial")
    try:
        if synthetic:  # first, so that the private split manifest lists it
            write_secret(private_tmp / SYNTHETIC_SECRET, read_secret(dirs.raw / RAW_SECRET) or b"")
        build_prepared(task, family, split, public_tmp, private_tmp, raw=dirs.raw)
    except BaseException:
        shutil.rmtree(public_tmp, ignore_errors=True)
        shutil.rmtree(private_tmp, ignore_errors=True)
        raise
    (dirs.root / PREPARED_MARKER).unlink(missing_ok=True)
    swap_in(public_tmp, dirs.public)
    swap_in(private_tmp, dirs.private)
    info = PreparedInfo(task_id=task.id, task_version=task.meta.version, synthetic=synthetic,
                        n_train=len(split.train), n_test=len(split.test), split_digest=split.digest,
                        prepared_at=_now(), cases=source.get("cases"), seed=source.get("seed"),
                        difficulty=source.get("difficulty"))
    (dirs.root / PREPARED_MARKER).write_text(json.dumps(info.to_json(), indent=1) + "\n")
    return info


def build_prepared(task: Task, family: TaskFamily, split: Split, public: Path, private: Path, *, raw: Path) -> None:
    """The family's prepare, then the framework's files (manifest, sample submission, description, checksums)."""
    ctx = PrepareContext(raw=raw, public=public, private=private, split=split, options=dict(task.meta.options))
    log.info("preparing %s: %d train / %d test cases", task.id, len(split.train), len(split.test))
    manifest = family.prepare(ctx)
    if list(manifest.ids) != list(split.test):
        raise RuntimeError(
            f"family {task.meta.family!r} returned test ids {list(manifest.ids)[:5]}... ({len(manifest.ids)}) "
            f"but the split's are {list(split.test)[:5]}... ({len(split.test)}); prepare must return "
            "TestManifest(ids=tuple(ctx.split.test), ...)"
        )
    manifest.write(public)
    task.grader.write_sample_submission(public, public / SAMPLE_SUBMISSION)
    from rexmle_tasks.description import render_description

    (public / DESCRIPTION).write_text(render_description(task, manifest, n_train=len(split.train)))
    write_split_manifests(task, split, public, private)


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


def swap_in(tmp: Path, final: Path) -> None:
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
