"""Cross-grader security and robustness of submission handling, for every registered task.

Each task is prepared once per run from its synthetic mirror (shared by the xdist workers through a file lock, each
worker grading its own copy of public/ and private/); every test copies the task's gold submission, applies ONE
corruption and then requires that

* ``validate_submission`` and ``grade_submission`` return instead of raising;
* the outcome is ``invalid_submission`` (never ``grader_error``, never ``valid``) with a problem naming the
  offending column and case (or the CSV line / header for table-level damage);
* no file under the run's temporary root outside the submission, the task's ``public/`` and (grading only)
  ``private/`` folders is opened: Python-level opens are recorded by an audit hook, opens by C libraries
  (SimpleITK, libtiff...) in the folders a submission must never reach are seen through Linux inotify;
* decompression bombs and memory amplifiers are refused without allocating gigabytes: they run in a child process
  whose address space is capped with ``RLIMIT_AS``.

Harmless CSV reformatting (BOM, CRLF, quoting, blank trailing lines, permuted columns, padded cells) must keep the
gold submission valid with unchanged metrics.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import functools
import gzip
import io
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rexmle_grade.grader import Grader, TestManifest, read_answers
from rexmle_grade.grading import GradeResult, grade_submission
from rexmle_grade.io import MAX_CSV_BYTES, MAX_FILE_BYTES, MAX_JSON_BYTES, Geometry, write_volume
from rexmle_grade.schema import SUBMISSION_CSV, FileColumn, FileKind, ValueColumn
from rexmle_grade.validation import ValidationReport, validate_submission

CASES = 8  # synthetic labelled cases per task: gives two test cases everywhere
SEED = 0
CHILD_MEMORY_HEADROOM = 1024 * 1024 * 1024  # address space a bomb check may add on top of the imports
BOMB_BYTES = 2 * 1024**3  # what a compressed bomb inflates to


# ---- who opens what -------------------------------------------------------------------------------------------
_AUDITED_EVENTS = frozenset({"open", "os.listdir", "os.scandir"})
_recorded: list[str] | None = None  # a list while a grading call is being watched


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _recorded is not None and event in _AUDITED_EVENTS and args:
        target = args[0]
        if isinstance(target, str | bytes | os.PathLike):
            _recorded.append(os.fsdecode(target))


sys.addaudithook(_audit)  # once per process: audit hooks cannot be removed


@contextlib.contextmanager
def recording_opens() -> Iterator[list[str]]:
    global _recorded
    opened: list[str] = []
    _recorded = opened
    try:
        yield opened
    finally:
        _recorded = None


IN_OPEN = 0x20
_INOTIFY_EVENT = struct.Struct("iIII")


class OpenWatch:
    """Files opened inside some folders (by C libraries too), via Linux inotify; a no-op where inotify is missing.

    Python's audit hook misses opens made by C++ readers such as SimpleITK's; inotify sees them, but from every
    process: each xdist worker therefore watches folders only it uses."""

    def __init__(self, folders: list[Path]) -> None:
        self.fd = -1
        self.watches: dict[int, str] = {}
        libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
        if libc is None or not hasattr(libc, "inotify_init1"):
            return
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        for folder in folders:
            for current, _, _ in os.walk(folder):
                wd = libc.inotify_add_watch(self.fd, os.fsencode(current), IN_OPEN)
                if wd >= 0:
                    self.watches[wd] = current
        self.opened()  # forget the walk's own directory opens

    def opened(self) -> list[str]:
        if self.fd < 0:
            return []
        found = []
        while True:
            try:
                buffer = os.read(self.fd, 65536)
            except BlockingIOError:
                return found
            offset = 0
            while offset < len(buffer):
                wd, _, _, length = _INOTIFY_EVENT.unpack_from(buffer, offset)
                name = buffer[offset + _INOTIFY_EVENT.size: offset + _INOTIFY_EVENT.size + length].rstrip(b"\0")
                found.append(os.path.join(self.watches.get(wd, "?"), os.fsdecode(name)))
                offset += _INOTIFY_EVENT.size + length

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


def _inside(path: str, folder: Path) -> bool:
    return Path(path).is_relative_to(folder)


def forbidden_opens(opened: list[str], *, root: Path, allowed: list[Path], submission: Path) -> list[str]:
    """Opened paths under ``root`` outside the ``allowed`` folders, and submission paths leading out of it."""
    bad = []
    for raw in opened:
        absolute, real = os.path.abspath(raw), os.path.realpath(raw)
        for path in {absolute, real}:
            if _inside(path, root) and not any(_inside(path, folder) for folder in allowed):
                bad.append(f"{raw} -> {real}")
        if _inside(absolute, submission) and not _inside(real, submission):
            bad.append(f"{raw} leads out of the submission to {real}")
    return bad


# ---- prepared tasks -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prepared:
    """A task prepared from its synthetic mirror, with this worker's own copy of its public and private folders."""

    task_id: str
    grader: Grader
    root: Path  # every file this test run writes lies under it
    public: Path
    private: Path
    gold: Path  # pristine gold submission, copied before any change
    gold_result: GradeResult
    manifest: TestManifest


def _task_registry() -> dict[str, Any]:
    try:
        from rexmle_tasks.registry import all_tasks
    except ImportError:  # the tasks package is optional for rexmle-grade alone
        return {}
    return all_tasks()


def _not_landed(task: Any) -> str | None:
    """Why a task cannot be tested yet (its grader or family is missing), or None."""
    from rexmle_grade.errors import UnknownNameError
    from rexmle_tasks.base import family_class

    try:
        _ = task.grader
    except UnknownNameError:
        return f"grader {task.meta.grader!r} of {task.id!r} has not landed"
    try:
        family_class(task.meta.family)
    except KeyError:
        return f"task family {task.meta.family!r} of {task.id!r} has not landed"
    return None


