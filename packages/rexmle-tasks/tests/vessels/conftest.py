"""Shared fixtures of the TopCoW and TopBrain task tests.

Every task is prepared once per session from its synthetic mirror (the six TopCoW tasks share one download, the
two TopBrain tasks another); tests that change files work on copies. The trivial "models" that show the synthetic
data is learnable live here too: an intensity band plus nearest label centroid for segmentation.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import rexmle_tasks.families.topbrain
import rexmle_tasks.families.topcow  # noqa: F401  (registers the families)
from rexmle_grade.grader import TestManifest, write_submission_csv
from rexmle_grade.grading import GradeResult, grade_submission
from rexmle_grade.io import read_volume, write_volume
from rexmle_grade.settings import TaskDirs
from rexmle_grade.validation import validate_submission
from rexmle_tasks.base import Task
from rexmle_tasks.pipeline import PreparedInfo, prepare_task
from rexmle_tasks.registry import get_task

TOPCOW_TASKS = tuple(f"topcow-track{track}-task{task}" for track in (1, 2) for task in (1, 2, 3))
TOPBRAIN_TASKS = ("topbrain-track1", "topbrain-track2")


@dataclass(frozen=True)
class Prepared:
    task: Task
    dirs: TaskDirs
    info: PreparedInfo

    @property
    def manifest(self) -> TestManifest:
        return TestManifest.read(self.dirs.public)

    @property
    def train_ids(self) -> list[str]:
        return sorted(p.name.removesuffix("_0000.nii.gz") for p in (self.dirs.public / "train" / "images").iterdir())

    def answers(self) -> dict[str, dict[str, str]]:
        with (self.dirs.private / "answers.csv").open(newline="") as fh:
            return {row["image_id"]: row for row in csv.DictReader(fh)}

    def grade(self, submission: Path) -> GradeResult:
        report = validate_submission(self.task.grader, submission, self.dirs.public)
        assert report.ok, report.problems
        result = grade_submission(self.task.grader, submission, self.dirs.public, self.dirs.private)
        assert result.status == "valid", (result.problems, result.error)
        return result

    def submit(self, dest: Path, write: Callable[[str, Path], None]) -> GradeResult:
        """Grade a submission with one prediction file per test case, written by ``write(case_id, path)``."""
        grader = self.task.grader
        (column,) = grader.schema.file_columns
        rows = []
        for case_id in self.manifest.ids:
            write(case_id, dest / column.path_for(case_id))
            rows.append({"image_id": case_id, "modality": grader.modality, column.name: column.path_for(case_id)})
        write_submission_csv(dest, grader.schema, rows)
        return self.grade(dest)


#: the synthetic secret pinned here, so that a test can write the same mirror with the generators themselves
SECRET = b"vessel-tests-secret"


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Prepared]:
    """``prepared(task_id)``: the task prepared synthetically (default case count, seed 0, :data:`SECRET`), built on
    first use."""
    root = tmp_path_factory.mktemp("vessel-tasks")
    cache: dict[str, Prepared] = {}

    def get(task_id: str) -> Prepared:
        if task_id not in cache:
            task = get_task(task_id)
            dirs = TaskDirs.for_task(task_id, raw_group=task.meta.raw_group, root=root)
            cache[task_id] = Prepared(task, dirs, prepare_task(task, dirs, synthetic=True, seed=0,
                                                               secret=SECRET))
        return cache[task_id]

    return get


def normalised_grid(shape: Sequence[int]) -> np.ndarray:
    """Voxel positions scaled to [0, 1] per axis, shape (*shape, 3): the same anatomy sits at about the same
    normalised position in every scan of one modality."""
    axes = [np.linspace(0.0, 1.0, n) for n in shape]
    return np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)


class BandCentroidSegmenter:
    """A non-deep segmenter: voxels inside an intensity band learned from the training vessels are foreground; each
    gets the label whose mean normalised training position is nearest."""

    def __init__(self, images: Sequence[np.ndarray], labels: Sequence[np.ndarray]) -> None:
        vessel = np.concatenate([img[lab > 0] for img, lab in zip(images, labels, strict=True)]).astype(float)
        self.low, self.high = np.percentile(vessel, [25, 99.5])
        positions: dict[int, list[np.ndarray]] = {}
        for lab in labels:
            grid = normalised_grid(lab.shape)
            for value in np.unique(lab[lab > 0]):
                positions.setdefault(int(value), []).append(grid[lab == value])
        self.classes = np.array(sorted(positions))
        self.centroids = np.stack([np.concatenate(positions[c]).mean(axis=0) for c in self.classes])

    def predict(self, image: np.ndarray) -> np.ndarray:
        out = np.zeros(image.shape, dtype=np.uint8)
        foreground = (image >= self.low) & (image <= self.high)
        points = normalised_grid(image.shape)[foreground]
        distances = ((points[:, None, :] - self.centroids[None]) ** 2).sum(axis=-1)
        out[foreground] = self.classes[distances.argmin(axis=1)]
        return out


def fit_segmenter(p: Prepared) -> BandCentroidSegmenter:
    train = p.dirs.public / "train"
    images = [read_volume(train / "images" / f"{i}_0000.nii.gz").array for i in p.train_ids]
    labels = [read_volume(train / "labels" / f"{i}.nii.gz").array for i in p.train_ids]
    return BandCentroidSegmenter(images, labels)


def segmentation_submission(p: Prepared, dest: Path) -> GradeResult:
    """Grade the band-and-centroid segmenter fitted on ``p``'s training data."""
    model = fit_segmenter(p)

    def write(case_id: str, path: Path) -> None:
        image = read_volume(p.dirs.public / "test" / "images" / f"{case_id}_0000.nii.gz")
        write_volume(path, model.predict(image.array), image.geometry)

    return p.submit(dest, write)
