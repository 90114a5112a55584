"""PUMA: what a pathologist's ten-minute script does, fitted on the public training ROIs.

* tissue (both tracks): each pixel's colour, smoothed over a few pixels, goes to the tissue class whose mean
  training colour is nearest (no texture, no context, no stain normalisation);
* nuclei (both tracks): colour deconvolution (Ruifrok-Johnston hematoxylin channel), one hematoxylin threshold
  fitted on the training nuclei masks, connected components, and each component to the class whose mean
  (log area, hematoxylin) over the training components is nearest; touching nuclei stay one component.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from rexmle_baselines.base import BaselineContext
from rexmle_baselines.convert import SegCase, SegmentationIO, segmentation_io
from rexmle_baselines.heuristics import Heuristic
from rexmle_grade.errors import TaskDataMissingError

COLOUR_SMOOTHING = 2.0  # px: the colour of a pixel's neighbourhood, not of one nucleus or fibre
MIN_NUCLEUS_AREA = 4  # px: smaller hematoxylin specks are noise


def _rgb(io: SegmentationIO, case: SegCase) -> np.ndarray:
    image, _ = io.read_image(case)
    return np.moveaxis(image[:3].astype(np.float64), 0, -1)


def _training(io: SegmentationIO) -> list[SegCase]:
    cases = io.training_cases()
    if not cases:
        raise TaskDataMissingError(f"no training ROIs with labels under {io.public_dir / 'train'}",
                                   hint=f"prepare the task again: `rexmle prepare {io.task_id} --force`")
    return cases


# ---- tissue ------------------------------------------------------------------------------------------------------
def _smoothed_colour(rgb: np.ndarray) -> np.ndarray:
    return ndimage.gaussian_filter(rgb, (COLOUR_SMOOTHING, COLOUR_SMOOTHING, 0))


def nearest_colour(ctx: BaselineContext) -> None:
    io = segmentation_io(ctx.task_id, ctx.grader_id, ctx.public_dir)
    n_classes = len(io.labels)
    sums, counts = np.zeros((n_classes, 3)), np.zeros(n_classes)
    for case in _training(io):
        colour, label = _smoothed_colour(_rgb(io, case)).reshape(-1, 3), io.read_label(case).ravel()
        counts += np.bincount(label, minlength=n_classes)
        for channel in range(3):
            sums[:, channel] += np.bincount(label, weights=colour[:, channel], minlength=n_classes)
    seen = counts > 0
    means = sums[seen] / counts[seen, None]
    values = np.flatnonzero(seen)
    ctx.log("mean training colour per class: " + ", ".join(
        f"{name} {np.round(means[list(values).index(v)]).astype(int).tolist()}" for name, v in io.labels.items()
        if seen[v]))
    predictions = {}
    for case in io.test_cases():
        colour = _smoothed_colour(_rgb(io, case))
        distance = ((colour[..., None, :] - means) ** 2).sum(axis=-1)
        predictions[case.case_id] = values[distance.argmin(axis=-1)].astype(np.uint8)
    io.write_submission(predictions, ctx.out_dir)


# ---- nuclei ------------------------------------------------------------------------------------------------------
def hematoxylin(rgb: np.ndarray) -> np.ndarray:
    from skimage.color import rgb2hed

    return rgb2hed(np.clip(rgb, 0, 255).astype(np.uint8))[..., 0]


def _components(channel: np.ndarray, threshold: float) -> tuple[np.ndarray, int]:
    mask = ndimage.binary_opening(channel > threshold)
    components, count = ndimage.label(mask)
    if count:
        areas = ndimage.sum_labels(mask, components, np.arange(1, count + 1))
        small = np.flatnonzero(areas < MIN_NUCLEUS_AREA) + 1
        components[np.isin(components, small)] = 0
        components, count = ndimage.label(components > 0)
    return components, count


def _features(channel: np.ndarray, components: np.ndarray, count: int) -> np.ndarray:
    index = np.arange(1, count + 1)
    areas = ndimage.sum_labels(np.ones_like(channel), components, index)
    mean_h = ndimage.mean(channel, components, index)
    return np.column_stack([np.log(areas), mean_h])


def threshold_and_size(ctx: BaselineContext) -> None:
    io = segmentation_io(ctx.task_id, ctx.grader_id, ctx.public_dir)
    training = [(hematoxylin(_rgb(io, case)), io.read_label(case)) for case in _training(io)]
    pooled = np.concatenate([h.ravel() for h, _ in training])
    candidates = np.quantile(pooled, np.linspace(0.5, 0.98, 49))

    def dice(threshold: float) -> float:
        hits = sum(int(((h > threshold) & (label > 0)).sum()) for h, label in training)
        total = sum(int((h > threshold).sum() + (label > 0).sum()) for h, label in training)
        return 2 * hits / max(total, 1)

    threshold = float(max(candidates, key=dice))
    features, classes = [], []
    for h, label in training:
        components, count = _components(h, threshold)
        if not count:
            continue
        features.append(_features(h, components, count))
        # each component's class: the labelled class covering most of it (background: a false detection)
        joint = np.bincount(components.ravel() * len(io.labels) + label.ravel(),
                            minlength=(count + 1) * len(io.labels)).reshape(count + 1, len(io.labels))[1:]
        classes.append(joint.argmax(axis=1))
    if not features:
        raise TaskDataMissingError("no hematoxylin component above the fitted threshold in any training ROI",
                                   hint="the training ROIs hold no nuclei: check the prepared task")
    stacked, labels = np.concatenate(features), np.concatenate(classes)
    centre, spread = stacked.mean(axis=0), stacked.std(axis=0) + 1e-9
    values = np.unique(labels[labels > 0])
    means = np.array([((stacked[labels == v] - centre) / spread).mean(axis=0) for v in values])
    ctx.log(f"hematoxylin threshold {threshold:.4f} (training pixel Dice {dice(threshold):.3f}); "
            f"{len(stacked)} training components, classes {values.tolist()}")
    predictions = {}
    for case in io.test_cases():
        h = hematoxylin(_rgb(io, case))
        components, count = _components(h, threshold)
        prediction = np.zeros(h.shape, dtype=np.uint8)
        if count and len(values):
            z = (_features(h, components, count) - centre) / spread
            nearest = values[((z[:, None, :] - means) ** 2).sum(axis=-1).argmin(axis=1)]
            prediction = np.concatenate([[0], nearest]).astype(np.uint8)[components]
        predictions[case.case_id] = prediction
    io.write_submission(predictions, ctx.out_dir)


# The trained rung (quick monai-seg) needs more than its 40 epochs to learn texture and context from 12 ROIs;
# class-balanced patches let it see the rare tissue classes (vessels, necrosis, epidermis) that micro Dice weighs
# as much as stroma. Measured figures: the ladder comment in tests/realistic/test_puma.py.
_TISSUE = Heuristic("each pixel's smoothed colour to the nearest mean training colour of a tissue class",
                    nearest_colour, ladder_overrides={"epochs": 120, "crop": "classes"})
_NUCLEI = Heuristic("hematoxylin channel (colour deconvolution), a threshold fitted on the training nuclei, "
                    "components classed by the nearest training (log area, hematoxylin) mean", threshold_and_size,
                    ladder_overrides={"epochs": 120})
HEURISTICS = {"puma-track1-task1": _TISSUE, "puma-track2-task1": _TISSUE,
              "puma-track1-task2": _NUCLEI, "puma-track2-task2": _NUCLEI}
