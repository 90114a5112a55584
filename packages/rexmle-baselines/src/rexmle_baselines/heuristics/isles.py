"""ISLES'22: acute infarcts are bright on DWI. Each case's DWI is divided by its own brain median (the scanners'
DWI scales differ) and one threshold on that ratio, fitted on the training cases for the best mean Dice, is the
mask: no ADC, no FLAIR, no shape."""

from __future__ import annotations

import numpy as np

from rexmle_baselines.base import BaselineContext
from rexmle_baselines.convert import segmentation_io
from rexmle_baselines.heuristics import Heuristic

RATIOS = np.linspace(1.1, 4.0, 30)


def _ratio(image: np.ndarray) -> np.ndarray:
    dwi = image[0]
    brain = dwi[dwi > 0]
    return dwi / (float(np.median(brain)) if brain.size else 1.0)


def dwi_ratio_threshold(ctx: BaselineContext) -> None:
    io = segmentation_io(ctx.task_id, ctx.grader_id, ctx.public_dir)
    dice = np.zeros(len(RATIOS))
    cases = io.training_cases()
    for case in cases:
        ratio, truth = _ratio(io.read_image(case)[0]), io.read_label(case) > 0
        for i, threshold in enumerate(RATIOS):
            mask = ratio > threshold
            total = mask.sum() + truth.sum()
            dice[i] += 1.0 if total == 0 else 2.0 * (mask & truth).sum() / total
    threshold = float(RATIOS[int(np.argmax(dice))])
    ctx.log(f"DWI / brain median > {threshold:.2f}: mean training Dice {dice.max() / len(cases):.3f}")
    predictions = {case.case_id: (_ratio(io.read_image(case)[0]) > threshold).astype(np.uint8)
                   for case in io.test_cases()}
    io.write_submission(predictions, ctx.out_dir)


HEURISTICS = {"isles22": Heuristic("one threshold on DWI over the case's brain median, fitted on the training Dice",
                                   dwi_ratio_threshold)}
