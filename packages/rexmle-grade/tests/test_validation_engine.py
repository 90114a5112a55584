"""The generic validation and grading engine, exercised with a tiny grader defined here."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rexmle_grade.errors import InvalidSubmissionError
from rexmle_grade.grader import (
    CaseInput,
    Direction,
    Grader,
    MetricSpec,
    TestManifest,
    write_submission_csv,
)
from rexmle_grade.grading import grade_submission
from rexmle_grade.io import Geometry, read_json, read_volume, write_volume
from rexmle_grade.schema import FileColumn, FileKind, SubmissionSchema, ValueColumn
from rexmle_grade.validation import validate_submission

GEOM = Geometry(size=(6, 5, 4), spacing=(1.0, 1.0, 2.0), origin=(0.0, 0.0, 0.0),
                direction=(1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0))


class ToyGrader(Grader):
    """Mask volume + a JSON number + a float column; metric = mean of voxel agreement and |value error|."""

    grader_id = "toy"
    title = "toy"
    schema = SubmissionSchema(
        id_column="case_id",
        columns=(
            FileColumn("mask_path", FileKind.LABEL_VOLUME, "predictions/{id}.nii.gz", (".nii.gz",), "mask",
                       labels=(0, 1)),
            FileColumn("json_path", FileKind.JSON, "predictions/{id}.json", (".json",), "a number", False),
            ValueColumn("value", float, "a value"),
        ),
    )
    metrics = (MetricSpec("agreement", Direction.HIGHER_BETTER, "voxel agreement", best=1.0),
               MetricSpec("error", Direction.LOWER_BETTER, "abs error", best=0.0))
    answer_columns = ("label_path", "value")

    def load_prediction(self, case: CaseInput, column: FileColumn) -> Any:
        path = case.prediction_path(column)
        if column.kind is FileKind.JSON:
            data = read_json(path)
            if not isinstance(data, dict) or not isinstance(data.get("x"), (int, float)):
                raise InvalidSubmissionError(f"{column.name} of {case.case_id!r} must be {{\"x\": number}}")
            return data
        vol = read_volume(path, expected=case.geometry, integer=True)
        from rexmle_grade.io import check_labels

        check_labels(vol.array, {0, 1}, what=column.name, name=case.case_id)
        return vol

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        pred = self.load_prediction(case, self.schema.file_columns[0]).array
        self.load_prediction(case, self.schema.file_columns[1])
        gt = read_volume(case.answer_path("label_path")).array
        return {"agreement": float((pred == gt).mean()),
                "error": abs(float(case.row["value"]) - float(case.answer["value"]))}

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        return {m: float(np.mean([c[m] for c in cases])) for m in ("agreement", "error")}

    def write_gold_submission(self, private_dir: Path, public_dir: Path, dest: Path) -> None:
        raise NotImplementedError

    def write_sample_submission(self, public_dir: Path, dest: Path) -> None:
        raise NotImplementedError


@pytest.fixture()
def task(tmp_path: Path) -> tuple[Path, Path]:
    public, private = tmp_path / "public", tmp_path / "private"
    public.mkdir()
    (private / "labels").mkdir(parents=True)
    ids = ("c1", "c2")
    TestManifest(ids=ids, geometry=dict.fromkeys(ids, GEOM)).write(public)
    rows = []
    for i, cid in enumerate(ids):
        arr = np.zeros((4, 5, 6), np.uint8)
        arr[1:3, 1:3, 1 + i:4 + i] = 1
        write_volume(private / "labels" / f"{cid}.nii.gz", arr, GEOM)
        rows.append({"case_id": cid, "label_path": f"labels/{cid}.nii.gz", "value": str(0.5 * i)})
    with (private / "answers.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["case_id", "label_path", "value"])
        w.writeheader()
        w.writerows(rows)
    return public, private


def make_submission(dest: Path, private: Path, *, perfect: bool = True) -> Path:
    rows = []
    for cid, value in (("c1", 0.0), ("c2", 0.5)):
        arr = read_volume(private / "labels" / f"{cid}.nii.gz").array
        if not perfect:
            arr = np.zeros_like(arr)
        write_volume(dest / "predictions" / f"{cid}.nii.gz", arr, GEOM)
        (dest / "predictions" / f"{cid}.json").write_text(json.dumps({"x": 1}))
        rows.append({"case_id": cid, "mask_path": f"predictions/{cid}.nii.gz", "json_path": f"predictions/{cid}.json",
                     "value": value if perfect else value + 1})
    write_submission_csv(dest, ToyGrader.schema, rows)
    return dest


def rewrite_csv(sub: Path, edit) -> None:
    with (sub / "submission.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows = edit(rows)
    with (sub / "submission.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()) if rows else ["case_id"])
        w.writeheader()
        w.writerows(rows)


def test_perfect_and_imperfect_grades(task: tuple[Path, Path], tmp_path: Path) -> None:
    public, private = task
    good = make_submission(tmp_path / "good", private)
    assert validate_submission(ToyGrader(), good, public).ok
    result = grade_submission(ToyGrader(), good, public, private)
    assert result.status == "valid" and result.metrics == {"agreement": 1.0, "error": 0.0}
    bad = make_submission(tmp_path / "bad", private, perfect=False)
    result = grade_submission(ToyGrader(), bad, public, private, workers=2)
    assert result.status == "valid"
    assert result.metrics["error"] == 1.0 and result.metrics["agreement"] < 1.0
    assert [r["case_id"] for r in result.per_case] == ["c1", "c2"]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda rows: rows[:1], "test id(s) missing: c2"),
        (lambda rows: [*rows, {**rows[0]}], "duplicate case_id(s): c1"),
        (lambda rows: [*rows, {**rows[0], "case_id": "zz"}], "not test cases: zz"),
        (lambda rows: [{**r, "value": "nan"} for r in rows], "values must be finite"),
        (lambda rows: [{**r, "value": "abc"} for r in rows], "not a float"),
        (lambda rows: [{k: v for k, v in r.items() if k != "value"} for r in rows], "missing column(s) ['value']"),
        (lambda rows: [{**r, "extra": "1"} for r in rows], "unexpected column(s) ['extra']"),
        (lambda rows: [{**r, "mask_path": "../private/labels/c1.nii.gz"} for r in rows], "contains '..'"),
        (lambda rows: [{**r, "mask_path": "/etc/passwd"} for r in rows], "is absolute"),
        (lambda rows: [{**r, "mask_path": "predictions/nothere.nii.gz"} for r in rows], "does not exist"),
        (lambda rows: [{**r, "mask_path": r["json_path"]} for r in rows], "expected one of .nii.gz"),
    ],
)
def test_table_and_path_problems(task: tuple[Path, Path], tmp_path: Path, edit, expected: str) -> None:
    public, private = task
    sub = make_submission(tmp_path / "sub", private)
    rewrite_csv(sub, edit)
    report = validate_submission(ToyGrader(), sub, public)
    assert not report.ok
    assert any(expected in p for p in report.problems), report.problems
    result = grade_submission(ToyGrader(), sub, public, private)
    assert result.status == "invalid_submission"


def test_symlink_escaping_the_folder_is_rejected(task: tuple[Path, Path], tmp_path: Path) -> None:
    public, private = task
    sub = make_submission(tmp_path / "sub", private)
    target = sub / "predictions" / "c1.nii.gz"
    target.unlink()
    os.symlink(private / "labels" / "c1.nii.gz", target)
    report = validate_submission(ToyGrader(), sub, public)
    assert any("outside the submission folder" in p for p in report.problems)


@pytest.mark.parametrize("corruption", ["shape", "label", "float", "truncated", "json_nan", "json_shape"])
def test_content_problems(task: tuple[Path, Path], tmp_path: Path, corruption: str) -> None:
    public, private = task
    sub = make_submission(tmp_path / "sub", private)
    path = sub / "predictions" / "c2.nii.gz"
    if corruption == "shape":
        write_volume(path, np.zeros((4, 5, 7), np.uint8), Geometry((7, 5, 4), GEOM.spacing, GEOM.origin,
                                                                       GEOM.direction))
        expected = "size [7, 5, 4]"
    elif corruption == "label":
        write_volume(path, np.full((4, 5, 6), 3, np.uint8), GEOM)
        expected = "label values 3"
    elif corruption == "float":
        write_volume(path, np.full((4, 5, 6), np.nan, np.float32), GEOM)
        expected = "integer type"
    elif corruption == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        expected = "c2.nii.gz"
    elif corruption == "json_nan":
        (sub / "predictions" / "c2.json").write_text('{"x": NaN}')
        expected = "not valid JSON"
    else:
        (sub / "predictions" / "c2.json").write_text('{"y": 1}')
        expected = "must be"
    report = validate_submission(ToyGrader(), sub, public)
    assert not report.ok and any(expected in p for p in report.problems), report.problems
    result = grade_submission(ToyGrader(), sub, public, private)
    assert result.status == "invalid_submission" and any(expected in p for p in result.problems)


def test_missing_csv_and_folder(task: tuple[Path, Path], tmp_path: Path) -> None:
    public, _ = task
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "submission.csv is missing" in validate_submission(ToyGrader(), empty, public).problems[0]
    assert "does not exist" in validate_submission(ToyGrader(), tmp_path / "nope", public).problems[0]


def test_grader_bug_is_reported_apart(task: tuple[Path, Path], tmp_path: Path) -> None:
    public, private = task
    sub = make_submission(tmp_path / "sub", private)

    class Buggy(ToyGrader):
        def score_case(self, case: CaseInput) -> dict[str, Any]:
            raise ZeroDivisionError("oops")

    result = grade_submission(Buggy(), sub, public, private)
    assert result.status == "grader_error" and "ZeroDivisionError" in (result.error or "")
    assert not result.problems


def test_markdown_tables_escape_pipes() -> None:
    from dataclasses import replace

    grader = ToyGrader()
    grader.metrics = (replace(grader.metrics[0], description="|a - b| summed"),)
    row = next(line for line in grader.describe_metrics_markdown().splitlines() if "agreement" in line)
    assert row.count("|") - row.count("\\|") == 5  # the table's own separators only
    schema = SubmissionSchema("case_id", (ValueColumn("value", float, "|x| of it"),))
    row = next(line for line in schema.to_markdown([]).splitlines() if line.startswith("| `value`"))
    assert "\\|x\\|" in row


def test_manifest_without_geometry_is_a_preparation_error() -> None:
    from rexmle_grade.errors import TaskDataMissingError

    manifest = TestManifest(ids=("c1", "c2"), geometry={"c1": GEOM})
    assert manifest.geometry_of("c1") == GEOM
    with pytest.raises(TaskDataMissingError, match="no image geometry for test case 'c2'"):
        manifest.geometry_of("c2")
