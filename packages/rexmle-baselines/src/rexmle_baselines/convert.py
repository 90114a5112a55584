"""Segmentation I/O shared by every segmentation baseline: a task's public folder in, its submission out.

:func:`segmentation_io` gives one :class:`SegmentationIO` per task family. It lists the training and test cases of
the public folder, reads images (channels first, float32) with their geometry, reads training labels as *training
label maps* and turns predicted training label maps back into the task's submission.

Training label maps use consecutive integers ``0..len(labels)``, as nnU-Net and MONAI want them (``labels`` maps
name -> integer, background 0). Where the task's own values differ they are translated both ways: RAVIR's
0/128/255, TopCoW's 15 (3rd-A2) becomes 13, CellSeg's instance ids become interior/boundary classes, PUMA nuclei
polygons are rasterised per class. ``write_submission`` turns the predictions into what the grader reads:

* masks copy the test image's header (size, spacing, origin, direction);
* NeurIPS CellSeg: instances = connected components of the interior class grown into the boundary class
  (watershed on the distance to background), cells under ``MIN_CELL_PIXELS`` (a network's speckle) dropped;
* PUMA nuclei: one polygon per connected component of each class, centred on its centroid (components under
  ``NucleiIO.min_pixels``, a network's speckle rather than a nucleus, are dropped);
* TopCoW task 2: the mean of two boxes read from the predicted labels (each label reduced to its largest connected
  component first, so that a stray island cannot pull them). One is where the segments meet: the ROI is drawn
  around the circle's junctions (ICA terminus, A1/Acom, P1/Pcom, basilar tip, Pcom roots), so the box around the
  centres of those junctions that the prediction has, grown by the training cases' median margin per face. The
  other is where the vessels lie: the training ROIs' median size at the predicted vessels' centroid moved by the
  training cases' median offset from their labels' centroid to their ROI centre. The junctions follow each
  patient's circle, size included, but shrink the box where a communicating artery is missing or missed; the
  centroid survives a missed vessel but keeps one size. On the same predictions of two realistic mirrors each, the
  mean scored 0.633 / 0.478 (CTA) and 0.528 / 0.566 (MRA) boundary IoU, the centroid box 0.613 / 0.415 and
  0.456 / 0.433, the junction box alone 0.517 / 0.436 and 0.502 / 0.627; a box drawn around the predicted voxels
  had scored 0.306 (CTA) and 0.359 (MRA) on the first. Fewer than two junctions give the centroid box alone;
  predicted vessels spanning under half the median ROI size on an axis, or none at all, give way to the training
  ROIs' median box at their median position relative to the image;
  task 3: the edge lists read from the predicted labels' adjacency (the same rule the task-1 grader applies to
  masks), as the challenge's strong teams derived them.
"""

from __future__ import annotations

import csv
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rexmle_grade.errors import TaskDataMissingError, UserInputError
from rexmle_grade.grader import Grader, TestManifest, get_grader, write_submission_csv
from rexmle_grade.io import (
    IMAGE_2D_SUFFIXES,
    VOLUME_SUFFIXES,
    Geometry,
    full_suffix,
    read_image_2d,
    read_volume,
    read_volume_geometry,
    write_volume,
)
from rexmle_grade.schema import SUBMISSION_CSV, FileColumn

CHANNEL_FILE = re.compile(r"^(?P<case>.+)_(?P<channel>\d{4})$")


@dataclass(frozen=True)
class SegCase:
    case_id: str
    channels: tuple[Path, ...]
    label: Path | None  # the task's label file (semantic map, instance map or nuclei JSON); None for test cases


def _stem(path: Path) -> str:
    suffix = full_suffix(path)
    return path.name[: len(path.name) - len(suffix)] if suffix else path.name


def _image_files(folder: Path, suffixes: Sequence[str]) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and full_suffix(p) in suffixes)


