"""Grader of ``dentex`` (DENTEX, MICCAI 2023): COCO box AP/AP50/AP75/AR on three hierarchical label sets.

Contract with the task:

* ``public/test_manifest.json``: the test image ids (the image file stems, e.g. ``train_7``);
* ``private/answers.csv``: ``image_id, coco_json``; ``coco_json`` is the relative path (under ``private/``) of ONE
  COCO JSON for the whole test set, the same value in every row. It holds ``images`` (``id``, ``file_name`` whose
  stem is the test image id), ``annotations`` (``image_id``, ``bbox`` [x, y, w, h], ``category_id_1``,
  ``category_id_2``, ``category_id_3``; ``area`` and ``iscrowd`` optional) and ``categories_1``, ``categories_2``,
  ``categories_3`` (the training JSON's lists). Its images must be exactly the test images.

Submission: ``image_id, predictions_json``; each path names a JSON file (``predictions/<id>.json``) holding a list
(possibly empty) of boxes ``{"bbox": [x, y, w, h], "category_id_1": q, "category_id_2": e, "category_id_3": d,
"score": s}`` in pixels of that image, with the training JSON's 0-based ids: quadrant q 0-3 (FDI quadrant 1-4),
tooth e 0-7 (tooth 1-8), diagnosis d 0-3 (0 Impacted, 1 Caries, 2 Periapical Lesion, 3 Deep Caries).

Metric (official ``evaluation.py``): for each label set the boxes keep their geometry and score and take that set's
id; default ``COCOeval`` over all test images with the GT file's category list; AP = stats[0], AP50 = stats[1],
AP75 = stats[2], AR = stats[8]; each ``*_mean`` is the plain mean over the three sets.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from rexmle_grade.errors import InvalidSubmissionError, TaskDataMissingError
from rexmle_grade.grader import (
    NO_IMAGE_HEADER,
    CaseInput,
    Direction,
    Grader,
    MetricSpec,
    TestManifest,
    answer_cases,
    read_answers,
    register_grader,
)
from rexmle_grade.graders._images2d import (
    enough_problems,
    is_finite_number,
    raise_problems,
    write_file_submission,
)
from rexmle_grade.io import read_json
from rexmle_grade.metrics.coco import CocoBoxScores, DetectedBox, GroundTruthBox, coco_box_scores
from rexmle_grade.schema import FileColumn, FileKind, SubmissionSchema


@dataclass(frozen=True)
class LabelSet:
    name: str  # metric suffix
    key: str  # id field of a box
    categories_key: str  # category list of the ground-truth file
    n_ids: int  # valid ids are 0..n_ids-1 (the training JSON's categories)
    meaning: str


LABEL_SETS = (
    LabelSet("quadrant", "category_id_1", "categories_1", 4, "0-3 = FDI quadrant 1-4"),
    LabelSet("enumeration", "category_id_2", "categories_2", 8, "0-7 = tooth 1-8"),
    LabelSet("diagnosis", "category_id_3", "categories_3", 4,
             "0 Impacted, 1 Caries, 2 Periapical Lesion, 3 Deep Caries"),
)
SCORE_FIELDS = (("ap", "AP over IoU 0.50:0.95"), ("ap50", "AP at IoU 0.50"), ("ap75", "AP at IoU 0.75"),
                ("ar", "AR with 100 detections per image (IoU 0.50:0.95)"))
def _is_id(value: Any, n_ids: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n_ids


def parse_boxes(data: Any, what: str) -> list[tuple[float, float, float, float, int, int, int, float]]:
    """(x, y, w, h, q, e, d, score) per box; every problem is listed, nothing is converted or defaulted."""
    if not isinstance(data, list):
        raise InvalidSubmissionError(f"{what}: expected a JSON list of box objects, got {type(data).__name__}")
    problems: list[str] = []
    boxes = []
    for k, box in enumerate(data):
        if enough_problems(problems):
            break
        where = f"{what} [{k}]"
        if not isinstance(box, dict):
            problems.append(f"{where} is a {type(box).__name__}; expected an object")
            continue
        missing = [f for f in ("bbox", *(s.key for s in LABEL_SETS), "score") if f not in box]
        if missing:
            problems.append(f"{where} lacks field(s) {missing}")
            continue
        bbox = box["bbox"]
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(is_finite_number(v) for v in bbox)):
            problems.append(f"{where} 'bbox' is {reprlib.repr(bbox)}; expected [x, y, w, h] (4 finite numbers)")
        elif bbox[2] < 0 or bbox[3] < 0:
            problems.append(f"{where} 'bbox' {bbox!r} has a negative width or height; boxes are [x, y, w, h]")
        for label_set in LABEL_SETS:
            value = box[label_set.key]
            if not _is_id(value, label_set.n_ids):
                problems.append(f"{where} '{label_set.key}' is {reprlib.repr(value)}; expected an integer "
                                f"0..{label_set.n_ids - 1} ({label_set.meaning})")
        if not is_finite_number(box["score"]):
            problems.append(f"{where} 'score' is {reprlib.repr(box['score'])}; expected a finite number")
        if not problems:
            boxes.append((*(float(v) for v in bbox), *(box[s.key] for s in LABEL_SETS), float(box["score"])))
    raise_problems(problems, what)
    return boxes


@dataclass(frozen=True)
class DentexTruth:
    image_ids: dict[str, int]  # test image id (file stem) -> COCO image id
    annotations: list[dict[str, Any]]
    categories: dict[str, list[int]]  # label set name -> category ids of the GT file


def load_truth(path: Path) -> DentexTruth:
    def bad(message: str) -> TaskDataMissingError:
        return TaskDataMissingError(f"ground-truth COCO file {str(path)!r}: {message}",
                                    hint="re-run `rexmle prepare dentex --force`")

    if not path.is_file():
        raise bad("missing")
    try:
        data = read_json(path, what="ground-truth COCO file")
    except InvalidSubmissionError as exc:
        raise bad(str(exc)) from None
    try:
        image_ids = {PurePosixPath(str(img["file_name"])).stem: int(img["id"]) for img in data["images"]}
        categories = {s.name: [int(c["id"]) for c in data[s.categories_key]] for s in LABEL_SETS}
        annotations = list(data["annotations"])
        for ann in annotations:
            _ = ann["image_id"], ann["bbox"], *(ann[s.key] for s in LABEL_SETS)
    except (KeyError, TypeError, ValueError) as exc:
        raise bad(f"lacks or mistypes a field ({exc!r})") from None
    return DentexTruth(image_ids, annotations, categories)


class DentexGrader(Grader):
    grader_id = "dentex"
    title = "DENTEX: hierarchical tooth detection (quadrant, enumeration, diagnosis), COCO AP/AR"
    answer_columns = ("coco_json",)
    reference = ("ibrahimethemhamamci/DENTEX @ 5483fcfeb975cec75bd23ebc2945625ea77beaf3, "
                 "DentexChallenge-AlgorithmPhases-Evaluation-Docker/evaluation.py")
    conventions = (
        "Category ids are the training JSON's 0-based ids; the categories evaluated are the ground-truth file's "
        "(official). A box's three ids are scored independently: a wrong tooth number does not stop the box from "
        "being a true positive for quadrant and diagnosis.",
        "Boxes must be [x, y, w, h]; nothing is converted (the release guessed [x1, y1, x2, y2] boxes) and every "
        "field is required (the release defaulted missing ids and scores).",
        "An empty prediction set scores AP = AR = 0 for every label set with ground truth (the official "
        "evaluator crashed).",
        "A category absent from the test ground truth is left out of the averages, so false positives in it cost "
        "nothing (pycocotools rule).",
        "The test set is a re-split of the 705 public training images, not the 250 hidden official test images.",
        "Leaderboard caveat: in the source board the ap50_mean, ap75_mean and ar_mean values of rows 3-6 belong to "
        "other rows and ar_mean equals ar_diagnosis, so positions on those three columns inherit the error.",
        NO_IMAGE_HEADER.convention,
    )

    def __init__(self) -> None:
        self.column = FileColumn(
            name="predictions_json",
            kind=FileKind.JSON,
            path_template="predictions/{id}.json",
            suffixes=(".json",),
            description='JSON list of boxes {"bbox": [x, y, w, h], "category_id_1": q, "category_id_2": e, '
                        '"category_id_3": d, "score": s} in image pixels; 0-based ids as in the training JSON: '
                        + "; ".join(f"{s.key} ({s.name}) {s.meaning}" for s in LABEL_SETS) + ".",
        )
        self.schema = SubmissionSchema(
            id_column="image_id", columns=(self.column,),
            notes=("Each box is scored three times, once per label set, with its score; at most the 100 "
                   "highest-scoring boxes per image and category count (COCO maxDets). An empty list is valid.",),
        )
        metrics = [MetricSpec(f"{field}_mean", Direction.HIGHER_BETTER,
                              f"mean over the three label sets of the COCO {text}", best=1.0)
                   for field, text in SCORE_FIELDS]
        metrics += [MetricSpec(f"{field}_{s.name}", Direction.HIGHER_BETTER, f"{s.name}: COCO {text}", best=1.0)
                    for s in LABEL_SETS for field, text in SCORE_FIELDS]
        self.metrics = tuple(metrics)

    def load_prediction(self, case: CaseInput, column: FileColumn) -> list[tuple]:
        path = case.prediction_path(column)
        what = f"{column.name} of {case.case_id!r} ({path.name})"
        return parse_boxes(read_json(path, what=what), what)

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        boxes = self.load_prediction(case, self.column)
        return {"n_boxes": len(boxes), "_boxes": [list(b) for b in boxes]}

    def _truth(self, private_dir: Path, case_ids: Sequence[str]) -> DentexTruth:
        """The ground-truth COCO file named by answers.csv, checked to hold exactly the test images."""
        paths = {row["coco_json"] for row in read_answers(private_dir, self).values()}
        if len(paths) != 1:
            raise TaskDataMissingError(f"private/answers.csv must name one COCO file in every row, found {paths}",
                                       hint="re-run `rexmle prepare dentex --force`")
        truth = load_truth(private_dir / paths.pop())
        if set(case_ids) != set(truth.image_ids):
            raise TaskDataMissingError(
                "the ground-truth COCO file's images do not match the test ids "
                f"(missing: {sorted(set(case_ids) - set(truth.image_ids))[:10]}, "
                f"extra: {sorted(set(truth.image_ids) - set(case_ids))[:10]})",
                hint="re-run `rexmle prepare dentex --force`")
        return truth

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        case_ids = [str(c["image_id"]) for c in cases]
        truth = self._truth(private_dir, case_ids)
        result: dict[str, float] = {}
        for k, label_set in enumerate(LABEL_SETS):
            ground_truth = [
                GroundTruthBox(image_id=int(a["image_id"]), bbox=tuple(float(v) for v in a["bbox"]),
                               category_id=int(a[label_set.key]), area=a.get("area"),
                               iscrowd=int(a.get("iscrowd", 0)))
                for a in truth.annotations
            ]
            detections = [
                DetectedBox(image_id=truth.image_ids[case_id], bbox=tuple(box[:4]), category_id=int(box[4 + k]),
                            score=box[7])
                for case_id, case in zip(case_ids, cases, strict=True) for box in case["_boxes"]
            ]
            scores = coco_box_scores(sorted(truth.image_ids.values()), truth.categories[label_set.name],
                                     ground_truth, detections)
            result.update(_named(scores, label_set.name))
        for field, _ in SCORE_FIELDS:
            result[f"{field}_mean"] = sum(result[f"{field}_{s.name}"] for s in LABEL_SETS) / len(LABEL_SETS)
        return {m.name: result[m.name] for m in self.metrics}

    def write_gold_submission(self, private_dir: Path, public_dir: Path, dest: Path) -> None:
        case_ids = [c.case_id for c in answer_cases(self, private_dir, public_dir)]
        truth = self._truth(private_dir, case_ids)
        per_image: dict[int, list[dict[str, Any]]] = {}
        for a in truth.annotations:
            per_image.setdefault(int(a["image_id"]), []).append(
                {"bbox": [float(v) for v in a["bbox"]], **{s.key: int(a[s.key]) for s in LABEL_SETS}, "score": 1.0})

        def boxes(case_id: str, path: Path) -> None:
            path.write_text(json.dumps(per_image.get(truth.image_ids[case_id], [])))

        write_file_submission(dest, self.schema, self.column, case_ids, boxes)

    def write_sample_submission(self, public_dir: Path, dest: Path) -> None:
        manifest = TestManifest.read(public_dir)
        write_file_submission(dest, self.schema, self.column, manifest.ids, lambda _, path: path.write_text("[]"))


def _named(scores: CocoBoxScores, set_name: str) -> dict[str, float]:
    return {f"ap_{set_name}": scores.ap, f"ap50_{set_name}": scores.ap50, f"ap75_{set_name}": scores.ap75,
            f"ar_{set_name}": scores.ar100}


@register_grader("dentex")
def _dentex() -> Grader:
    return DentexGrader()
