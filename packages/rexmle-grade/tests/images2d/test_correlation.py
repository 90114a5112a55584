"""LDCT-IQA |PLCC| + |SROCC| + |KROCC|: the page's examples, hand cases and loop-based references."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from rexmle_grade.metrics.correlation import absolute_correlations

GT = [0.4, 1.2, 2.0, 2.0, 3.6]
PRED = [1.0, 0.8, 2.5, 2.9, 3.1]


def test_official_example():
    scores = absolute_correlations(PRED, GT)
    assert (scores.plcc, scores.srocc, scores.krocc) == pytest.approx((0.8497, 0.8721, 0.7379), abs=5e-5)
    assert scores.score == pytest.approx(2.4597, abs=5e-5)
    assert not scores.undefined


def test_negated_prediction_scores_the_same():
    assert absolute_correlations([-p for p in PRED], GT) == absolute_correlations(PRED, GT)


def test_constant_prediction_scores_zero_and_is_flagged():
    scores = absolute_correlations([2, 2, 2], [1, 2, 3])
    assert (scores.plcc, scores.srocc, scores.krocc, scores.score, scores.undefined) == (0, 0, 0, 0, True)
    assert absolute_correlations([1.0], [2.0]).undefined


def test_hand_computed():
    # p = (1, 2, 3), g = (1, 3, 2): r = 0.5, rho = 0.5, tau = (2 - 1) / 3
    scores = absolute_correlations([1, 2, 3], [1, 3, 2])
    assert (scores.plcc, scores.srocc, scores.krocc) == pytest.approx((0.5, 0.5, 1 / 3))
    assert absolute_correlations([1, 2, 3], [10, 20, 30]).score == pytest.approx(3.0)


# ---- loop-based references -------------------------------------------------------------------------------------
def average_ranks(values: list[float]) -> list[float]:
    return [sum(1 for w in values if w < v) + (sum(1 for w in values if w == v) + 1) / 2 for v in values]


def pearson(x: list[float], y: list[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    return sxy / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def kendall_tau_b(x: list[float], y: list[float]) -> float:
    concordant = discordant = ties_x = ties_y = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        dx, dy = x[i] - x[j], y[i] - y[j]
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            ties_x += 1
        elif dy == 0:
            ties_y += 1
        elif dx * dy > 0:
            concordant += 1
        else:
            discordant += 1
    pairs = concordant + discordant
    return (concordant - discordant) / math.sqrt((pairs + ties_x) * (pairs + ties_y))


@pytest.mark.parametrize("seed", range(8))
def test_match_loop_references(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.integers(5, 40))
    gt = list(np.round(rng.integers(0, 21, size) * 0.2, 1))  # 0-4 on a 0.2 grid: many ties
    pred = list(rng.normal(size=size).round(1) + np.array(gt) * (seed % 3 - 1))
    scores = absolute_correlations(pred, gt)
    expected = (abs(pearson(pred, gt)), abs(pearson(average_ranks(pred), average_ranks(gt))),
                abs(kendall_tau_b(pred, gt)))
    assert (scores.plcc, scores.srocc, scores.krocc) == pytest.approx(expected, abs=1e-6)
