"""Graders of the PUMA 2024 melanoma tasks: tissue segmentation (micro Dice) and nuclei detection (macro F1).

``puma-track1-task1`` and ``puma-track2-task1`` (tissue; identical metric, different leaderboards)
-----------------------------------------------------------------------------------------------------
Contract with the task:

* ``public/test_manifest.json``: test ROI ids and each ROI's ``size`` = (width, height) (1024x1024 for real ROIs);
* ``private/answers.csv``: ``case_id, label_path``; ``label_path`` is an 8-bit TIFF class map relative to
  ``private/`` with 0 = tissue_white_background, 1 = tissue_stroma, 2 = tissue_blood_vessel, 3 = tissue_tumor,
  4 = tissue_epidermis, 5 = tissue_necrosis (the task rasterises the GeoJSON polygons).

Submission: ``case_id, predicted_mask_path``; each path names a 2-D single-channel integer TIFF
(``predictions/<id>.tif``) of the ROI's size with values 0..5 (other values are rejected).

Metric (official ``evaluate_tissue.py``): both maps are resized to 1024x1024 with PIL nearest-neighbour (an
identity for real ROIs); for each class c in 1..5, I_c and S_c = |GT=c| + |P=c| are summed over all ROIs;
Dice_c = (2 I_c + 1e-5) / (S_c + 1e-5), or 0 when I_c = 0; ``dice`` = mean of the five Dice_c.

``puma-track1-task2`` (3 classes) and ``puma-track2-task2`` (10 classes): nuclei
-----------------------------------------------------------------------------------
Contract with the task: ``private/answers.csv``: ``case_id, nuclei_path``; ``nuclei_path`` is a JSON file in the
submission format below (ground-truth polygons with the official class names) relative to ``private/``.

Submission: ``case_id, predicted_nuclei_path``; each path names a JSON file (``predictions/<id>.json``) in the
Grand Challenge "Multiple polygons" format: an object with a ``polygons`` list whose items have ``name`` (a class
name string), ``path_points`` (a list of ``[x, y]`` or ``[x, y, z]`` numbers in ROI pixels, x = column) and an
optional numeric ``score`` (default 1). Other keys (``type``, ``version``, ``probability``...) are ignored.

Metric: :mod:`rexmle_grade.metrics.nuclei` (centroid match < 15 px, greedy in ground-truth order, per-ROI per-class
F1, each class summed over ROIs and divided by the number of ROIs, mean over every class name seen).
"""

from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rexmle_grade.errors import InvalidSubmissionError, TaskDataMissingError
from rexmle_grade.grader import (
    IMAGE_2D_HEADER,
    NO_IMAGE_HEADER,
    CaseInput,
    Direction,
    Grader,
    MetricSpec,
    TestManifest,
    answer_cases,
    register_grader,
)
from rexmle_grade.graders._images2d import (
    ImageAnswerGrader,
    enough_problems,
    is_finite_number,
    raise_problems,
    read_answer_image,
    read_answer_json,
    read_prediction_image,
    require_same_shape,
    write_file_submission,
    write_tiff,
)
from rexmle_grade.io import read_json
from rexmle_grade.metrics.nuclei import MIN_POLYGON_POINTS, Nucleus, macro_f1_over_rois, roi_class_counts, vertex_mean
from rexmle_grade.schema import FileColumn, FileKind, SubmissionSchema

PUMA_REFERENCE = ("tueimage/PUMA-challenge-eval-track1 @ 2650261fd094d54a9033fbba6c17ff42b33c10f6 and "
                  "tueimage/PUMA-challenge-eval-track2 @ cb847d1a6651500b427963820bc121cb399f0db2 "
                  "(evaluate.py, evaluate_tissue.py, eval_nuclei.py)")

# ---------------------------------------------------------------------------------------------------------------
# tissue
TISSUE_CLASSES = ("tissue_white_background", "tissue_stroma", "tissue_blood_vessel", "tissue_tumor",
                  "tissue_epidermis", "tissue_necrosis")  # index = value in the class map
SCORED_TISSUE_VALUES = range(1, len(TISSUE_CLASSES))
EVALUATION_SIZE = 1024
DICE_EPS = 1e-5


def tissue_micro_dice(intersection: int, size_sum: int) -> float:
    """The official pooled Dice of one class: (2I + 1e-5) / (S + 1e-5), but exactly 0 whenever I = 0."""
    return 0.0 if intersection == 0 else (2 * intersection + DICE_EPS) / (size_sum + DICE_EPS)


