"""TopCoW 2024 graders: ``topcow-track{1,2}-task{1,2,3}`` (track 1 = CTA, modality ``ct``; track 2 = MRA, ``mr``).

Official evaluation: ``CoWBenchmark/TopCoW_Eval_Metrics`` @ 25ca839 (package ``topcow24_eval``); every definition
here follows ``shared/reference/metrics/topcow.md``. Both tracks are evaluated identically.

Contract with the task's ``prepare`` (all three tasks):

* Case ids are the release's file stems with the modality, e.g. ``topcow_ct_001`` or ``topcow_mr_131`` (the label
  file ``cow_seg_labelsTr/topcow_ct_001.nii.gz`` has the id as its stem; the image adds ``_0000``).
* ``submission.csv``: ``image_id, modality, <prediction column>``; ``modality`` is ``ct`` (track 1) or ``mr``.
* ``public/test_manifest.json``: test ids with each test image's geometry (validation of task-1 masks, sample
  submissions).
* ``private/answers.csv`` (``image_id`` + answer columns, paths relative to ``private/``):

  ====== ================================= ==============================================================
  task   answer columns                    files
  ====== ================================= ==============================================================
  1      ``label_path``, ``roi_path``      label map (``cow_seg_labelsTr``), ROI txt (``roi_loc_labelsTr``)
  2      ``roi_path``                      ROI txt (``--- ROI Meta Data ---``, size line, location line)
  3      ``edges_path``                    edge-list YAML (``antpos_edges_labelsTr``)
  ====== ================================= ==============================================================

Predictions:

* task 1, ``predicted_mask_path`` -> ``predictions/<id>_0000.nii.gz``: a label map on the test image's grid (same
  size, spacing, origin, direction), integer voxels in {0..12, 15}. Scored inside the case's ground-truth ROI box.
* task 2, ``predicted_bbox_path`` -> ``predictions/<id>_bbox.json``: ``{"size": [sx, sy, sz], "location": [x, y, z]}``,
  plain integers, voxel indices in (x, y, z) = NIfTI index order; ``location`` is the minimum corner and the box
  covers ``location .. location + size - 1`` inclusive; sizes >= 1.
* task 3, ``predicted_edges_path`` -> ``predictions/<id>_edges.json`` (``.yml``/``.yaml`` also read):
  ``{"anterior": {"L-A1", "Acom", "3rd-A2", "R-A1"}, "posterior": {"L-Pcom", "L-P1", "R-P1", "R-Pcom"}}``,
  exactly these keys, values the integers 0 or 1.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rexmle_grade.errors import InvalidSubmissionError, TaskDataMissingError
from rexmle_grade.grader import (
    COPIED_HEADER,
    NO_IMAGE_HEADER,
    CaseInput,
    Direction,
    Grader,
    MetricSpec,
    TestManifest,
    answer_cases,
    register_grader,
    write_submission_csv,
)
from rexmle_grade.graders._binary_volume import LABEL_PATH
from rexmle_grade.graders._vessels import (
    LabelScores,
    MulticlassVesselGrader,
    detections,
    mask_column,
    modality_schema,
)
from rexmle_grade.io import Geometry, check_file_size, full_suffix, read_json
from rexmle_grade.metrics.boxes import BoxSlices, VoxelBox, boundary_iou, box_iou, crop_slices_zyx, parse_roi_txt
from rexmle_grade.metrics.classification import balanced_accuracy
from rexmle_grade.metrics.detection import Detection
from rexmle_grade.metrics.topology import label_adjacency
from rexmle_grade.schema import FileColumn, FileKind

REFERENCE = ("CoWBenchmark/TopCoW_Eval_Metrics @ 25ca8399e056e71e3ff6743ac4a47ce28624cb3d "
             "(topcow24_eval); shared/reference/metrics/topcow.md")
MODALITIES = {"ct": (1, "CTA"), "mr": (2, "MRA")}  # modality -> (track number, name)

LABEL_NAMES = {1: "BA", 2: "R-PCA", 3: "L-PCA", 4: "R-ICA", 5: "R-MCA", 6: "L-ICA", 7: "L-MCA", 8: "R-Pcom",
               9: "L-Pcom", 10: "Acom", 11: "R-ACA", 12: "L-ACA", 15: "3rd-A2"}
ALLOWED_LABELS = frozenset({0, *LABEL_NAMES})
GROUP2_LABELS = (8, 9, 10, 15)
REGION_LABELS = {"anterior": (10, 11, 12, 15), "posterior": (2, 3, 8, 9)}
EDGE_KEYS = {"anterior": ("L-A1", "Acom", "3rd-A2", "R-A1"), "posterior": ("L-Pcom", "L-P1", "R-P1", "R-Pcom")}
# (left, right) label pairs whose median x decides a left-right flip, tried in order
FLIP_PAIRS = {"anterior": ((6, 4), (12, 11)), "posterior": ((3, 2),)}
MISSING_HD95 = 90.0  # official HD95_UPPER_BOUND: "roughly the maximum distance in ROI"
ROI_ANSWER = "roi_path"
EDGES_ANSWER = "edges_path"
FAILED = "FAIL"

EdgeLists = dict[str, tuple[int, ...]]


def task_id(modality: str, task: int) -> str:
    return f"topcow-track{MODALITIES[modality][0]}-task{task}"


def _common_conventions(modality: str) -> tuple[str, ...]:
    return (f"Tracks are evaluated identically; this is the {MODALITIES[modality][1]} track (modality `{modality}`).",)


def read_private_text(case: CaseInput, column: str) -> str:
    path = case.answer_path(column)
    if not path.is_file():
        raise TaskDataMissingError(f"{column} {path} of case {case.case_id!r} is missing",
                                   hint="re-run `rexmle prepare TASK --force`")
    return path.read_text()


def read_roi(case: CaseInput) -> VoxelBox:
    try:
        return parse_roi_txt(read_private_text(case, ROI_ANSWER))
    except ValueError as exc:
        raise TaskDataMissingError(f"ROI file of case {case.case_id!r} is malformed: {exc}",
                                   hint="re-run `rexmle prepare TASK --force`") from None


# ---- task 1: multiclass segmentation ---------------------------------------------------------------------------
def edge_lists(present: set[int], neighbours: Mapping[int, frozenset[int]]) -> EdgeLists:
    """Anterior [L-A1, Acom, 3rd-A2, R-A1] and posterior [L-Pcom, L-P1, R-P1, R-Pcom] edges of a label map."""

    def touches(label: int, other: int) -> bool:
        return label in present and other in neighbours.get(label, frozenset())

    return {
        "anterior": (int(touches(12, 6)), int(10 in present), int(15 in present), int(touches(11, 4))),
        "posterior": (int(9 in present), int(touches(3, 1)), int(touches(2, 1)), int(8 in present)),
    }


def variant(region: str, edges: Sequence[int]) -> str:
    """Variant class string, e.g. ``Var_Ant_1_1_0_1`` (the official ``edge_list_to_variant_str``)."""
    return f"Var_{'Ant' if region == 'anterior' else 'Pos'}_" + "_".join(str(int(e)) for e in edges)


def median_x(mask: np.ndarray) -> float:
    """numpy's median of the x (last-axis) indices of a mask's voxels, from per-x counts (no coordinate list)."""
    cumulative = np.cumsum(np.count_nonzero(mask, axis=(0, 1)))
    n = int(cumulative[-1])
    # the voxel of 0-based rank r sits at the first x whose cumulative count exceeds r
    lower, upper = np.searchsorted(cumulative, [(n - 1) // 2, n // 2], side="right")
    return (lower + upper) / 2


def left_right_flipped(pred: np.ndarray, present: set[int], region: str) -> bool:
    """True when the left label of the first fully present pair lies at smaller median x than its right twin (LPS+)."""
    for left, right in FLIP_PAIRS[region]:
        if left in present and right in present:
            return median_x(pred == left) < median_x(pred == right)
    return False


def topology_matches(region: str, scores: Mapping[int, LabelScores], gt_neighbours: Mapping[int, frozenset[int]],
                     pred_neighbours: Mapping[int, frozenset[int]], flipped: bool) -> bool:
    """Official topology match of one region: every region label detected (TP/TN) with the same neighbour labels and
    the same number of components as in the ground truth, and no left-right flip."""
    labels = REGION_LABELS[region]
    found = detections(scores, labels)
    for label in labels:
        if found[str(label)] not in (Detection.TP.value, Detection.TN.value):
            return False
        if gt_neighbours.get(label, frozenset()) != pred_neighbours.get(label, frozenset()):
            return False
        s = scores.get(label)
        if s is not None and s.gt_components != s.pred_components:
            return False
    return not flipped


class TopCowSegmentationGrader(MulticlassVesselGrader):
    """Task 1: nine leaderboard columns from class-average voxel metrics, Group-2 detection, graph and topology."""

    allowed_labels = ALLOWED_LABELS
    detection_labels = GROUP2_LABELS
    detection_metric = "f1_grp2"
    missing_distance = MISSING_HD95
    per_class_cldice = False
    answer_columns = (LABEL_PATH, ROI_ANSWER)
    header_rule = COPIED_HEADER

    def __init__(self, modality: str) -> None:
        self.modality = modality
        self.grader_id = task_id(modality, 1)
        self.title = f"TopCoW 2024 {MODALITIES[modality][1]} multiclass Circle-of-Willis segmentation"
        self.reference = REFERENCE
        labels = ", ".join(f"{k} {v}" for k, v in LABEL_NAMES.items())
        mask = mask_column(sorted(ALLOWED_LABELS), f"Label map: 0 background, {labels} (13 and 14 unused).")
        self.schema = modality_schema(modality, mask, notes=(
            "Voxel indices (x, y, z) follow NIfTI/SimpleITK index order; the images are LPS+, so every left-side "
            "vessel lies at larger x than its right-side twin (a left-right swap fails the topology columns).",
        ))
        self.metrics = (
            *self.class_average_specs("centreline Dice of the merged binary masks (all labels > 0), skeletons in "
                                      "(x, y, z) order, averaged over cases"),
            MetricSpec("f1_grp2", Direction.HIGHER_BETTER, "detection F1 (IoU >= 0.25) of R-Pcom, L-Pcom, Acom, "
                       "3rd-A2, counts pooled over the test set per label, mean of the 4 (0 for a label never seen, "
                       "so a perfect submission reaches 1 only if every Group-2 label occurs in the test set)"),
            *(MetricSpec(f"{region}_graph_acc", Direction.HIGHER_BETTER, f"balanced accuracy over {region} variants "
                         "of the edge list derived from the predicted mask vs the one derived from the ground truth",
                         best=1.0) for region in REGION_LABELS),
            *(MetricSpec(f"{region}_topology", Direction.HIGHER_BETTER, f"balanced accuracy over {region} variants "
                         "where a case counts as correct only if every region label is detected (TP/TN) with the "
                         "ground truth's neighbours and component count and no left-right flip", best=1.0)
              for region in REGION_LABELS),
        )
        self.conventions = (
            *_common_conventions(modality),
            "Every metric is computed inside the case's ground-truth CoW ROI box (official need_crop=True); the test "
            "ROIs are private.",
            "Class set per case = labels present in ground truth or prediction inside the ROI. A label on one side "
            f"only scores Dice 0, HD95 {MISSING_HD95:g} mm, B0 error = its component count; an empty class set scores "
            "Dice 0, clDice 0, B0 error 0, HD95 0.",
            "Distances use the ground truth's spacing; contours are 26-connected; HD95 is the maximum of the two "
            "directed 95th percentiles.",
            "f1_grp2 pools detections over the test set per label; a Group-2 label absent from every ground truth and "
            "prediction scores F1 0, so a perfect submission can score below 1.",
            "Graph and topology columns derive edge lists from the masks (26-neighbour touching), not from the "
            "task-3 annotations; the left-right check assumes LPS+ images (x grows towards patient left).",
            "Non-integer voxels or labels outside {0..12, 15} are rejected (the official evaluator cast them).",
            COPIED_HEADER.convention,
        )

    def region(self, case: CaseInput, truth: Geometry) -> BoxSlices:
        """The case's ground-truth ROI box, clipped to the image as the official crop (``need_crop=True``)."""
        try:
            return crop_slices_zyx(read_roi(case), truth.size)
        except ValueError as exc:
            raise TaskDataMissingError(f"ROI of case {case.case_id!r}: {exc}",
                                       hint="re-run `rexmle prepare TASK --force`") from None

    def extra_case_scores(self, gt: np.ndarray, pred: np.ndarray,
                          scores: Mapping[int, LabelScores]) -> dict[str, Any]:
        gt_present = {label for label, s in scores.items() if s.gt_voxels}
        pred_present = {label for label, s in scores.items() if s.pred_voxels}
        gt_neighbours, pred_neighbours = label_adjacency(gt), label_adjacency(pred)
        gt_edges = edge_lists(gt_present, gt_neighbours)
        pred_edges = edge_lists(pred_present, pred_neighbours)
        result: dict[str, Any] = {}
        for region in REGION_LABELS:
            flipped = left_right_flipped(pred, pred_present, region)
            match = topology_matches(region, scores, gt_neighbours, pred_neighbours, flipped)
            result[f"{region}_graph_match"] = int(gt_edges[region] == pred_edges[region])
            result[f"{region}_topology_match"] = int(match)
            result[f"_{region}_gt_variant"] = variant(region, gt_edges[region])
            result[f"_{region}_pred_variant"] = variant(region, pred_edges[region])
        return result

    def extra_aggregate(self, cases: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        metrics = {}
        for region in REGION_LABELS:
            truth = [c[f"_{region}_gt_variant"] for c in cases]
            metrics[f"{region}_graph_acc"] = balanced_accuracy(truth, [c[f"_{region}_pred_variant"] for c in cases])
            matched = [t if c[f"{region}_topology_match"] else FAILED for t, c in zip(truth, cases, strict=True)]
            metrics[f"{region}_topology"] = balanced_accuracy(truth, matched)
        return metrics


# ---- task 2: ROI box ---------------------------------------------------------------------------------------------
MAX_VOXEL_INDEX = 2**31 - 1  # beyond any image; bigger integers would overflow the float maths of the metrics


def _int_triple(value: Any, key: str, where: str) -> tuple[int, int, int]:
    if (not isinstance(value, list) or len(value) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and abs(v) <= MAX_VOXEL_INDEX for v in value)):
        raise InvalidSubmissionError(f"{where}: {key!r} must be a list of 3 integers (x, y, z) of magnitude at most "
                                     f"{MAX_VOXEL_INDEX}, got {reprlib.repr(value)}")
    return (value[0], value[1], value[2])


