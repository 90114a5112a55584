"""Validation behaviours with a small CSV-and-JSON grader defined here: every problem is listed (not the first only),
each kind of problem is named precisely, harmless formatting is accepted, and deep checks run only on a clean table."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from rexmle_grade import validation
from rexmle_grade.errors import InvalidSubmissionError
from rexmle_grade.grader import CaseInput, Direction, Grader, MetricSpec, TestManifest, warn_case
from rexmle_grade.io import Geometry
from rexmle_grade.schema import FileColumn, FileKind, SubmissionSchema, ValueColumn
from rexmle_grade.validation import (
    MAX_LISTED_PROBLEMS,
    ValidationReport,
    build_cases,
    check_paths,
    check_table,
    parallel_map,
    read_submission_csv,
    summarise,
    validate_submission,
)

HEADER = "case_id,box_path,score,count,grade,note"


class JsonGrader(Grader):
    """One JSON file per case ({"x": number}), a float, an int, a choice and a free-text column."""

    grader_id = "json-toy"
    title = "json toy"
    schema = SubmissionSchema(
        id_column="case_id",
        columns=(
            FileColumn("box_path", FileKind.JSON, "boxes/{id}.json", (".json",), "a box", match_geometry=False),
            ValueColumn("score", float, "a score"),
            ValueColumn("count", int, "a count"),
            ValueColumn("grade", str, "a grade", choices=("low", "high")),
            ValueColumn("note", str, "a note"),
        ),
    )
    metrics = (MetricSpec("score", Direction.HIGHER_BETTER, "score"),)

    def load_prediction(self, case: CaseInput, column: FileColumn) -> Any:
        data = json.loads(case.prediction_path(column).read_text())
        if not isinstance(data.get("x"), (int, float)):
            raise InvalidSubmissionError(f"{column.name} of {case.case_id!r} must hold a number x")
        if data["x"] < 0:
            warn_case(f"{case.case_id}: negative x accepted")
        return data

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        raise NotImplementedError

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        raise NotImplementedError

    def write_gold_submission(self, private_dir: Path, public_dir: Path, dest: Path) -> None:
        raise NotImplementedError

    def write_sample_submission(self, public_dir: Path, dest: Path) -> None:
        raise NotImplementedError


@pytest.fixture()
def public(tmp_path: Path) -> Path:
    folder = tmp_path / "public"
    folder.mkdir()
    TestManifest(ids=("c1", "c2")).write(folder)
    return folder


def submission(folder: Path, lines: Sequence[str], boxes: Mapping[str, str] | None = None) -> Path:
    """A submission folder with ``submission.csv`` made of ``lines`` and the given box files (name -> text)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "boxes").mkdir(exist_ok=True)
    for name, text in (boxes if boxes is not None else {"c1": '{"x": 1}', "c2": '{"x": 2}'}).items():
        (folder / "boxes" / f"{name}.json").write_text(text)
    (folder / "submission.csv").write_text("\n".join(lines) + "\n")
    return folder


GOOD = [HEADER, "c1,boxes/c1.json,0.5,3,low,first", "c2,boxes/c2.json,1.5,4,high,second"]


def test_a_clean_submission_is_valid_and_keeps_its_rows(public: Path, tmp_path: Path) -> None:
    report = validate_submission(JsonGrader(), submission(tmp_path / "sub", GOOD), public)
    assert report.ok and report.problems == [] and report.warnings == []
    assert report.n_rows == 2 and [r["case_id"] for r in report.rows] == ["c1", "c2"]
    report.raise_if_invalid()  # a valid report raises nothing


def test_an_invalid_report_raises_with_its_problems() -> None:
    with pytest.raises(InvalidSubmissionError) as caught:
        ValidationReport(ok=False, problems=["a", "b"]).raise_if_invalid()
    assert caught.value.problems == ["a", "b"]


def test_problems_beyond_the_listing_limit_are_counted_not_listed() -> None:
    exactly = [f"p{i}" for i in range(MAX_LISTED_PROBLEMS)]
    assert summarise(exactly) == exactly
    over = [*exactly, "one more", "and another"]
    assert summarise(over) == [*exactly, "... and 2 more problems"]