def scored_values(class_map: np.ndarray) -> np.ndarray:
    """The map as uint8 with every value outside 0..5 set to 0: such values match no class (official behaviour)."""
    values = class_map.astype(np.int64, copy=False)
    return np.where((values >= 0) & (values < len(TISSUE_CLASSES)), values, 0).astype(np.uint8)


def to_evaluation_grid(class_map: np.ndarray) -> np.ndarray:
    """Resize a uint8 map to 1024x1024 with PIL nearest-neighbour, as the official evaluator does with every map."""
    if class_map.shape == (EVALUATION_SIZE, EVALUATION_SIZE):
        return class_map
    from PIL import Image

    return np.asarray(Image.fromarray(class_map).resize((EVALUATION_SIZE, EVALUATION_SIZE), Image.NEAREST))


def tissue_confusion(truth: np.ndarray, prediction: np.ndarray) -> np.ndarray:
    """6x6 pixel counts [truth value, predicted value] of two maps with values 0..5."""
    n = len(TISSUE_CLASSES)
    joint = truth.astype(np.int64).ravel() * n + prediction.ravel()
    return np.bincount(joint, minlength=n * n).reshape(n, n)


def _tissue_metric_name(value: int) -> str:
    return "dice_" + TISSUE_CLASSES[value].removeprefix("tissue_")


class PumaTissueGrader(ImageAnswerGrader):
    answer_columns = ("label_path",)
    answer_image_column = "label_path"
    write_image = staticmethod(write_tiff)
    reference = PUMA_REFERENCE
    header_rule = IMAGE_2D_HEADER
    conventions = (
        "Dice is pooled over all test ROIs per class (micro Dice) and averaged over the 5 tissue classes; "
        "background is not scored; a class with no correctly predicted pixel in any ROI scores 0, also when it is "
        "absent everywhere (official rule).",
        "Predicted values must be 0..5; the official evaluator silently treated other values as background.",
        "The prediction must be a single-channel image of the ROI's size; both maps are resized to 1024x1024 with "
        "nearest-neighbour as the official evaluator does (no change for the 1024x1024 ROIs).",
        "The ground-truth class maps are rasterised by rexmle from the released GeoJSON (polygon holes honoured, "
        "pixel-centre rule); the organisers' own rasterisation is not public.",
        IMAGE_2D_HEADER.convention,
    )

    def __init__(self, grader_id: str, board: str) -> None:
        self.grader_id = grader_id
        self.title = f"PUMA {board}: tissue segmentation, micro Dice over 5 classes"
        self.column = FileColumn(
            name="predicted_mask_path",
            kind=FileKind.LABEL_IMAGE,
            path_template="predictions/{id}.tif",
            suffixes=(".tif", ".tiff"),
            description="Tissue class map: " + ", ".join(f"{v} = {n}" for v, n in enumerate(TISSUE_CLASSES)) + ".",
            labels=tuple(range(len(TISSUE_CLASSES))),
        )
        self.schema = SubmissionSchema(id_column="case_id", columns=(self.column,))
        self.metrics = (
            MetricSpec("dice", Direction.HIGHER_BETTER,
                       "mean over the 5 tissue classes of the Dice pooled over all test ROIs", best=1.0),
            *(MetricSpec(_tissue_metric_name(v), Direction.HIGHER_BETTER,
                         f"Dice of {TISSUE_CLASSES[v]} pooled over all test ROIs", ranked=False, best=1.0)
              for v in SCORED_TISSUE_VALUES),
        )

    def load_prediction(self, case: CaseInput, column: FileColumn) -> np.ndarray:
        return read_prediction_image(case, column, integer=True, allowed=column.labels)

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        prediction = self.load_prediction(case, self.column)
        truth = read_answer_image(case, "label_path")
        require_same_shape(prediction, truth, case, self.column)
        confusion = tissue_confusion(to_evaluation_grid(scored_values(truth)),
                                     to_evaluation_grid(scored_values(prediction)))
        intersection = [int(confusion[v, v]) for v in SCORED_TISSUE_VALUES]
        size_sum = [int(confusion[v, :].sum() + confusion[:, v].sum()) for v in SCORED_TISSUE_VALUES]
        result: dict[str, Any] = {"_intersection": intersection, "_size_sum": size_sum}
        # the official per-image Dice (unranked there too): a class absent from both maps scores 1
        for v, inter, total in zip(SCORED_TISSUE_VALUES, intersection, size_sum, strict=True):
            result["image_" + _tissue_metric_name(v)] = 1.0 if total == 0 else (2 * inter + DICE_EPS) / (
                total + DICE_EPS)
        return result

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        intersection = np.sum([c["_intersection"] for c in cases], axis=0)
        size_sum = np.sum([c["_size_sum"] for c in cases], axis=0)
        per_class = {_tissue_metric_name(v): tissue_micro_dice(int(i), int(s))
                     for v, i, s in zip(SCORED_TISSUE_VALUES, intersection, size_sum, strict=True)}
        return {"dice": float(np.mean(list(per_class.values()))), **per_class}


