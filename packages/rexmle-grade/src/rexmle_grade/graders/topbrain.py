"""TopBrain 2025 graders: ``topbrain-track1`` (CTA, 40 vessel labels) and ``topbrain-track2`` (MRA, 42 labels).

Official evaluation: ``CoWBenchmark/TopBrain_Eval_Metrics`` @ ba4252a (package ``topbrain25_eval``); definitions in
``shared/reference/metrics/topbrain_sega.md`` §1. Scored on the whole volume (no ROI crop).

Contract with the task's ``prepare``:

* Case ids are the release's label-file stems, which keep TopCoW's prefix: ``topcow_ct_001``, ``topcow_mr_027``.
* ``submission.csv``: ``image_id, modality, predicted_mask_path``; ``modality`` is ``ct`` (track 1) or ``mr``
  (track 2); masks at ``predictions/<id>_0000.nii.gz`` (``.nii``, ``.mha``, ``.nrrd`` also read): a 3-D integer label
  map on the test image's grid (same size, spacing, origin, direction) with values 0..40 (CTA) or 0..42 (MRA).
* ``public/test_manifest.json``: test ids and each test image's geometry.
* ``private/answers.csv``: ``image_id, label_path`` (ground-truth label map, relative to ``private/``).

Leaderboard columns: class-average Dice, clDice (per class), B0 error and HD95 (290 mm for a label on one side
only), each averaged over cases; ``neighbor_error`` (invalid neighbour labels of the prediction, averaged over the
predicted labels); ``f1_side_road`` (side-road detection F1 pooled over the test set).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from importlib import resources
from typing import Any

import numpy as np

from rexmle_grade.grader import COPIED_HEADER, Direction, MetricSpec, register_grader
from rexmle_grade.graders._vessels import (
    LabelScores,
    MulticlassVesselGrader,
    class_average,
    mask_column,
    modality_schema,
)
from rexmle_grade.metrics.topology import label_adjacency

REFERENCE = ("CoWBenchmark/TopBrain_Eval_Metrics @ ba4252ab0dbe9d59a9ae45058ae040b016aae0ad (topbrain25_eval); "
             "shared/reference/metrics/topbrain_sega.md §1")
MISSING_HD95 = 290.0  # official HD95_UPPER_BOUND, "max head size"
SIDE_ROAD_COMMON = (8, 9, 10, 15, 16, *range(25, 35))  # Pcoms, Acom, 3rd-A2, 3rd-A3, SCA, AICA, PICA, AChA, OA
TRACKS = {
    # modality: (track, name, number of labels, side-road labels beyond the common ones)
    "ct": (1, "CTA", 40, (37, 38, 39)),  # ICVs, R-BVR, L-BVR
    "mr": (2, "MRA", 42, (41, 42)),  # MMAs
}


def valid_neighbours(modality: str) -> dict[int, frozenset[int]]:
    """The organisers' table of allowed touching labels (``valid_neighbors_{ct,mr}_all.json``, symmetric)."""
    text = resources.files("rexmle_grade.graders").joinpath("data", f"valid_neighbors_{modality}_all.json").read_text()
    return {int(label): frozenset(int(n) for n in allowed) for label, allowed in json.loads(text).items()}


def neighbour_error(pred_neighbours: Mapping[int, frozenset[int]], valid: Mapping[int, frozenset[int]]) -> float:
    """Mean over the predicted labels of the number of distinct labels touching them that the table forbids.

    The official code averages over the labels present in the *prediction* (its class set is taken with
    ``gt=pred``); a predicted label touching nothing adds 0 to the sum and 1 to the count; no label -> 0.
    """
    return class_average([len(found - valid[label]) for label, found in pred_neighbours.items()])


class TopBrainGrader(MulticlassVesselGrader):
    """Whole-brain multiclass vessel segmentation: five class-average columns and side-road detection F1."""

    detection_metric = "f1_side_road"
    missing_distance = MISSING_HD95
    per_class_cldice = True
    header_rule = COPIED_HEADER

    def __init__(self, modality: str) -> None:
        track, name, n_labels, extra_side_roads = TRACKS[modality]
        self.modality = modality
        self.grader_id = f"topbrain-track{track}"
        self.title = f"TopBrain 2025 {name} whole-brain multiclass vessel segmentation"
        self.reference = REFERENCE
        self.allowed_labels = frozenset(range(n_labels + 1))
        self.detection_labels = (*SIDE_ROAD_COMMON, *extra_side_roads)
        self.valid = valid_neighbours(modality)
        self.schema = modality_schema(modality, mask_column(
            sorted(self.allowed_labels),
            f"Label map with the TopBrain {name} labels 0 (background) to {n_labels}, as in the training labels."))
        self.metrics = (
            *self.class_average_specs("centreline Dice per label (Lee skeletons in (x, y, z) order; 0 for a label on "
                                      "one side only), class-averaged per case, then averaged over cases"),
            MetricSpec("neighbor_error", Direction.LOWER_BETTER, "per predicted label, the number of distinct labels "
                       "touching it (26-neighbourhood) that the organisers' table of valid neighbours forbids; mean "
                       "over the labels present in the prediction, then over cases (the ground truth is not used)",
                       best=0.0),
            MetricSpec("f1_side_road", Direction.HIGHER_BETTER, f"detection F1 (IoU >= 0.25) of the "
                       f"{len(self.detection_labels)} side-road labels {list(self.detection_labels)}, counts pooled "
                       "over the test set per label, unweighted mean (0 for a label never seen, so a perfect "
                       "submission reaches 1 only if every side-road label occurs in the test set)"),
        )
        self.conventions = (
            "Class set per case = labels present in ground truth or prediction. A label on one side only scores "
            f"Dice 0, clDice 0, HD95 {MISSING_HD95:g} mm, B0 error = its component count; an empty class set "
            "scores 0 on every class-average column.",
            "HD95 is symmetric (maximum of the two directed 95th percentiles) between 26-neighbour contours, in mm "
            "with the ground truth's spacing (the original ReX-MLE release used one direction and 6-connected edges).",
            "neighbor_error averages over the predicted labels only, as the official code does (the release averaged "
            "over ground-truth and predicted labels).",
            "f1_side_road pools detections over the test set; a side-road label absent from every ground truth and "
            "prediction scores F1 0, so a perfect submission can score below 1.",
            f"Non-integer voxels or labels above {n_labels} are rejected (the official evaluator cast them).",
            COPIED_HEADER.convention,
        )

    def extra_case_scores(self, gt: np.ndarray, pred: np.ndarray,
                          scores: Mapping[int, LabelScores]) -> dict[str, Any]:
        return {"neighbor_error": neighbour_error(label_adjacency(pred), self.valid)}

    def extra_aggregate(self, cases: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        return self.case_means(cases, ("neighbor_error",))


for _modality, (_track, *_) in TRACKS.items():
    register_grader(f"topbrain-track{_track}")(partial(TopBrainGrader, _modality))
