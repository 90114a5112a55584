"""A held-out selection split the agent cannot overfit (``--selection-cases K``; off by default).

An agent's own validation score is noisy and drifts over a long search. With this option the harness carves K
training *groups* (cases of one group, e.g. one patient, never straddle) out of the agent's training data and mixes
their inputs into the test inputs the agent must predict. Every candidate submission then covers the real test
cases and the K selection cases; the harness grades it on the selection cases with the task's own grader (to pick
the final node) and the final submission on the real test cases only (the task's grade).

Nothing in the graders changes; the split is pure data. Under ``<data>/<task>/selection-<k>-<folder id>/``::

    agent/public/    what the agent sees: train minus the K groups; test inputs = real test + selection cases
    agent/private/   answers of all those test inputs (never given to the agent)
    agent/prepared.json  the preparation record of the agent view, so :func:`rexmle_tasks.check.check_task` runs on it
    select/{public,private}  grading view of the selection cases: test manifest, sample submission, answers
    test/{public,private}    grading view of the real test cases (the final grade)
    selection.json   what was built: task version, the task's split digest, k, the names and the cases behind them

A secret decides everything an agent could otherwise compute: the harness draws 32 random bytes per run (kept in
the run folder, never in the workspace; :data:`SELECTION_SECRET_FILE`) and passes them in. The folder id is a keyed
hash of the secret. Which groups: the training groups sorted by ``HMAC(secret, group)``; the first ``k`` form the
selection split.

Telling the selection inputs apart: the split rule and seed ship with the package, so an agent that sees every case
id computes which of its inputs are the real test cases. So the *names* of the test inputs are shuffled: the agent
view shows the same set of test-input ids as an unshuffled one, but which case's data sits under which id is a
secret permutation (within ids of one shape, digits aside, so that e.g. a metastatic ROI keeps a metastatic name). A
prediction made under an id is graded against the answer of the case shown under it; ``selection_ids`` and
``test_ids`` are ids as the agent sees them. The test inputs are copied afresh in the order of their new names
(inode numbers, creation and directory order follow the names) and every file and folder of ``agent/public`` gets
one fixed modification time; the manifest, sample submission, description and split manifest are written from the
shuffled names. What is left is the data itself: a case whose content differs in kind (an official test set from
another source, an id the only one of its shape, an id written inside an image header) can still be recognised.

The agent view is prepared by the family's own ``prepare`` from ``raw/`` with the split (train minus the K groups,
test plus their cases) into a staging folder, then published under the shuffled names. The folder is built aside and
swapped in whole (like :func:`rexmle_tasks.pipeline.prepare_task`), and reused while the task's preparation (version,
split), ``k`` and the secret are unchanged. Each run holds its own folder (a copy of the public data): delete
``selection-*`` folders of finished runs to reclaim the space.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import hashlib
import hmac
import io
import json
import logging
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from rexmle_grade.errors import ConfigurationError, TaskDataMissingError, UserInputError
from rexmle_grade.grader import ANSWERS_CSV, TEST_MANIFEST, Grader, TestManifest
from rexmle_grade.schema import SUBMISSION_CSV
from rexmle_grade.settings import TaskDirs
from rexmle_grade.targets import GradingTarget
from rexmle_tasks.base import Task, reset_dir
from rexmle_tasks.check import INDEX_SUFFIXES, may_name_test_ids, token_pattern
from rexmle_tasks.grading import resolve_grading_target
from rexmle_tasks.pipeline import (
    DESCRIPTION,
    EXTRACTED_MARKER,
    PREPARED_MARKER,
    SAMPLE_SUBMISSION,
    SPLIT_MANIFEST,
    PreparedInfo,
    build_prepared,
    require_prepared,
    swap_in,
    task_dirs,
    write_split_manifests,
)
from rexmle_tasks.registry import get_task
from rexmle_tasks.splits import Split, make_split

log = logging.getLogger(__name__)

SELECTION_MARKER = "selection.json"
AGENT, SELECT, TEST = "agent", "select", "test"
SECRET_BYTES = 32
#: where the harness keeps a run's selection secret: in the run folder, which no sandbox mounts
SELECTION_SECRET_FILE = "selection-secret"
#: the modification time of every file and folder of an agent view (2000-01-01 UTC): no write order shows
FIXED_MTIME = 946_684_800


@dataclass(frozen=True)
class SelectionRecord:
    """``selection.json``: what a selection folder was built from (a mismatch means it is rebuilt)."""

    task_id: str
    task_version: str
    k: int
    split_digest: str  # the task's ordinary split
    selection_digest: str  # the agent view's split (train minus the K groups, test plus their cases)
    selection_ids: tuple[str, ...]  # as the agent sees them (shuffled names)
    test_ids: tuple[str, ...]
    created_at: str
    secret_digest: str  # sha256 of the secret the folder was built with
    cases: dict[str, str]  # shown name -> the case whose data it carries

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "selection_ids": list(self.selection_ids),
                "test_ids": list(self.test_ids)}

    @classmethod
    def read(cls, path: Path) -> SelectionRecord | None:
        """The record at ``path``; None when it is absent or unreadable (the folder is then simply rebuilt)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(**{**data, "selection_ids": tuple(data["selection_ids"]), "test_ids": tuple(data["test_ids"])})
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
            return None


