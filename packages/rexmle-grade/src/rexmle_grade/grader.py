"""The grader contract, the grader registry, and the test manifest that links graders to prepared tasks.

A grader scores one prepared task. It reads three things:

* ``public/test_manifest.json`` (written by the task's ``prepare``): the test case ids and, for image tasks, each
  test image's geometry. Validation needs nothing else, so it never touches private labels.
* the submission folder: ``submission.csv`` + prediction files (see :mod:`rexmle_grade.schema`).
* ``private/answers.csv`` (written by ``prepare``): one row per test case, id column first, then the columns
  listed in :attr:`Grader.answer_columns` (paths relative to ``private/`` or values).

Scoring is split in two so cases run in parallel: :meth:`Grader.score_case` turns one case into a dict of
per-case numbers (and any statistics a dataset-level metric needs), :meth:`Grader.aggregate` turns all of them
into the leaderboard metrics.
"""

from __future__ import annotations

import csv
import importlib
import json
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import Enum
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from rexmle_grade.errors import InvalidSubmissionError, TaskDataMissingError, UnknownNameError
from rexmle_grade.io import HEADER_FIELDS, HEADER_TOLERANCES, Geometry, resolve_inside
from rexmle_grade.schema import FileColumn, SubmissionSchema

TEST_MANIFEST = "test_manifest.json"
ANSWERS_CSV = "answers.csv"
GRADERS_ENTRY_POINT_GROUP = "rexmle.graders"


class Direction(str, Enum):
    HIGHER_BETTER = "higher_better"
    LOWER_BETTER = "lower_better"


@dataclass(frozen=True)
class MetricSpec:
    """One metric a grader reports. ``ranked`` metrics are the leaderboard columns."""

    name: str
    direction: Direction
    description: str
    ranked: bool = True
    best: float | None = None  # the best attainable value, where one exists (1.0 for Dice, 0.0 for an error)


class HeaderUse(str, Enum):
    """What the official evaluation does with the header (spacing, origin, direction) of a prediction image."""

    IGNORES = "ignores"  # copies the ground truth's header onto the prediction (CopyInformation)
    CHECKS = "checks"  # compares (some of) it with the ground truth's and fails on a difference
    USES = "uses"  # computes with it (e.g. a voxel volume), so a forged header would change a score
    NOT_PUBLIC = "not public"  # no official evaluation code to follow
    NO_HEADER = "no header"  # 2-D pixel images, JSON documents or values: nothing physical to compare


@dataclass(frozen=True)
class HeaderRule:
    """How a grader treats prediction headers: a difference in a ``checked`` field rejects the prediction; one in
    another field is reported as a warning and the prediction is scored on the ground truth's grid."""

    official: HeaderUse
    checked: tuple[str, ...]
    why: str

    @property
    def ignored(self) -> tuple[str, ...]:
        return tuple(name for name in HEADER_FIELDS if name not in self.checked)

    @property
    def convention(self) -> str:
        """The rule as one line of a grader's conventions."""
        if self.official is HeaderUse.NO_HEADER:
            return f"Prediction headers: {self.why}"
        parts = ["a prediction of another size is rejected"]
        if self.checked:
            tolerances = ", ".join(f"{name} {HEADER_TOLERANCES[name]:g}" for name in self.checked)
            parts.append(f"a different {' or '.join(self.checked)} is rejected (tolerances: {tolerances})")
        if self.ignored:
            parts.append(f"a different {' or '.join(self.ignored)} is accepted with a warning naming the fields, and "
                         "the prediction is scored on the ground truth's grid")
        source = ("no official evaluation code is public" if self.official is HeaderUse.NOT_PUBLIC
                  else f"the official evaluation {self.official.value} them")
        return f"Prediction headers ({source}): {self.why} Here " + "; ".join(parts) + "."


#: rule of graders whose predictions are JSON documents or CSV values
NO_IMAGE_HEADER = HeaderRule(HeaderUse.NO_HEADER, (), "none read (predictions are JSON documents or CSV values).")
#: rule of graders whose predictions are 2-D pixel images
IMAGE_2D_HEADER = HeaderRule(HeaderUse.NO_HEADER, (), "none read (2-D pixel images carry no spacing, origin or "
                                                      "direction the evaluation uses); only the size must equal the "
                                                      "test image's.")
#: rule of graders whose official evaluation copies the ground truth's header onto the prediction
COPIED_HEADER = HeaderRule(HeaderUse.IGNORES, (), "the official code copies the ground truth's spacing, origin and "
                                                  "direction onto the prediction (CopyInformation) and scores any "
                                                  "prediction of the right size.")

_CASE_WARNINGS: ContextVar[list[str] | None] = ContextVar("rexmle_case_warnings", default=None)


def warn_case(message: str) -> None:
    """Record a warning about the case being checked or scored (e.g. a header difference the grader ignores); it
    reaches the validation result, the grade result and the report (see :func:`collect_case_warnings`)."""
    found = _CASE_WARNINGS.get()
    if found is not None:
        found.append(message)


