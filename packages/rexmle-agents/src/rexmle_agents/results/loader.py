"""The one typed loader of run folders, shared by ``rexmle report``, ``rexmle view``, ``rexmle runs`` and notebooks.

:func:`load_runs` takes run folders, group folders or a runs root and returns :class:`RunRecord` s whose
``spec.json``, ``status.json`` and ``grade.json`` were validated against the run format
(:mod:`rexmle_agents.results.records`). The journal is read only when asked for (:meth:`RunRecord.journal`), so a
report over a thousand runs reads three small files per run.

What is refused and what is read:

* a folder whose ``spec.json`` carries another ``format_version`` (or none: written before versions existed) is
  refused with a message naming the version it has and the one this rexmle reads; so is an unreadable spec;
* a run folder of format 1 written before the format was published is read: ``model_call`` times given as ISO
  strings become Unix seconds, a ``status.json`` without hardware or usage leaves those unknown, a ``grade.json``
  without ``synthetic`` takes it from the task's prepared data when that is still there;
* the data variant (real, synthetic-easy, synthetic-realistic) is the spec's; a spec written before variants were
  recorded takes it from ``grade.json``'s labels, else from whether the data was synthetic: ``real``, or
  ``synthetic-unknown`` (its difficulty was not recorded and is never guessed from the data folder, which may have
  been prepared again at another difficulty since), or ``unknown``;
* a record or journal line that breaks the schema is kept out and listed in :attr:`RunRecord.problems`, never
  guessed at, so a report says what it could not use;
* ``cluster.json`` (runs of the SLURM executor: their jobs as SLURM reported them) is read when present.

Journals are scanned with ``mmap``: a scaffold saves its whole search tree after every node (``agent_state``), so
a long run's journal is mostly those lines; only the last one per key is parsed.
"""

from __future__ import annotations

import csv
import functools
import json
import mmap
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rexmle_agents.harness.spec import REAL_VARIANT, RUN_FORMAT_VERSION, UNKNOWN_VARIANT, RunSpec, data_kind_of
from rexmle_agents.results.records import (
    EVENT_ADAPTER,
    EVENT_KINDS,
    PENDING_STATUS,
    RUN_STATES,
    ClusterRecord,
    RunStatus,
)
from rexmle_grade.errors import RexmleError, UserInputError
from rexmle_grade.report import ReportEntry

SPEC_FILE, STATUS_FILE, JOURNAL_FILE, GRADE_FILE = "spec.json", "status.json", "journal.jsonl", "grade.json"
CLUSTER_FILE = "cluster.json"  # only runs of the SLURM executor have one
SYNTHETIC_UNKNOWN_VARIANT = "synthetic-unknown"  # synthetic data of a difficulty the run folder does not record
# journal lines are written by json.dumps (", " and ": ") or by pydantic (compact); both forms are recognised
_STATE_PREFIXES = (b'{"kind": "agent_state"', b'{"kind":"agent_state"')
_STATE_KEY = re.compile(rb'"key":\s?"((?:[^"\\]|\\.)*)"')
_DELTA = re.compile(rb'"state":\s?\{"format":\s?\d+,\s?"delta":\s?true')
MAX_PROBLEMS_PER_FILE = 20


class RunFormatError(UserInputError):
    """A folder that is not a run folder this rexmle can read (no spec, another run format, a broken spec)."""


@dataclass(frozen=True)
class RawEvent:
    """A journal line that is no known event of this run format (kept for display, never interpreted)."""

    kind: str
    time: float | None
    data: dict[str, Any]


