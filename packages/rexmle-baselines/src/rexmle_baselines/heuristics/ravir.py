"""RAVIR: vessels are darker than the fundus around them, veins darker than arteries. Each image's darkness relative
to its own background (a grey closing wider than any vessel removes the vessels and keeps the illumination, the disc
and the vignette), scaled by the image's own 99th percentile, is cut by two thresholds fitted on the training masks:
above the first a pixel is vessel, and a vessel pixel whose neighbourhood (the vessel's cross-section, which fills
in an artery's central reflex) is darker than the second is vein. What the ophthalmologist's eye does first, blind
to the reflex pattern, to which vessel a branch belongs and to faint vessels the annotators left out."""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from rexmle_baselines.base import BaselineContext
from rexmle_baselines.convert import SegmentationIO, segmentation_io
from rexmle_baselines.heuristics import Heuristic

#: the grey closing's width as a share of the image width: 1/24 is 32 pixels (400 um) on a real 768-pixel image,
#: wider than the widest vein
CLOSING_FRACTION = 1 / 24
#: the class feature's neighbourhood as a share of the image width: about a major vein's half-width
SIGMA_FRACTION = 1 / 128
#: candidate thresholds (on darkness scaled by the image's 99th percentile)
GRID = np.linspace(0.0, 1.6, 161)


def darkness(image: np.ndarray) -> np.ndarray:
    """Each pixel's darkness relative to the local background, scaled by the image's 99th percentile."""
    image = np.asarray(image, dtype=np.float64)
    width = max(7, round(image.shape[1] * CLOSING_FRACTION) | 1)
    smoothed = ndimage.gaussian_filter(image, 1.0)
    background = ndimage.gaussian_filter(ndimage.grey_closing(smoothed, size=(width, width)), width / 4)
    relative = np.clip((background - smoothed) / np.maximum(background, 1.0), 0.0, None)
    return relative / max(float(np.percentile(relative, 99)), 1e-6)


def cross_section_mean(values: np.ndarray, vessel: np.ndarray, sigma: float) -> np.ndarray:
    """The mean of ``values`` over the vessel pixels near each pixel (normalised convolution)."""
    weight = ndimage.gaussian_filter(vessel.astype(np.float64), sigma)
    return ndimage.gaussian_filter(np.where(vessel, values, 0.0), sigma) / np.maximum(weight, 1e-6)


def _histogram(values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Pixel counts of ``values[where]`` at or above each grid threshold."""
    counts = np.histogram(np.clip(values[where], GRID[0], GRID[-1]), bins=np.append(GRID, np.inf))[0]
    return np.cumsum(counts[::-1])[::-1]


def _classes(image: np.ndarray, vessel_threshold: float, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """(vessel mask, the class feature) of one image."""
    dark = darkness(image)
    vessel = dark >= vessel_threshold
    return vessel, cross_section_mean(dark, vessel, sigma)


def fit(io: SegmentationIO, sigma: float) -> tuple[float, float]:
    """The (vessel, vein) thresholds with the best mean training Dice: the vessel threshold first (binary Dice of
    vessel against background), then the vein threshold on the vessels it gives (mean of artery and vein Dice)."""
    cases = io.training_cases()
    images = [io.read_image(case)[0][0] for case in cases]
    labels = [io.read_label(case) for case in cases]
    vessel_counts = []
    for image, label in zip(images, labels, strict=True):
        dark = darkness(image)
        vessel_counts.append((_histogram(dark, label > 0), _histogram(dark, np.ones_like(label, dtype=bool)),
                              int((label > 0).sum())))
    vessel_dice = np.mean([2 * hit / np.maximum(predicted + truth, 1) for hit, predicted, truth in vessel_counts],
                          axis=0)
    vessel_threshold = float(GRID[int(np.argmax(vessel_dice))])
    scores = np.zeros(len(GRID))
    for image, label in zip(images, labels, strict=True):
        vessel, feature = _classes(image, vessel_threshold, sigma)
        vein_hit = _histogram(feature, vessel & (label == 2))
        vein_predicted = _histogram(feature, vessel)
        artery_truth, vein_truth = int((label == 1).sum()), int((label == 2).sum())
        artery_hit = int((vessel & (label == 1)).sum()) - _histogram(feature, vessel & (label == 1))
        artery_predicted = int(vessel.sum()) - vein_predicted
        scores += (2 * artery_hit / np.maximum(artery_predicted + artery_truth, 1)
                   + 2 * vein_hit / np.maximum(vein_predicted + vein_truth, 1)) / 2
    return vessel_threshold, float(GRID[int(np.argmax(scores))])


def two_thresholds(ctx: BaselineContext) -> None:
    io = segmentation_io(ctx.task_id, ctx.grader_id, ctx.public_dir)
    sigma = io.read_image(io.training_cases()[0])[0].shape[2] * SIGMA_FRACTION
    vessel_threshold, vein_threshold = fit(io, sigma)
    ctx.log(f"vessel where darkness >= {vessel_threshold:.3f}, vein where its cross-section's >= {vein_threshold:.3f}")
    ctx.measurements["thresholds"] = {"vessel": vessel_threshold, "vein": vein_threshold}
    predictions = {}
    for case in io.test_cases():
        vessel, feature = _classes(io.read_image(case)[0][0], vessel_threshold, sigma)
        predictions[case.case_id] = np.where(vessel, np.where(feature >= vein_threshold, 2, 1), 0).astype(np.uint8)
    io.write_submission(predictions, ctx.out_dir)


#: the trained rung of the realistic mirror's ladder: the quick monai-seg UNet with twice its channels (the quick
#: (8, 16, 32) UNet learns the veins but almost never predicts an artery), trained 7.5 times as long on twice the
#: patches per image; a few CPU minutes on 8-10 training images of 384 x 384
LADDER_OVERRIDES = {"channels": (16, 32, 64), "epochs": 300, "samples_per_case": 4}

HEURISTICS = {"ravir": Heuristic("darkness against a grey-closing background, two thresholds fitted on the training "
                                 "masks: vessel, then vein where the vessel's cross-section is darker", two_thresholds,
                                 ladder_overrides=LADDER_OVERRIDES)}