@contextmanager
def collect_case_warnings() -> Iterator[list[str]]:
    """Collect the :func:`warn_case` messages of the code run inside (one case at a time, in any process)."""
    found: list[str] = []
    token = _CASE_WARNINGS.set(found)
    try:
        yield found
    finally:
        _CASE_WARNINGS.reset(token)


@dataclass(frozen=True)
class TestManifest:
    """Public facts about the test set: ids (in order) and, for image tasks, each test image's geometry."""

    __test__ = False  # not a pytest test class

    ids: tuple[str, ...]
    geometry: Mapping[str, Geometry] = field(default_factory=dict)

    def write(self, public_dir: Path) -> Path:
        path = public_dir / TEST_MANIFEST
        data = {"ids": list(self.ids), "geometry": {k: g.to_json() for k, g in self.geometry.items()}}
        path.write_text(json.dumps(data, indent=1) + "\n")
        return path

    def geometry_of(self, case_id: str) -> Geometry:
        """The test image geometry of ``case_id``; a manifest without it means a broken preparation."""
        geometry = self.geometry.get(case_id)
        if geometry is None:
            raise TaskDataMissingError(f"public/{TEST_MANIFEST} has no image geometry for test case {case_id!r}",
                                       hint="re-run `rexmle prepare TASK --force`")
        return geometry

    @classmethod
    def read(cls, public_dir: Path) -> TestManifest:
        path = public_dir / TEST_MANIFEST
        if not path.is_file():
            raise TaskDataMissingError(
                f"{path} is missing: the task is not prepared", hint="run `rexmle prepare TASK` first"
            )
        data = json.loads(path.read_text())
        return cls(ids=tuple(data["ids"]),
                   geometry={k: Geometry.from_json(v) for k, v in (data.get("geometry") or {}).items()})


@dataclass(frozen=True)
class CaseInput:
    """Everything :meth:`Grader.score_case` needs for one test case (picklable: paths and strings only)."""

    case_id: str
    row: Mapping[str, str]  # the submission.csv row
    submission_dir: Path
    answer: Mapping[str, str]  # the answers.csv row
    private_dir: Path
    geometry: Geometry | None  # the test image's geometry (None for non-image tasks)

    def prediction_path(self, column: FileColumn) -> Path:
        """The resolved, safety-checked path of this case's prediction file for ``column``."""
        path = resolve_inside(self.submission_dir, self.row[column.name], what=f"{column.name} of {self.case_id!r}")
        check_suffix(path, column, self.case_id)
        return path

    def answer_path(self, column: str) -> Path:
        return self.private_dir / self.answer[column]


def check_suffix(path: Path, column: FileColumn, case_id: str) -> None:
    from rexmle_grade.io import full_suffix

    name = path.name.lower()
    if not any(name.endswith(s) for s in column.suffixes):
        raise InvalidSubmissionError(
            f"{column.name} of {case_id!r} is {path.name!r} ({full_suffix(path) or 'no suffix'}); "
            f"expected one of {', '.join(column.suffixes)}"
        )