@dataclass(frozen=True)
class SelectionSplit:
    """A task prepared with K selection cases held out of training (see module docstring).

    ``selection`` ranks against the task's human leaderboard like any target, but a rank computed on K *training*
    cases is only an internal score for choosing among candidates: never report it as the task's result. ``test``
    is the final grade: the real test cases' answers, under the names the agent saw their data by.
    """

    task_id: str
    k: int
    root: Path
    agent_public: Path
    selection: GradingTarget
    test: GradingTarget
    selection_ids: tuple[str, ...]  # the names the agent sees the selection cases' data under
    test_ids: tuple[str, ...]  # and the real test cases'
    cases: dict[str, str]  # shown name -> the case whose data it carries (never for the agent)

    def case_of(self, name: str) -> str:
        return self.cases[name]

    @property
    def agent_private(self) -> Path:
        """The answers of every input the agent predicts (for reference submissions; never for the agent)."""
        return self.root / AGENT / "private"


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def _keyed(secret: bytes, purpose: str, value: str) -> str:
    return hmac.new(secret, f"{purpose}\0{value}".encode(), hashlib.sha256).hexdigest()


def _secret_digest(secret: bytes) -> str:
    return hashlib.sha256(secret).hexdigest()


def selection_root(dirs: TaskDirs, k: int, secret: bytes) -> Path:
    return dirs.root / f"selection-{k}-{_keyed(secret, 'folder', '')[:16]}"


def selection_groups(groups: Iterable[str], *, secret: bytes, k: int) -> list[str]:
    """The ``k`` groups carved out of ``groups`` (sorted by their keyed hash under the secret and ``k``)."""
    return sorted(set(groups), key=lambda g: _keyed(secret, f"group:{k}", g))[:k]


def shuffled_names(case_ids: Iterable[str], secret: bytes) -> dict[str, str]:
    """{case: the name its data is shown under}: a secret permutation of ``case_ids`` within ids of one shape (the
    id with every run of digits read as one ``#``)."""
    shapes: dict[str, list[str]] = {}
    for case_id in sorted(set(case_ids)):
        shapes.setdefault(re.sub(r"[0-9]+", "#", case_id), []).append(case_id)
    names = {}
    for members in shapes.values():
        names.update(zip(members, sorted(members, key=lambda i: _keyed(secret, "name", i)), strict=True))
    return names


def prepare_selection(task_id: str, k: int, data_root: Path | None = None, *, secret: bytes | None = None,
                      force: bool = False) -> SelectionSplit:
    """Build (or reuse) the selection split of a prepared task with ``k`` held-out training groups, drawn with
    ``secret`` (the harness passes its run's; None: a fresh one, so every call gets another split).

    Raises UnknownNameError for an unknown task, TaskDataMissingError when the task is not prepared (or its
    preparation is stale or its ``raw/`` gone), UserInputError for a ``k`` that is not in ``1 .. groups - 1``, and
    ConfigurationError for a task whose answers cannot be restricted to a subset of cases.
    """
    task, dirs, info, ordinary = _requested(task_id, k, data_root)
    secret = new_secret() if secret is None else secret
    if len(secret) < 16:
        raise UserInputError(f"a selection secret of {len(secret)} byte(s) can be guessed",
                             hint=f"draw it with rexmle_tasks.selection.new_secret() ({SECRET_BYTES} bytes)")
    root = selection_root(dirs, k, secret)
    split, agent_split, selection_ids = _carve(task, dirs, info, k, secret)  # refuses before anything is written
    with _locked(root):
        record = SelectionRecord.read(root / SELECTION_MARKER)
        if (not force and record is not None and record.task_version == task.meta.version
                and record.split_digest == info.split_digest and record.k == k
                and record.secret_digest == _secret_digest(secret)):
            return _selection_split(task, ordinary, root, record)
        partial = reset_dir(root.with_name(root.name + ".partial"))
        try:
            record = _build_selection(task, dirs, info, k, split, agent_split, selection_ids, partial, secret)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        swap_in(partial, root)
    return _selection_split(task, ordinary, root, record)


