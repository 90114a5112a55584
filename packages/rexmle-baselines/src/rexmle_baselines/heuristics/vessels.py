"""TopCoW and TopBrain: what a person does without a network.

* Segmentation (TopCoW task 1, TopBrain): vessels are the bright voxels, and which vessel a voxel belongs to is read
  from an atlas. The vessel mask is one intensity rule fitted on the training labels for the best binary Dice:
  either a window of raw values (CTA is calibrated in Hounsfield units, and the window also drops the brighter
  bone) or the brightest fraction of each image (MRA has no unit). The atlas is the frequency of every label at
  each position, lightly smoothed: for TopCoW in a window around the training ROIs' centres, placed on a test image
  by the task-2 template match; for TopBrain, which has no ROIs, on the image taken as the unit cube (the training
  label maps averaged on a common 48^3 grid). A vessel voxel takes the atlas's most frequent label there, or stays
  background where the training set never had a vessel near it.
* ROI box (TopCoW task 2): template matching. The training images, each standardised and cropped around its ROI,
  are averaged into a template of the circle's surroundings (skull base, carotids); the test box has the training
  ROIs' median size and sits where the template correlates best with the test image.
* Variant edges (TopCoW task 3): the most frequent anterior and the most frequent posterior variant of the
  training edge lists, for every test case.

Each is fitted on the public training data only and is valid on real data as well; none of them looks at a vessel's
shape, so head pose, field-of-view placement and anatomical variants are what they get wrong.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
from scipy import ndimage

from rexmle_baselines.base import BaselineContext
from rexmle_baselines.convert import SegCase, SegmentationIO, first_channel_file, segmentation_io
from rexmle_baselines.heuristics import Heuristic
from rexmle_grade.errors import TaskDataMissingError
from rexmle_grade.grader import TestManifest, get_grader, write_submission_csv
from rexmle_grade.graders.topcow import EDGE_KEYS, parse_edges, read_edge_document
from rexmle_grade.io import read_volume
from rexmle_grade.metrics.boxes import parse_roi_txt

ATLAS_SHAPE = (48, 48, 48)
ATLAS_SIGMA = 1.0  # atlas voxels: tolerates a voxel or two of misplacement, keeps neighbouring vessels apart
ATLAS_FLOOR = 0.02  # below this frequency of any vessel label the atlas says "no vessel was ever here"
ROI_ATLAS_MARGIN = 1.3  # the ROI-centred atlas window: the median ROI grown by 30 % (vessels leave the ROI)
QUANTILES = np.linspace(0.5, 0.999, 60)  # window bounds: quantiles of the pooled training intensities
FRACTIONS = np.array([0.002, 0.004, 0.007, 0.01, 0.015, 0.02, 0.03, 0.045, 0.06, 0.08])


# ---- segmentation: threshold + atlas ---------------------------------------------------------------------------
def _atlas_index(shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """The nearest atlas cell of every voxel of an image of ``shape``, per axis (both span the unit cube)."""
    return np.ix_(*[np.minimum((np.arange(n) + 0.5) * a / n, a - 1).astype(np.int64)
                    for n, a in zip(shape, ATLAS_SHAPE, strict=True)])


def _dice(mask: np.ndarray, truth: np.ndarray) -> float:
    total = int(mask.sum()) + int(truth.sum())
    return 1.0 if total == 0 else 2.0 * int((mask & truth).sum()) / total


class VesselRule:
    """The fitted intensity rule: a raw-value window ``low <= value < high`` or the brightest ``fraction`` of each
    image."""

    def __init__(self, low: float | None, high: float | None, fraction: float | None) -> None:
        self.low, self.high, self.fraction = low, high, fraction

    def __call__(self, image: np.ndarray) -> np.ndarray:
        if self.fraction is not None:
            return image > np.quantile(image, 1.0 - self.fraction)
        return (image >= self.low) & (image < self.high)

    def __str__(self) -> str:
        if self.fraction is not None:
            return f"the brightest {self.fraction:.1%} of each image"
        return f"values in [{self.low:.0f}, {self.high:.0f})"

    @classmethod
    def fit(cls, pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[VesselRule, float]:
        """The rule with the best mean training Dice among raw windows (bounds at pooled quantiles) and fractions."""
        pooled = np.concatenate([image[::3, ::3, ::3].ravel() for image, _ in pairs])
        edges = np.append(np.quantile(pooled, QUANTILES), float(pooled.max()) + 1.0)
        # every window at once from per-image histograms: cumulative[x] counts the voxels below edges[x]
        window_dice = np.zeros((len(edges), len(edges)))
        for image, truth in pairs:
            below = np.searchsorted(edges, image.ravel(), side="right")
            everything = np.cumsum(np.bincount(below, minlength=len(edges) + 1))[:len(edges)]
            vessel = np.cumsum(np.bincount(below[truth.ravel()], minlength=len(edges) + 1))[:len(edges)]
            kept = everything[None, :] - everything[:, None]  # [low index, high index]
            hits = vessel[None, :] - vessel[:, None]
            total = kept + int(truth.sum())
            window_dice += np.where(total > 0, 2.0 * hits / np.maximum(total, 1), 1.0)
        window_dice = np.where(np.triu(np.ones_like(window_dice), 1) > 0, window_dice / len(pairs), -1.0)
        low, high = np.unravel_index(int(np.argmax(window_dice)), window_dice.shape)
        best: tuple[VesselRule, float] = (cls(float(edges[low]), float(edges[high]), None),
                                          float(window_dice[low, high]))
        fraction_dice = np.zeros(len(FRACTIONS))
        for image, truth in pairs:
            for i, threshold in enumerate(np.quantile(image, 1.0 - FRACTIONS)):
                fraction_dice[i] += _dice(image > threshold, truth) / len(pairs)
        top = int(np.argmax(fraction_dice))
        if fraction_dice[top] > best[1]:
            best = (cls(None, None, float(FRACTIONS[top])), float(fraction_dice[top]))
        return best


def fit_atlas(io: SegmentationIO, cases: list[SegCase]) -> np.ndarray:
    """(labels, *ATLAS_SHAPE) frequency of every training label index in each cell of the unit-cube grid (cells
    averaged over the voxels that fall into them, then over cases, then smoothed)."""
    n, cells = len(io.labels), int(np.prod(ATLAS_SHAPE))
    atlas = np.zeros((n, cells), dtype=np.float64)
    for case in cases:
        label = io.read_label(case).astype(np.int64)
        index = _atlas_index(label.shape)
        cell = np.ravel_multi_index(np.broadcast_arrays(*index), ATLAS_SHAPE)
        counts = np.bincount((label * cells + cell).ravel(), minlength=n * cells).reshape(n, cells)
        atlas += counts / np.maximum(counts.sum(axis=0), 1)
    atlas = (atlas / max(1, len(cases))).reshape(n, *ATLAS_SHAPE).astype(np.float32)
    for value in range(1, n):
        atlas[value] = ndimage.gaussian_filter(atlas[value], ATLAS_SIGMA)
    return atlas


def atlas_labels(atlas: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Label indices of the vessel voxels of ``mask`` from the atlas (0 where the atlas knows no vessel)."""
    local = atlas[(slice(1, None), *_atlas_index(mask.shape))]
    best = local.argmax(axis=0) + 1
    known = local.max(axis=0) >= ATLAS_FLOOR
    return np.where(mask & known, best, 0).astype(np.uint8)


