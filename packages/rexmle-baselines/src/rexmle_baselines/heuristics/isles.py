"""ISLES'22: acute infarcts are bright on DWI, so the heuristic is one DWI threshold, the same for every case,
chosen among the pooled training brains' upper percentiles for the best mean training Dice: no ADC, no FLAIR, no
per-case normalisation (the scanners' DWI scales differ, which is what a trained model learns to undo), no shape."""

from __future__ import annotations

import numpy as np

from rexmle_baselines.base import BaselineContext
from rexmle_baselines.convert import segmentation_io
from rexmle_baselines.heuristics import Heuristic

PERCENTILES = np.linspace(90.0, 99.9, 34)


def dwi_threshold(ctx: BaselineContext) -> None:
    io = segmentation_io(ctx.task_id, ctx.grader_id, ctx.public_dir)
    cases = [(io.read_image(case)[0][0], io.read_label(case) > 0) for case in io.training_cases()]
    pooled = np.concatenate([dwi[dwi > 0][::7] for dwi, _ in cases])
    thresholds = np.percentile(pooled, PERCENTILES)

    def mean_dice(threshold: float) -> float:
        scores = []
        for dwi, truth in cases:
            mask = dwi > threshold
            total = mask.sum() + truth.sum()
            scores.append(1.0 if total == 0 else 2.0 * (mask & truth).sum() / total)
        return float(np.mean(scores))

    dice = [mean_dice(t) for t in thresholds]
    threshold = float(thresholds[int(np.argmax(dice))])
    ctx.log(f"DWI > {threshold:.4g} (the training brains' {PERCENTILES[int(np.argmax(dice))]:.1f}th percentile): "
            f"mean training Dice {max(dice):.3f}")
    predictions = {case.case_id: (io.read_image(case)[0][0] > threshold).astype(np.uint8) for case in io.test_cases()}
    io.write_submission(predictions, ctx.out_dir)


HEURISTICS = {"isles22": Heuristic("one DWI threshold for all cases, fitted on the training Dice", dwi_threshold)}