def check_selection_request(task_id: str, k: int, data_root: Path | None = None) -> None:
    """What :func:`prepare_selection` would refuse, found without building anything (a run checks this when it is
    planned; the split itself is drawn when the run starts)."""
    task, dirs, info, _ = _requested(task_id, k, data_root)
    _carve(task, dirs, info, k, new_secret())
    _check_restrictable(task.grader, dirs.private)


def _requested(task_id: str, k: int, data_root: Path | None) -> tuple[Task, TaskDirs, PreparedInfo, GradingTarget]:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise UserInputError(f"the number of selection cases must be a whole number >= 1, not {k!r}",
                             hint="pass --selection-cases K with K >= 1, or leave the option out")
    task = get_task(task_id)
    dirs = task_dirs(task, data_root)
    info = require_prepared(task, dirs)
    ordinary = resolve_grading_target(task_id, data_root)  # also refuses a preparation of another task version
    return task, dirs, info, ordinary


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """A run and its resumed attempt (or a regrade) ask for the same split: one builds it, the other reuses it."""
    import fcntl

    root.parent.mkdir(parents=True, exist_ok=True)
    with root.with_name(root.name + ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _carve(task: Task, dirs: TaskDirs, info: PreparedInfo, k: int,
           secret: bytes) -> tuple[Split, Split, tuple[str, ...]]:
    """(the task's split, the agent view's split, the selection ids), after checking that raw/ still holds the
    data the task was prepared from."""
    if not (dirs.raw / EXTRACTED_MARKER).is_file():
        raise TaskDataMissingError(f"{dirs.raw} holds no extracted data of {task.id!r}",
                                   hint=f"run `rexmle prepare {task.id} --force{_synthetic_flag(info)}`")
    family = task.family()
    split = family.fixed_split(dirs.raw) or make_split(
        family.case_ids(dirs.raw), seed=task.meta.split.seed, test_fraction=task.meta.split.test_fraction,
        group_of=family.split_group)
    if split.digest != info.split_digest:
        raise TaskDataMissingError(
            f"the cases in {dirs.raw} split to {split.digest[:12]}, but {task.id!r} was prepared with split "
            f"{info.split_digest[:12]} (raw/ was replaced since)",
            hint=f"run `rexmle prepare {task.id} --force{_synthetic_flag(info)}`")
    groups = sorted({family.split_group(i) for i in split.train})
    if k > len(groups) - 1:
        raise UserInputError(
            f"{task.id!r} has {len(groups)} training group(s); {k} selection group(s) would leave "
            f"{len(groups) - k} for training",
            hint=f"choose --selection-cases between 1 and {len(groups) - 1}")
    chosen = set(selection_groups(groups, secret=secret, k=k))
    selection_ids = tuple(i for i in split.train if family.split_group(i) in chosen)
    agent_split = Split(train=tuple(i for i in split.train if family.split_group(i) not in chosen),
                        test=tuple(sorted((*split.test, *selection_ids))))
    return split, agent_split, selection_ids


def _build_selection(task: Task, dirs: TaskDirs, info: PreparedInfo, k: int, split: Split, agent_split: Split,
                     selection_ids: tuple[str, ...], out: Path, secret: bytes) -> SelectionRecord:
    agent_public, agent_private = out / AGENT / "public", out / AGENT / "private"
    staging_public, staging_private = out / "staging" / "public", out / "staging" / "private"
    for folder in (agent_public, agent_private, staging_public, staging_private):
        folder.mkdir(parents=True)
    log.info("preparing %s with %d selection case(s) held out of training", task.id, len(selection_ids))
    build_prepared(task, task.family(), agent_split, staging_public, staging_private, raw=dirs.raw)
    names = shuffled_names(agent_split.test, secret)
    publish_shuffled(task, agent_split, names, staging_public, staging_private, agent_public, agent_private)
    shutil.rmtree(out / "staging")
    agent_info = dataclasses.replace(info, n_train=len(agent_split.train), n_test=len(agent_split.test),
                                     split_digest=agent_split.digest, prepared_at=_now())
    (out / AGENT / PREPARED_MARKER).write_text(json.dumps(agent_info.to_json(), indent=1) + "\n")
    grader = task.grader
    shown_selection = tuple(sorted(names[i] for i in selection_ids))
    shown_test = tuple(sorted(names[i] for i in split.test))
    for view, ids in ((SELECT, shown_selection), (TEST, shown_test)):
        restrict_view(grader, agent_public, agent_private, ids, out / view / "public", out / view / "private")
    record = SelectionRecord(task_id=task.id, task_version=task.meta.version, k=k, split_digest=info.split_digest,
                             selection_digest=agent_split.digest, selection_ids=shown_selection, test_ids=shown_test,
                             created_at=_now(), secret_digest=_secret_digest(secret),
                             cases={shown: case for case, shown in sorted(names.items(), key=lambda kv: kv[1])})
    (out / SELECTION_MARKER).write_text(json.dumps(record.to_json(), indent=1) + "\n")
    return record


def _selection_split(task: Task, ordinary: GradingTarget, root: Path, record: SelectionRecord) -> SelectionSplit:
    def view(name: str) -> GradingTarget:
        return dataclasses.replace(ordinary, public_dir=root / name / "public", private_dir=root / name / "private")

    return SelectionSplit(task_id=task.id, k=record.k, root=root, agent_public=root / AGENT / "public",
                          selection=view(SELECT), test=view(TEST), selection_ids=record.selection_ids,
                          test_ids=record.test_ids, cases=dict(record.cases))


# ---- the agent view under shuffled names ---------------------------------------------------------------------
def publish_shuffled(task: Task, split: Split, names: dict[str, str], staging_public: Path, staging_private: Path,
                     public: Path, private: Path) -> None:
    """Publish a prepared ``staging_public``/``staging_private`` (test inputs ``split.test``) into the empty
    ``public``/``private`` with each test case's data under ``names[case]`` (see module docstring)."""
    pattern = token_pattern(names)
    framework = {TEST_MANIFEST, SPLIT_MANIFEST, DESCRIPTION}

    def shown(rel: str) -> str:
        if pattern is None or not may_name_test_ids(rel):
            return rel
        return "/".join(pattern.sub(lambda hit: names[hit.group(0)], part) for part in rel.split("/"))

    placed: dict[str, Path] = {}
    for path in sorted(staging_public.rglob("*")):
        rel = path.relative_to(staging_public).as_posix()
        if path.is_dir() or rel in framework or PurePosixPath(rel).parts[0] == SAMPLE_SUBMISSION:
            continue
        new = shown(rel)
        if new in placed:
            raise ConfigurationError(f"public/{rel} and public/{placed[new].relative_to(staging_public)} would both "
                                     f"be shown as {new}", hint="this task does not support --selection-cases yet")
        placed[new] = path
    for new, path in sorted(placed.items()):  # fresh files, made in the order of their new names
        target = public / new
        target.parent.mkdir(parents=True, exist_ok=True)
        if new == path.relative_to(staging_public).as_posix() and not may_name_test_ids(new):
            path.rename(target)  # a training file: nothing about the test inputs in where or when it was made
        elif path.suffix.lower() in INDEX_SUFFIXES:
            target.write_text(_renamed_text(path, pattern, names), encoding="utf-8")
        else:
            shutil.copyfile(path, target)
    manifest = TestManifest.read(staging_public)
    shuffled = TestManifest(ids=tuple(sorted(names[i] for i in manifest.ids)),
                            geometry={names[i]: g for i, g in manifest.geometry.items()})
    shuffled.write(public)
    task.grader.write_sample_submission(public, public / SAMPLE_SUBMISSION)
    from rexmle_tasks.description import render_description

    (public / DESCRIPTION).write_text(render_description(task, shuffled, n_train=len(split.train)))
    _shuffled_answers(task.grader, staging_private, private, names)
    write_split_manifests(task, split, public, private)
    for folder, dirnames, filenames in os.walk(public, topdown=False):
        for name in (*filenames, *dirnames, ""):
            os.utime(os.path.join(folder, name) if name else folder, (FIXED_MTIME, FIXED_MTIME))


def _renamed_text(path: Path, pattern: re.Pattern[str] | None, names: dict[str, str]) -> str:
    """A test input's index file with the names shown; one listing several test cases is refused, as its order
    would give the shuffle away."""
    text = path.read_text(encoding="utf-8")
    if pattern is None:
        return text
    mentioned = {hit.group(0) for hit in pattern.finditer(text)}
    if len(mentioned) > 1:
        raise ConfigurationError(f"{path.name} lists {len(mentioned)} test cases; its order would tell which case "
                                 "is shown under which name", hint="this task does not support --selection-cases yet")
    return pattern.sub(lambda hit: names[hit.group(0)], text)


def _shuffled_answers(grader: Grader, staging: Path, private: Path, names: dict[str, str]) -> None:
    """The staging answers under the shown names (the label files keep theirs: the agent never sees them)."""
    for path in sorted(staging.rglob("*")):
        if path.is_file() and path.relative_to(staging).as_posix() not in (ANSWERS_CSV, SPLIT_MANIFEST):
            target = private / path.relative_to(staging)
            target.parent.mkdir(parents=True, exist_ok=True)
            path.rename(target)
    with (staging / ANSWERS_CSV).open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header, rows = list(reader.fieldnames or ()), list(reader)
    id_column = grader.schema.id_column
    for row in rows:
        row[id_column] = names[row[id_column]]
    with (private / ANSWERS_CSV).open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: r[id_column]))


