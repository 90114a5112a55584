"""Tiny prepared tasks and submissions for the ISLES'22 and PANTHER grader tests (written in tmp_path)."""

from __future__ import annotations

import csv
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest

from rexmle_grade.grader import TestManifest, write_submission_csv
from rexmle_grade.io import Geometry, write_volume
from rexmle_grade.schema import SubmissionSchema

Cases = Mapping[str, tuple[np.ndarray, Geometry]]


def _geometry(shape_zyx: tuple[int, ...], spacing_xyz: tuple[float, ...]) -> Geometry:
    return Geometry(size=tuple(reversed(shape_zyx)), spacing=tuple(spacing_xyz), origin=(0.0, 0.0, 0.0),
                    direction=(1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0))


@pytest.fixture
def geometry_for() -> Callable[[tuple[int, ...], tuple[float, ...]], Geometry]:
    """geometry_for(shape_zyx, spacing_xyz): an axis-aligned grid at the origin."""
    return _geometry


@pytest.fixture
def make_task(tmp_path: Path) -> Callable[..., tuple[Path, Path]]:
    """make_task(id_column, {id: (label array zyx, geometry)}, suffix) -> (public_dir, private_dir)."""

    def make(id_column: str, cases: Cases, suffix: str = ".nii.gz") -> tuple[Path, Path]:
        public, private = tmp_path / "task" / "public", tmp_path / "task" / "private"
        public.mkdir(parents=True)
        private.mkdir(parents=True)
        TestManifest(ids=tuple(cases), geometry={k: g for k, (_, g) in cases.items()}).write(public)
        with (private / "answers.csv").open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow([id_column, "label_path"])
            for case_id, (label, geometry) in cases.items():
                relative = f"labels/{case_id}{suffix}"
                write_volume(private / relative, label, geometry)
                writer.writerow([case_id, relative])
        return public, private

    return make


@pytest.fixture
def write_masks(tmp_path: Path) -> Callable[..., Path]:
    """write_masks(schema, {id: (array zyx, geometry)}, name) -> a submission folder at the schema's paths."""

    def write(schema: SubmissionSchema, masks: Cases, name: str = "submission") -> Path:
        dest = tmp_path / name
        rows = []
        (column,) = schema.file_columns
        for case_id, (array, geometry) in masks.items():
            row = schema.example_row(case_id)
            write_volume(dest / row[column.name], array, geometry)
            rows.append(row)
        write_submission_csv(dest, schema, rows)
        return dest

    return write