def threshold_and_atlas(ctx: BaselineContext) -> None:
    io = segmentation_io(ctx.task_id, ctx.grader_id, ctx.public_dir)
    cases = io.training_cases()
    pairs = [(io.read_image(case)[0][0], io.read_label(case) > 0) for case in cases]
    rule, dice = VesselRule.fit(pairs)
    ctx.log(f"vessels = {rule}: mean training Dice {dice:.3f} (binary, whole image)")
    if (ctx.public_dir / "train" / "roi").is_dir():
        # TopCoW: the training ROIs say where the circle is; the atlas is laid out around the ROI centre, and each
        # test image's circle is found by template matching
        template = RoiTemplate.fit(ctx.public_dir, ctx.task_id)
        atlas = fit_roi_atlas(io, cases, template)
        ctx.log(f"atlas of {len(cases)} training label maps around their ROI centres, {atlas.shape[1:]} voxels "
                "(z, y, x), placed by template matching")
        predictions = {}
        for case in io.test_cases():
            image = io.read_image(case)[0][0]
            predictions[case.case_id] = roi_atlas_labels(atlas, rule(image), template.centre(image))
    else:
        atlas = fit_atlas(io, cases)
        ctx.log(f"atlas of {len(cases)} training label maps on a {ATLAS_SHAPE} unit-cube grid")
        predictions = {case.case_id: atlas_labels(atlas, rule(io.read_image(case)[0][0])) for case in io.test_cases()}
    io.write_submission(predictions, ctx.out_dir)