def _check_restrictable(grader: Grader, private: Path) -> None:
    with (private / ANSWERS_CSV).open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    for column in grader.answer_columns:
        files = [r.get(column) or "" for r in rows]
        files = [f for f in files if f and (private / f).is_file()]
        if len(files) != len(set(files)):
            raise ConfigurationError(
                f"{grader.grader_id!r} keeps the answers of several cases in one file ({column}), so its answers "
                "cannot be restricted to a subset of cases", hint="this task does not support --selection-cases yet")


# ---- restricted views ---------------------------------------------------------------------------------------------
def restrict_view(grader: Grader, public: Path, private: Path, case_ids: Iterable[str], out_public: Path,
                  out_private: Path) -> None:
    """A grading view of ``public``/``private`` on ``case_ids`` only: a test manifest and sample submission listing
    just those cases, and answers with just their rows (their label files hard-linked, or copied across devices)."""
    wanted = set(case_ids)
    manifest = TestManifest.read(public)
    missing = sorted(wanted - set(manifest.ids))
    if missing:
        raise ConfigurationError(f"case(s) {missing[:5]} are not test inputs of {public}",
                                 hint="a view can only restrict the test inputs of the folder it is made from")
    out_public.mkdir(parents=True)
    out_private.mkdir(parents=True)
    TestManifest(ids=tuple(i for i in manifest.ids if i in wanted),
                 geometry={i: g for i, g in manifest.geometry.items() if i in wanted}).write(out_public)
    restrict_submission(public / SAMPLE_SUBMISSION, wanted, out_public / SAMPLE_SUBMISSION,
                        id_column=grader.schema.id_column)
    _restrict_answers(grader, private, wanted, out_private)