class Grader(ABC):
    """Base class of the per-challenge graders (one instance per challenge id)."""

    grader_id: str
    title: str
    schema: SubmissionSchema
    metrics: tuple[MetricSpec, ...]
    answer_columns: tuple[str, ...]
    #: documented choices and deliberate departures from the original evaluation, shown in descriptions/reports
    conventions: tuple[str, ...] = ()
    #: where the metric definitions come from (repository @ commit, or page)
    reference: str = ""
    #: what the official evaluation does with prediction headers, and so what this grader checks
    header_rule: HeaderRule = NO_IMAGE_HEADER
    #: the metric an agent should report on its own validation cases (see :attr:`validation_metric`); None: the
    #: first ranked metric
    primary_metric: str | None = None

    # ---- metric facts -------------------------------------------------------------------------------------
    @property
    def ranked_metrics(self) -> list[MetricSpec]:
        return [m for m in self.metrics if m.ranked]

    @property
    def directions(self) -> dict[str, Direction]:
        return {m.name: m.direction for m in self.metrics}

    @property
    def validation_metric(self) -> MetricSpec:
        """The one metric a developing agent measures on its held-out training cases and compares its solutions
        by: :attr:`primary_metric`, else the first ranked metric (the leaderboard itself may rank by several)."""
        name = self.primary_metric or self.ranked_metrics[0].name
        for metric in self.metrics:
            if metric.name == name:
                return metric
        raise UnknownNameError(f"primary metric of grader {self.grader_id!r}", name, [m.name for m in self.metrics])

    # ---- validation hooks -----------------------------------------------------------------------------------
    def check_case(self, case: CaseInput) -> None:
        """Deep check of one case's prediction files (read them, check content); raise InvalidSubmissionError.

        The default loads every file column through :meth:`load_prediction`. Graders override
        :meth:`load_prediction` (or this) for JSON structures and content rules.
        """
        for column in self.schema.file_columns:
            self.load_prediction(case, column)

    @abstractmethod
    def load_prediction(self, case: CaseInput, column: FileColumn) -> Any:
        """Read and fully check one prediction file; raise InvalidSubmissionError with a clear message."""

    # ---- scoring --------------------------------------------------------------------------------------------
    @abstractmethod
    def score_case(self, case: CaseInput) -> dict[str, Any]:
        """Per-case numbers (JSON-serialisable) plus whatever :meth:`aggregate` needs."""

    @abstractmethod
    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        """Dataset-level metrics (every name in :attr:`metrics`) from the per-case dicts, in test-manifest order."""

    # ---- reference submissions ---------------------------------------------------------------------------
    @abstractmethod
    def write_gold_submission(self, private_dir: Path, public_dir: Path, dest: Path) -> None:
        """Write a submission made from the private answers (it must grade at the best value)."""

    @abstractmethod
    def write_sample_submission(self, public_dir: Path, dest: Path) -> None:
        """Write a trivial but valid submission from public information only (e.g. empty masks)."""

    # ---- helpers for subclasses -------------------------------------------------------------------------
    def describe_metrics_markdown(self) -> str:
        lines = ["| metric | better | ranked | definition |", "|---|---|---|---|"]
        for m in self.metrics:
            better = "higher" if m.direction is Direction.HIGHER_BETTER else "lower"
            definition = m.description.replace("|", "\\|")  # a literal | would end the table cell
            lines.append(f"| `{m.name}` | {better} | {'yes' if m.ranked else 'no'} | {definition} |")
        return "\n".join(lines)


def write_submission_csv(dest: Path, schema: SubmissionSchema, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write ``submission.csv`` with the schema's columns (used by reference submissions and agents)."""
    from rexmle_grade.schema import SUBMISSION_CSV

    dest.mkdir(parents=True, exist_ok=True)
    path = dest / SUBMISSION_CSV
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=schema.column_names)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row[k] for k in schema.column_names})
    return path


def read_answers(private_dir: Path, grader: Grader) -> dict[str, dict[str, str]]:
    """``private/answers.csv`` as {case_id: row}."""
    path = private_dir / ANSWERS_CSV
    if not path.is_file():
        raise TaskDataMissingError(f"{path} is missing: the task's private answers are not prepared",
                                   hint="run `rexmle prepare TASK` first")
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    id_col = grader.schema.id_column
    missing = [c for c in (id_col, *grader.answer_columns) if rows and c not in rows[0]]
    if missing:
        raise TaskDataMissingError(f"{path} lacks columns {missing}; re-run `rexmle prepare TASK --force`")
    return {r[id_col]: r for r in rows}


def answer_cases(grader: Grader, private_dir: Path, public_dir: Path) -> list[CaseInput]:
    """One answer-only :class:`CaseInput` per test id, in manifest order (for writing gold submissions)."""
    manifest = TestManifest.read(public_dir)
    answers = read_answers(private_dir, grader)
    missing = [i for i in manifest.ids if i not in answers]
    if missing:
        raise TaskDataMissingError(f"private/{ANSWERS_CSV} has no row for test id(s) {missing[:10]}",
                                   hint="re-run `rexmle prepare TASK --force`")
    return [CaseInput(case_id=i, row={}, submission_dir=private_dir, answer=answers[i], private_dir=private_dir,
                      geometry=manifest.geometry.get(i)) for i in manifest.ids]


# ---- registry -------------------------------------------------------------------------------------------
_REGISTRY: dict[str, Callable[[], Grader]] = {}
_LOADED = False


def register_grader(grader_id: str) -> Callable[[Callable[[], Grader]], Callable[[], Grader]]:
    """Register a grader factory under ``grader_id`` (a challenge id). Used as a decorator."""

    def deco(factory: Callable[[], Grader]) -> Callable[[], Grader]:
        if grader_id in _REGISTRY and _REGISTRY[grader_id] is not factory:
            raise ValueError(f"grader {grader_id!r} registered twice")
        _REGISTRY[grader_id] = factory
        return factory

    return deco


def _load_all() -> None:
    global _LOADED
    if _LOADED:
        return
    import rexmle_grade.graders as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{info.name}")
    for ep in entry_points(group=GRADERS_ENTRY_POINT_GROUP):
        ep.load()  # third-party modules register themselves on import
    _LOADED = True


def grader_ids() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def get_grader(grader_id: str) -> Grader:
    """The grader for a challenge id; an unknown id raises UnknownNameError naming the close matches."""
    _load_all()
    try:
        factory = _REGISTRY[grader_id]
    except KeyError:
        raise UnknownNameError("grader", grader_id, _REGISTRY) from None
    return factory()
