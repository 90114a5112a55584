"""Detection outcomes, pooled F1 and balanced accuracy (TopCoW §5 E2/E3, TopBrain §1.6 E4)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score

from rexmle_grade.metrics.classification import balanced_accuracy
from rexmle_grade.metrics.detection import Detection, DetectionCounts, detect, mean_pooled_f1, pooled_counts

TP, FN, FP, TN = Detection.TP, Detection.FN, Detection.FP, Detection.TN


def test_detect_threshold_is_inclusive() -> None:
    assert detect(4, 4, 2) is TP  # IoU 2/6
    assert detect(4, 4, 1) is FN  # IoU 1/7
    assert detect(4, 1, 1) is TP  # IoU 1/4 = 0.25 exactly
    assert detect(5, 2, 1) is FN  # IoU 1/6
    assert detect(3, 0, 0) is FN  # nothing predicted: IoU 0
    assert detect(0, 2, 0) is FP
    assert detect(0, 0, 0) is TN
    assert detect(4, 2, 2, iou_threshold=0.6) is FN


def test_counts_and_f1_conventions() -> None:
    counts = DetectionCounts.of([TP, FP, FN, TN, TN])
    assert (counts.tp, counts.fp, counts.fn, counts.tn) == (1, 1, 1, 2)
    assert counts.f1 == pytest.approx(0.5)
    assert (counts.precision, counts.recall) == (0.5, 0.5)
    never_seen = DetectionCounts.of([TN, TN])
    assert (never_seen.f1, never_seen.precision, never_seen.recall) == (0.0, 0.0, 0.0)


def test_topcow_e2_pooled_f1() -> None:
    # Acom TP/FN/FP, R-Pcom TP/TP/TN, L-Pcom TN/TN/TN, 3rd-A2 TN/FP/TN -> 0.5, 1.0, 0, 0 -> 0.375
    cases = [{"10": "TP", "8": "TP", "9": "TN", "15": "TN"},
             {"10": "FN", "8": "TP", "9": "TN", "15": "FP"},
             {"10": "FP", "8": "TN", "9": "TN", "15": "TN"}]
    counts = pooled_counts(cases, (8, 9, 10, 15))
    assert {label: c.f1 for label, c in counts.items()} == {8: 1.0, 9: 0.0, 10: 0.5, 15: 0.0}
    assert mean_pooled_f1(cases, (8, 9, 10, 15)) == pytest.approx(0.375)


def test_topbrain_e4_side_road_f1() -> None:
    # case A: R-Pcom IoU 0.5 (TP), Acom exact (TP); case B: R-Pcom IoU 1/6 (FN); case C: R-Pcom predicted only (FP)
    side_roads = (8, 9, 10, 15, 16, *range(25, 35), 37, 38, 39)
    base = {str(label): "TN" for label in side_roads}
    cases = [{**base, "8": detect(4, 2, 2).value, "10": detect(3, 3, 3).value},
             {**base, "8": detect(5, 2, 1).value},
             {**base, "8": detect(0, 2, 0).value}]
    counts = pooled_counts(cases, side_roads)
    assert (counts[8].tp, counts[8].fp, counts[8].fn) == (1, 1, 1)
    assert mean_pooled_f1(cases, side_roads) == pytest.approx(1.5 / 18)
    assert mean_pooled_f1(cases, side_roads) == pytest.approx(0.08333, abs=1e-5)
    assert np.mean([c.precision for c in counts.values()]) == pytest.approx(0.08333, abs=1e-5)


def test_topcow_e3_balanced_accuracy() -> None:
    assert balanced_accuracy(["A", "A", "A", "B"], ["A", "A", "C", "C"]) == pytest.approx(1 / 3)
    truth = ["V1", "V1", "V1", "V2", "V3"]
    matched = [True, False, True, False, True]
    predicted = [t if m else "FAIL" for t, m in zip(truth, matched, strict=True)]
    assert balanced_accuracy(truth, predicted) == pytest.approx((2 / 3 + 0 + 1) / 3)
    assert balanced_accuracy(truth, predicted) == pytest.approx(0.5556, abs=1e-4)


def test_balanced_accuracy_matches_sklearn() -> None:
    rng = np.random.default_rng(2)
    for _ in range(20):
        y_true = list(rng.choice(["a", "b", "c", "d"], 15))
        y_pred = list(rng.choice(["a", "b", "c", "e"], 15))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "y_pred contains classes not in y_true" is expected
            expected = balanced_accuracy_score(y_true, y_pred)
        assert balanced_accuracy(y_true, y_pred) == pytest.approx(expected, abs=1e-12)


def test_balanced_accuracy_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="entries"):
        balanced_accuracy(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="at least one"):
        balanced_accuracy([], [])