def parse_box_json(data: Any, where: str) -> VoxelBox:
    """Validate a task-2 prediction ``{"size": [..3 ints..], "location": [..3 ints..]}`` (sizes >= 1)."""
    if not isinstance(data, dict) or set(data) != {"size", "location"}:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise InvalidSubmissionError(f"{where}: expected an object with exactly the keys 'size' and 'location', "
                                     f"got {keys}")
    size = _int_triple(data["size"], "size", where)
    location = _int_triple(data["location"], "location", where)
    if min(size) < 1:
        raise InvalidSubmissionError(f"{where}: every size must be >= 1 voxel, got {list(size)}")
    return VoxelBox(location=location, size=size)


class TopCowBoxGrader(Grader):
    """Task 2: boundary IoU (band ratio 0.2) and IoU of the predicted CoW ROI box, averaged over cases."""

    answer_columns = (ROI_ANSWER,)

    def __init__(self, modality: str) -> None:
        self.modality = modality
        self.grader_id = task_id(modality, 2)
        self.title = f"TopCoW 2024 {MODALITIES[modality][1]} Circle-of-Willis ROI box detection"
        self.reference = REFERENCE
        self.box = FileColumn(
            name="predicted_bbox_path", kind=FileKind.JSON, path_template="predictions/{id}_bbox.json",
            suffixes=(".json",),
            description='JSON `{"size": [sx, sy, sz], "location": [x, y, z]}` with integers: `location` is the '
                        "minimum corner in voxel indices (x, y, z) = NIfTI index order, 0-based, not the centre and "
                        "not mm; the box covers `location .. location + size - 1` inclusive; sizes >= 1.")
        self.schema = modality_schema(modality, self.box)
        self.metrics = (
            MetricSpec("boundary_iou", Direction.HIGHER_BETTER, "IoU of the boxes' boundary bands (each face band "
                       "ceil(0.2 x size) voxels deep, per axis), averaged over cases", best=1.0),
            MetricSpec("iou", Direction.HIGHER_BETTER, "voxel IoU of the two boxes, averaged over cases", best=1.0),
        )
        self.conventions = (
            *_common_conventions(modality),
            "Boxes are sets of whole voxels, location = minimum corner, inclusive ends; a box may extend beyond the "
            "image (scored as given, as the official metric does).",
            "Band widths are ceil(0.2 x size) voxels per axis, each box using its own sizes (official); iou equals the "
            "official boundary IoU at ratio 0.5, whose band is the whole box.",
            NO_IMAGE_HEADER.convention,
        )

    def load_prediction(self, case: CaseInput, column: FileColumn) -> VoxelBox:
        path = case.prediction_path(column)
        where = f"{column.name} of {case.case_id!r} ({path.name})"
        return parse_box_json(read_json(path, what=where), where)

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        predicted = self.load_prediction(case, self.box)
        truth = read_roi(case)
        return {"boundary_iou": boundary_iou(truth, predicted), "iou": box_iou(truth, predicted)}

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        return {name: float(np.mean([c[name] for c in cases])) for name in ("boundary_iou", "iou")}

    def write_gold_submission(self, private_dir: Path, public_dir: Path, dest: Path) -> None:
        def box_of(case: CaseInput) -> dict[str, list[int]]:
            roi = read_roi(case)
            return {"size": list(roi.size), "location": list(roi.location)}

        _write_json_submission(self, self.box, private_dir, public_dir, dest, box_of)

    def write_sample_submission(self, public_dir: Path, dest: Path) -> None:
        manifest = TestManifest.read(public_dir)
        rows = []
        for case_id in manifest.ids:
            geometry = manifest.geometry_of(case_id)
            # the central box of half the image size on each axis
            size = [max(1, n // 2) for n in geometry.size]
            box = {"size": size, "location": [(n - s) // 2 for n, s in zip(geometry.size, size, strict=True)]}
            rows.append(_write_json_file(self, self.box, dest, case_id, box))
        write_submission_csv(dest, self.schema, rows)


# ---- task 3: anterior/posterior edge lists -----------------------------------------------------------------------
def parse_edges(data: Any, where: str) -> EdgeLists:
    """Validate an edge-list document (exact keys, integer values 0/1) into {region: 4-tuple in official order}."""
    if not isinstance(data, dict) or set(data) != set(EDGE_KEYS):
        keys = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise InvalidSubmissionError(f"{where}: expected an object with exactly the keys 'anterior' and "
                                     f"'posterior', got {keys}")
    problems = []
    edges: EdgeLists = {}
    for region, keys in EDGE_KEYS.items():
        section = data[region]
        if not isinstance(section, dict) or set(section) != set(keys):
            found = sorted(map(str, section)) if isinstance(section, dict) else type(section).__name__
            problems.append(f"{where}: {region!r} must map exactly the keys {list(keys)}, got {found}")
            continue
        bad = {k: v for k, v in section.items()
               if not (isinstance(v, int) and not isinstance(v, bool) and v in (0, 1))}
        if bad:
            problems.append(f"{where}: {region} values must be the integers 0 or 1, got {bad}")
            continue
        edges[region] = tuple(int(section[k]) for k in keys)
    if problems:
        raise InvalidSubmissionError(problems)
    return edges


MAX_YAML_BYTES = 64 * 1024  # an edge list takes a few hundred bytes; PyYAML parses about 2 MB per second


def read_edge_document(path: Path, where: str) -> Any:
    """JSON, or YAML for ``.yml``/``.yaml`` files (safe loader, size-limited)."""
    if full_suffix(path) == ".json":
        return read_json(path, what=where)
    check_file_size(path, MAX_YAML_BYTES, what=where)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InvalidSubmissionError(f"{where} is not valid YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise InvalidSubmissionError(f"{where} is nested too deeply to be a valid document") from None


class TopCowEdgeGrader(Grader):
    """Task 3: variant-balanced accuracy of the predicted anterior and posterior edge lists."""

    answer_columns = (EDGES_ANSWER,)

    def __init__(self, modality: str) -> None:
        self.modality = modality
        self.grader_id = task_id(modality, 3)
        self.title = f"TopCoW 2024 {MODALITIES[modality][1]} Circle-of-Willis variant (edge-list) classification"
        self.reference = REFERENCE
        self.edges = FileColumn(
            name="predicted_edges_path", kind=FileKind.JSON, path_template="predictions/{id}_edges.json",
            suffixes=(".json", ".yml", ".yaml"),
            description='`{"anterior": {"L-A1": 0|1, "Acom": 0|1, "3rd-A2": 0|1, "R-A1": 0|1}, "posterior": '
                        '{"L-Pcom": 0|1, "L-P1": 0|1, "R-P1": 0|1, "R-Pcom": 0|1}}` (1 = segment present); exactly '
                        "these keys, integer values. YAML with the same structure (as the training labels) is also "
                        "accepted.")
        self.schema = modality_schema(modality, self.edges)
        self.metrics = tuple(
            MetricSpec(f"{region}_acc", Direction.HIGHER_BETTER, f"balanced accuracy over the {region} variants "
                       f"(4-edge patterns) present in the ground truth; a case is correct when all 4 {region} edges "
                       "match", best=1.0)
            for region in EDGE_KEYS
        )
        self.conventions = (
            *_common_conventions(modality),
            "Balanced accuracy averages the recall of each ground-truth variant; predicted variants absent from the "
            "ground truth add no class (scikit-learn balanced_accuracy_score).",
            NO_IMAGE_HEADER.convention,
        )

    def load_prediction(self, case: CaseInput, column: FileColumn) -> EdgeLists:
        path = case.prediction_path(column)
        where = f"{column.name} of {case.case_id!r} ({path.name})"
        return parse_edges(read_edge_document(path, where), where)

    def read_truth(self, case: CaseInput) -> EdgeLists:
        path = case.answer_path(EDGES_ANSWER)
        if not path.is_file():
            raise TaskDataMissingError(f"edge list {path} of case {case.case_id!r} is missing",
                                       hint="re-run `rexmle prepare TASK --force`")
        try:
            return parse_edges(read_edge_document(path, f"ground truth of {case.case_id!r}"), path.name)
        except InvalidSubmissionError as exc:
            raise TaskDataMissingError("; ".join(exc.problems), hint="re-run `rexmle prepare TASK --force`") from None

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        predicted = self.load_prediction(case, self.edges)
        truth = self.read_truth(case)
        result: dict[str, Any] = {}
        for region in EDGE_KEYS:
            result[f"{region}_correct"] = int(predicted[region] == truth[region])
            result[f"_{region}_gt_variant"] = variant(region, truth[region])
            result[f"_{region}_pred_variant"] = variant(region, predicted[region])
        return result

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        return {
            f"{region}_acc": balanced_accuracy([c[f"_{region}_gt_variant"] for c in cases],
                                               [c[f"_{region}_pred_variant"] for c in cases])
            for region in EDGE_KEYS
        }

    def write_gold_submission(self, private_dir: Path, public_dir: Path, dest: Path) -> None:
        def edges_of(case: CaseInput) -> dict[str, dict[str, int]]:
            truth = self.read_truth(case)
            return {region: dict(zip(keys, truth[region], strict=True)) for region, keys in EDGE_KEYS.items()}

        _write_json_submission(self, self.edges, private_dir, public_dir, dest, edges_of)

    def write_sample_submission(self, public_dir: Path, dest: Path) -> None:
        # no edge at all: a circle no patient has (without both A1s and both P1s the ACAs and PCAs would have no
        # supply), so it scores 0 on every test set, the floor that an agent leaving no submission is graded on.
        # (Version 1.0.0's sample, every edge present, is itself a variant: balanced accuracy gave it 1/k whenever
        # a patient with a third A2 was tested, and 1/k of the posterior score almost always.)
        no_edge = {region: dict.fromkeys(keys, 0) for region, keys in EDGE_KEYS.items()}
        rows = [_write_json_file(self, self.edges, dest, case_id, no_edge)
                for case_id in TestManifest.read(public_dir).ids]
        write_submission_csv(dest, self.schema, rows)


# ---- shared by tasks 2 and 3 ------------------------------------------------------------------------------------
def _write_json_file(grader: TopCowBoxGrader | TopCowEdgeGrader, column: FileColumn, dest: Path, case_id: str,
                     content: Any) -> dict[str, str]:
    relative = column.path_for(case_id)
    target = dest / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(content) + "\n")
    return {grader.schema.id_column: case_id, "modality": grader.modality, column.name: relative}


def _write_json_submission(grader: TopCowBoxGrader | TopCowEdgeGrader, column: FileColumn, private_dir: Path,
                           public_dir: Path, dest: Path, content_of: Callable[[CaseInput], Any]) -> None:
    rows = [_write_json_file(grader, column, dest, case.case_id, content_of(case))
            for case in answer_cases(grader, private_dir, public_dir)]
    write_submission_csv(dest, grader.schema, rows)


for _modality in MODALITIES:
    register_grader(task_id(_modality, 1))(partial(TopCowSegmentationGrader, _modality))
    register_grader(task_id(_modality, 2))(partial(TopCowBoxGrader, _modality))
    register_grader(task_id(_modality, 3))(partial(TopCowEdgeGrader, _modality))