def test_harmless_formatting_is_accepted(tmp_path: Path) -> None:
    folder = tmp_path / "sub"
    folder.mkdir()
    text = "\ufeff" + HEADER + "\r\n\r\n c1 ,boxes/c1.json, 0.5 ,3,low,x\r\n  ,  ,  ,  ,  ,  \r\n"
    (folder / "submission.csv").write_bytes(text.encode("utf-8"))
    rows = read_submission_csv(folder)
    assert rows == [{"case_id": "c1", "box_path": "boxes/c1.json", "score": "0.5", "count": "3", "grade": "low",
                     "note": "x"}]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "is empty; it needs a header row"),
        (b"\xff\xfe\x00bad", "is not UTF-8 text"),
        (b"a,b,a\n1,2,3\n", "repeats header column(s) ['a']"),
        (b"a,b\n", "has a header (a, b) but no rows"),
        (("a\n" + "x" * 200_000 + "\n").encode(), "is not valid CSV"),
    ],
)
def test_unreadable_csv_files_are_named_precisely(tmp_path: Path, content: bytes, expected: str) -> None:
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "submission.csv").write_bytes(content)
    with pytest.raises(InvalidSubmissionError) as caught:
        read_submission_csv(folder)
    assert expected in caught.value.problems[0]


def test_every_ragged_row_is_listed(tmp_path: Path) -> None:
    folder = submission(tmp_path / "sub", ["a,b", "1,2", "3", "4,5,6", "7,8"])
    with pytest.raises(InvalidSubmissionError) as caught:
        read_submission_csv(folder)
    assert caught.value.problems == ["submission.csv line 3 has 1 fields; the header has 2",
                                     "submission.csv line 4 has 3 fields; the header has 2"]