def fit_roi_atlas(io: SegmentationIO, cases: list[SegCase], template: RoiTemplate) -> np.ndarray:
    """(labels, *window) frequency of every training label index in a window around the training ROI centres."""
    window = tuple(round(n * ROI_ATLAS_MARGIN) for n in template.shape)
    n, cells = len(io.labels), int(np.prod(window))
    atlas = np.zeros((n, cells), dtype=np.float64)
    for case in cases:
        centre = template.roi_centres.get(case.case_id)
        if centre is None:
            continue
        label = _crop(io.read_label(case).astype(np.float32), centre, window).astype(np.int64)
        atlas += np.bincount((label * cells + np.arange(cells).reshape(window)).ravel(),
                             minlength=n * cells).reshape(n, cells)
    atlas = (atlas / max(1, len(template.roi_centres))).reshape(n, *window).astype(np.float32)
    for value in range(1, n):
        atlas[value] = ndimage.gaussian_filter(atlas[value], ATLAS_SIGMA)
    return atlas


def roi_atlas_labels(atlas: np.ndarray, mask: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """Label indices of the vessel voxels of ``mask`` from an ROI-centred atlas placed at ``centre`` (z, y, x)."""
    window = atlas.shape[1:]
    start = np.round(centre - np.asarray(window) / 2).astype(int)
    out = np.zeros(mask.shape, dtype=np.uint8)
    image_part = tuple(slice(max(0, s), min(n, s + k)) for s, k, n in zip(start, window, mask.shape, strict=True))
    atlas_part = tuple(slice(p.start - s, p.stop - s) for p, s in zip(image_part, start, strict=True))
    local = atlas[(slice(1, None), *atlas_part)]
    best = local.argmax(axis=0) + 1
    known = local.max(axis=0) >= ATLAS_FLOOR
    out[image_part] = np.where(mask[image_part] & known, best, 0)
    return out


# ---- TopCoW task 2: template matching -------------------------------------------------------------------------
def _standardised(image: np.ndarray) -> np.ndarray:
    """The image clipped to its 1-99.5 percentiles and z-scored (scanners and sites differ in scale)."""
    low, high = np.percentile(image, [1.0, 99.5])
    clipped = np.clip(image, low, high).astype(np.float32)
    return (clipped - clipped.mean()) / max(float(clipped.std()), 1e-6)


def _crop(image: np.ndarray, centre_zyx: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The ``shape`` block of ``image`` centred on ``centre_zyx``, padded with zeros where it leaves the image."""
    out = np.zeros(shape, dtype=np.float32)
    start = np.round(centre_zyx - np.asarray(shape) / 2).astype(int)
    source = tuple(slice(max(0, s), min(n, s + k)) for s, k, n in zip(start, shape, image.shape, strict=True))
    target = tuple(slice(src.start - s, src.stop - s) for src, s in zip(source, start, strict=True))
    out[target] = image[source]
    return out


class RoiTemplate:
    """The training ROIs' mean image (each standardised and cropped at its ROI's centre with the median ROI size),
    matched to a test image by normalised cross-correlation."""

    def __init__(self, template: np.ndarray, size_xyz: np.ndarray, roi_centres: dict[str, np.ndarray]) -> None:
        self.template = template
        self.shape: tuple[int, ...] = template.shape
        self.size_xyz = size_xyz
        self.roi_centres = roi_centres  # training case id -> ROI centre (z, y, x)

    @classmethod
    def fit(cls, public: Path, task_id: str) -> RoiTemplate:
        roi_files = sorted((public / "train" / "roi").glob("*.txt"))
        if not roi_files:
            raise TaskDataMissingError(f"no training ROI files in {public / 'train' / 'roi'}",
                                       hint=f"`rexmle prepare {task_id} --force`")
        rois = {path.stem: parse_roi_txt(path.read_text()) for path in roi_files}
        size_xyz = np.median([roi.size for roi in rois.values()], axis=0).round().astype(int)
        shape = tuple(int(v) for v in size_xyz[::-1])
        template = np.zeros(shape, dtype=np.float32)
        centres = {}
        for case_id, roi in rois.items():
            path = first_channel_file(public / "train" / "images", case_id)
            image = _standardised(read_volume(path, what="image").array)
            centres[case_id] = (np.asarray(roi.location) + (np.asarray(roi.size) - 1) / 2)[::-1]
            template += _crop(image, centres[case_id], shape) / len(rois)
        return cls(template - template.mean(), size_xyz, centres)

    def centre(self, image: np.ndarray) -> np.ndarray:
        """(z, y, x) voxel where the template matches ``image`` best."""
        from scipy import signal

        image = _standardised(image)
        # normalised cross-correlation: the template's match divided by the image's spread under the window, so
        # that bright bone or a dark air border does not win by its contrast alone
        window = np.ones(self.shape, dtype=np.float32)
        local_sum = signal.fftconvolve(image, window, mode="same")
        local_spread = signal.fftconvolve(image * image, window, mode="same") - local_sum ** 2 / window.size
        match = signal.fftconvolve(image, self.template[::-1, ::-1, ::-1], mode="same")
        score = match / np.sqrt(np.maximum(local_spread, 1e-3 * window.size))
        return np.asarray(np.unravel_index(int(np.argmax(score)), score.shape), dtype=float)


def template_matched_box(ctx: BaselineContext) -> None:
    """A box of the training ROIs' median size centred where the :class:`RoiTemplate` matches best."""
    public = ctx.public_dir
    template = RoiTemplate.fit(public, ctx.task_id)
    ctx.log(f"template: the mean of {len(template.roi_centres)} training ROIs, {template.size_xyz.tolist()} voxels "
            "(x, y, z)")
    answers = {}
    for case_id in TestManifest.read(public).ids:
        image = read_volume(first_channel_file(public / "test" / "images", case_id), what="image").array
        centre_xyz = template.centre(image)[::-1]
        size = np.asarray(image.shape[::-1])
        extent = np.clip(template.size_xyz, 1, size)
        location = np.clip(np.round(centre_xyz - (extent - 1) / 2).astype(np.int64), 0, size - extent)
        answers[case_id] = {"size": [int(v) for v in extent], "location": [int(v) for v in location]}
    _write_json_answers(ctx, answers)


# ---- TopCoW task 3: the most frequent variant --------------------------------------------------------------------
def most_frequent_variant(ctx: BaselineContext) -> None:
    public = ctx.public_dir
    edge_files = sorted((public / "train" / "edges").glob("*.yml"))
    if not edge_files:
        raise TaskDataMissingError(f"no training edge lists in {public / 'train' / 'edges'}",
                                   hint=f"`rexmle prepare {ctx.task_id} --force`")
    documents = [parse_edges(read_edge_document(p, p.name), p.name) for p in edge_files]
    answer = {}
    for region, keys in EDGE_KEYS.items():
        counts = Counter(document[region] for document in documents)
        # ties go to the variant with more segments present, the anatomy's default
        flags = max(counts, key=lambda v: (counts[v], sum(v), v))
        answer[region] = dict(zip(keys, (int(f) for f in flags), strict=True))
        ctx.log(f"{region}: {answer[region]} in {counts[flags]} of {len(documents)} training cases")
    _write_json_answers(ctx, dict.fromkeys(TestManifest.read(public).ids, answer))


def _write_json_answers(ctx: BaselineContext, answers: dict[str, object]) -> None:
    grader = get_grader(ctx.grader_id)
    (column,) = grader.schema.file_columns
    rows = []
    for case_id, content in answers.items():
        relative = column.path_for(case_id)
        target = ctx.out_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(content) + "\n")
        rows.append({grader.schema.id_column: case_id, "modality": str(grader.modality),  # type: ignore[attr-defined]
                     column.name: relative})
    write_submission_csv(ctx.out_dir, grader.schema, rows)