@dataclass
class JournalScan:
    """A journal read once: typed events in order, and the last saved agent state per key (parsed on demand)."""

    path: Path
    events: list[Any]
    problems: list[str]
    # key -> the spans (offset, end, line number) of its last full state and every later delta
    _state_spans: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    _states: dict[str, list[Any]] = field(default_factory=dict)

    def of_kind(self, *kinds: str) -> list[Any]:
        return [e for e in self.events if getattr(e, "kind", None) in kinds]

    @property
    def state_keys(self) -> list[str]:
        return list(self._state_spans)

    def state(self, key: str) -> Any:
        """The last ``agent_state`` saved under ``key`` (None if never saved)."""
        states = self.states(key)
        return states[-1] if states else None

    def states(self, key: str) -> list[Any]:
        """The states saved under ``key`` from its last full state on (a delta-saving agent folds them: the
        scaffolds' :meth:`Tree.from_states`); parsed on demand."""
        if key in self._states:
            return self._states[key]
        values = []
        with self.path.open("rb") as handle:
            for start, end, number in self._state_spans.get(key, []):
                handle.seek(start)
                raw = handle.read(end - start)
                try:
                    values.append(EVENT_ADAPTER.validate_json(raw).state)
                except ValidationError as exc:
                    self.problems.append(f"{self.path.name} line {number}: agent_state does not match the run "
                                         f"format: {_first_error(exc)}")
        self._states[key] = values
        return values


def scan_journal(path: Path) -> JournalScan:
    """Read ``journal.jsonl``; a torn last line (a crash mid-write) is skipped, as the harness itself does."""
    scan = JournalScan(path=path, events=[], problems=[])
    if not path.is_file() or path.stat().st_size == 0:
        return scan
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        size = len(data)
        start, number = 0, 0
        while start < size:
            end = data.find(b"\n", start)
            torn = end == -1
            end = size if torn else end
            number += 1
            head = data[start:start + 300]
            if head.startswith(_STATE_PREFIXES) and not torn:
                match = _STATE_KEY.search(head)
                if match is not None:
                    key = json.loads(b'"' + match.group(1) + b'"')
                    if _DELTA.search(head) and key in scan._state_spans:
                        scan._state_spans[key].append((start, end, number))
                    else:  # a full state: what came before it is not needed
                        scan._state_spans[key] = [(start, end, number)]
                    start = end + 1
                    continue
            line = data[start:end]
            start = end + 1
            if line.strip():
                _add_event(scan, line, number, torn)
    return scan


def _add_event(scan: JournalScan, line: bytes, number: int, torn: bool) -> None:
    try:
        raw = json.loads(line)
    except ValueError as exc:
        if not torn:
            _problem(scan.problems, f"{scan.path.name} line {number} is not JSON ({exc})")
        return
    kind = raw.get("kind") if isinstance(raw, dict) else None
    if kind not in EVENT_KINDS:
        _problem(scan.problems, f"{scan.path.name} line {number}: unknown event kind {kind!r} "
                                f"(run format {RUN_FORMAT_VERSION} knows {len(EVENT_KINDS)} kinds)")
        if isinstance(raw, dict):
            scan.events.append(RawEvent(kind=str(kind), time=_float_or_none(raw.get("time")), data=raw))
        return
    try:
        scan.events.append(EVENT_ADAPTER.validate_python(raw))
    except ValidationError as exc:
        _problem(scan.problems, f"{scan.path.name} line {number}: {kind} does not match the run format: "
                                f"{_first_error(exc)}")
        scan.events.append(RawEvent(kind=kind, time=_float_or_none(raw.get("time")), data=raw))


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _problem(problems: list[str], message: str) -> None:
    if len(problems) < MAX_PROBLEMS_PER_FILE:
        problems.append(message)
    elif len(problems) == MAX_PROBLEMS_PER_FILE:
        problems.append("(further problems not listed)")


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "record"
    return f"{where}: {first['msg']} ({exc.error_count()} problem(s))"


# ---------------------------------------------------------------------------------------------------------------
# one run


@dataclass
class RunRecord:
    """One run folder as read: its spec, status and grade (validated), the data kind, and what could not be used."""

    run_dir: Path
    spec: RunSpec
    status: RunStatus
    grade: ReportEntry | None
    synthetic: bool | None  # None: unknown (an older grade.json, and the task's data is gone)
    variant: str = UNKNOWN_VARIANT  # real, synthetic-easy, synthetic-realistic, synthetic-unknown or unknown
    problems: list[str] = field(default_factory=list)
    cluster: ClusterRecord | None = None  # the run's SLURM jobs (cluster.json), None for runs of other executors
    _journal: JournalScan | None = None

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    @property
    def group(self) -> str:
        return self.run_dir.parent.name

    @property
    def data_kind(self) -> str:
        return data_kind_of(self.variant)

    def journal(self) -> JournalScan:
        if self._journal is None:
            self._journal = scan_journal(self.run_dir / JOURNAL_FILE)
            self.problems += self._journal.problems
        return self._journal