def _restrict_answers(grader: Grader, private: Path, wanted: set[str], out_private: Path) -> None:
    with (private / ANSWERS_CSV).open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
        header = list(rows[0]) if rows else []
    id_column = grader.schema.id_column
    kept = [r for r in rows if r[id_column] in wanted]
    files_of = {c: {r[c] for r in kept} for c in grader.answer_columns}
    for column, kept_values in files_of.items():
        shared = sorted(v for v in kept_values & {r[column] for r in rows if r[id_column] not in wanted}
                        if (private / v).is_file())
        if shared:
            # one answer file for many cases (DENTEX's COCO file) holds the other cases too; restricting it means
            # rewriting its content, which only the grader's format knows
            raise ConfigurationError(
                f"{grader.grader_id!r} keeps the answers of several cases in one file ({column}: {shared[0]}), so "
                "its answers cannot be restricted to a subset of cases",
                hint="this task does not support --selection-cases yet")
        for value in sorted(kept_values):
            source = private / value
            if value and source.is_file():
                _link_or_copy(source, out_private / value)
    with (out_private / ANSWERS_CSV).open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        writer.writerows(kept)


def restrict_submission(submission_dir: Path, case_ids: Iterable[str], dest: Path, *,
                        id_column: str | None = None) -> Path:
    """A copy of a submission in ``dest`` with only the rows of ``case_ids`` and the files those rows name.

    This is how a submission covering several views is graded on one of them with the ordinary
    ``evaluate_submission``. Nothing is repaired, so an invalid submission stays invalid: a missing folder or
    ``submission.csv`` stays missing, an unreadable ``submission.csv`` is copied unchanged, rows of the wrong length
    are kept, missing rows stay missing, and a file that a row names but that does not lie inside the submission
    folder (absolute, ``..``, a link leading out, absent) is not copied. ``id_column``: the grader's id column
    (default: the first column of the header, where every grader's schema puts it). ``dest`` must not exist or
    be empty. Returns ``dest``.
    """
    submission_dir, dest = Path(submission_dir), Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UserInputError(f"{dest} already exists and is not an empty folder",
                             hint="give a new folder for the restricted submission")
    if not submission_dir.is_dir():
        return dest  # nothing to copy: the restricted submission is missing as the original was
    dest.mkdir(parents=True, exist_ok=True)
    source = submission_dir / SUBMISSION_CSV
    if not source.is_file() or source.is_symlink():
        return dest
    wanted = set(case_ids)
    data = source.read_bytes()
    try:
        table = list(csv.reader(io.StringIO(data.decode("utf-8-sig"))))
    except (UnicodeDecodeError, csv.Error):
        (dest / SUBMISSION_CSV).write_bytes(data)
        return dest
    table = [row for row in table if any(cell.strip() for cell in row)]
    if not table:
        (dest / SUBMISSION_CSV).write_bytes(data)
        return dest
    header = [h.strip() for h in table[0]]
    column = header.index(id_column) if id_column in header else 0 if id_column is None else None
    kept = [row for row in table[1:]
            if len(row) != len(header) or (column is not None and row[column].strip() in wanted)]
    root = submission_dir.resolve()
    for row in kept:
        for cell in row:
            _copy_named_file(root, cell.strip(), dest)
    with (dest / SUBMISSION_CSV).open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([table[0], *kept])
    return dest