def _group_channels(files: Sequence[Path]) -> dict[str, tuple[Path, ...]]:
    """``{case}_{channel:04d}.ext`` files grouped by case in channel order; a file without the channel part is a
    one-channel case."""
    grouped: dict[str, dict[int, Path]] = {}
    for path in files:
        match = CHANNEL_FILE.match(_stem(path))
        case, channel = (match["case"], int(match["channel"])) if match else (_stem(path), 0)
        grouped.setdefault(case, {})[channel] = path
    return {case: tuple(channels[c] for c in sorted(channels)) for case, channels in sorted(grouped.items())}


def first_channel_file(folder: Path, case_id: str) -> Path:
    """The one ``{case_id}_0000.*`` image of a case in ``folder`` (nnU-Net naming; the first or only channel)."""
    matches = sorted(folder.glob(f"{case_id}_0000.*"))
    if len(matches) != 1:
        raise TaskDataMissingError(f"expected one image {case_id}_0000.* in {folder}, found {len(matches)}",
                                   hint="run `rexmle prepare TASK` (with --force to prepare it again)")
    return matches[0]


class SegmentationIO(ABC):
    """Cases, images and labels of one task, and the writer of its submission (see the module docstring)."""

    dim: int
    labels: dict[str, int]
    image_suffixes: tuple[str, ...] = VOLUME_SUFFIXES
    label_suffixes: tuple[str, ...] = VOLUME_SUFFIXES
    label_name_suffix = ""  # e.g. "_label" for CellSeg's ``cell_00001_label.tiff``

    def __init__(self, task_id: str, grader: Grader, public_dir: Path) -> None:
        self.task_id = task_id
        self.grader = grader
        self.public_dir = public_dir
        self.manifest = TestManifest.read(public_dir)

    # ---- cases ----------------------------------------------------------------------------------------------
    @property
    def column(self) -> FileColumn:
        (column,) = self.grader.schema.file_columns
        return column

    def _label_files(self) -> dict[str, Path]:
        files = _image_files(self.public_dir / "train" / "labels", self.label_suffixes)
        return {_stem(p).removesuffix(self.label_name_suffix): p for p in files}

    def training_cases(self) -> list[SegCase]:
        images = _group_channels(_image_files(self.public_dir / "train" / "images", self.image_suffixes))
        labels = self._label_files()
        cases = [SegCase(case, channels, labels[case]) for case, channels in images.items() if case in labels]
        if not cases:
            raise TaskDataMissingError(f"no labelled training cases found under {self.public_dir / 'train'}",
                                       hint=f"prepare the task again: `rexmle prepare {self.task_id} --force`")
        return cases

    def test_cases(self) -> list[SegCase]:
        images = _group_channels(_image_files(self.public_dir / "test" / "images", self.image_suffixes))
        missing = [case for case in self.manifest.ids if case not in images]
        if missing:
            raise TaskDataMissingError(f"test images of {missing[:5]} are missing from {self.public_dir / 'test'}",
                                       hint=f"prepare the task again: `rexmle prepare {self.task_id} --force`")
        return [SegCase(case, images[case], None) for case in self.manifest.ids]

    # ---- reading --------------------------------------------------------------------------------------------
    @abstractmethod
    def read_image(self, case: SegCase) -> tuple[np.ndarray, Geometry]:
        """Channels-first float32 image and its geometry."""

    @abstractmethod
    def read_label(self, case: SegCase) -> np.ndarray:
        """The training label map (values in ``labels``) on the image grid."""

    # ---- writing --------------------------------------------------------------------------------------------
    def write_submission(self, predictions: Mapping[str, np.ndarray], out_dir: Path) -> None:
        """Predicted training label maps (keyed by test case id, on the test image grids) -> the submission."""
        missing = [case for case in self.manifest.ids if case not in predictions]
        if missing:
            raise UserInputError(f"predictions for {len(missing)} test cases are missing: {missing[:5]}",
                                 hint="predict every id of public/test_manifest.json")
        out_dir.mkdir(parents=True, exist_ok=True)
        constants = self._constant_values()
        rows = []
        for case in self.test_cases():
            prediction = np.asarray(predictions[case.case_id])
            relative = self.column.path_for(case.case_id)
            target = out_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            self.write_prediction(case, prediction, target)
            rows.append({self.grader.schema.id_column: case.case_id, self.column.name: relative,
                         **constants.get(case.case_id, {})})
        write_submission_csv(out_dir, self.grader.schema, rows)

    @abstractmethod
    def write_prediction(self, case: SegCase, prediction: np.ndarray, target: Path) -> None:
        """Write one test case's prediction file from its predicted training label map."""

    def _constant_values(self) -> dict[str, dict[str, str]]:
        """Value columns (e.g. ``modality``) as the public sample submission fills them."""
        names = [c.name for c in self.grader.schema.value_columns]
        if not names:
            return {}
        path = self.public_dir / "sample_submission" / SUBMISSION_CSV
        if not path.is_file():
            raise TaskDataMissingError(f"{path} is missing", hint=f"`rexmle prepare {self.task_id} --force`")
        with path.open(newline="") as fh:
            return {row[self.grader.schema.id_column]: {n: row[n] for n in names} for row in csv.DictReader(fh)}

    def _check_shape(self, case: SegCase, prediction: np.ndarray, shape: tuple[int, ...]) -> None:
        if prediction.shape != tuple(shape):
            raise UserInputError(f"the prediction of {case.case_id!r} has shape {prediction.shape}; the test image "
                                 f"grid is {tuple(shape)}", hint="predict on the test image's own grid")

    def _check_values(self, case: SegCase, prediction: np.ndarray) -> None:
        if prediction.size and (prediction.min() < 0 or prediction.max() > max(self.labels.values())):
            raise UserInputError(f"the prediction of {case.case_id!r} holds values {prediction.min()}.."
                                 f"{prediction.max()}; training label maps hold 0..{max(self.labels.values())}",
                                 hint="predict training labels (SegmentationIO.labels)")