# ---- the table -----------------------------------------------------------------------------------------------------
_THRESHOLD = "an intensity window or per-image brightest fraction fitted on the training Dice"
_COW_SEGMENTATION = (f"{_THRESHOLD}, each vessel voxel labelled by an atlas of the training label maps around the "
                     "ROI centre, placed by template matching")
_BRAIN_SEGMENTATION = f"{_THRESHOLD}, each vessel voxel labelled by a unit-cube atlas of the training label maps"
_BOX = ("a template of the training ROIs' mean image, matched to each test image by cross-correlation; the box "
        "of the training ROIs' median size at the best match")
_EDGES = "the most frequent anterior and posterior variant of the training edge lists"

def ladder_overrides(track: int, epochs: int) -> dict[str, object]:
    """The quick monai-seg of the vessel ladders: the whole circle in one patch on the median grid (a vessel's name
    is where it lies relative to the others, which a 32-voxel patch cannot see), every label as a patch centre
    equally often, a deeper UNet, about 1,440 steps (``epochs``: 80 on TopCoW's 19 training scans, 160 on
    TopBrain's 9; at 360 steps the loss stalled near 0.9 and Dice stayed under 0.1), nnU-Net's intensity
    augmentation, and on CTA (track 1) nnU-Net's dataset normalisation, so that a vessel's Hounsfield value means
    the same in every scan whatever bone it holds. About 17 CPU minutes on one thread for TopCoW, 50 for TopBrain
    (40 labels, larger scans)."""
    return {"resample": "median", "patch_size_3d": (32, 64, 64), "channels": (16, 32, 64, 128), "strides": (2, 2, 2),
            "crop": "classes", "epochs": epochs, "batch_size": 2, "samples_per_case": 2,
            "intensity": "dataset" if track == 1 else "case", "intensity_aug": "strong"}


HEURISTICS = {
    **{f"topcow-track{track}-task1": Heuristic(_COW_SEGMENTATION, threshold_and_atlas,
                                               ladder_overrides=ladder_overrides(track, 80)) for track in (1, 2)},
    **{f"topcow-track{track}-task2": Heuristic(_BOX, template_matched_box,
                                               ladder_overrides=ladder_overrides(track, 80)) for track in (1, 2)},
    # task 3's trained rung is the segmentation network with its edge lists read from the predicted labels, as the
    # challenge's strong teams derived them: a classifier of maximum-intensity projections (timm-cls) stayed at
    # chance on the realistic mirrors (0.25 with 120 patients), the thread-like Acom and Pcoms not showing in them
    **{f"topcow-track{track}-task3": Heuristic(_EDGES, most_frequent_variant, ladder_baseline="monai-seg",
                                               ladder_overrides=ladder_overrides(track, 80)) for track in (1, 2)},
    **{f"topbrain-track{track}": Heuristic(_BRAIN_SEGMENTATION, threshold_and_atlas,
                                           ladder_overrides=ladder_overrides(track, 160)) for track in (1, 2)},
}
