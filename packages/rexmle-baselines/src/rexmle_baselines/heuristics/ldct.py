"""LDCT-IQA: one noise statistic per slice (the robust standard deviation of its Laplacian residual, which tissue
edges barely move) mapped to the readers' score by a least-squares line fitted on the training slices: the
radiologist's first proxy, blind to streaks, blur and the tissue's own texture."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from scipy import ndimage

from rexmle_baselines.base import BaselineContext
from rexmle_baselines.heuristics import Heuristic
from rexmle_grade.errors import TaskDataMissingError
from rexmle_grade.grader import TestManifest, get_grader, write_submission_csv
from rexmle_grade.io import read_image_2d


def _noise(path: Path) -> float:
    image = np.asarray(read_image_2d(path), dtype=np.float64)
    residual = ndimage.laplace(image)
    return float(1.4826 * np.median(np.abs(residual - np.median(residual))))


def noise_line(ctx: BaselineContext) -> None:
    public = ctx.public_dir
    labels = public / "train" / "labels.csv"
    if not labels.is_file():
        raise TaskDataMissingError(f"{labels} is missing", hint="`rexmle prepare ldct-iqa --force`")
    with labels.open(newline="") as fh:
        scores = {row["image_id"]: float(row["quality_score"]) for row in csv.DictReader(fh)}
    x = np.array([_noise(public / "train" / "images" / f"{image_id}.tif") for image_id in scores])
    slope, intercept = np.polyfit(x, np.array(list(scores.values())), 1)
    ctx.log(f"score = {slope:.4g} * noise + {intercept:.4g} over {len(x)} training slices")
    grader = get_grader(ctx.grader_id)
    rows = []
    for image_id in TestManifest.read(public).ids:
        value = slope * _noise(public / "test" / "images" / f"{image_id}.tif") + intercept
        rows.append({grader.schema.id_column: image_id, "quality_score": f"{float(np.clip(value, 0.0, 4.0)):.4f}"})
    write_submission_csv(ctx.out_dir, grader.schema, rows)


HEURISTICS = {"ldct-iqa": Heuristic("a robust noise level (MAD of the Laplacian) and a line fitted on the training "
                                    "scores", noise_line)}
