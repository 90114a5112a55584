"""Tiny prepared tasks (public manifest, private answers) for the vessel grader tests, written in tmp_path."""

from __future__ import annotations

import csv
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from rexmle_grade.grader import Grader, TestManifest, write_submission_csv
from rexmle_grade.io import Geometry

IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)


def _geometry(shape_zyx: Sequence[int], spacing_xyz: Sequence[float] = (1.0, 1.0, 1.0)) -> Geometry:
    return Geometry(size=tuple(int(n) for n in reversed(shape_zyx)), spacing=tuple(float(s) for s in spacing_xyz),
                    origin=(0.0, 0.0, 0.0), direction=IDENTITY)


@pytest.fixture
def geometry_for() -> Callable[..., Geometry]:
    """geometry_for(shape_zyx, spacing_xyz=(1, 1, 1)): an axis-aligned grid at the origin."""
    return _geometry


@pytest.fixture
def make_task(tmp_path: Path) -> Callable[..., tuple[Path, Path]]:
    """make_task(id_column, geometries {id: Geometry | None}, answers {id: {column: value}}) -> (public, private).

    Writes ``public/test_manifest.json`` and ``private/answers.csv``; the caller writes the answer files.
    """

    def make(id_column: str, geometries: Mapping[str, Geometry | None],
             answers: Mapping[str, Mapping[str, str]]) -> tuple[Path, Path]:
        public, private = tmp_path / "task" / "public", tmp_path / "task" / "private"
        public.mkdir(parents=True, exist_ok=True)
        private.mkdir(parents=True, exist_ok=True)
        TestManifest(ids=tuple(geometries),
                     geometry={k: g for k, g in geometries.items() if g is not None}).write(public)
        columns = list(next(iter(answers.values())))
        with (private / "answers.csv").open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow([id_column, *columns])
            for case_id, row in answers.items():
                writer.writerow([case_id, *(row[c] for c in columns)])
        return public, private

    return make


@pytest.fixture
def write_submission(tmp_path: Path) -> Callable[..., Path]:
    """write_submission(grader, rows, name="submission") -> folder; the caller writes the prediction files."""

    def write(grader: Grader, rows: Sequence[Mapping[str, Any]], name: str = "submission") -> Path:
        dest = tmp_path / name
        write_submission_csv(dest, grader.schema, rows)
        return dest

    return write
