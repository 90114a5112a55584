"""PUMA nucleus matching and macro F1: worked example, hand-computed cases, brute-force reference."""

from __future__ import annotations

import numpy as np
import pytest

from rexmle_grade.metrics.nuclei import (
    ClassCounts,
    Nucleus,
    macro_f1_over_rois,
    match_nuclei,
    roi_class_counts,
    roi_class_f1,
    vertex_mean,
)

TUMOR, LYMPH, OTHER = "nuclei_tumor", "nuclei_lymphocyte", "nuclei_other"


def n(name: str, x: float, y: float, score: float = 1.0) -> Nucleus:
    return Nucleus(name, float(x), float(y), score)


def test_worked_example_track1():
    i1_gt = [n(TUMOR, 100, 100), n(TUMOR, 200, 100), n(LYMPH, 300, 300), n(OTHER, 500, 500)]
    i1_pred = [n(TUMOR, 105, 100), n(TUMOR, 600, 600), n(LYMPH, 300, 312), n(OTHER, 500, 516)]
    i2 = [n(TUMOR, 100, 100), n(LYMPH, 150, 150)]
    roi1 = roi_class_counts(i1_gt, i1_pred)
    assert roi1 == {TUMOR: ClassCounts(1, 1, 1), LYMPH: ClassCounts(1, 0, 0), OTHER: ClassCounts(0, 1, 1)}
    per_roi = [roi_class_f1(i1_gt, i1_pred), roi_class_f1(i2, list(i2))]
    assert per_roi[0] == {TUMOR: 0.5, LYMPH: 1.0, OTHER: 0.0}
    assert per_roi[1] == {TUMOR: 1.0, LYMPH: 1.0}
    macro, per_class = macro_f1_over_rois(per_roi)
    assert per_class == {TUMOR: 0.75, LYMPH: 1.0, OTHER: 0.0}
    assert macro == pytest.approx(0.583333, abs=1e-6)


def test_radius_is_strict():
    gt = [n(TUMOR, 0, 0)]
    assert match_nuclei(gt, [n(TUMOR, 9, 12)]) == []  # exactly 15 px
    assert match_nuclei(gt, [n(TUMOR, 9, 11.999)]) == [(0, 0)]


def test_class_names_must_agree():
    assert match_nuclei([n(TUMOR, 0, 0)], [n(LYMPH, 0, 0)]) == []
    assert roi_class_f1([n(TUMOR, 0, 0)], [n(LYMPH, 0, 0)]) == {TUMOR: 0.0, LYMPH: 0.0}


def test_greedy_in_ground_truth_order_can_lose_a_match():
    # GT 0 takes the nearer prediction 1, which GT 1 needed; prediction 0 is out of GT 1's reach
    gt = [n(TUMOR, 0, 0), n(TUMOR, 20, 0)]
    pred = [n(TUMOR, -10, 0), n(TUMOR, 8, 0)]
    assert match_nuclei(gt, pred) == [(0, 1)]


def test_highest_score_wins_over_distance_then_distance_then_order():
    gt = [n(TUMOR, 0, 0)]
    assert match_nuclei(gt, [n(TUMOR, 1, 0, 0.5), n(TUMOR, 10, 0, 0.9)]) == [(0, 1)]
    assert match_nuclei(gt, [n(TUMOR, 5, 0, 0.9), n(TUMOR, 1, 0, 0.9)]) == [(0, 1)]
    assert match_nuclei(gt, [n(TUMOR, 0, 3), n(TUMOR, 3, 0)]) == [(0, 0)]


def test_duplicate_positions_remove_the_first_duplicate():
    # the official pool removal deletes the first prediction at the chosen position: the higher-scored duplicate
    # stays available, so both ground-truth nuclei match it
    gt = [n(TUMOR, 0, 0), n(TUMOR, 2, 0)]
    pred = [n(TUMOR, 1, 0, 0.5), n(TUMOR, 1, 0, 0.9)]
    assert match_nuclei(gt, pred) == [(0, 1), (1, 1)]
    assert roi_class_counts(gt, pred) == {TUMOR: ClassCounts(2, 0, 0)}