def load_run(run_dir: str | Path) -> RunRecord:
    """Read one run folder; raises :class:`RunFormatError` for a folder this rexmle cannot read."""
    run_dir = Path(run_dir)
    spec = _read_spec(run_dir)
    problems: list[str] = []
    status = _read_status(run_dir / STATUS_FILE, problems)
    grade = _read_grade(run_dir / GRADE_FILE, problems)
    synthetic = grade.synthetic if grade is not None and grade.synthetic is not None else _prepared_synthetic(spec)
    variant = run_variant(spec, grade, synthetic)
    if variant != UNKNOWN_VARIANT and synthetic is None:
        synthetic = variant != REAL_VARIANT
    return RunRecord(run_dir=run_dir, spec=spec, status=status, grade=grade, synthetic=synthetic, variant=variant,
                     problems=problems, cluster=_read_cluster(run_dir / CLUSTER_FILE, problems))


def run_variant(spec: RunSpec, grade: ReportEntry | None, synthetic: bool | None) -> str:
    """The data variant a run used (see the module docstring for folders written before it was recorded)."""
    if spec.data_variant != UNKNOWN_VARIANT:
        return spec.data_variant
    labelled = grade.labels.get("data_variant") if grade is not None else None
    if labelled and labelled != UNKNOWN_VARIANT:
        return labelled
    return UNKNOWN_VARIANT if synthetic is None else SYNTHETIC_UNKNOWN_VARIANT if synthetic else REAL_VARIANT


def _read_spec(run_dir: Path) -> RunSpec:
    path = run_dir / SPEC_FILE
    if not path.is_file():
        raise RunFormatError(f"{run_dir} is not a run folder (no {SPEC_FILE})",
                             hint="pass runs/<group>/<run_id>/, a group folder runs/<group>/ or the runs folder")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise RunFormatError(f"{path} cannot be read as JSON: {exc}",
                             hint="restore the file, or leave this folder out of the report") from None
    found = raw.get("format_version") if isinstance(raw, dict) else None
    if found != RUN_FORMAT_VERSION:
        written = "before run formats were versioned" if found is None else f"in run format {found!r}"
        versions = raw.get("rexmle_versions", {}) if isinstance(raw, dict) else {}
        made_by = versions.get("rexmle-agents") if isinstance(versions, dict) else None
        raise RunFormatError(
            f"{run_dir} was written {written}; this rexmle-agents reads run format {RUN_FORMAT_VERSION}",
            hint=(f"read it with rexmle-agents {made_by}, which wrote it, " if made_by else "read it with the "
                  "rexmle-agents that wrote it, ") + "or run it again; nothing in it is guessed at",
        )
    try:
        return RunSpec.model_validate(raw)
    except ValidationError as exc:
        raise RunFormatError(f"{path} does not match the run format: {_first_error(exc)}",
                             hint="see the published schema spec.schema.json (rexmle_agents/results/schema/)") from None


def _read_status(path: Path, problems: list[str]) -> RunStatus:
    if not path.is_file():
        return PENDING_STATUS
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        problems.append(f"{STATUS_FILE} is not JSON ({exc}); the run counts as pending")
        return PENDING_STATUS
    try:
        return RunStatus.model_validate(raw)
    except ValidationError as exc:
        problems.append(f"{STATUS_FILE} does not match the run format ({_first_error(exc)}); only its state is used")
        state = raw.get("state") if isinstance(raw, dict) else None
        return RunStatus(state=state if state in RUN_STATES else "pending")


def _read_grade(path: Path, problems: list[str]) -> ReportEntry | None:
    if not path.is_file():
        return None
    try:
        return ReportEntry.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        problems.append(f"{GRADE_FILE} does not match the run format ({_first_error(exc)}); the run counts as "
                        "ungraded")
        return None