def _copy_named_file(root: Path, relative: str, dest: Path) -> None:
    """Copy ``root/relative`` to ``dest/relative`` when it is a file inside ``root`` (links followed)."""
    posix = PurePosixPath(relative.replace("\\", "/"))
    if not relative or "\x00" in relative or posix.is_absolute() or ".." in posix.parts or posix == PurePosixPath():
        return
    try:
        resolved = root.joinpath(*posix.parts).resolve(strict=True)
    except (OSError, RuntimeError):
        return
    target = dest.joinpath(*posix.parts)
    if resolved.is_file() and resolved.is_relative_to(root) and not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(resolved, target)


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another file system, or one without hard links
        shutil.copyfile(source, target)


# ---- checks -------------------------------------------------------------------------------------------------------
def check_selection(selection: SelectionSplit) -> list[str]:
    """Every leak found in the agent view: the task's leak checks (:func:`rexmle_tasks.check.check_task`) on it,
    plus: no selection id listed as a training id, every selection case among the test inputs, no record of the
    selection split inside ``agent/public``."""
    from rexmle_tasks.check import check_task

    task = get_task(selection.task_id)
    raw = task_dirs(task, selection.root.parent.parent).raw
    problems = check_task(task, TaskDirs(root=selection.root / AGENT, raw=raw, public=selection.agent_public,
                                         private=selection.agent_private), regenerate=False)
    split_doc = json.loads((selection.agent_public / "split_manifest.json").read_text())
    as_train = sorted(set(selection.selection_ids) & set(split_doc.get("train_ids", ())))
    if as_train:
        problems.append(f"selection case(s) {as_train[:5]} are listed as training cases in agent/public")
    absent = sorted(set(selection.selection_ids) - set(TestManifest.read(selection.agent_public).ids))
    if absent:
        problems.append(f"selection case(s) {absent[:5]} are not among agent/public's test inputs")
    for path in sorted(selection.agent_public.rglob(SELECTION_MARKER)):  # check_task covers the task's own files
        problems.append(f"agent/public/{path.relative_to(selection.agent_public).as_posix()} is a grading file")
    return problems


def _synthetic_flag(info: PreparedInfo) -> str:
    return " --synthetic" if info.synthetic else ""


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
