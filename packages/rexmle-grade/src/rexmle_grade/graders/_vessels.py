"""Machinery shared by the multiclass vessel-segmentation graders (TopCoW task 1 and TopBrain).

* a fast label-set check (minimum and maximum first, holes looked for in the foreground box only);
* reading only the scored region of a private label map;
* per-label scores of a multiclass case (Dice/IoU counts, Betti-0, contour HD95/HD, optional per-class clDice),
  each computed inside the bounding box of that label in ground truth ∪ prediction;
* :class:`MulticlassVesselGrader`, the base of the TopCoW task-1 and TopBrain graders: class-average Dice, clDice,
  B0 error, HD95 (and unranked HD) per case, means over cases, pooled detection F1. Subclasses set the label set
  and constants and add their own columns through :meth:`~MulticlassVesselGrader.region`,
  :meth:`~MulticlassVesselGrader.extra_case_scores` and :meth:`~MulticlassVesselGrader.extra_aggregate`.
  Reading, geometry checks and the sample (all background) and gold (ground truth) submissions come from
  :class:`~rexmle_grade.graders._binary_volume.BinaryVolumeGrader`: one label volume per case either way.

Definitions: ``shared/reference/metrics/topcow.md`` §2 and ``topbrain_sega.md`` §1 (official evaluators
``CoWBenchmark/TopCoW_Eval_Metrics`` and ``CoWBenchmark/TopBrain_Eval_Metrics``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rexmle_grade.errors import InvalidSubmissionError, TaskDataMissingError
from rexmle_grade.grader import CaseInput, Direction, MetricSpec
from rexmle_grade.graders._binary_volume import LABEL_PATH, BinaryVolumeGrader, align_to_truth
from rexmle_grade.io import Geometry, check_labels, check_nifti_complete, full_suffix, read_volume_geometry
from rexmle_grade.metrics.boxes import BoxSlices, mask_bounding_box, union_box
from rexmle_grade.metrics.detection import Detection, detect, mean_pooled_f1
from rexmle_grade.metrics.overlap import dice as binary_dice
from rexmle_grade.metrics.surface import Spacing, contour_hausdorff
from rexmle_grade.metrics.topology import betti0, cldice
from rexmle_grade.schema import FileColumn, FileKind, SubmissionSchema, ValueColumn

# ---- label check --------------------------------------------------------------------------------------------
MAX_GAP_SCANS = 8  # allowed sets with a few holes (TopCoW: 13, 14) are checked value by value


def check_label_values(array: np.ndarray, allowed: frozenset[int], *, what: str, name: str) -> None:
    """Reject values outside ``allowed`` (which holds 0), quickly on large integer volumes.

    Listing the values of a whole 512x512x300 volume (``np.unique``) costs about half a second; the minimum and
    maximum cost milliseconds and settle contiguous label sets. Holes in the set inside [min, max] are looked for in
    the foreground box only; whenever something is wrong, :func:`rexmle_grade.io.check_labels` writes the message.
    """
    box = mask_bounding_box(array)
    if box is None:
        return
    crop = array[box]
    if array.dtype.kind in "iub":
        low, high = int(crop.min()), int(crop.max())
        holes = [v for v in range(low, high + 1) if v not in allowed]
        if not holes or (len(holes) <= MAX_GAP_SCANS and not any(np.any(crop == v) for v in holes)):
            return
    check_labels(crop, allowed, what=what, name=name)


def _task_data_error(case: CaseInput, path: Path, problem: str) -> TaskDataMissingError:
    return TaskDataMissingError(f"ground truth {path} of case {case.case_id!r} {problem}",
                                hint="re-run `rexmle prepare TASK --force`")


def ground_truth_geometry(case: CaseInput, path: Path) -> Geometry:
    """Header of a private label file, after checking that the file holds every voxel its header announces (ITK
    would fill a truncated NIfTI file's missing voxels silently, and a region read may stop before the cut); an
    unreadable or truncated file is a task-data problem, never the submission's fault."""
    if not path.is_file():
        raise _task_data_error(case, path, "is missing")
    try:
        geometry, _, _ = read_volume_geometry(path, what="ground truth")
        if full_suffix(path) in (".nii", ".nii.gz"):
            check_nifti_complete(path, what="ground truth")
    except InvalidSubmissionError as exc:
        raise _task_data_error(case, path, f"cannot be read: {exc.message}") from None
    return geometry


def read_label_region(case: CaseInput, path: Path, box: BoxSlices | None) -> np.ndarray:
    """Decode a private label map, or only the (z, y, x) ``box`` of it (ITK streams the region out of the file)."""
    import SimpleITK as sitk  # lazily, as rexmle_grade.io: only the 3-D graders need it

    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    if box is not None:
        reader.SetExtractIndex([s.start for s in reversed(box)])
        reader.SetExtractSize([s.stop - s.start for s in reversed(box)])
    try:
        return sitk.GetArrayFromImage(reader.Execute())
    except RuntimeError as exc:
        raise _task_data_error(case, path, f"cannot be decoded: {str(exc).strip().splitlines()[-1]}") from None


# ---- per-label scores -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LabelScores:
    """Everything the class averages and detections need about one label of one case."""

    gt_voxels: int
    pred_voxels: int
    intersection: int
    gt_components: int
    pred_components: int
    hd95: float
    hd: float
    cldice: float | None  # per-class clDice, when asked for

    @property
    def dice(self) -> float:
        total = self.gt_voxels + self.pred_voxels
        return 2.0 * self.intersection / total if total else 0.0

    @property
    def b0_error(self) -> int:
        return abs(self.pred_components - self.gt_components)

    def details(self) -> dict[str, float]:
        """The per-class values of a case's report details."""
        values = {"dice": self.dice, "hd95": self.hd95, "hd": self.hd, "b0_error": float(self.b0_error)}
        return values if self.cldice is None else {**values, "cldice": self.cldice}


@dataclass(frozen=True)
class Foreground:
    """The non-zero voxels of a label map: flat indices (ascending) and their labels; vessels fill ~1 % of a volume,
    so counting and boxing them costs a fraction of a pass over the whole array."""

    index: np.ndarray
    label: np.ndarray
    shape: tuple[int, ...]

    @classmethod
    def of(cls, labels: np.ndarray) -> Foreground:
        flat = np.ascontiguousarray(labels).ravel()
        index = np.flatnonzero(flat)
        return cls(index=index, label=flat[index], shape=labels.shape)

    def counts(self) -> np.ndarray:
        """Voxels per label value (index = label)."""
        return np.bincount(self.label, minlength=256)

    def boxes(self) -> dict[int, BoxSlices]:
        """Bounding box of every present label."""
        if self.index.size == 0:
            return {}
        order = np.argsort(self.label, kind="stable")
        labels = self.label[order]
        starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
        coords = np.unravel_index(self.index[order], self.shape)
        lows = [np.minimum.reduceat(c, starts) for c in coords]
        highs = [np.maximum.reduceat(c, starts) for c in coords]
        return {int(labels[s]): tuple(slice(int(lo[i]), int(hi[i]) + 1) for lo, hi in zip(lows, highs, strict=True))
                for i, s in enumerate(starts)}


def label_scores(gt: np.ndarray, pred: np.ndarray, spacing_zyx: Spacing, *,
                 missing_distance: float, per_class_cldice: bool) -> dict[int, LabelScores]:
    """Scores of every label present in ``gt`` or ``pred`` (uint8 (z, y, x) label maps of one shape).

    A label on one side only gets Dice 0, HD95 = HD = ``missing_distance`` and clDice 0; its component counts are
    computed normally. Work per label is confined to the bounding box of that label in gt ∪ pred.
    """
    if gt.shape != pred.shape:
        raise ValueError(f"label maps differ in shape: {gt.shape} vs {pred.shape}")
    gt_fg, pred_fg = Foreground.of(gt), Foreground.of(pred)
    gt_counts, pred_counts = gt_fg.counts(), pred_fg.counts()
    agree = np.ascontiguousarray(gt).ravel()[pred_fg.index] == pred_fg.label
    intersection = np.bincount(pred_fg.label[agree], minlength=256)
    gt_boxes, pred_boxes = gt_fg.boxes(), pred_fg.boxes()
    scores = {}
    for label in sorted(gt_boxes.keys() | pred_boxes.keys()):
        box = union_box(gt_boxes.get(label), pred_boxes.get(label))
        g, p = gt[box] == label, pred[box] == label
        both = label in gt_boxes and label in pred_boxes
        hd = contour_hausdorff(g, p, spacing_zyx) if both else None
        scores[label] = LabelScores(
            gt_voxels=int(gt_counts[label]), pred_voxels=int(pred_counts[label]),
            intersection=int(intersection[label]), gt_components=betti0(g), pred_components=betti0(p),
            hd95=hd.hd95 if hd else missing_distance, hd=hd.hd if hd else missing_distance,
            cldice=(cldice(g, p) if both else 0.0) if per_class_cldice else None,
        )
    return scores


def class_average(values: Sequence[float]) -> float:
    """Plain mean over the class set; 0 for an empty class set (the official convention)."""
    return float(sum(values) / len(values)) if values else 0.0


def detections(scores: Mapping[int, LabelScores], labels: Sequence[int]) -> dict[str, str]:
    """Detection outcome (TP/FN/FP/TN, IoU >= 0.25) of each of ``labels``, keyed by ``str(label)``."""
    found = {}
    for label in labels:
        s = scores.get(label)
        outcome = Detection.TN if s is None else detect(s.gt_voxels, s.pred_voxels, s.intersection)
        found[str(label)] = outcome.value
    return found


# ---- the multiclass vessel grader ---------------------------------------------------------------------------
MASK_COLUMN = "predicted_mask_path"
MASK_SUFFIXES = (".nii.gz", ".nii", ".mha", ".nrrd")


def modality_schema(modality: str, file_column: FileColumn, notes: tuple[str, ...] = ()) -> SubmissionSchema:
    """``image_id, modality, <file column>``: the submission layout of the TopCoW and TopBrain tasks."""
    return SubmissionSchema(
        id_column="image_id",
        columns=(ValueColumn("modality", str, f"imaging modality, always `{modality}` for this task.",
                             choices=(modality,)), file_column),
        notes=notes,
    )


def mask_column(allowed_labels: Sequence[int], description: str) -> FileColumn:
    return FileColumn(name=MASK_COLUMN, kind=FileKind.LABEL_VOLUME, path_template="predictions/{id}_0000.nii.gz",
                      suffixes=MASK_SUFFIXES, description=description, labels=tuple(allowed_labels))


CASE_MEANS = ("dice", "cldice", "b0_error", "hd95", "hd")  # per-case values whose mean over cases is reported


class MulticlassVesselGrader(BinaryVolumeGrader):
    """Class-average Dice, clDice, B0 error and HD95 per case, means over cases, pooled detection F1."""

    modality: str
    allowed_labels: frozenset[int]
    detection_labels: tuple[int, ...]
    detection_metric: str
    missing_distance: float  # HD95 and HD of a label present on one side only
    per_class_cldice: bool

    # ---- hooks -------------------------------------------------------------------------------------------
    def region(self, case: CaseInput, truth: Geometry) -> BoxSlices | None:
        """The (z, y, x) box of the volumes that is scored; None (the default) for the whole volume."""
        return None

    def extra_case_scores(self, gt: np.ndarray, pred: np.ndarray,
                          scores: Mapping[int, LabelScores]) -> dict[str, Any]:
        return {}

    def extra_aggregate(self, cases: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        return {}

    # ---- grader contract ---------------------------------------------------------------------------------
    def check_values(self, array: np.ndarray, name: str) -> None:
        check_label_values(array, self.allowed_labels, what=self.prediction_column.name, name=name)

    def gold_mask(self, label: np.ndarray) -> np.ndarray:
        return label

    def load_region(self, case: CaseInput) -> tuple[np.ndarray, np.ndarray, Spacing]:
        """(ground truth, prediction) uint8 arrays of the scored region, and the ground truth's (z, y, x) spacing.

        The prediction is read and checked whole; of the ground truth only the region is decoded (its header is
        checked against the prediction's grid first), which skips most of a 512x512x300 volume when TopCoW scores
        its ROI.
        """
        prediction = self.load_prediction(case, self.prediction_column)
        path = case.answer_path(LABEL_PATH)
        truth = ground_truth_geometry(case, path)
        align_to_truth(case, self.prediction_column, self.header_rule, truth, prediction.geometry)
        box = self.region(case, truth)
        gt = read_label_region(case, path, box)
        try:
            check_label_values(gt, self.allowed_labels, what="ground truth", name=case.case_id)
        except InvalidSubmissionError as exc:
            raise TaskDataMissingError(exc.problems[0], hint="re-run `rexmle prepare TASK --force`") from None
        # every allowed label fits a byte; the crop is copied so that the full prediction can be freed
        pred = prediction.array if box is None else np.ascontiguousarray(prediction.array[box])
        spacing = truth.spacing or (1.0, 1.0, 1.0)
        return gt.astype(np.uint8, copy=False), pred.astype(np.uint8, copy=False), tuple(reversed(spacing))

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        gt, pred, spacing = self.load_region(case)  # distances use the ground truth's spacing, as the official code
        scores = label_scores(gt, pred, spacing, missing_distance=self.missing_distance,
                              per_class_cldice=self.per_class_cldice)
        per_class = list(scores.values())
        cl_dice = (class_average([s.cldice or 0.0 for s in per_class]) if self.per_class_cldice
                   else cldice(gt > 0, pred > 0))
        result: dict[str, Any] = {
            "dice": class_average([s.dice for s in per_class]),
            "cldice": cl_dice,
            "b0_error": class_average([s.b0_error for s in per_class]),
            "hd95": class_average([s.hd95 for s in per_class]),
            "hd": class_average([s.hd for s in per_class]),
            "_detections": detections(scores, self.detection_labels),
            # the per-class values the official metrics.json lists besides the class averages
            "_per_class": {str(label): s.details() for label, s in scores.items()},
        }
        # the official MergedBin Dice (all labels > 0); its B0 and distances would cost more than every class's
        result["dice_merged_binary"] = binary_dice(gt > 0, pred > 0, empty=0.0)
        result.update(self.extra_case_scores(gt, pred, scores))
        return result

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        metrics = self.case_means(cases, (*CASE_MEANS, "dice_merged_binary"))
        metrics[self.detection_metric] = mean_pooled_f1([c["_detections"] for c in cases], self.detection_labels)
        metrics.update(self.extra_aggregate(cases))
        return metrics

    # ---- metric table shared by subclasses ----------------------------------------------------------------
    def class_average_specs(self, cldice_text: str) -> tuple[MetricSpec, ...]:
        """Specs of the per-case means (:data:`CASE_MEANS`); ``cldice_text`` says how clDice is taken."""
        missing = f"a label present on one side only counts {self.missing_distance:g} mm"
        return (
            MetricSpec("dice", Direction.HIGHER_BETTER, "Dice per label, averaged over the labels present in ground "
                       "truth or prediction (0 for a label on one side only), then over cases", best=1.0),
            MetricSpec("cldice", Direction.HIGHER_BETTER, cldice_text, best=1.0),
            MetricSpec("b0_error", Direction.LOWER_BETTER, "|Betti-0 (26-connected components) of prediction − ground "
                       "truth| per label, class-averaged per case, then averaged over cases", best=0.0),
            MetricSpec("hd95", Direction.LOWER_BETTER, "95th-percentile Hausdorff distance (mm, ground-truth spacing) "
                       f"between 26-neighbour contours, symmetric; {missing}; class-averaged, then averaged over cases",
                       best=0.0),
            MetricSpec("hd", Direction.LOWER_BETTER, "maximum Hausdorff distance between the same contours; "
                       f"{missing}; class-averaged, then averaged over cases (reported by the official evaluator, "
                       "not ranked)",
                       ranked=False, best=0.0),
            MetricSpec("dice_merged_binary", Direction.HIGHER_BETTER, "Dice of the merged binary masks (every label "
                       "> 0; the official MergedBin Dice; 0 when both are empty), averaged over cases (not ranked)",
                       ranked=False, best=1.0),
        )