@register_grader("puma-track1-task1")
def _puma_track1_tissue() -> Grader:
    return PumaTissueGrader("puma-track1-task1", "track 1 (final board)")


@register_grader("puma-track2-task1")
def _puma_track2_tissue() -> Grader:
    return PumaTissueGrader("puma-track2-task1", "track 2 (final board)")


# ---------------------------------------------------------------------------------------------------------------
# nuclei
TRACK1_NUCLEI = ("nuclei_tumor", "nuclei_lymphocyte", "nuclei_other")
TRACK2_NUCLEI = ("nuclei_tumor", "nuclei_lymphocyte", "nuclei_plasma_cell", "nuclei_histiocyte", "nuclei_melanophage",
                 "nuclei_neutrophil", "nuclei_stroma", "nuclei_epithelium", "nuclei_endothelium", "nuclei_apoptosis")
def parse_multiple_polygons(data: Any, what: str) -> list[Nucleus]:
    """Nuclei of a "Multiple polygons" JSON document; every structural problem is listed.

    Polygons with fewer than 3 points are skipped, as the official evaluator skips them.
    """
    if not isinstance(data, dict) or not isinstance(data.get("polygons"), list):
        got = type(data).__name__ if not isinstance(data, dict) else "an object without a 'polygons' list"
        raise InvalidSubmissionError(
            f'{what}: expected a JSON object {{"type": "Multiple polygons", "polygons": [...]}}, got {got}'
        )
    problems: list[str] = []
    nuclei: list[Nucleus] = []
    for k, polygon in enumerate(data["polygons"]):
        if enough_problems(problems):
            break
        where = f"{what} polygons[{k}]"
        if not isinstance(polygon, dict):
            problems.append(f"{where} is a {type(polygon).__name__}; expected an object with name and path_points")
            continue
        name, points, score = polygon.get("name"), polygon.get("path_points"), polygon.get("score", 1)
        if not isinstance(name, str):
            problems.append(f"{where} 'name' is {reprlib.repr(name)}; expected a class-name string")
        if not is_finite_number(score):
            problems.append(f"{where} 'score' is {reprlib.repr(score)}; expected a finite number (or leave it out)")
        if not isinstance(points, list) or not all(
            isinstance(p, list) and len(p) in (2, 3) and all(is_finite_number(v) for v in p) for p in points
        ):
            problems.append(f"{where} 'path_points' must be a list of [x, y] or [x, y, z] finite numbers")
            continue
        if isinstance(name, str) and is_finite_number(score) and len(points) >= MIN_POLYGON_POINTS:
            x, y = vertex_mean(np.asarray([p[:2] for p in points], dtype=float))
            nuclei.append(Nucleus(name, x, y, float(score)))
    raise_problems(problems, what)
    return nuclei


EMPTY_POLYGONS = {"type": "Multiple polygons", "polygons": [], "version": {"major": 1, "minor": 0}}


