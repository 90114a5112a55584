"""Correlation score of the LDCT-IQA challenge: |PLCC| + |SROCC| + |KROCC|.

Official rule (organisers' scoring snippet; metrics page ``dentex_us_ldct.md`` §2): one pooled computation over
all test images of Pearson's r (no logistic fit), Spearman's rho (average ranks for ties) and Kendall's tau-b
(tie-corrected), each taken in absolute value, summed. A perfectly reversed predictor therefore scores 3.

Where a correlation is undefined (a constant prediction or reference, or fewer than two values) the official
snippet yields NaN; here the correlation counts 0 and :attr:`CorrelationScores.undefined` is set so graders can
flag it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CorrelationScores:
    plcc: float
    srocc: float
    krocc: float
    undefined: bool  # some correlation was undefined and counted as 0

    @property
    def score(self) -> float:
        return self.plcc + self.srocc + self.krocc


def absolute_correlations(prediction: np.ndarray, reference: np.ndarray) -> CorrelationScores:
    """|Pearson|, |Spearman| and |Kendall tau-b| of two equally long vectors (see module docstring)."""
    from scipy import stats  # imported when used: the grader registry imports every grader module

    p = np.asarray(prediction, dtype=np.float64).ravel()
    g = np.asarray(reference, dtype=np.float64).ravel()
    if p.shape != g.shape:
        raise ValueError(f"prediction and reference differ in length: {p.size} vs {g.size}")
    if p.size < 2 or np.ptp(p) == 0 or np.ptp(g) == 0:
        return CorrelationScores(0.0, 0.0, 0.0, undefined=True)
    values = [float(stats.pearsonr(p, g).statistic), float(stats.spearmanr(p, g).statistic),
              float(stats.kendalltau(p, g).statistic)]
    undefined = any(math.isnan(v) for v in values)
    plcc, srocc, krocc = (0.0 if math.isnan(v) else abs(v) for v in values)
    return CorrelationScores(plcc, srocc, krocc, undefined=undefined)