# ---- 3-D label volumes -----------------------------------------------------------------------------------------
class VolumeIO(SegmentationIO):
    """3-D masks on the test image grid. ``task_values[i]`` is the task's value of training label ``i``."""

    dim = 3

    def __init__(self, task_id: str, grader: Grader, public_dir: Path, labels: dict[str, int],
                 task_values: Sequence[int], *, binary_labels: bool = False) -> None:
        super().__init__(task_id, grader, public_dir)
        self.labels = labels
        self.task_values = np.asarray(task_values, dtype=np.int64)
        self.binary_labels = binary_labels  # any positive label value is the one foreground class

    def read_image(self, case: SegCase) -> tuple[np.ndarray, Geometry]:
        volumes = [read_volume(path, what="image") for path in case.channels]
        geometry = volumes[0].geometry
        for path, volume in zip(case.channels[1:], volumes[1:], strict=True):
            if volume.geometry.size != geometry.size:
                raise TaskDataMissingError(f"channel {path.name} of {case.case_id!r} has size {volume.geometry.size}"
                                           f", the first channel {geometry.size}",
                                           hint="all channels of a case must share one grid")
        return np.stack([v.array.astype(np.float32) for v in volumes]), geometry

    def read_label(self, case: SegCase) -> np.ndarray:
        if case.label is None:
            raise UserInputError(f"case {case.case_id!r} has no label (a test case)")
        values = read_volume(case.label, what="label", integer=True).array
        if self.binary_labels:
            return (values > 0).astype(np.uint8)
        lookup = np.zeros(int(max(self.task_values.max(), values.max())) + 1, dtype=np.int64) - 1
        lookup[self.task_values] = np.arange(len(self.task_values))
        mapped = lookup[values]
        if (mapped < 0).any():
            unknown = sorted(set(np.unique(values[mapped < 0]).tolist()))
            raise TaskDataMissingError(f"label {case.label.name} holds values {unknown[:10]} outside the task's "
                                       f"labels {self.task_values.tolist()}", hint="prepare the task again")
        return mapped.astype(np.uint8)

    def test_geometry(self, case: SegCase) -> Geometry:
        return read_volume_geometry(case.channels[0], what="test image")[0]

    def task_label_map(self, case: SegCase, prediction: np.ndarray) -> np.ndarray:
        geometry = self.test_geometry(case)
        self._check_shape(case, prediction, geometry.numpy_shape)
        self._check_values(case, prediction)
        return self.task_values[prediction.astype(np.int64)].astype(np.uint8)

    def write_prediction(self, case: SegCase, prediction: np.ndarray, target: Path) -> None:
        write_volume(target, self.task_label_map(case, prediction), self.test_geometry(case))


