"""Submission validation from public information only.

``validate_submission`` checks, and reports *every* problem it finds (not just the first):

* the folder and its ``submission.csv`` (size, encoding, CSV syntax, exactly the schema's columns);
* ids: none missing, none extra, no duplicates, none empty (against ``public/test_manifest.json``);
* value columns: parseable, finite, within their allowed choices;
* path columns: relative, no ``..``, inside the folder after following symlinks, existing regular files with an
  accepted suffix and a sane size;
* with ``deep=True`` every prediction file is read and checked by the grader (decodable, size equal to the test
  image's and the header fields its ``header_rule`` checks too, integer labels from the allowed set, no NaN/inf,
  JSON structure). Header fields the official evaluation ignores may differ: they come back as ``warnings``.

Harmless formatting is accepted: a UTF-8 byte-order mark, CRLF line ends, quoted fields, any column order, blank
lines, and whitespace around cells (cells are stripped, so ``" c1 "`` is the id ``c1``).

What is an error (documented choice): anything above. Nothing is repaired: no resampling, no label remapping,
no guessing of box formats. Private labels are never read.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rexmle_grade.errors import InvalidSubmissionError
from rexmle_grade.grader import CaseInput, Grader, TestManifest, collect_case_warnings
from rexmle_grade.io import MAX_CSV_BYTES, MAX_FILE_BYTES, resolve_inside
from rexmle_grade.schema import SUBMISSION_CSV, ValueColumn

MAX_LISTED_PROBLEMS = 40
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class ValidationReport:
    ok: bool
    problems: list[str]
    n_rows: int = 0
    rows: list[dict[str, str]] = field(default_factory=list, repr=False)
    #: accepted departures worth knowing, e.g. prediction header fields that differ and are ignored when scoring
    warnings: list[str] = field(default_factory=list)

    def raise_if_invalid(self) -> None:
        if not self.ok:
            raise InvalidSubmissionError(self.problems)


def summarise(problems: Sequence[str]) -> list[str]:
    if len(problems) <= MAX_LISTED_PROBLEMS:
        return list(problems)
    return [*problems[:MAX_LISTED_PROBLEMS], f"... and {len(problems) - MAX_LISTED_PROBLEMS} more problems"]


def read_submission_csv(submission_dir: Path) -> list[dict[str, str]]:
    """Read ``submission.csv`` strictly (UTF-8, size limit, rectangular rows, unique header)."""
    if not submission_dir.is_dir():
        raise InvalidSubmissionError(f"submission folder {str(submission_dir)!r} does not exist or is not a folder")
    if not (submission_dir / SUBMISSION_CSV).exists():
        raise InvalidSubmissionError(f"{SUBMISSION_CSV} is missing from the submission folder {str(submission_dir)!r}")
    path = resolve_inside(submission_dir, SUBMISSION_CSV, what=SUBMISSION_CSV)
    size = path.stat().st_size
    if size > MAX_CSV_BYTES:
        raise InvalidSubmissionError(f"{SUBMISSION_CSV} is {size} bytes; the limit is {MAX_CSV_BYTES}")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidSubmissionError(f"{SUBMISSION_CSV} is not UTF-8 text: {exc}") from None
    reader = csv.reader(io.StringIO(text))
    try:
        table = [row for row in reader if any(cell.strip() for cell in row)]
    except csv.Error as exc:
        raise InvalidSubmissionError(f"{SUBMISSION_CSV} is not valid CSV: {exc}") from None
    if not table:
        raise InvalidSubmissionError(f"{SUBMISSION_CSV} is empty; it needs a header row and one row per test case")
    header = [h.strip() for h in table[0]]
    dupes = [h for h, n in Counter(header).items() if n > 1]
    if dupes:
        raise InvalidSubmissionError(f"{SUBMISSION_CSV} repeats header column(s) {dupes}")
    rows = []
    problems = []
    for lineno, raw in enumerate(table[1:], start=2):
        if len(raw) != len(header):
            problems.append(f"{SUBMISSION_CSV} line {lineno} has {len(raw)} fields; the header has {len(header)}")
            continue
        rows.append({h: v.strip() for h, v in zip(header, raw, strict=True)})
    if problems:
        raise InvalidSubmissionError(problems)
    if not rows:
        raise InvalidSubmissionError(f"{SUBMISSION_CSV} has a header ({', '.join(header)}) but no rows")
    return rows


def check_table(grader: Grader, rows: list[dict[str, str]], manifest: TestManifest) -> list[str]:
    """Columns, ids and value columns; returns the problems."""
    schema = grader.schema
    problems: list[str] = []
    header = list(rows[0].keys())
    missing_cols = [c for c in schema.column_names if c not in header]
    extra_cols = [c for c in header if c not in schema.column_names]
    if missing_cols:
        problems.append(f"missing column(s) {missing_cols}; expected exactly {schema.column_names}")
    if extra_cols:
        problems.append(f"unexpected column(s) {extra_cols}; expected exactly {schema.column_names}")
    if schema.id_column not in header:
        return problems
    ids = [r[schema.id_column] for r in rows]
    expected = set(manifest.ids)
    if any(not i for i in ids):
        problems.append(f"{sum(1 for i in ids if not i)} row(s) have an empty {schema.id_column}")
    dupes = sorted(i for i, n in Counter(ids).items() if n > 1 and i)
    if dupes:
        problems.append(f"duplicate {schema.id_column}(s): {_list(dupes)}")
    missing = [i for i in manifest.ids if i not in set(ids)]
    if missing:
        problems.append(f"{len(missing)} test id(s) missing: {_list(missing)}")
    extra = sorted({i for i in ids if i and i not in expected})
    if extra:
        problems.append(f"{len(extra)} id(s) are not test cases: {_list(extra)}")
    for col in schema.value_columns:
        if col.name in header:
            problems += _check_values(col, rows, schema.id_column)
    return problems


def _check_values(col: ValueColumn, rows: list[dict[str, str]], id_column: str) -> list[str]:
    problems = []
    for r in rows:
        value = r[col.name]
        where = f"{col.name} of {r[id_column]!r}"
        if col.choices is not None:
            if value not in col.choices:
                problems.append(f"{where} is {value!r}; expected one of {list(col.choices)}")
            continue
        if col.dtype is str:
            if not value:
                problems.append(f"{where} is empty")
            continue
        try:
            number = col.dtype(value)
        except ValueError:
            problems.append(f"{where} is {value!r}, not a {col.dtype.__name__}")
            continue
        if isinstance(number, float) and not math.isfinite(number):
            problems.append(f"{where} is {value!r}; values must be finite (no NaN or inf)")
    return problems


def check_paths(grader: Grader, rows: list[dict[str, str]], submission_dir: Path) -> list[str]:
    """Every path column: safe, existing, accepted suffix, size limit (no file content is read)."""
    from rexmle_grade.grader import check_suffix

    problems = []
    id_col = grader.schema.id_column
    for column in grader.schema.file_columns:
        seen: dict[Path, str] = {}
        for r in rows:
            if column.name not in r:
                continue
            case_id = r.get(id_col, "?")
            try:
                path = resolve_inside(submission_dir, r[column.name], what=f"{column.name} of {case_id!r}")
                check_suffix(path, column, case_id)
                size = path.stat().st_size
                if size > MAX_FILE_BYTES or size == 0:
                    raise InvalidSubmissionError(f"{column.name} of {case_id!r} has {size} bytes (empty or too big)")
            except InvalidSubmissionError as exc:
                problems += exc.problems
                continue
            if path in seen:
                problems.append(f"{column.name} of {case_id!r} names the same file as {seen[path]!r}")
            seen[path] = case_id
    return problems


def build_cases(rows: list[dict[str, str]], grader: Grader, manifest: TestManifest, submission_dir: Path,
                private_dir: Path, answers: dict[str, dict[str, str]] | None = None) -> list[CaseInput]:
    by_id = {r[grader.schema.id_column]: r for r in rows}
    return [
        CaseInput(case_id=i, row=by_id[i], submission_dir=submission_dir,
                  answer=(answers or {}).get(i, {}), private_dir=private_dir, geometry=manifest.geometry.get(i))
        for i in manifest.ids
    ]


def parallel_map(fn: Callable[[T], R], items: Sequence[T], workers: int = 1,
                 progress: Callable[[int, int], None] | None = None) -> Iterator[R]:
    """Map ``fn`` over ``items`` in order, in ``workers`` processes (1: in this process)."""
    total = len(items)
    if workers <= 1 or total <= 1:
        for n, item in enumerate(items, start=1):
            yield fn(item)
            if progress:
                progress(n, total)
        return
    with ProcessPoolExecutor(max_workers=min(workers, total)) as pool:
        for n, result in enumerate(pool.map(fn, items), start=1):
            yield result
            if progress:
                progress(n, total)


@dataclass(frozen=True)
class _DeepCheck:
    grader: Grader

    def __call__(self, case: CaseInput) -> tuple[list[str], list[str]]:
        """(problems, warnings) of one case."""
        with collect_case_warnings() as warnings:
            try:
                self.grader.check_case(case)
            except InvalidSubmissionError as exc:
                return exc.problems, warnings
        return [], warnings


def validate_submission(grader: Grader, submission_dir: str | Path, public_dir: str | Path, *, deep: bool = True,
                        workers: int = 1, progress: Callable[[int, int], None] | None = None) -> ValidationReport:
    """Validate a submission folder against a prepared task's public test manifest (see module docstring)."""
    submission_dir, public_dir = Path(submission_dir), Path(public_dir)
    manifest = TestManifest.read(public_dir)
    try:
        rows = read_submission_csv(submission_dir)
    except InvalidSubmissionError as exc:
        return ValidationReport(ok=False, problems=summarise(exc.problems))
    problems = check_table(grader, rows, manifest)
    problems += check_paths(grader, rows, submission_dir)
    warnings: list[str] = []
    if not problems and deep:
        cases = build_cases(rows, grader, manifest, submission_dir, private_dir=Path("/nonexistent-private"))
        for case_problems, case_warnings in parallel_map(_DeepCheck(grader), cases, workers, progress):
            problems += case_problems
            warnings += case_warnings
    return ValidationReport(ok=not problems, problems=summarise(problems), n_rows=len(rows), rows=rows,
                            warnings=summarise(warnings))


def _list(items: Iterable[Any], limit: int = 10) -> str:
    items = list(items)
    shown = ", ".join(map(str, items[:limit]))
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")