class PumaNucleiGrader(Grader):
    answer_columns = ("nuclei_path",)
    reference = PUMA_REFERENCE

    def __init__(self, grader_id: str, board: str, classes: Sequence[str], aggregate_key: str) -> None:
        self.grader_id = grader_id
        self.classes = tuple(classes)
        self.title = f"PUMA {board}: {len(self.classes)}-class nuclei detection, macro F1"
        self.column = FileColumn(
            name="predicted_nuclei_path",
            kind=FileKind.JSON,
            path_template="predictions/{id}.json",
            suffixes=(".json",),
            description='Grand Challenge "Multiple polygons" JSON: {"type": "Multiple polygons", "polygons": '
                        '[{"name": CLASS, "path_points": [[x, y, 0], ...], "score": 0.9}, ...]} with x = column, '
                        "y = row in ROI pixels; class names: " + ", ".join(f"`{c}`" for c in self.classes) + ".",
        )
        self.schema = SubmissionSchema(
            id_column="case_id", columns=(self.column,),
            notes=("A nucleus is located at the mean of its polygon's vertices; polygons with fewer than 3 points "
                   "are ignored. `score` ranks candidates (default 1); the Grand Challenge key `probability` is "
                   "not read.",),
        )
        self.conventions = (
            "A predicted nucleus matches a ground-truth nucleus of the same class name whose vertex-mean centroid "
            "is less than 15 pixels away; ground-truth nuclei are matched greedily in file order, each taking the "
            "highest-scoring, then nearest, unmatched prediction (official rule).",
            "Per ROI an F1 is computed for every class name present in that ROI's ground truth or prediction; "
            "each class's F1 is summed over ROIs and divided by the number of ROIs, so a class missing from "
            "some ROIs caps the score below 1 even for a perfect prediction (official rule, key "
            f"`{aggregate_key}`).",
            "Class names are compared exactly; a prediction name outside the official list adds a class with F1 0 "
            "to the mean (official rule).",
            "Every test ROI must have a prediction file (an empty `polygons` list is valid); the official "
            "evaluator scored whatever jobs existed. If no class occurs in any ROI the score is 0 (the official "
            "code gives NaN).",
            "The ground-truth JSON is converted by rexmle from the released GeoJSON (exterior ring without the "
            "repeated closing vertex"
            + ("; lymphocytes and plasma cells grouped as nuclei_lymphocyte, every other non-tumour class as "
               "nuclei_other" if len(self.classes) == len(TRACK1_NUCLEI) else "")
            + "); the organisers' conversion is not public.",
            NO_IMAGE_HEADER.convention,
        )
        self.metrics = (
            MetricSpec("f1", Direction.HIGHER_BETTER,
                       "mean over class names of (sum over ROIs where the class occurs of its per-ROI F1) / #ROIs",
                       best=None),
            *(MetricSpec(f"f1_{c}", Direction.HIGHER_BETTER,
                         f"{c}: sum over ROIs of its per-ROI F1 / #ROIs (0 if it occurs nowhere)", ranked=False)
              for c in self.classes),
            MetricSpec("unknown_classes", Direction.LOWER_BETTER,
                       "number of predicted class names outside the official list (each adds an F1-0 class)",
                       ranked=False, best=0.0),
        )

    def load_prediction(self, case: CaseInput, column: FileColumn) -> list[Nucleus]:
        path = case.prediction_path(column)
        what = f"{column.name} of {case.case_id!r} ({path.name})"
        return parse_multiple_polygons(read_json(path, what=what), what)

    def load_truth(self, case: CaseInput) -> list[Nucleus]:
        try:
            return parse_multiple_polygons(read_answer_json(case, "nuclei_path"), f"answer of {case.case_id!r}")
        except InvalidSubmissionError as exc:
            raise TaskDataMissingError("; ".join(exc.problems), hint="re-run `rexmle prepare TASK --force`") from None

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        prediction = self.load_prediction(case, self.column)
        truth = self.load_truth(case)
        counts = roi_class_counts(truth, prediction)
        return {
            "n_nuclei": len(truth),
            "n_predicted": len(prediction),
            "n_matched": sum(c.tp for c in counts.values()),
            "_class_f1": {name: c.f1 for name, c in counts.items()},
        }

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        macro, per_class = macro_f1_over_rois([c["_class_f1"] for c in cases])
        result = {"f1": 0.0 if math.isnan(macro) else macro}
        result.update({f"f1_{c}": per_class.get(c, 0.0) for c in self.classes})
        result["unknown_classes"] = float(len(set(per_class) - set(self.classes)))
        return result

    def write_gold_submission(self, private_dir: Path, public_dir: Path, dest: Path) -> None:
        cases = {c.case_id: c for c in answer_cases(self, private_dir, public_dir)}

        def copy(case_id: str, path: Path) -> None:
            path.write_text(json.dumps(read_answer_json(cases[case_id], "nuclei_path")))

        write_file_submission(dest, self.schema, self.column, cases, copy)

    def write_sample_submission(self, public_dir: Path, dest: Path) -> None:
        manifest = TestManifest.read(public_dir)
        write_file_submission(dest, self.schema, self.column, manifest.ids,
                              lambda _, path: path.write_text(json.dumps(EMPTY_POLYGONS)))


@register_grader("puma-track1-task2")
def _puma_track1_nuclei() -> Grader:
    return PumaNucleiGrader("puma-track1-task2", "track 1 (final board)", TRACK1_NUCLEI, "macro_f1_nuclei")


@register_grader("puma-track2-task2")
def _puma_track2_nuclei() -> Grader:
    return PumaNucleiGrader("puma-track2-task2", "track 2 (final board)", TRACK2_NUCLEI, "macro_f1_nuclei_average")