def test_a_csv_over_the_size_limit_is_rejected_before_reading(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    folder = submission(tmp_path / "sub", GOOD)
    size = (folder / "submission.csv").stat().st_size
    monkeypatch.setattr(validation, "MAX_CSV_BYTES", size)
    assert len(read_submission_csv(folder)) == 2  # exactly at the limit is fine
    monkeypatch.setattr(validation, "MAX_CSV_BYTES", size - 1)
    with pytest.raises(InvalidSubmissionError, match=f"is {size} bytes; the limit is {size - 1}"):
        read_submission_csv(folder)


def test_a_missing_folder_or_csv_is_one_problem(public: Path, tmp_path: Path) -> None:
    gone = validate_submission(JsonGrader(), tmp_path / "gone", public)
    assert not gone.ok and gone.n_rows == 0 and len(gone.problems) == 1 and "is not a folder" in gone.problems[0]
    (tmp_path / "empty").mkdir()
    empty = validate_submission(JsonGrader(), tmp_path / "empty", public)
    assert empty.problems == [f"submission.csv is missing from the submission folder {str(tmp_path / 'empty')!r}"]


def rows_of(*lines: str, header: str = HEADER) -> list[dict[str, str]]:
    names = header.split(",")
    return [dict(zip(names, line.split(","), strict=True)) for line in lines]


MANIFEST = TestManifest(ids=("c1", "c2", "c3"))


def test_column_and_id_problems_are_all_reported_together() -> None:
    header = "case_id,box_path,score,count,grade,extra"  # note missing, extra unexpected
    rows = rows_of("c1,b,1,1,low,x", "c1,b,1,1,low,x", ",b,1,1,low,x", "zz,b,1,1,low,x", "aa,b,1,1,low,x",
                   header=header)
    problems = check_table(JsonGrader(), rows, MANIFEST)
    assert problems == [
        "missing column(s) ['note']; expected exactly ['case_id', 'box_path', 'score', 'count', 'grade', 'note']",
        "unexpected column(s) ['extra']; expected exactly ['case_id', 'box_path', 'score', 'count', 'grade', "
        "'note']",
        "1 row(s) have an empty case_id",
        "duplicate case_id(s): c1",
        "2 test id(s) missing: c2, c3",
        "2 id(s) are not test cases: aa, zz",
    ]


def test_without_an_id_column_only_the_columns_are_reported() -> None:
    rows = rows_of("b,1,1,low,x", header="box_path,score,count,grade,note")
    assert check_table(JsonGrader(), rows, MANIFEST) == [
        "missing column(s) ['case_id']; expected exactly ['case_id', 'box_path', 'score', 'count', 'grade', "
        "'note']"]


def test_value_columns_are_checked_by_type_and_choice() -> None:
    rows = rows_of("c1,b,inf,2.5,medium,", "c2,b,x,7,high,ok", "c3,b,-1e3,-2,low,fine")
    assert check_table(JsonGrader(), rows, MANIFEST) == [
        "score of 'c1' is 'inf'; values must be finite (no NaN or inf)",
        "score of 'c2' is 'x', not a float",
        "count of 'c1' is '2.5', not a int",
        "grade of 'c1' is 'medium'; expected one of ['low', 'high']",
        "note of 'c1' is empty",
    ]


def test_long_id_lists_are_shortened_with_a_count() -> None:
    manifest = TestManifest(ids=tuple(f"c{i:02d}" for i in range(13)))
    problems = check_table(JsonGrader(), rows_of("c00,b,1,1,low,x"), manifest)
    assert problems == ["12 test id(s) missing: c01, c02, c03, c04, c05, c06, c07, c08, c09, c10, ... (2 more)"]


def test_file_columns_must_name_distinct_non_empty_files_of_a_sane_size(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    folder = submission(tmp_path / "sub", GOOD, boxes={"c1": '{"x": 1}', "c2": "", "c3": '{"x": 12345}'})
    (folder / "boxes" / "c5.txt").write_text('{"x": 1}')
    rows = rows_of("c1,boxes/c1.json,1,1,low,x", "c2,boxes/c2.json,1,1,low,x", "c3,boxes/c1.json,1,1,low,x",
                   "c4,boxes/c3.json,1,1,low,x", "c5,boxes/c5.txt,1,1,low,x")
    monkeypatch.setattr(validation, "MAX_FILE_BYTES", len('{"x": 1}'))
    assert check_paths(JsonGrader(), rows, folder) == [
        "box_path of 'c2' has 0 bytes (empty or too big)",
        "box_path of 'c3' names the same file as 'c1'",
        "box_path of 'c4' has 12 bytes (empty or too big)",
        "box_path of 'c5' is 'c5.txt' (.txt); expected one of .json",
    ]


def test_deep_checks_run_only_on_a_clean_table_and_only_when_asked(public: Path, tmp_path: Path) -> None:
    broken = submission(tmp_path / "broken", GOOD, boxes={"c1": '{"x": 1}', "c2": '{"y": 2}'})
    shallow = validate_submission(JsonGrader(), broken, public, deep=False)
    assert shallow.ok
    deep = validate_submission(JsonGrader(), broken, public)
    assert deep.problems == ["box_path of 'c2' must hold a number x"] and not deep.ok
    # a table problem stops before any file is read: only the table's problem is listed
    bad_table = submission(tmp_path / "bad-table", [*GOOD[:2], "c2,boxes/c2.json,1.5,4,high,"],
                           boxes={"c1": '{"x": 1}', "c2": '{"y": 2}'})
    assert validate_submission(JsonGrader(), bad_table, public).problems == ["note of 'c2' is empty"]


def test_warnings_of_the_deep_check_reach_the_report(public: Path, tmp_path: Path) -> None:
    folder = submission(tmp_path / "sub", GOOD, boxes={"c1": '{"x": -1}', "c2": '{"x": -2}'})
    for workers in (1, 2):
        report = validate_submission(JsonGrader(), folder, public, workers=workers)
        assert report.ok and report.warnings == ["c1: negative x accepted", "c2: negative x accepted"]


def test_cases_follow_the_manifest_order_with_their_rows_answers_and_geometry(tmp_path: Path) -> None:
    geometry = Geometry(size=(2, 2), spacing=(1.0, 1.0))
    manifest = TestManifest(ids=("c2", "c1"), geometry={"c1": geometry})
    rows = rows_of("c1,b1,1,1,low,x", "c2,b2,2,2,high,y")
    cases = build_cases(rows, JsonGrader(), manifest, tmp_path, tmp_path / "private", answers={"c1": {"v": "9"}})
    assert [c.case_id for c in cases] == ["c2", "c1"]
    assert [c.row["box_path"] for c in cases] == ["b2", "b1"]
    assert [c.answer for c in cases] == [{}, {"v": "9"}]
    assert [c.geometry for c in cases] == [None, geometry]
    assert build_cases(rows, JsonGrader(), manifest, tmp_path, tmp_path)[1].answer == {}


def _square(x: int) -> int:
    return x * x


@pytest.mark.parametrize("workers", [1, 3])
def test_parallel_map_keeps_the_order_and_reports_progress(workers: int) -> None:
    seen: list[tuple[int, int]] = []
    assert list(parallel_map(_square, [3, 1, 2], workers, lambda n, total: seen.append((n, total)))) == [9, 1, 4]
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert list(parallel_map(_square, [5], workers)) == [25]
    assert list(parallel_map(_square, [], workers)) == []