class PantherIO(VolumeIO):
    """Training labels tumour 1 and pancreas 2; the submission holds the tumour only."""

    def task_label_map(self, case: SegCase, prediction: np.ndarray) -> np.ndarray:
        return (super().task_label_map(case, prediction) == 1).astype(np.uint8)


# TopCoW label values of the segments that meet at the CoW landmarks the ROI is drawn around: ICA terminus (ICA with
# MCA and ACA), A1/Acom junctions, P1/Pcom junctions, the basilar tip (BA with each PCA) and the Pcom roots (ICA)
COW_JUNCTIONS = ((4, 5), (4, 11), (6, 7), (6, 12), (10, 11), (10, 12), (2, 8), (3, 9), (1, 2), (1, 3), (4, 8), (6, 9))


class TopCowBoxIO(VolumeIO):
    """TopCoW task 2: the ROI box from the predicted CoW labels (see the module docstring)."""

    def training_boxes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """From the training cases, per (x, y, z) axis in voxels: the median offset from the label map's centroid
        to the ROI centre, the median ROI size, the median ROI centre as a fraction of the image size (None
        without ROI files), and the median margins (2, 3) from the junction box's lower and upper faces to the
        ROI's (None where no training case has two junctions)."""
        from rexmle_grade.metrics.boxes import parse_roi_txt

        offsets, sizes, centres, margins = [], [], [], []
        for case in self.training_cases():
            roi_file = self.public_dir / "train" / "roi" / f"{case.case_id}.txt"
            if not roi_file.is_file():
                continue
            roi = parse_roi_txt(roi_file.read_text())
            sizes.append(np.asarray(roi.size))
            low = np.asarray(roi.location)
            high = low + np.asarray(roi.size) - 1
            centres.append(((low + high) / 2 + 0.5) / np.asarray(self.test_geometry(case).size))
            labels = self.task_values[self.read_label(case)]  # read_label validated them
            centroid = label_centroid(labels)
            if centroid is not None:
                offsets.append((low + high) / 2 - centroid)
            junctions = junction_box(labels)
            if junctions is not None:
                margins.append(np.stack([junctions[0] - low, high - junctions[1]]))

        def median(values: list[np.ndarray]) -> np.ndarray:
            return np.median(values, axis=0) if values else np.zeros(3)

        centre = np.median(centres, axis=0) if centres else None
        margin = np.median(margins, axis=0) if margins else None
        return median(offsets), np.round(median(sizes)).astype(np.int64), centre, margin

    def write_submission(self, predictions: Mapping[str, np.ndarray], out_dir: Path) -> None:
        self._offset, self._roi_size, self._roi_centre, self._margins = self.training_boxes()
        super().write_submission(predictions, out_dir)

    def write_prediction(self, case: SegCase, prediction: np.ndarray, target: Path) -> None:
        # each CoW label is one vessel segment: a stray island of it elsewhere would pull the centroid
        labels = largest_component_per_label(self.task_label_map(case, prediction))
        size = np.asarray(self.test_geometry(case).size)
        box = label_box(labels)
        if self._roi_centre is None:  # no training ROIs to learn from: the predicted vessels' box, or the central half
            if box is None:
                location, extent = size // 4, np.maximum(size // 2, 1)
            else:
                location, extent = box[0], box[1] - box[0] + 1
        else:
            extent = np.clip(self._roi_size, 1, size)
            junctions = None
            if box is None or (box[1] - box[0] + 1 < extent // 2).any():
                # nothing predicted, or too few voxels to hold the circle (a few stray ones): the training ROIs'
                # median box at their median relative position in the image
                centre = self._roi_centre * size - 0.5
            else:
                centre = label_centroid(labels) + self._offset  # type: ignore[operator]
                junctions = junction_box(labels) if self._margins is not None else None
            # halves round up (not to even), so that a box moves exactly as far as the vessels do
            low = centre - (extent - 1) / 2
            if junctions is None:  # the median box, moved inside the image where it would leave it
                location = np.clip(np.floor(low + 0.5).astype(np.int64), 0, size - extent)
            else:  # the mean of the centroid box and the junction box, cut at the image's edges
                high = (centre + (extent - 1) / 2 + junctions[1] + self._margins[1]) / 2  # type: ignore[index]
                low = (low + junctions[0] - self._margins[0]) / 2  # type: ignore[index]
                location = np.clip(np.floor(low + 0.5).astype(np.int64), 0, size - 1)
                extent = np.clip(np.floor(high + 0.5).astype(np.int64), location, size - 1) - location + 1
        target.write_text(json.dumps({"size": [int(v) for v in extent], "location": [int(v) for v in location]})
                          + "\n")


def junction_box(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(low, high) corners in (x, y, z) voxels of the box around the centres of the :data:`COW_JUNCTIONS` present
    in a (z, y, x) TopCoW label map (a junction's centre: the mean of the face centres between its two segments'
    touching voxels); None with fewer than two junctions."""
    found: dict[tuple[int, int], list[np.ndarray]] = {}
    for axis in range(3):
        before = np.moveaxis(labels, axis, 0)
        lower, upper = before[:-1].astype(np.int64), before[1:].astype(np.int64)
        code = np.minimum(lower, upper) * 256 + np.maximum(lower, upper)
        for first, second in COW_JUNCTIONS:
            where = np.argwhere(code == first * 256 + second).astype(np.float64)
            if where.size:
                where[:, 0] += 0.5  # the face between the two voxels
                order = np.argsort([axis, *[a for a in range(3) if a != axis]])  # back to (z, y, x)
                found.setdefault((first, second), []).append(where[:, order])
    if len(found) < 2:
        return None
    points = np.array([np.concatenate(faces).mean(axis=0)[::-1] for faces in found.values()])
    return points.min(axis=0), points.max(axis=0)


def largest_component_per_label(labels: np.ndarray) -> np.ndarray:
    """Each non-zero label reduced to its largest 26-connected (8 in 2-D) component; a label is never removed."""
    from scipy import ndimage

    kept = np.zeros_like(labels)
    structure = np.ones((3,) * labels.ndim, dtype=bool)
    for value in np.unique(labels):
        if value == 0:
            continue
        components, count = ndimage.label(labels == value, structure=structure)
        if count > 1:
            sizes = np.bincount(components.ravel())[1:]
            kept[components == int(np.argmax(sizes)) + 1] = value
        else:
            kept[components > 0] = value
    return kept


def label_box(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Inclusive (start, end) voxel indices in (x, y, z) order of the non-zero voxels of a (z, y, x) map."""
    nonzero = np.nonzero(labels)
    if not nonzero[0].size:
        return None
    start = np.asarray([axis.min() for axis in reversed(nonzero)], dtype=np.int64)
    end = np.asarray([axis.max() for axis in reversed(nonzero)], dtype=np.int64)
    return start, end


def label_centroid(labels: np.ndarray) -> np.ndarray | None:
    """Mean (x, y, z) voxel index of the non-zero voxels of a (z, y, x) map (None when there are none)."""
    nonzero = np.nonzero(labels)
    if not nonzero[0].size:
        return None
    return np.asarray([axis.mean() for axis in reversed(nonzero)])


class TopCowEdgesIO(VolumeIO):
    """TopCoW task 3: anterior/posterior edge lists from the predicted labels' adjacency."""

    def write_prediction(self, case: SegCase, prediction: np.ndarray, target: Path) -> None:
        from rexmle_grade.graders.topcow import EDGE_KEYS, edge_lists
        from rexmle_grade.metrics.topology import label_adjacency

        labels = self.task_label_map(case, prediction)
        present = {int(v) for v in np.unique(labels) if v}
        edges = edge_lists(present, label_adjacency(labels))
        document = {region: dict(zip(keys, edges[region], strict=True)) for region, keys in EDGE_KEYS.items()}
        target.write_text(json.dumps(document) + "\n")


# ---- 2-D images --------------------------------------------------------------------------------------------------
def _as_channels(array: np.ndarray, channels: int) -> np.ndarray:
    """(h, w[, c]) -> (channels, h, w) float32: gray replicated, alpha dropped, colour averaged for one channel."""
    image = array.astype(np.float32)
    if image.ndim == 2:
        image = image[..., None]
    elif image.shape[0] in (1, 3, 4) and image.shape[-1] not in (1, 3, 4):  # a channels-first TIFF
        image = np.moveaxis(image, 0, -1)
    if image.shape[-1] in (2, 4):  # gray + alpha, RGB + alpha
        image = image[..., :-1]
    if image.shape[-1] == channels:
        return np.moveaxis(image, -1, 0)
    if channels == 1:
        return image.mean(axis=-1)[None]
    return np.repeat(image[..., :1], channels, axis=-1).transpose(2, 0, 1)


class Image2DIO(SegmentationIO):
    """2-D class maps (PUMA tissue, RAVIR). ``task_values[i]`` is the task's value of training label ``i``."""

    dim = 2
    image_suffixes = IMAGE_2D_SUFFIXES
    label_suffixes = IMAGE_2D_SUFFIXES

    def __init__(self, task_id: str, grader: Grader, public_dir: Path, labels: dict[str, int],
                 task_values: Sequence[int], *, channels: int) -> None:
        super().__init__(task_id, grader, public_dir)
        self.labels = labels
        self.task_values = np.asarray(task_values, dtype=np.int64)
        self.channels = channels

    def read_image(self, case: SegCase) -> tuple[np.ndarray, Geometry]:
        array = read_image_2d(case.channels[0], what="image", allow_channels=True)
        image = _as_channels(array, self.channels)
        return image, Geometry(size=(int(image.shape[2]), int(image.shape[1])))

    def read_label(self, case: SegCase) -> np.ndarray:
        if case.label is None:
            raise UserInputError(f"case {case.case_id!r} has no label (a test case)")
        values = read_image_2d(case.label, what="label", integer=True).astype(np.int64)
        lookup = np.full(int(max(self.task_values.max(), values.max())) + 1, -1, dtype=np.int64)
        lookup[self.task_values] = np.arange(len(self.task_values))
        mapped = lookup[values]
        if (mapped < 0).any():
            raise TaskDataMissingError(f"label {case.label.name} holds values outside {self.task_values.tolist()}",
                                       hint="prepare the task again")
        return mapped.astype(np.uint8)

    def test_size(self, case: SegCase) -> tuple[int, int]:
        """(height, width) of the test image."""
        width, height = self.manifest.geometry_of(case.case_id).size[:2]
        return int(height), int(width)

    def write_prediction(self, case: SegCase, prediction: np.ndarray, target: Path) -> None:
        from rexmle_grade.graders._images2d import write_png, write_tiff

        self._check_shape(case, prediction, self.test_size(case))
        self._check_values(case, prediction)
        values = self.task_values[prediction.astype(np.int64)].astype(np.uint8)
        (write_png if full_suffix(target) == ".png" else write_tiff)(target, values)


class CellInstanceIO(Image2DIO):
    """NeurIPS CellSeg: instance maps <-> background / interior / boundary classes."""

    label_name_suffix = "_label"

    def __init__(self, task_id: str, grader: Grader, public_dir: Path) -> None:
        super().__init__(task_id, grader, public_dir, {"background": 0, "interior": 1, "boundary": 2}, (0, 1, 2),
                         channels=3)

    def read_label(self, case: SegCase) -> np.ndarray:
        from skimage.segmentation import find_boundaries

        if case.label is None:
            raise UserInputError(f"case {case.case_id!r} has no label (a test case)")
        instances = read_image_2d(case.label, what="label", integer=True)
        semantic = (instances > 0).astype(np.uint8)
        semantic[find_boundaries(instances, mode="inner") & (instances > 0)] = 2
        return semantic

    def write_prediction(self, case: SegCase, prediction: np.ndarray, target: Path) -> None:
        from rexmle_grade.graders._images2d import write_tiff

        self._check_shape(case, prediction, self.test_size(case))
        self._check_values(case, prediction)
        write_tiff(target, instances_from_semantic(prediction))


MIN_CELL_PIXELS = 15


def instances_from_semantic(semantic: np.ndarray) -> np.ndarray:
    """Cells from a background/interior/boundary map: interior components are the seeds, grown by watershed on
    the distance to background over all foreground pixels; foreground without a seed becomes its own cell, and
    cells under :data:`MIN_CELL_PIXELS` are dropped."""
    from scipy import ndimage
    from skimage.segmentation import watershed

    foreground = semantic > 0
    seeds, n_seeds = ndimage.label(semantic == 1)
    if not foreground.any():
        return np.zeros(semantic.shape, dtype=np.uint32)
    distance = ndimage.distance_transform_edt(foreground)
    instances = watershed(-distance, seeds, mask=foreground).astype(np.uint32)
    orphans, _ = ndimage.label(foreground & (instances == 0))
    instances[orphans > 0] = orphans[orphans > 0] + n_seeds
    # stray specks of predicted foreground would each count as a false-positive cell; like Cellpose's default
    # (min_size=15), cells under 15 px are dropped
    areas = np.bincount(instances.ravel())
    instances[(areas < MIN_CELL_PIXELS)[instances] & (instances > 0)] = 0
    return instances


class NucleiIO(Image2DIO):
    """PUMA nuclei: polygons of ``train/nuclei/<id>.json`` rasterised per class; predictions -> one polygon per
    connected component of each class, centred on its centroid."""

    polygon_vertices = 8
    min_pixels = 4  # the smallest nucleus of the smallest (quarter-scale) mirror covers about 10 pixels

    def __init__(self, task_id: str, grader: Grader, public_dir: Path, classes: Sequence[str]) -> None:
        labels = {"background": 0, **{name: i + 1 for i, name in enumerate(classes)}}
        super().__init__(task_id, grader, public_dir, labels, tuple(range(len(labels))), channels=3)
        self.classes = tuple(classes)

    def _label_files(self) -> dict[str, Path]:
        folder = self.public_dir / "train" / "nuclei"
        return {p.stem: p for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}

    def read_label(self, case: SegCase) -> np.ndarray:
        from skimage.draw import polygon

        if case.label is None:
            raise UserInputError(f"case {case.case_id!r} has no label (a test case)")
        _, geometry = self.read_image(case)
        width, height = geometry.size
        semantic = np.zeros((height, width), dtype=np.uint8)
        document = json.loads(case.label.read_text())
        for item in document.get("polygons", []):
            value = self.labels.get(item.get("name"))
            points = np.asarray([p[:2] for p in item.get("path_points", [])], dtype=float)
            if value is None or len(points) < 3:
                continue
            rows, cols = polygon(points[:, 1], points[:, 0], shape=semantic.shape)
            semantic[rows, cols] = value
        return semantic

    def write_prediction(self, case: SegCase, prediction: np.ndarray, target: Path) -> None:
        from scipy import ndimage

        self._check_shape(case, prediction, self.test_size(case))
        self._check_values(case, prediction)
        angles = np.linspace(0, 2 * np.pi, self.polygon_vertices, endpoint=False)
        polygons = []
        for name, value in self.labels.items():
            if value == 0:
                continue
            components, count = ndimage.label(prediction == value)
            if not count:
                continue
            index = np.arange(1, count + 1)
            centres = ndimage.center_of_mass(np.ones_like(components), components, index)
            areas = ndimage.sum_labels(np.ones_like(components), components, index)
            for (row, col), area in zip(centres, areas, strict=True):
                if area < self.min_pixels:
                    continue
                radius = max(float(np.sqrt(area / np.pi)), 1.0)
                points = [[round(col + radius * np.cos(a), 2), round(row + radius * np.sin(a), 2), 0]
                          for a in angles]
                polygons.append({"name": name, "path_points": points, "score": 1.0})
        document = {"type": "Multiple polygons", "polygons": polygons, "version": {"major": 1, "minor": 0}}
        target.write_text(json.dumps(document) + "\n")


# ---- the task -> I/O table ---------------------------------------------------------------------------------------
def _topcow_labels() -> tuple[dict[str, int], tuple[int, ...]]:
    from rexmle_grade.graders.topcow import LABEL_NAMES

    values = (0, *sorted(LABEL_NAMES))
    return {"background": 0, **{LABEL_NAMES[v]: i for i, v in enumerate(values) if v}}, values


def segmentation_io(task_id: str, grader_id: str, public_dir: Path) -> SegmentationIO:
    """The :class:`SegmentationIO` of a segmentation-type task; other tasks raise :class:`UserInputError`."""
    grader = get_grader(grader_id)
    if grader_id.startswith("topcow-"):
        labels, values = _topcow_labels()
        kind = {"task1": VolumeIO, "task2": TopCowBoxIO, "task3": TopCowEdgesIO}[grader_id.rsplit("-", 1)[1]]
        return kind(task_id, grader, public_dir, labels, values)
    if grader_id.startswith("topbrain-"):
        values = tuple(sorted(grader.allowed_labels))
        return VolumeIO(task_id, grader, public_dir,
                        {"background": 0, **{f"vessel_{v}": i for i, v in enumerate(values) if v}}, values)
    if grader_id.startswith("panther-"):
        return PantherIO(task_id, grader, public_dir, {"background": 0, "tumour": 1, "pancreas": 2}, (0, 1, 2))
    if grader_id == "isles22":
        return VolumeIO(task_id, grader, public_dir, {"background": 0, "lesion": 1}, (0, 1), binary_labels=True)
    if grader_id == "seg_a":
        return VolumeIO(task_id, grader, public_dir, {"background": 0, "aorta": 1}, (0, 1), binary_labels=True)
    if grader_id in ("puma-track1-task1", "puma-track2-task1"):
        from rexmle_grade.graders.puma import TISSUE_CLASSES

        # class 0 (tissue_white_background) is the background nnU-Net requires under that name
        labels = {"background": 0, **{name: i for i, name in enumerate(TISSUE_CLASSES) if i}}
        return Image2DIO(task_id, grader, public_dir, labels, tuple(range(len(TISSUE_CLASSES))), channels=3)
    if grader_id in ("puma-track1-task2", "puma-track2-task2"):
        return NucleiIO(task_id, grader, public_dir, grader.classes)
    if grader_id == "neurips-cellseg":
        return CellInstanceIO(task_id, grader, public_dir)
    if grader_id == "ravir":
        from rexmle_grade.graders.ravir import ARTERY, BACKGROUND, VEIN

        return Image2DIO(task_id, grader, public_dir, {"background": 0, "artery": 1, "vein": 2},
                         (BACKGROUND, ARTERY, VEIN), channels=1)
    raise UserInputError(f"task {task_id!r} (grader {grader_id!r}) is not a segmentation task",
                         hint="segmentation tasks: TopCoW, TopBrain, PANTHER, ISLES'22, SEG.A., PUMA, NeurIPS "
                              "CellSeg, RAVIR")


def segmentation_grader_ids() -> list[str]:
    """Every grader id :func:`segmentation_io` supports."""
    return [*(f"topcow-track{t}-task{k}" for t in (1, 2) for k in (1, 2, 3)), "topbrain-track1", "topbrain-track2",
            "panther-task1", "panther-task2", "isles22", "seg_a", *(f"puma-track{t}-task{k}" for t in (1, 2)
                                                                     for k in (1, 2)),
            "neurips-cellseg", "ravir"]