def _run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder of this pytest run, shared by its xdist workers."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base).resolve()


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    import fcntl

    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare(task_id: str, tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    from rexmle_grade.settings import TaskDirs
    from rexmle_tasks.pipeline import prepare_task

    task = _task_registry()[task_id]
    root = _run_root(tmp_path_factory)
    data = root / "security-tasks"
    data.mkdir(exist_ok=True)
    # tasks of one raw group share raw/: one preparation at a time per group, across workers
    with _exclusive(data / f"{task.meta.raw_group or task_id}.lock"):
        dirs = TaskDirs.for_task(task_id, raw_group=task.meta.raw_group, root=data)
        prepare_task(task, dirs, synthetic=True, cases=CASES, seed=SEED)
        gold = data / f"{task_id}-gold"
        if not (gold / SUBMISSION_CSV).is_file():
            partial = data / f"{task_id}-gold.partial"
            shutil.rmtree(partial, ignore_errors=True)
            task.grader.write_gold_submission(dirs.private, dirs.public, partial)
            partial.rename(gold)
    # inotify reports the opens of every process: each worker grades its own copy, so that the watches of one
    # worker never see the other grading
    own = tmp_path_factory.mktemp(task_id)
    public, private = own / "public", own / "private"
    shutil.copytree(dirs.public, public)
    shutil.copytree(dirs.private, private)
    grader = task.grader
    result = grade_submission(grader, gold, public, private)
    assert result.status == "valid", f"the gold submission of {task_id} does not grade: {result}"
    return Prepared(task_id=task_id, grader=grader, root=root, public=public.resolve(), private=private.resolve(),
                    gold=gold, gold_result=result, manifest=TestManifest.read(public))


_PREPARED: dict[str, Prepared] = {}


def prepared_once(task_id: str, tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    # kept for the whole process: pytest's ordering interleaves the tasks of the differently parametrised tests
    if task_id not in _PREPARED:
        _PREPARED[task_id] = prepare(task_id, tmp_path_factory)
    return _PREPARED[task_id]


@pytest.fixture
def prepared(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    return prepared_once(request.param, tmp_path_factory)


@pytest.fixture
def bomb_task(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    return prepared_once(request.param, tmp_path_factory)


# ---- running a submission under watch -------------------------------------------------------------------------
@dataclass
class Outcome:
    report: ValidationReport
    result: GradeResult
    forbidden: list[str] = field(default_factory=list)

    def explain(self) -> str:
        return (f"validation ok={self.report.ok} problems={self.report.problems}\n"
                f"grading status={self.result.status} problems={self.result.problems}\nerror={self.result.error}")


def _watched(label: str, call: Callable[[], Any], *, p: Prepared, submission: Path, allowed: list[Path],
             untouchable: list[Path]) -> tuple[Any, list[str]]:
    """``call()`` and what it opened that it should not have: anything under the run's root outside ``allowed``
    (audit hook), anything at all in the ``untouchable`` folders (inotify, C libraries included)."""
    watch = OpenWatch(untouchable)
    try:
        with recording_opens() as opened:
            try:
                value = call()
            except Exception as exc:  # the property under test: neither call may raise
                pytest.fail(f"{label} raised {type(exc).__name__}: {exc}")
        bad = [f"{label} opened {x}" for x in forbidden_opens(opened, root=p.root, allowed=allowed,
                                                               submission=submission)]
        return value, bad + [f"{label} opened (C level) {x}" for x in watch.opened()]
    finally:
        watch.close()


def run_watched(p: Prepared, submission: Path, *, decoys: list[Path]) -> Outcome:
    """Validate, then grade; ``decoys`` are folders nothing may open, and validation may not open private/."""
    submission = submission.resolve()
    report, forbidden = _watched("validation", lambda: validate_submission(p.grader, submission, p.public), p=p,
                                 submission=submission, allowed=[submission, p.public],
                                 untouchable=[*decoys, p.private])
    result, more = _watched("grading", lambda: grade_submission(p.grader, submission, p.public, p.private), p=p,
                            submission=submission, allowed=[submission, p.public, p.private], untouchable=decoys)
    return Outcome(report, result, forbidden + more)


def assert_rejected(outcome: Outcome, needles: tuple[str, ...]) -> None:
    assert not outcome.forbidden, "files outside the allowed folders were opened:\n" + "\n".join(outcome.forbidden)
    assert outcome.result.status != "grader_error", outcome.explain()
    assert not outcome.report.ok and outcome.result.status == "invalid_submission", outcome.explain()
    for problems in (outcome.report.problems, outcome.result.problems):
        assert len(problems) <= 41 and all(len(p) < 2000 for p in problems), outcome.explain()
        assert any(all(n in p for n in needles) for p in problems), f"no problem names {needles}:\n{outcome.explain()}"


# ---- the submission under change ------------------------------------------------------------------------------
@dataclass
class Case:
    """A fresh copy of the gold submission and the cell a corruption targets."""

    p: Prepared
    submission: Path
    outside: Path  # a folder beside the submission that nothing may read
    column: FileColumn | ValueColumn | None
    header: list[str]
    rows: list[dict[str, str]]
    case_id: str

    @classmethod
    def create(cls, p: Prepared, tmp: Path, column: FileColumn | ValueColumn | None) -> Case:
        submission = tmp / "submission"
        shutil.copytree(p.gold, submission)
        outside = tmp / "outside"
        outside.mkdir()
        with (submission / SUBMISSION_CSV).open(newline="") as fh:
            reader = csv.DictReader(fh)
            header, rows = list(reader.fieldnames or []), list(reader)
        return cls(p, submission, outside, column, header, rows, p.manifest.ids[0])

    # table
    @property
    def id_column(self) -> str:
        return self.p.grader.schema.id_column

    def row(self, case_id: str | None = None) -> dict[str, str]:
        wanted = case_id or self.case_id
        return next(r for r in self.rows if r[self.id_column] == wanted)

    def set_cell(self, value: str, case_id: str | None = None) -> None:
        assert self.column is not None
        self.row(case_id)[self.column.name] = value
        self.write_csv()

    def csv_text(self, *, header: list[str] | None = None, rows: list[list[str]] | None = None,
                 quoting: int = csv.QUOTE_MINIMAL, line_end: str = "\n") -> str:
        header = header or self.header
        rows = rows if rows is not None else [[r[h] for h in header] for r in self.rows]
        buffer = io.StringIO()
        writer = csv.writer(buffer, quoting=quoting, lineterminator=line_end)
        writer.writerow(header)
        writer.writerows(rows)
        return buffer.getvalue()

    def write_csv(self, text: str | None = None) -> None:
        path = self.submission / SUBMISSION_CSV
        path.unlink()
        path.write_bytes((text if text is not None else self.csv_text()).encode("utf-8"))

    # the targeted prediction file
    @property
    def file_column(self) -> FileColumn:
        assert isinstance(self.column, FileColumn)
        return self.column

    def gold_file(self, case_id: str | None = None) -> Path:
        return self.submission / self.row(case_id)[self.file_column.name]

    def suffix(self) -> str:
        return self.file_column.suffixes[0]

    def new_file(self, suffix: str | None = None, name: str = "replacement") -> tuple[Path, str]:
        """A path in the gold file's folder whose name does not carry the case id, and its CSV text."""
        relative = Path(self.row()[self.file_column.name]).parent / f"{name}{suffix or self.suffix()}"
        return self.submission / relative, relative.as_posix()

    def replace(self, content: bytes, suffix: str | None = None) -> Path:
        path, relative = self.new_file(suffix)
        path.write_bytes(content)
        self.set_cell(relative)
        return path

    def private_file(self) -> Path | None:
        """A private answer file of the targeted case (a label map or answer document), if the task has one."""
        answers = read_answers(self.p.private, self.p.grader).get(self.case_id, {})
        for column in self.p.grader.answer_columns:
            candidate = self.p.private / answers.get(column, "")
            if answers.get(column) and candidate.is_file():
                return candidate
        return None

    @property
    def geometry(self) -> Geometry:
        geometry = self.p.manifest.geometry.get(self.case_id)
        assert geometry is not None, f"{self.p.task_id}: the manifest has no geometry for {self.case_id}"
        return geometry

    def needles(self) -> tuple[str, ...]:
        assert self.column is not None
        return (self.column.name, self.case_id)


class NotApplicable(Exception):
    """The corruption cannot be built for this task's data (e.g. its gold documents hold no numbers)."""


# changes the copy; returns the texts one problem must all contain, or None where the file may also be accepted
# (bombs whose decoded image is still valid: only bounded memory and a clean outcome are required)
Build = Callable[[Case], tuple[str, ...] | None]


@dataclass(frozen=True)
class Corruption:
    name: str
    build: Build
    applies: Callable[[FileColumn | ValueColumn | None], bool]
    bomb: bool = False  # checked in a memory-capped child process only
    slow: bool = False  # bombs that take seconds (tens of megabytes to parse): opt in with -m slow


CORRUPTIONS: list[Corruption] = []


def corruption(applies: Callable[[Any], bool], *, bomb: bool = False, slow: bool = False) -> Callable[[Build], Build]:
    def register(build: Build) -> Build:
        CORRUPTIONS.append(Corruption(build.__name__, build, applies, bomb, slow))
        return build

    return register


def table(column: Any) -> bool:
    return column is None


def any_file(column: Any) -> bool:
    return isinstance(column, FileColumn)


def volume(column: Any) -> bool:
    return isinstance(column, FileColumn) and column.kind is FileKind.LABEL_VOLUME


def image_2d(column: Any) -> bool:
    return isinstance(column, FileColumn) and column.kind.is_image and column.kind is not FileKind.LABEL_VOLUME


def json_file(column: Any) -> bool:
    return isinstance(column, FileColumn) and column.kind is FileKind.JSON


def accepts(*suffixes: str) -> Callable[[Any], bool]:
    return lambda column: isinstance(column, FileColumn) and any(s in column.suffixes for s in suffixes)


def with_suffix(kind_test: Callable[[Any], bool], *suffixes: str) -> Callable[[Any], bool]:
    return lambda column: kind_test(column) and accepts(*suffixes)(column)


def float_values(column: Any) -> bool:
    return isinstance(column, ValueColumn) and column.choices is None and column.dtype is float


def choice_values(column: Any) -> bool:
    return isinstance(column, ValueColumn) and column.choices is not None


# ---- 1. path escapes ------------------------------------------------------------------------------------------
@corruption(any_file)
def dotdot_path(c: Case) -> tuple[str, ...]:
    shutil.copy(c.gold_file(), c.outside / f"copy{c.suffix()}")
    c.set_cell(f"../outside/copy{c.suffix()}")
    return c.needles()


@corruption(any_file)
def dotdot_inside_path(c: Case) -> tuple[str, ...]:
    shutil.copy(c.gold_file(), c.outside / f"copy{c.suffix()}")
    c.set_cell(f"{Path(c.row()[c.file_column.name]).parent.as_posix()}/../../outside/copy{c.suffix()}")
    return c.needles()


@corruption(any_file)
def backslash_dotdot_path(c: Case) -> tuple[str, ...]:
    shutil.copy(c.gold_file(), c.outside / f"copy{c.suffix()}")
    c.set_cell(f"..\\outside\\copy{c.suffix()}")
    return c.needles()


@corruption(any_file)
def absolute_path_to_private_label(c: Case) -> tuple[str, ...]:
    target = c.private_file()
    if target is None:
        raise NotApplicable("no private answer file")
    c.set_cell(str(target))
    return c.needles()


@corruption(any_file)
def absolute_path_outside(c: Case) -> tuple[str, ...]:
    copy = c.outside / f"copy{c.suffix()}"
    shutil.copy(c.gold_file(), copy)
    c.set_cell(str(copy))
    return c.needles()


@corruption(any_file)
def symlink_to_private_label(c: Case) -> tuple[str, ...]:
    target = c.private_file()
    if target is None:
        raise NotApplicable("no private answer file")
    path, relative = c.new_file()
    path.symlink_to(target)
    c.set_cell(relative)
    return c.needles()


@corruption(any_file)
def symlink_to_outside_file(c: Case) -> tuple[str, ...]:
    copy = c.outside / f"copy{c.suffix()}"
    shutil.copy(c.gold_file(), copy)
    path, relative = c.new_file()
    path.symlink_to(copy)
    c.set_cell(relative)
    return c.needles()


@corruption(any_file)
def symlinked_folder_outside(c: Case) -> tuple[str, ...]:
    folder = c.gold_file().parent
    if folder == c.submission:
        raise NotApplicable("the gold files lie at the top of the submission")
    moved = c.outside / "moved"
    shutil.move(folder, moved)
    folder.symlink_to(moved, target_is_directory=True)
    return c.needles()


@corruption(any_file)
def symlink_to_dev_zero(c: Case) -> tuple[str, ...]:
    path, relative = c.new_file()
    path.symlink_to("/dev/zero")
    c.set_cell(relative)
    return c.needles()


@corruption(any_file)
def symlink_loop(c: Case) -> tuple[str, ...]:
    path, relative = c.new_file()
    other = path.with_name("other" + c.suffix())
    path.symlink_to(other.name)
    other.symlink_to(path.name)
    c.set_cell(relative)
    return c.needles()


@corruption(any_file)
def fifo_instead_of_file(c: Case) -> tuple[str, ...]:
    path, relative = c.new_file()
    os.mkfifo(path)  # opening it for reading would block forever
    c.set_cell(relative)
    return c.needles()


@corruption(any_file)
def windows_drive_path(c: Case) -> tuple[str, ...]:
    c.set_cell("C:\\" + c.row()[c.file_column.name].replace("/", "\\"))
    return c.needles()


@corruption(any_file)
def drive_relative_path(c: Case) -> tuple[str, ...]:
    c.set_cell("C:" + c.row()[c.file_column.name])
    return c.needles()


@corruption(any_file)
def nul_byte_in_path(c: Case) -> tuple[str, ...]:
    c.set_cell(c.row()[c.file_column.name] + "\x00.png")
    return (*c.needles(), "NUL")


@corruption(any_file)
def folder_instead_of_file(c: Case) -> tuple[str, ...]:
    c.gold_file().parent.joinpath("folder" + c.suffix()).mkdir()
    c.set_cell(Path(c.row()[c.file_column.name]).parent.joinpath("folder" + c.suffix()).as_posix())
    return c.needles()


@corruption(any_file)
def missing_file(c: Case) -> tuple[str, ...]:
    c.gold_file().unlink()
    return c.needles()


@corruption(any_file)
def empty_path(c: Case) -> tuple[str, ...]:
    c.set_cell("")
    return c.needles()


@corruption(any_file)
def wrong_suffix(c: Case) -> tuple[str, ...]:
    path, relative = c.new_file(".txt")
    shutil.copy(c.gold_file(), path)
    c.set_cell(relative)
    return c.needles()


@corruption(any_file)
def one_file_for_two_cases(c: Case) -> tuple[str, ...]:
    if len(c.p.manifest.ids) < 2:
        raise NotApplicable("a single test case")
    second = c.p.manifest.ids[1]
    c.set_cell(c.row()[c.file_column.name], case_id=second)
    return (c.file_column.name, second)


# ---- 2. malformed files of every kind -------------------------------------------------------------------------
@corruption(any_file)
def zero_byte_file(c: Case) -> tuple[str, ...]:
    c.replace(b"")
    return c.needles()


@corruption(any_file)
def random_bytes(c: Case) -> tuple[str, ...]:
    c.replace(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    return c.needles()


@corruption(any_file)
def truncated_file(c: Case) -> tuple[str, ...]:
    data = c.gold_file().read_bytes()
    if json_file(c.column):
        text = data.decode()
        if len(text.strip()) <= 2:
            raise NotApplicable("the gold document is too short to cut")
        c.replace(text[: len(text) // 2].encode())
    else:
        c.replace(data[: max(len(data) // 2, 1)])
    return c.needles()


@corruption(any_file)
def oversized_sparse_file(c: Case) -> tuple[str, ...]:
    """A file just above the size limit (sparse: no disk used) must be refused from its size alone."""
    limit = MAX_JSON_BYTES if json_file(c.column) else MAX_FILE_BYTES
    path, relative = c.new_file()
    with path.open("wb") as fh:
        fh.write(b"[" if json_file(c.column) else c.gold_file().read_bytes()[:1024])
        fh.truncate(limit + 1)
    c.set_cell(relative)
    return c.needles()


def _gold_volume(c: Case) -> tuple[np.ndarray, Geometry]:
    import SimpleITK as sitk

    image = sitk.ReadImage(str(c.gold_file()))
    return sitk.GetArrayFromImage(image), c.geometry


def _write_volume_file(c: Case, array: np.ndarray, geometry: Geometry, suffix: str | None = None) -> None:
    path, relative = c.new_file(suffix)
    write_volume(path, array, geometry)
    c.set_cell(relative)


@corruption(volume)
def two_d_instead_of_3d(c: Case) -> tuple[str, ...]:
    array, geometry = _gold_volume(c)
    _write_volume_file(c, array[0], Geometry(size=geometry.size[:2], spacing=geometry.spacing[:2],
                                             origin=geometry.origin[:2], direction=(1.0, 0.0, 0.0, 1.0)))
    return c.needles()


@corruption(volume)
def vector_voxels(c: Case) -> tuple[str, ...]:
    import SimpleITK as sitk

    array, geometry = _gold_volume(c)
    image = sitk.GetImageFromArray(np.stack([array] * 3, axis=-1), isVector=True)
    image.SetSpacing(geometry.spacing)
    image.SetOrigin(geometry.origin)
    image.SetDirection(geometry.direction)
    path, relative = c.new_file()
    sitk.WriteImage(image, str(path), useCompression=True)
    c.set_cell(relative)
    return c.needles()


@corruption(volume)
def float_voxels(c: Case) -> tuple[str, ...]:
    array, geometry = _gold_volume(c)
    _write_volume_file(c, array.astype(np.float32), geometry)
    return c.needles()


@corruption(volume)
def nan_and_inf_voxels(c: Case) -> tuple[str, ...]:
    array, geometry = _gold_volume(c)
    bad = array.astype(np.float32)
    bad.flat[0], bad.flat[1] = np.nan, np.inf
    _write_volume_file(c, bad, geometry)
    return c.needles()


@corruption(volume)
def negative_label_volume(c: Case) -> tuple[str, ...]:
    array, geometry = _gold_volume(c)
    bad = array.astype(np.int16)
    bad.flat[0] = -1
    _write_volume_file(c, bad, geometry)
    return c.needles()


def _out_of_set_value(c: Case) -> int:
    labels = c.file_column.labels
    assert labels is not None
    return next(v for v in range(1, 256) if v not in labels)


@corruption(volume)
def out_of_set_label_volume(c: Case) -> tuple[str, ...]:
    array, geometry = _gold_volume(c)
    bad = array.astype(np.uint8)
    if c.file_column.labels is not None:
        bad.flat[0] = _out_of_set_value(c)
    elif c.p.task_id.startswith("panther"):
        bad[...] = 0  # PANTHER accepts {0, k} only: three values are out of set
        bad.flat[:2] = (1, 2)
    else:
        raise NotApplicable("every non-negative label is accepted")
    _write_volume_file(c, bad, geometry)
    return c.needles()


def _grid_changed(c: Case, **change: Any) -> tuple[str, ...]:
    ignored = [name for name in change if name in c.p.grader.header_rule.ignored]
    if ignored:
        raise NotApplicable(f"the official evaluation ignores the prediction's {ignored[0]}: accepted with a warning "
                            "(test_ignored_header_fields_grade_like_gold)")
    array, geometry = _gold_volume(c)
    if "size" in change:
        array = np.zeros(tuple(reversed(change["size"])), dtype=array.dtype)
    fields = {"size": geometry.size, "spacing": geometry.spacing, "origin": geometry.origin,
              "direction": geometry.direction, **change}
    _write_volume_file(c, array, Geometry(**fields))
    return c.needles()


@corruption(volume)
def wrong_size_volume(c: Case) -> tuple[str, ...]:
    return _grid_changed(c, size=tuple(n + 1 for n in c.geometry.size))


@corruption(volume)
def wrong_spacing_volume(c: Case) -> tuple[str, ...]:
    return _grid_changed(c, spacing=tuple(s * 1.5 for s in c.geometry.spacing))


@corruption(volume)
def wrong_origin_volume(c: Case) -> tuple[str, ...]:
    return _grid_changed(c, origin=tuple(o + 5.0 for o in c.geometry.origin))


@corruption(volume)
def wrong_direction_volume(c: Case) -> tuple[str, ...]:
    return _grid_changed(c, direction=(0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0))


def _nifti1_header(size_xyz: tuple[int, int, int]) -> bytes:
    """A NIfTI-1 single-file header (uint8 voxels, unit spacing) declaring ``size_xyz``, data at byte 352."""
    header = bytearray(352)
    struct.pack_into("<i", header, 0, 348)
    struct.pack_into("<8h", header, 40, 3, *size_xyz, 1, 1, 1, 1)
    struct.pack_into("<hh", header, 70, 2, 8)  # datatype uint8, 8 bits per voxel
    struct.pack_into("<8f", header, 76, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0)
    struct.pack_into("<f", header, 108, 352.0)
    header[344:348] = b"n+1\0"
    return bytes(header)


BOMB_SIDE = 30000  # voxels per axis declared by the hand-written bomb headers (2.7e13 voxels)


@corruption(with_suffix(volume, ".nii.gz", ".nii"), bomb=True)
def nifti_header_bomb(c: Case) -> tuple[str, ...]:
    content = _nifti1_header((BOMB_SIDE,) * 3) + bytes(64)
    c.replace(gzip.compress(content) if ".nii.gz" in c.file_column.suffixes else content,
              ".nii.gz" if ".nii.gz" in c.file_column.suffixes else ".nii")
    return c.needles()


def _mha_header(size: tuple[int, ...], geometry: Geometry, *, data_file: str = "LOCAL", extra: str = "",
                separator: str = " = ") -> bytes:
    fields = [
        "ObjectType = Image", "NDims = 3", f"DimSize = {' '.join(map(str, size))}", "ElementType = MET_UCHAR",
        f"ElementSpacing = {' '.join(map(repr, geometry.spacing))}", f"Offset = {' '.join(map(repr, geometry.origin))}",
        f"TransformMatrix = {' '.join(map(repr, geometry.direction))}",
    ]
    return ("\n".join(fields) + "\n" + extra + f"ElementDataFile{separator}{data_file}\n").encode("latin-1")


@corruption(with_suffix(volume, ".mha"), bomb=True)
def metaimage_header_bomb(c: Case) -> tuple[str, ...]:
    c.replace(_mha_header((BOMB_SIDE,) * 3, c.geometry) + bytes(64), ".mha")
    return c.needles()


@corruption(with_suffix(volume, ".mha"), bomb=True)
def metaimage_compressed_size_bomb(c: Case) -> tuple[str, ...]:
    """The right grid, but a compressed-size field promising 100 GB of data."""
    payload = zlib.compress(bytes(math.prod(c.geometry.size)))
    header = _mha_header(c.geometry.size, c.geometry, extra="CompressedData = True\n"
                                                          "CompressedDataSize = 100000000000\n")
    c.replace(header + payload, ".mha")
    return c.needles()


def _nrrd_header(size: tuple[int, ...], geometry: Geometry, *, fields: str = "", encoding: str = "raw") -> bytes:
    directions = " ".join(
        "(" + ",".join(repr(geometry.direction[row * 3 + axis] * geometry.spacing[axis]) for row in range(3)) + ")"
        for axis in range(3))
    return ("NRRD0004\ntype: uint8\ndimension: 3\nspace: left-posterior-superior\n"
            f"sizes: {' '.join(map(str, size))}\nspace directions: {directions}\n"
            f"space origin: ({','.join(map(repr, geometry.origin))})\nendian: little\nencoding: {encoding}\n"
            + fields).encode("latin-1")


def _nrrd_suffix(c: Case) -> str:
    return next(s for s in c.file_column.suffixes if s.endswith(".nrrd"))


@corruption(with_suffix(volume, ".nrrd", ".seg.nrrd"), bomb=True)
def nrrd_header_bomb(c: Case) -> tuple[str, ...]:
    c.replace(_nrrd_header((BOMB_SIDE,) * 3, c.geometry) + b"\n" + bytes(64), _nrrd_suffix(c))
    return c.needles()


# External voxel files: a header of the right grid whose voxels come from a file the submission must not reach.
def _decoy_voxels(c: Case) -> Path:
    decoy = c.outside / "secret.raw"
    decoy.write_bytes(bytes([1]) * math.prod(c.geometry.size))
    return decoy


@corruption(with_suffix(volume, ".mha"))
def metaimage_external_data_file(c: Case) -> tuple[str, ...]:
    c.replace(_mha_header(c.geometry.size, c.geometry, data_file=str(_decoy_voxels(c))), ".mha")
    return c.needles()


@corruption(with_suffix(volume, ".mha"))
def metaimage_external_data_file_colon(c: Case) -> tuple[str, ...]:
    """MetaIO also takes ':' as separator; a later '= LOCAL' line is mere voxel data to it."""
    header = _mha_header(c.geometry.size, c.geometry, data_file=str(_decoy_voxels(c)), separator=": ")
    c.replace(header + b"ElementDataFile = LOCAL\n", ".mha")
    return c.needles()


@corruption(with_suffix(volume, ".mha"))
def metaimage_external_data_file_tab(c: Case) -> tuple[str, ...]:
    header = _mha_header(c.geometry.size, c.geometry, data_file=str(_decoy_voxels(c)), separator="\t= ")
    c.replace(header + b"ElementDataFile = LOCAL\n", ".mha")
    return c.needles()


@corruption(with_suffix(volume, ".mha"))
def metaimage_external_data_file_hidden_line(c: Case) -> tuple[str, ...]:
    """A NEL byte: Python's splitlines breaks the line there, MetaIO does not."""
    header = _mha_header(c.geometry.size, c.geometry, data_file=str(_decoy_voxels(c)),
                         extra="Comment = x\x85ElementDataFile = LOCAL\n")
    c.replace(header, ".mha")
    return c.needles()


@corruption(with_suffix(volume, ".mha"))
def metaimage_data_file_list(c: Case) -> tuple[str, ...]:
    """``LIST``: the following lines name the slice files; a file named LIST beside it must not make it pass."""
    decoy = _decoy_voxels(c)
    path = c.replace(_mha_header(c.geometry.size, c.geometry, data_file="LIST")
                     + (f"{decoy}\n" * c.geometry.size[2]).encode(), ".mha")
    path.with_name("LIST").write_bytes(b"x")
    return c.needles()


@corruption(with_suffix(volume, ".nrrd", ".seg.nrrd"))
def nrrd_external_data_file(c: Case) -> tuple[str, ...]:
    c.replace(_nrrd_header(c.geometry.size, c.geometry, fields=f"data file: {_decoy_voxels(c)}\n\n"),
              _nrrd_suffix(c))
    return c.needles()


@corruption(with_suffix(volume, ".nrrd", ".seg.nrrd"))
def nrrd_external_data_file_after_form_feeds(c: Case) -> tuple[str, ...]:
    """Two form feeds look like a blank line (end of header) to Python's splitlines, not to teem."""
    fields = f"content: x\x0c\x0c\ndata file: {_decoy_voxels(c)}\n\n"
    c.replace(_nrrd_header(c.geometry.size, c.geometry, fields=fields), _nrrd_suffix(c))
    return c.needles()


@corruption(with_suffix(volume, ".nrrd", ".seg.nrrd"))
def nrrd_external_data_file_after_comment(c: Case) -> tuple[str, ...]:
    fields = f"#\x0b\ndata file: {_decoy_voxels(c)}\n\n"
    c.replace(_nrrd_header(c.geometry.size, c.geometry, fields=fields), _nrrd_suffix(c))
    return c.needles()


@corruption(with_suffix(volume, ".nrrd", ".seg.nrrd"))
def nrrd_data_file_list(c: Case) -> tuple[str, ...]:
    decoy = _decoy_voxels(c)
    fields = "data file: LIST\n" + f"{decoy}\n" * c.geometry.size[2]
    path = c.replace(_nrrd_header(c.geometry.size, c.geometry, fields=fields), _nrrd_suffix(c))
    path.with_name("LIST").write_bytes(b"x")
    return c.needles()


def _nrrd_reading_the_private_label(c: Case, hide: str) -> tuple[str, ...]:
    """The real exploit: teem un-gzips the private .nii.gz label and skips its header, so the 'prediction' is the
    ground truth (a perfect score without a model). ``hide`` goes before the data file field."""
    target = c.private_file()
    if target is None or not target.name.endswith(".nii.gz"):
        raise NotApplicable("the private label is not a .nii.gz file")
    with gzip.open(target) as fh:
        header = fh.read(352)
    datatype, = struct.unpack_from("<h", header, 70)
    vox_offset, = struct.unpack_from("<f", header, 108)
    nrrd_type = {2: "uint8", 4: "int16", 8: "int32", 16: "float", 256: "int8", 512: "uint16", 768: "uint32"}[datatype]
    fields = f"{hide}byte skip: {int(vox_offset)}\ndata file: {target}\n\n"
    content = _nrrd_header(c.geometry.size, c.geometry, fields=fields, encoding="gzip")
    c.replace(content.replace(b"type: uint8", f"type: {nrrd_type}".encode()), _nrrd_suffix(c))
    return c.needles()


@corruption(with_suffix(volume, ".nrrd", ".seg.nrrd"))
def nrrd_reads_the_private_label(c: Case) -> tuple[str, ...]:
    return _nrrd_reading_the_private_label(c, "")


@corruption(with_suffix(volume, ".nrrd", ".seg.nrrd"))
def nrrd_reads_the_private_label_behind_form_feeds(c: Case) -> tuple[str, ...]:
    return _nrrd_reading_the_private_label(c, "content: x\x0c\x0c\n")


def _gold_image(c: Case) -> np.ndarray:
    from rexmle_grade.io import read_image_2d

    return read_image_2d(c.gold_file(), allow_channels=True)


def _write_image(c: Case, array: np.ndarray) -> None:
    path, relative = c.new_file()
    if c.suffix() in (".tif", ".tiff"):
        import tifffile

        tifffile.imwrite(path, array, photometric="minisblack" if array.ndim == 2 or array.shape[-1] != 3 else "rgb")
    else:
        from PIL import Image

        Image.fromarray(array).save(path)
    c.set_cell(relative)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_bytes(width: int, height: int, idat: bytes) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def _tiff_bytes(width: int, height: int, strip: bytes, *, compression: int) -> bytes:
    """A one-strip 8-bit grayscale little-endian TIFF, written by hand so that its tags may lie."""
    tags = [(256, 4, width), (257, 4, height), (258, 3, 8), (259, 3, compression), (262, 3, 1),
            (273, 4, 0), (277, 3, 1), (278, 4, height), (279, 4, len(strip))]
    ifd_size = 2 + 12 * len(tags) + 4
    data_offset = 8 + ifd_size
    entries = b"".join(
        struct.pack("<HHI", tag, kind, 1) + (struct.pack("<I", data_offset if tag == 273 else value) if kind == 4
                                             else struct.pack("<HH", value, 0))
        for tag, kind, value in tags)
    return b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", len(tags)) + entries + b"\0\0\0\0" + strip


@functools.cache
def zlib_bomb() -> bytes:
    """A valid zlib stream inflating to :data:`BOMB_BYTES` zero bytes (about 2 MB).

    After a full flush deflate starts afresh, so the block compressing one chunk can be repeated instead of
    compressing gigabytes; only the Adler-32 trailer needs the whole (zero) data."""
    chunk = bytes(16 * 1024 * 1024)
    compressor = zlib.compressobj(9)
    head = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    block = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    end = compressor.flush()[:-4]  # the final empty block, without the checksum of two chunks only
    checksum = 1
    for _ in range(BOMB_BYTES // len(chunk)):
        checksum = zlib.adler32(chunk, checksum)
    return head + block * (BOMB_BYTES // len(chunk) - 1) + end + struct.pack(">I", checksum)


@corruption(with_suffix(image_2d, ".png"), bomb=True)
def png_dimension_bomb(c: Case) -> tuple[str, ...]:
    c.replace(_png_bytes(100_000, 100_000, zlib.compress(b"\0" * 1000)), ".png")
    return c.needles()


@corruption(with_suffix(image_2d, ".png"), bomb=True)
def png_data_bomb(c: Case) -> None:
    """The test image's size, but an IDAT stream inflating to gigabytes."""
    width, height = c.geometry.size[:2]
    c.replace(_png_bytes(width, height, zlib_bomb()), ".png")
    return None


@corruption(with_suffix(image_2d, ".tif", ".tiff"), bomb=True)
def tiff_dimension_bomb(c: Case) -> tuple[str, ...]:
    c.replace(_tiff_bytes(100_000, 100_000, bytes(1000), compression=1), c.suffix())
    return c.needles()


@corruption(with_suffix(image_2d, ".tif", ".tiff"), bomb=True)
def tiff_strip_bomb(c: Case) -> tuple[str, ...]:
    """The test image's size, one deflate strip inflating to gigabytes."""
    width, height = c.geometry.size[:2]
    c.replace(_tiff_bytes(width, height, zlib_bomb(), compression=8), c.suffix())
    return c.needles()


@corruption(image_2d)
def three_d_instead_of_2d(c: Case) -> tuple[str, ...]:
    array = _gold_image(c)
    if c.suffix() in (".tif", ".tiff"):
        _write_image(c, np.stack([array] * 5))  # five pages
    else:
        from PIL import Image

        frames = [Image.fromarray(array.astype(np.uint8)) for _ in range(5)]
        path, relative = c.new_file()
        frames[0].save(path, save_all=True, append_images=frames[1:])  # an animated PNG of five frames
        c.set_cell(relative)
    return c.needles()


@corruption(image_2d)
def rgb_instead_of_gray(c: Case) -> tuple[str, ...]:
    _write_image(c, np.stack([_gold_image(c).astype(np.uint8)] * 3, axis=-1))
    return c.needles()


@corruption(with_suffix(image_2d, ".png"))
def palette_image(c: Case) -> tuple[str, ...]:
    from PIL import Image

    image = Image.fromarray(_gold_image(c).astype(np.uint8)).convert("P")
    path, relative = c.new_file()
    image.save(path)
    c.set_cell(relative)
    return c.needles()


@corruption(image_2d)
def wrong_format_content(c: Case) -> tuple[str, ...]:
    """TIFF bytes in a .png file or PNG bytes in a .tif file: the format is never guessed from the content."""
    from PIL import Image

    array = _gold_image(c).astype(np.uint8)
    path, relative = c.new_file()
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="TIFF" if c.suffix() == ".png" else "PNG")
    path.write_bytes(buffer.getvalue())
    c.set_cell(relative)
    return c.needles()


@corruption(with_suffix(image_2d, ".tif", ".tiff"))
def float_pixels_with_nan(c: Case) -> tuple[str, ...]:
    array = _gold_image(c).astype(np.float32)
    array.flat[0], array.flat[1] = np.nan, np.inf
    _write_image(c, array)
    return c.needles()


@corruption(lambda column: with_suffix(image_2d, ".png")(column) and (column.kind is FileKind.GRAY_IMAGE
                                                                     or column.labels is not None))
def sixteen_bit_png(c: Case) -> tuple[str, ...]:
    array = _gold_image(c).astype(np.uint16)
    array.flat[0] = 40000
    _write_image(c, array)
    return c.needles()


@corruption(with_suffix(image_2d, ".tif", ".tiff"))
def negative_label_image(c: Case) -> tuple[str, ...]:
    array = _gold_image(c).astype(np.int16)
    array.flat[0] = -1
    _write_image(c, array)
    return c.needles()


@corruption(lambda column: image_2d(column) and column.labels is not None)
def out_of_set_label_image(c: Case) -> tuple[str, ...]:
    array = _gold_image(c).astype(np.uint8)
    array.flat[0] = _out_of_set_value(c)
    _write_image(c, array)
    return c.needles()


@corruption(image_2d)
def wrong_size_image(c: Case) -> tuple[str, ...]:
    array = _gold_image(c)
    _write_image(c, np.pad(array, ((0, 1), (0, 2))))
    return c.needles()


# JSON documents
def _deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


@corruption(json_file)
def deeply_nested_document(c: Case) -> tuple[str, ...]:
    c.replace(_deep(100_000))
    return c.needles()


@corruption(with_suffix(json_file, ".yml", ".yaml"))
def deeply_nested_yaml(c: Case) -> tuple[str, ...]:
    c.replace(_deep(1_500), ".yaml")  # beyond the recursion limit, under the YAML size limit
    return c.needles()


@corruption(with_suffix(json_file, ".yml", ".yaml"), bomb=True)
def yaml_billion_laughs(c: Case) -> tuple[str, ...]:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{k}: &a{k} [" + ", ".join([f"*a{k - 1}"] * 10) + "]" for k in range(1, 10)]
    lines += ["anterior: *a9", "posterior: *a9"]
    c.replace("\n".join(lines).encode(), ".yaml")
    return c.needles()


@corruption(json_file, bomb=True, slow=True)
def empty_containers_at_size_limit(c: Case) -> tuple[str, ...]:
    """As many empty lists as the size limit allows: each 3-byte '[],' costs a 56-byte Python object."""
    path, relative = c.new_file()
    count = (MAX_JSON_BYTES - 3) // 3
    with path.open("wb") as fh:
        fh.write(b"[")
        fh.write(b"[]," * count)
        fh.write(b"[]]")
    c.set_cell(relative)
    return c.needles()


@corruption(json_file, bomb=True, slow=True)
def wrong_items_at_size_limit(c: Case) -> tuple[str, ...]:
    """Millions of wrong entries: the problem list must stay short (and cheap)."""
    path, relative = c.new_file()
    gold = json.loads(c.gold_file().read_text())
    item = b"0,"
    count = (MAX_JSON_BYTES - 64) // len(item)
    with path.open("wb") as fh:
        if isinstance(gold, dict):
            key = next((k for k, v in gold.items() if isinstance(v, list)), next(iter(gold), "x"))
            fh.write(b'{"type": "Multiple polygons", "' + key.encode() + b'": [')
            fh.write(item * count)
            fh.write(b"0]}")
        else:
            fh.write(b"[" + item * count + b"0]")
    c.set_cell(relative)
    return c.needles()


@corruption(json_file)
def nan_literal(c: Case) -> tuple[str, ...]:
    text = c.gold_file().read_text()
    changed = _replace_numbers(json.loads(text), lambda _: float("nan"))
    if changed is None:
        raise NotApplicable("the gold document holds no number")
    c.replace(json.dumps(changed).encode())  # json.dumps writes the literal NaN
    return c.needles()


@corruption(json_file)
def overflowing_float(c: Case) -> tuple[str, ...]:
    changed = _replace_numbers(json.loads(c.gold_file().read_text()), lambda _: "__BIG__")
    if changed is None:
        raise NotApplicable("the gold document holds no number")
    c.replace(json.dumps(changed).replace('"__BIG__"', "1e400").encode())  # parses as inf
    return c.needles()


@corruption(json_file)
def huge_integers(c: Case) -> tuple[str, ...]:
    changed = _replace_numbers(json.loads(c.gold_file().read_text()), lambda _: 10**400)
    if changed is None:
        raise NotApplicable("the gold document holds no number")
    c.replace(json.dumps(changed).encode())
    return c.needles()


@corruption(json_file)
def wrong_document_type(c: Case) -> tuple[str, ...]:
    c.replace(b'"a string, not the expected structure"')
    return c.needles()


@corruption(json_file)
def non_utf8_document(c: Case) -> tuple[str, ...]:
    c.replace(b'["\xff\xfe"]')
    return c.needles()


def _replace_numbers(document: Any, new: Callable[[Any], Any]) -> Any | None:
    """``document`` with every number (not booleans) replaced; None when it holds no number."""
    found = False

    def walk(node: Any) -> Any:
        nonlocal found
        if isinstance(node, bool):
            return node
        if isinstance(node, int | float):
            found = True
            return new(node)
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        return node

    result = walk(document)
    return result if found else None


# ---- 3. the CSV itself ----------------------------------------------------------------------------------------
@corruption(table)
def csv_symlink_outside(c: Case) -> tuple[str, ...]:
    copy = c.outside / SUBMISSION_CSV
    shutil.copy(c.submission / SUBMISSION_CSV, copy)
    (c.submission / SUBMISSION_CSV).unlink()
    (c.submission / SUBMISSION_CSV).symlink_to(copy)
    return (SUBMISSION_CSV,)


@corruption(table)
def csv_missing(c: Case) -> tuple[str, ...]:
    (c.submission / SUBMISSION_CSV).unlink()
    return (SUBMISSION_CSV, "missing")


@corruption(table)
def csv_is_a_folder(c: Case) -> tuple[str, ...]:
    (c.submission / SUBMISSION_CSV).unlink()
    (c.submission / SUBMISSION_CSV).mkdir()
    return (SUBMISSION_CSV,)


@corruption(table)
def csv_zero_bytes(c: Case) -> tuple[str, ...]:
    c.write_csv("")
    return (SUBMISSION_CSV,)


@corruption(table)
def csv_header_only(c: Case) -> tuple[str, ...]:
    c.write_csv(c.csv_text(rows=[]))
    return (SUBMISSION_CSV,)


@corruption(table)
def csv_oversized(c: Case) -> tuple[str, ...]:
    with (c.submission / SUBMISSION_CSV).open("ab") as fh:
        fh.truncate(MAX_CSV_BYTES + 1)  # sparse
    return (SUBMISSION_CSV,)


@corruption(table)
def csv_duplicated_header_column(c: Case) -> tuple[str, ...]:
    header = [*c.header, c.id_column]
    c.write_csv(c.csv_text(header=header, rows=[[r[h] for h in header] for r in c.rows]))
    return (c.id_column,)


@corruption(table)
def csv_header_repeated_as_row(c: Case) -> tuple[str, ...]:
    rows = [[r[h] for h in c.header] for r in c.rows]
    c.write_csv(c.csv_text(rows=[rows[0], c.header, *rows[1:]]))
    return (c.id_column,)


@corruption(table)
def csv_row_too_long(c: Case) -> tuple[str, ...]:
    rows = [[r[h] for h in c.header] for r in c.rows]
    rows[0].append("surplus")
    c.write_csv(c.csv_text(rows=rows))
    return (SUBMISSION_CSV, "line 2")


@corruption(table)
def csv_row_too_short(c: Case) -> tuple[str, ...]:
    rows = [[r[h] for h in c.header] for r in c.rows]
    rows[-1].pop()
    c.write_csv(c.csv_text(rows=rows))
    return (SUBMISSION_CSV, f"line {len(rows) + 1}")


@corruption(table)
def csv_unbalanced_quote(c: Case) -> tuple[str, ...]:
    text = c.csv_text()
    first_break = text.index("\n")
    c.write_csv(text[: first_break + 1] + '"' + text[first_break + 1:])
    return (SUBMISSION_CSV,)


@corruption(table)
def csv_not_utf8(c: Case) -> tuple[str, ...]:
    (c.submission / SUBMISSION_CSV).write_bytes(c.csv_text().replace(c.case_id, c.case_id + "\udcff", 1)
                                                .encode("utf-8", "surrogateescape"))
    return ("UTF-8",)


@corruption(table)
def csv_utf16(c: Case) -> tuple[str, ...]:
    (c.submission / SUBMISSION_CSV).write_bytes(c.csv_text().encode("utf-16"))
    return ("UTF-8",)


@corruption(table)
def csv_nul_byte(c: Case) -> tuple[str, ...]:
    c.write_csv(c.csv_text().replace(c.case_id, c.case_id + "\x00", 1))
    return (c.case_id,)


@corruption(table)
def csv_field_beyond_csv_limit(c: Case) -> tuple[str, ...]:
    c.write_csv(c.csv_text().replace(c.case_id, c.case_id + "x" * 200_000, 1))
    return (SUBMISSION_CSV,)


@corruption(table)
def csv_missing_id(c: Case) -> tuple[str, ...]:
    c.rows = [r for r in c.rows if r[c.id_column] != c.case_id]
    c.write_csv()
    return (c.case_id,)


@corruption(table)
def csv_duplicated_id(c: Case) -> tuple[str, ...]:
    c.rows = [*c.rows, dict(c.row())]
    c.write_csv()
    return (c.case_id, "duplicate")


@corruption(table)
def csv_extra_id(c: Case) -> tuple[str, ...]:
    c.rows = [*c.rows, {**c.row(), c.id_column: "not_a_test_case"}]
    c.write_csv()
    return ("not_a_test_case",)


@corruption(table)
def csv_empty_id(c: Case) -> tuple[str, ...]:
    c.row()[c.id_column] = ""
    c.write_csv()
    return (c.id_column, "empty")


@corruption(table)
def csv_missing_column(c: Case) -> tuple[str, ...]:
    dropped = c.header[-1]
    c.header = c.header[:-1]
    c.write_csv()
    return (dropped,)


@corruption(table)
def csv_extra_column(c: Case) -> tuple[str, ...]:
    c.header = [*c.header, "notes"]
    for r in c.rows:
        r["notes"] = "hello"
    c.write_csv()
    return ("notes",)


@corruption(table)
def csv_renamed_id_column(c: Case) -> tuple[str, ...]:
    renamed = c.id_column.upper()
    c.header = [renamed if h == c.id_column else h for h in c.header]
    for r in c.rows:
        r[renamed] = r.pop(c.id_column)
    c.write_csv()
    return (c.id_column,)


# value columns
def _value(text: str) -> Build:
    def build(c: Case) -> tuple[str, ...]:
        c.set_cell(text)
        return c.needles()

    return build


CORRUPTIONS += [Corruption(f"float_value_{name}", _value(text), float_values)
                for name, text in (("nan", "nan"), ("inf", "inf"), ("minus_inf", "-Infinity"), ("empty", ""),
                                   ("text", "good"), ("overflow", "1e999"))]
CORRUPTIONS += [Corruption(f"choice_value_{name}", _value(text), choice_values)
                for name, text in (("empty", ""), ("other", "xray"), ("nan", "nan"))]


@corruption(choice_values)
def choice_value_upper_case(c: Case) -> tuple[str, ...]:
    column, case_id = c.needles()
    c.set_cell(c.row()[column].upper())  # choices are compared exactly
    return (column, case_id)


def _columns(grader: Grader) -> list[FileColumn | ValueColumn | None]:
    return [None, *grader.schema.columns]


def _param_id(task_id: str, corruption: Corruption, column: FileColumn | ValueColumn | None, several: bool) -> str:
    return f"{task_id}-{column.name + ':' if several and column is not None else ''}{corruption.name}"


def matrix() -> list[Any]:
    """(task id, corruption, column name) for every registered task and applicable in-process corruption."""
    params = []
    for task_id, task in _task_registry().items():
        reason = _not_landed(task)
        if reason:
            params.append(pytest.param(task_id, None, None, id=task_id, marks=pytest.mark.skip(reason=reason)))
            continue
        grader = task.grader
        several = len(grader.schema.columns) > 1
        for column in _columns(grader):
            for item in CORRUPTIONS:
                if not item.bomb and item.applies(column):
                    name = None if column is None else column.name
                    params.append(pytest.param(task_id, item, name, id=_param_id(task_id, item, column, several)))
    if not params:
        params.append(pytest.param(None, None, None, marks=pytest.mark.skip(reason="no task is registered")))
    return params


def _column(grader: Grader, name: str | None) -> FileColumn | ValueColumn | None:
    return None if name is None else next(c for c in grader.schema.columns if c.name == name)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "corruption" in metafunc.fixturenames:
        metafunc.parametrize(("prepared", "corruption", "column_name"), matrix(), indirect=["prepared"])
    elif "prepared" in metafunc.fixturenames:
        params = [pytest.param(t, marks=pytest.mark.skip(reason=r) if (r := _not_landed(task)) else ())
                  for t, task in _task_registry().items()]
        metafunc.parametrize("prepared", params or [pytest.param(None, marks=pytest.mark.skip(reason="no task"))],
                             indirect=True)


# ---- the tests ------------------------------------------------------------------------------------------------
def test_corrupted_submission_is_rejected(prepared: Prepared, corruption: Corruption, column_name: str | None,
                                          tmp_path: Path) -> None:
    c = Case.create(prepared, tmp_path, _column(prepared.grader, column_name))
    try:
        needles = corruption.build(c)
    except NotApplicable as exc:
        pytest.skip(str(exc))
    assert needles is not None, f"{corruption.name} must be rejected: say which problem names it"
    outcome = run_watched(prepared, c.submission, decoys=[c.outside])
    assert_rejected(outcome, needles)


HARMLESS_FORMATS: dict[str, Callable[[Case], str]] = {
    "bom": lambda c: "\ufeff" + c.csv_text(),
    "crlf": lambda c: c.csv_text(line_end="\r\n"),
    "all_quoted": lambda c: c.csv_text(quoting=csv.QUOTE_ALL),
    "trailing_blank_lines": lambda c: c.csv_text() + "\n\n,,\n   \n",
    "columns_permuted": lambda c: c.csv_text(header=[*reversed(c.header)]),
    "cells_padded": lambda c: c.csv_text(rows=[[f"  {r[h]} " for h in c.header] for r in c.rows]),
    "everything_at_once": lambda c: "\ufeff" + c.csv_text(header=[*reversed(c.header)], quoting=csv.QUOTE_ALL,
                                                          line_end="\r\n") + "\r\n\r\n",
}


@pytest.mark.parametrize("style", list(HARMLESS_FORMATS))
def test_harmless_csv_formatting_keeps_the_gold_submission_valid(prepared: Prepared, style: str,
                                                                  tmp_path: Path) -> None:
    c = Case.create(prepared, tmp_path, None)
    c.write_csv(HARMLESS_FORMATS[style](c))
    outcome = run_watched(prepared, c.submission, decoys=[c.outside])
    assert not outcome.forbidden, outcome.forbidden
    assert outcome.report.ok and outcome.result.status == "valid", outcome.explain()
    assert outcome.result.metrics == pytest.approx(prepared.gold_result.metrics, rel=1e-12, abs=1e-12)


HEADER_CHANGES: dict[str, Callable[[Geometry], Any]] = {
    "spacing": lambda g: tuple(s * 1.5 for s in g.spacing),
    "origin": lambda g: tuple(o + 5.0 for o in g.origin),
    "direction": lambda g: (0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0),
}


@pytest.mark.parametrize("field_name", list(HEADER_CHANGES))
def test_ignored_header_fields_grade_like_gold(prepared: Prepared, field_name: str, tmp_path: Path) -> None:
    """A header field the official evaluation ignores may differ: the gold voxels still grade exactly like gold, on
    the ground truth's grid, and validation and grading both warn naming the field."""
    if not any(c.kind is FileKind.LABEL_VOLUME for c in prepared.grader.schema.file_columns):
        pytest.skip("no prediction volumes")
    if field_name not in prepared.grader.header_rule.ignored:
        pytest.skip(f"{prepared.task_id} checks the prediction's {field_name} (wrong_{field_name}_volume)")
    c = Case.create(prepared, tmp_path, prepared.grader.schema.file_columns[0])
    array, geometry = _gold_volume(c)
    _write_volume_file(c, array, Geometry(**{**asdict(geometry), field_name: HEADER_CHANGES[field_name](geometry)}))
    outcome = run_watched(prepared, c.submission, decoys=[c.outside])
    assert not outcome.forbidden, outcome.forbidden
    assert outcome.report.ok and outcome.result.status == "valid", outcome.explain()
    assert outcome.result.metrics == pytest.approx(prepared.gold_result.metrics, rel=1e-12, abs=1e-12)
    for warnings in (outcome.report.warnings, outcome.result.warnings):
        assert len(warnings) == 1 and field_name in warnings[0] and c.case_id in warnings[0], warnings


def test_truncated_private_file_is_a_grader_error(prepared: Prepared, tmp_path: Path) -> None:
    """Every grader verifies every private file it reads: gold graded against a private folder whose first case's
    answer file lost its second half is a grader error naming that case, never a grade against a corrupt key."""
    c = Case.create(prepared, tmp_path, None)
    target = c.private_file()
    if target is None:
        pytest.skip("the answers are values in answers.csv, no private file")
    private = tmp_path / "private"
    shutil.copytree(prepared.private, private)
    cut = private / target.relative_to(prepared.private)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    result = grade_submission(prepared.grader, prepared.gold, prepared.public, private)
    assert result.status == "grader_error", (result.status, result.metrics, result.problems)


def test_sample_submission_validates_and_grades_without_reaching_out(prepared: Prepared, tmp_path: Path) -> None:
    sample = tmp_path / "sample"
    shutil.copytree(prepared.public / "sample_submission", sample)
    outcome = run_watched(prepared, sample, decoys=[])
    assert not outcome.forbidden, outcome.forbidden
    assert outcome.report.ok and outcome.result.status == "valid", outcome.explain()
    assert all(math.isfinite(v) for v in outcome.result.metrics.values()), outcome.result.metrics


def test_gold_grading_opens_only_its_three_folders(prepared: Prepared, tmp_path: Path) -> None:
    c = Case.create(prepared, tmp_path, None)
    outcome = run_watched(prepared, c.submission, decoys=[c.outside])
    assert not outcome.forbidden, outcome.forbidden
    assert outcome.result.metrics == prepared.gold_result.metrics


# ---- bombs: in a child process with a capped address space -----------------------------------------------------
_CHILD = textwrap.dedent("""
    import json, resource, sys, traceback
    from rexmle_grade.grader import get_grader
    from rexmle_grade.grading import grade_submission
    from rexmle_grade.validation import validate_submission
    import SimpleITK, tifffile, PIL.Image, scipy.ndimage, yaml  # imported before the cap: code is not data

    jobs = json.loads(sys.stdin.read())
    with open("/proc/self/status") as fh:
        used = int(next(line for line in fh if line.startswith("VmSize:")).split()[1]) * 1024
    cap = used + int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    results = []
    for job in jobs:
        grader = get_grader(job["grader"])
        out = {"name": job["name"]}
        try:
            report = validate_submission(grader, job["submission"], job["public"])
            out["validation"] = {"ok": report.ok, "problems": report.problems}
        except BaseException as exc:
            out["validation"] = {"raised": "".join(traceback.format_exception_only(exc))[-500:]}
        try:
            result = grade_submission(grader, job["submission"], job["public"], job["private"])
            out["grading"] = {"status": result.status, "problems": result.problems,
                              "error": (result.error or "")[-800:]}
        except BaseException as exc:
            out["grading"] = {"raised": "".join(traceback.format_exception_only(exc))[-500:]}
        results.append(out)
    print(json.dumps(results))
""")


def run_capped(jobs: list[dict[str, str]], headroom: int = CHILD_MEMORY_HEADROOM) -> list[dict[str, Any]]:
    """Validate and grade each job's submission in one child process whose address space may grow by at most
    ``headroom`` bytes beyond what its imports take."""
    done = subprocess.run([sys.executable, "-c", _CHILD, str(headroom)], input=json.dumps(jobs), capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, f"the capped child failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def bomb_failures(outcome: dict[str, Any], needles: tuple[str, ...] | None) -> str | None:
    """Why a bomb's outcome is wrong (None: refused cleanly, or accepted where acceptance is allowed)."""
    validation, grading = outcome["validation"], outcome["grading"]
    if "raised" in validation or "raised" in grading:
        return "raised"
    if needles is None:
        return None if validation["ok"] == (grading["status"] == "valid") and grading["status"] != "grader_error" \
            else "inconsistent or grader error"
    if grading["status"] != "invalid_submission" or validation["ok"]:
        return "not rejected"
    for problems in (validation["problems"], grading["problems"]):
        if len(problems) > 41 or any(len(p) >= 2000 for p in problems):
            return "problem list too long"
        if not any(all(n in p for n in needles) for p in problems):
            return f"no problem names {needles}"
    return None


def bomb_params(*, slow: bool) -> list[Any]:
    params = []
    for task_id, task in _task_registry().items():
        reason = _not_landed(task)
        if reason:
            params.append(pytest.param(task_id, id=task_id, marks=pytest.mark.skip(reason=reason)))
        elif any(item.bomb and item.slow == slow and item.applies(column)
                 for column in _columns(task.grader) for item in CORRUPTIONS):
            params.append(pytest.param(task_id, id=task_id, marks=[pytest.mark.slow] if slow else []))
    return params or [pytest.param(None, marks=pytest.mark.skip(reason="no task has bombs to check"))]


def check_bombs(p: Prepared, tmp_path: Path, *, slow: bool) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("the address-space cap is measured through /proc")
    jobs, needles = [], {}
    for column in _columns(p.grader):
        for item in CORRUPTIONS:
            if not (item.bomb and item.slow == slow and item.applies(column)):
                continue
            name = f"{column.name if column else 'table'}:{item.name}"
            folder = tmp_path / name.replace(":", "-")
            folder.mkdir()
            c = Case.create(p, folder, column)
            try:
                needles[name] = item.build(c)
            except NotApplicable:
                continue
            jobs.append({"name": name, "grader": p.grader.grader_id, "submission": str(c.submission),
                         "public": str(p.public), "private": str(p.private)})
    if not jobs:
        pytest.skip("no bomb applies to this task's data")
    outcomes = run_capped(jobs)
    wrong = {o["name"]: (why, o) for o in outcomes if (why := bomb_failures(o, needles[o["name"]]))}
    assert not wrong, "\n".join(f"{name}: {why}\n  {json.dumps(o)[:1500]}" for name, (why, o) in wrong.items())


@pytest.mark.parametrize("bomb_task", bomb_params(slow=False), indirect=True)
def test_bombs_are_refused_within_bounded_memory(bomb_task: Prepared, tmp_path: Path) -> None:
    check_bombs(bomb_task, tmp_path, slow=False)


@pytest.mark.parametrize("bomb_task", bomb_params(slow=True), indirect=True)
def test_memory_amplifiers_at_the_size_limit_are_bounded(bomb_task: Prepared, tmp_path: Path) -> None:
    check_bombs(bomb_task, tmp_path, slow=True)


def test_the_watchers_see_python_and_c_level_opens(tmp_path: Path) -> None:
    """The harness itself: an open outside the allowed folders is reported, by the audit hook for Python code and
    by inotify for SimpleITK's C++ reader."""
    allowed, elsewhere = tmp_path / "allowed", tmp_path / "elsewhere"
    allowed.mkdir()
    elsewhere.mkdir()
    write_volume(elsewhere / "x.nii.gz", np.zeros((2, 2, 2), np.uint8), Geometry(size=(2, 2, 2)))
    (allowed / "link.txt").symlink_to(elsewhere / "x.nii.gz")
    with recording_opens() as opened:
        (allowed / "link.txt").read_bytes()
    assert forbidden_opens(opened, root=tmp_path, allowed=[allowed], submission=allowed)
    if not sys.platform.startswith("linux"):
        return
    import SimpleITK as sitk

    watch = OpenWatch([elsewhere])
    try:
        with recording_opens() as opened:
            sitk.ReadImage(str(elsewhere / "x.nii.gz"))
        assert not opened  # invisible to the audit hook...
        assert str(elsewhere / "x.nii.gz") in watch.opened()  # ...but not to inotify
    finally:
        watch.close()


def test_the_memory_cap_catches_a_gigabyte_allocation(tmp_path: Path) -> None:
    """The harness itself: a child allocating 2 GB under the cap must fail, or the bomb tests prove nothing."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the address-space cap is measured through /proc")
    code = ("import resource, sys\n"
            "used = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize:')).split()[1]) * 1024\n"
            f"resource.setrlimit(resource.RLIMIT_AS, (used + {CHILD_MEMORY_HEADROOM}, ) * 2)\n"
            "try:\n    bytearray(2 * 1024**3)\nexcept MemoryError:\n    sys.exit(3)\n")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 3
