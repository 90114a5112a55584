"""NeurIPS CellSeg: the classic pipeline of a microscopist without a network. Each image is turned grey and
smoothed, Otsu's threshold splits it, and the side of the threshold the background's median is not on is the cells
(bright cells on black or dark cells on a light field, chosen per image); holes are filled, specks smaller than the
training cells are dropped, and touching cells are split by a watershed on the distance to the background, seeded
at distance peaks at least a fitted fraction of the training cells' median radius apart. From the training labels
come the smallest cell kept and the seed spacing (the fraction with the best mean training F1 at IoU 0.5)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import ndimage

from rexmle_baselines.base import BaselineContext
from rexmle_baselines.convert import SegCase, segmentation_io
from rexmle_baselines.heuristics import Heuristic
from rexmle_grade.errors import TaskDataMissingError
from rexmle_grade.grader import write_submission_csv
from rexmle_grade.graders._images2d import write_tiff
from rexmle_grade.io import read_image_2d
from rexmle_grade.metrics.instances import cellseg_match_counts

SPACINGS = (0.5, 0.8, 1.2)  # seed spacing as a fraction of the median training cell radius
FITTING_IMAGES = 12  # training images the spacing is chosen on (a fixed, sorted subset keeps it quick)


def grey_image(path: Path) -> np.ndarray:
    """The image as one smoothed float channel: colour and replicated grey averaged, alpha dropped."""
    pixels = read_image_2d(path, what="image", allow_channels=True).astype(np.float64)
    if pixels.ndim == 3:
        if pixels.shape[0] in (3, 4) and pixels.shape[-1] not in (3, 4):  # a channels-first TIFF
            pixels = np.moveaxis(pixels, 0, -1)
        if pixels.shape[-1] in (2, 4):
            pixels = pixels[..., :-1]
        pixels = pixels.mean(axis=-1)
    return ndimage.gaussian_filter(pixels, 1.0)


def cell_mask(grey: np.ndarray, min_area: float) -> np.ndarray:
    """Otsu's split, the side away from the background's median, holes filled, small specks dropped."""
    from skimage.filters import threshold_otsu

    if float(grey.max()) == float(grey.min()):
        return np.zeros(grey.shape, dtype=bool)
    threshold = threshold_otsu(grey)
    mask = grey < threshold if np.median(grey) > threshold else grey > threshold
    mask = ndimage.binary_fill_holes(mask)
    components, count = ndimage.label(mask)
    if count:
        areas = np.bincount(components.ravel())
        mask = (areas >= min_area)[components] & mask
    return mask


def split_cells(mask: np.ndarray, spacing: float) -> np.ndarray:
    """Watershed on the distance to the background from its peaks at least ``spacing`` px apart."""
    from skimage.feature import peak_local_max
    from skimage.segmentation import watershed

    if not mask.any():
        return np.zeros(mask.shape, dtype=np.uint32)
    distance = ndimage.distance_transform_edt(mask)
    components, _ = ndimage.label(mask)
    peaks = peak_local_max(distance, min_distance=max(1, round(spacing)), labels=components,
                           exclude_border=False)
    seeds = np.zeros(mask.shape, dtype=np.int32)
    seeds[tuple(peaks.T)] = np.arange(1, len(peaks) + 1)
    instances = watershed(-distance, seeds, mask=mask).astype(np.uint32)
    orphans, _ = ndimage.label(mask & (instances == 0))  # a component whose peak was suppressed keeps its cell
    instances[orphans > 0] = orphans[orphans > 0] + len(peaks)
    return instances


def training_cell_sizes(cases: list[SegCase]) -> tuple[float, float]:
    """(median equivalent radius, 5th-percentile area) of the training cells, in pixels."""
    areas = []
    for case in cases:
        if case.label is None:
            continue
        instances = read_image_2d(case.label, what="label", integer=True)
        counts = np.bincount(instances.ravel().astype(np.int64))[1:]
        areas.extend(counts[counts > 0].tolist())
    if not areas:
        raise TaskDataMissingError("the training labels hold no cells", hint="prepare the task again with --force")
    return float(np.sqrt(np.median(areas) / np.pi)), float(np.percentile(areas, 5))


def otsu_watershed(ctx: BaselineContext) -> None:
    io = segmentation_io(ctx.task_id, ctx.grader_id, ctx.public_dir)
    training = io.training_cases()
    radius, small_area = training_cell_sizes(training)
    min_area = max(4.0, small_area / 2)
    fitting = training[:FITTING_IMAGES]
    masks = [cell_mask(grey_image(case.channels[0]), min_area) for case in fitting]
    truths = [read_image_2d(case.label, what="label", integer=True) for case in fitting if case.label is not None]
    scores = []
    for fraction in SPACINGS:
        f1 = [cellseg_match_counts(truth, split_cells(mask, fraction * radius), (0.5,))[0].f1
              for mask, truth in zip(masks, truths, strict=True)]
        scores.append(float(np.mean(f1)))
    spacing = SPACINGS[int(np.argmax(scores))] * radius
    ctx.log(f"median training cell radius {radius:.1f} px, specks under {min_area:.0f} px dropped, seeds "
            f"{spacing:.1f} px apart (mean training F1@0.5 {max(scores):.3f} on {len(fitting)} images)")
    rows = []
    for case in io.test_cases():
        instances = split_cells(cell_mask(grey_image(case.channels[0]), min_area), spacing)
        relative = io.column.path_for(case.case_id)
        target = ctx.out_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        write_tiff(target, instances)
        rows.append({io.grader.schema.id_column: case.case_id, io.column.name: relative})
    write_submission_csv(ctx.out_dir, io.grader.schema, rows)


# the trained rung: the quick UNet with twice its channels and four times its optimiser steps (four patches a case,
# 80 epochs; about two CPU minutes on one thread at the ladder's 40 cases). Quick's own 640 steps leave its loss
# still falling and its DIC cells unfound, so which of the two rungs won turned on the modalities that the 8 test
# images happened to draw (0.48 against this heuristic's 0.50 for one secret).
LADDER_OVERRIDES = {"epochs": 80, "samples_per_case": 4, "channels": (16, 32, 64)}

HEURISTICS = {"neurips-cellseg": Heuristic(
    "Otsu's threshold with per-image polarity, then a distance-transform watershed seeded at a spacing fitted on "
    "the training cells", otsu_watershed, ladder_overrides=LADDER_OVERRIDES)}