def _read_cluster(path: Path, problems: list[str]) -> ClusterRecord | None:
    if not path.is_file():
        return None
    try:
        return ClusterRecord.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        problems.append(f"{CLUSTER_FILE} does not match the run format ({_first_error(exc)}); the run's SLURM jobs "
                        "are not shown")
        return None


def _prepared_synthetic(spec: RunSpec) -> bool | None:
    """Whether the task data a run used is synthetic, from the data folder (for grades written before they said)."""
    if not spec.data_root:
        return None
    return _prepared_synthetic_at(spec.data_root, spec.task_id)


@functools.cache
def _prepared_synthetic_at(data_root: str, task_id: str) -> bool | None:
    try:
        from rexmle_tasks.pipeline import prepared_info, task_dirs
        from rexmle_tasks.registry import get_task

        info = prepared_info(task_dirs(get_task(task_id), data_root))
    except (RexmleError, OSError):  # an unknown task or a broken data folder only means "unknown" here
        return None
    return None if info is None else info.synthetic


# ---------------------------------------------------------------------------------------------------------------
# many runs


@dataclass
class RunSet:
    """Runs read from some folders, and the folders that were refused (with why)."""

    sources: list[Path]
    runs: list[RunRecord]
    refused: list[tuple[Path, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.runs)


def find_run_dirs(path: Path) -> list[Path]:
    """The run folders at ``path``: the folder itself, its children (a group) or its grandchildren (a runs root)."""
    if (path / SPEC_FILE).is_file():
        return [path]
    children = sorted(p.parent for p in path.glob(f"*/{SPEC_FILE}"))
    if children:
        return children
    return sorted(p.parent for p in path.glob(f"*/*/{SPEC_FILE}"))


def load_runs(paths: Iterable[str | Path], *, strict: bool = False) -> RunSet:
    """Every run under ``paths`` (run folders, group folders, runs roots). A folder that cannot be read is listed
    in :attr:`RunSet.refused`; ``strict=True`` raises its error instead."""
    sources = [Path(p) for p in paths]
    found: list[Path] = []
    for source in sources:
        if not source.is_dir():
            raise UserInputError(f"{source} is not a folder", hint="pass a run folder, a group folder or runs/")
        dirs = find_run_dirs(source)
        if not dirs:
            raise UserInputError(f"no run folders under {source}",
                                 hint="start runs with `rexmle run`; run folders hold a spec.json")
        found += dirs
    runs: list[RunRecord] = []
    refused: list[tuple[Path, str]] = []
    for run_dir in dict.fromkeys(p.resolve() for p in found):
        try:
            runs.append(load_run(run_dir))
        except RunFormatError as exc:
            if strict:
                raise
            refused.append((run_dir, exc.message + (f" ({exc.hint})" if exc.hint else "")))
    return RunSet(sources=sources, runs=runs, refused=refused)


# ---------------------------------------------------------------------------------------------------------------
# what a task is, for tables: competition (the bootstrap's top level), type, dimension, board


@dataclass(frozen=True)
class TaskFacts:
    task_id: str
    competition: str
    task_type: str
    dim: str
    board_rows: int | None  # None: the task has no human leaderboard
    board_teams: int | None
    board_phase: str = ""
    board_team: str = ""  # the team of a board whose every row is one team's


@functools.cache
def task_facts(task_id: str) -> TaskFacts:
    """From the installed task registry (the board's rows read from its CSV, without loading any grader); a task it
    does not know (a removed plug-in) stands alone."""
    try:
        from rexmle_tasks.registry import get_task

        task = get_task(task_id)
    except RexmleError:  # a task the registry no longer knows (a removed plug-in) stands alone
        return TaskFacts(task_id=task_id, competition=task_id, task_type="", dim="", board_rows=None,
                         board_teams=None)
    info = task.meta.leaderboard
    rows: list[dict[str, str]] = []
    if info is not None and (task.folder / info.file).is_file():
        with (task.folder / info.file).open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    teams = sorted({r.get("team", "") for r in rows})
    return TaskFacts(task_id=task_id, competition=task.meta.competition, task_type=task.meta.task_type,
                     dim=task.meta.dim, board_rows=len(rows) or None, board_teams=len(teams) or None,
                     board_phase="" if info is None else info.phase, board_team=teams[0] if len(teams) == 1 else "")