def test_unknown_prediction_names_add_zero_classes_and_absent_classes_cap_the_score():
    gt = [n(TUMOR, 0, 0)]
    macro, per_class = macro_f1_over_rois([roi_class_f1(gt, [n(TUMOR, 0, 0), n("tumour", 50, 50)])])
    assert per_class == {TUMOR: 1.0, "tumour": 0.0}
    assert macro == 0.5
    # a perfect prediction of a class present in one ROI of two scores 1/2 for that class
    macro, per_class = macro_f1_over_rois([{TUMOR: 1.0, LYMPH: 1.0}, {TUMOR: 1.0}])
    assert per_class == {TUMOR: 1.0, LYMPH: 0.5} and macro == 0.75
    assert np.isnan(macro_f1_over_rois([{}, {}])[0])


def test_empty_sides():
    assert roi_class_f1([], []) == {}
    assert roi_class_f1([n(TUMOR, 0, 0)], []) == {TUMOR: 0.0}
    assert roi_class_f1([], [n(TUMOR, 0, 0)]) == {TUMOR: 0.0}


def test_vertex_mean_counts_a_repeated_closing_vertex():
    square = np.array([[0, 0], [4, 0], [4, 4], [0, 4]])
    assert vertex_mean(square) == (2.0, 2.0)
    assert vertex_mean(np.vstack([square, square[:1]])) == (1.6, 1.6)
    assert vertex_mean(np.array([[0, 0, 7], [3, 0, 7], [0, 3, 7]])) == (1.0, 1.0)


def test_class_counts_f1_conventions():
    assert ClassCounts(0, 0, 0).f1 == 0.0
    assert ClassCounts(2, 1, 3).f1 == pytest.approx(2 * (2 / 3) * (2 / 5) / (2 / 3 + 2 / 5))


# ---- brute-force reference: the official eval_nuclei.py procedure written out literally ------------------------
def reference_counts(gt: list[Nucleus], pred: list[Nucleus]) -> dict[str, tuple[int, int, int]]:
    pool: dict[str, list[Nucleus]] = {}
    for p in pred:
        pool.setdefault(p.name, []).append(p)
    tp: dict[str, int] = {}
    for g in gt:
        eligible = []
        for p in pool.get(g.name, []):
            distance = float(np.linalg.norm(np.array([g.x, g.y]) - np.array([p.x, p.y])))
            if distance < 15:
                eligible.append((p, distance))
        eligible.sort(key=lambda e: (-e[0].score, e[1]))
        if eligible:
            best = eligible[0][0]
            tp[g.name] = tp.get(g.name, 0) + 1
            for k, p in enumerate(pool[g.name]):
                if (p.x, p.y) == (best.x, best.y):
                    del pool[g.name][k]
                    break
    names = {x.name for x in gt} | {x.name for x in pred}
    return {k: (tp.get(k, 0), sum(p.name == k for p in pred) - tp.get(k, 0),
                sum(g.name == k for g in gt) - tp.get(k, 0)) for k in names}


@pytest.mark.parametrize("seed", range(10))
def test_matches_brute_force_reference(seed):
    rng = np.random.default_rng(seed)
    names = [TUMOR, LYMPH, OTHER]

    def cloud(count: int) -> list[Nucleus]:
        xy = rng.integers(0, 60, size=(count, 2)).astype(float)  # integer grid: ties and exact 15-px distances
        return [n(names[int(rng.integers(0, 3))], x, y, float(rng.choice([0.5, 0.7, 1.0]))) for x, y in xy]

    gt = cloud(int(rng.integers(0, 40)))
    pred = cloud(int(rng.integers(0, 40)))
    pred += [pred[k] for k in range(0, len(pred), 7)]  # exact duplicates
    fast = {k: (c.tp, c.fp, c.fn) for k, c in roi_class_counts(gt, pred).items()}
    assert fast == reference_counts(gt, pred)
