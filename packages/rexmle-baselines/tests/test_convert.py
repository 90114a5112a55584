"""convert.py: every segmentation family turns gold-like training label maps into a submission that validates and
grades at the best value, and reads its training data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rexmle_baselines.convert import SegCase, instances_from_semantic, segmentation_grader_ids, segmentation_io
from rexmle_grade.errors import UserInputError
from rexmle_grade.grader import get_grader
from rexmle_grade.grading import grade_submission
from rexmle_grade.validation import validate_submission

# TopCoW tasks 2 and 3 keep no label maps of their test cases: those come from task 1 of the same track, whose
# split is the same (one shared download)
LABEL_SOURCE = {f"topcow-track{t}-task{k}": f"topcow-track{t}-task1" for t in (1, 2) for k in (2, 3)}
# best value of the metric each family is checked at (gold-like predictions must reach it)
BEST = {"topcow-track1-task1": ("dice", 1.0), "topcow-track1-task3": ("anterior_acc", 1.0),
        "topbrain-track2": ("dice", 1.0), "panther-task2": ("dsc", 1.0), "isles22": ("dice", 1.0),
        "seg_a": ("dsc_50pc", 1.0), "puma-track1-task1": ("dice", 1.0), "puma-track2-task2": ("f1", 1.0),
        "neurips-cellseg": ("f1_0.5", 1.0), "ravir": ("dice", 1.0)}


def gold_predictions(io, prepared, task_id: str) -> dict[str, np.ndarray]:
    if task_id in LABEL_SOURCE:  # prepared first: tests run in any order (and across xdist workers)
        prepared.public(LABEL_SOURCE[task_id], cases=4)
    private = prepared.private(LABEL_SOURCE.get(task_id, task_id))
    predictions = {}
    for case in io.test_cases():
        files = [p for folder in ("labels", "nuclei") for p in sorted((private / folder).glob(f"{case.case_id}*"))]
        predictions[case.case_id] = io.read_label(SegCase(case.case_id, case.channels, files[0]))
    return predictions


@pytest.mark.parametrize("task_id", segmentation_grader_ids())
def test_gold_label_maps_make_a_valid_submission(task_id: str, prepared, tmp_path: Path) -> None:
    public = prepared.public(task_id, cases=4)
    grader = get_grader(task_id)
    io = segmentation_io(task_id, task_id, public)
    training = io.training_cases()
    image, geometry = io.read_image(training[0])
    label = io.read_label(training[0])
    assert image.dtype == np.float32 and image.shape[1:] == label.shape == geometry.numpy_shape
    assert label.min() >= 0 and label.max() <= max(io.labels.values())
    assert io.labels["background"] == 0 and sorted(io.labels.values()) == list(range(len(io.labels)))

    io.write_submission(gold_predictions(io, prepared, task_id), tmp_path / "sub")
    report = validate_submission(grader, tmp_path / "sub", public)
    assert report.ok, report.problems
    if task_id in BEST:
        metric, best = BEST[task_id]
        result = grade_submission(grader, tmp_path / "sub", public, prepared.private(task_id))
        assert result.metrics[metric] == pytest.approx(best)


def test_topcow_box_from_gold_labels_overlaps_the_true_roi(prepared, tmp_path: Path) -> None:
    task_id = "topcow-track1-task2"
    public = prepared.public(task_id, cases=4)
    io = segmentation_io(task_id, task_id, public)
    io.write_submission(gold_predictions(io, prepared, task_id), tmp_path)
    result = grade_submission(get_grader(task_id), tmp_path, public, prepared.private(task_id))
    assert result.metrics["iou"] > 0.5  # the central-box sample submission scores about 0.1 here


def test_junction_box_surrounds_the_faces_where_cow_segments_meet() -> None:
    from rexmle_baselines.convert import junction_box

    labels = np.zeros((12, 12, 12), dtype=np.uint8)  # (z, y, x), TopCoW values
    labels[2:5, 3:5, 3:5] = 4  # R-ICA, top face at z 4.5 over y 3-4, x 3-4
    labels[5:7, 3:5, 3:5] = 5  # R-MCA on top of it: the ICA terminus
    labels[8, 8, 6:9] = 10  # Acom along x 6-8
    labels[8, 8, 9:11] = 11  # R-ACA meets it at the face x 8.5
    labels[8, 2, 2:4] = 7  # L-MCA
    labels[8, 2, 4] = 12  # L-ACA touching it: not a pair of the list (the L-ICA is missing), ignored
    low, high = junction_box(labels)
    # the junctions' centres, (x, y, z): ICA/MCA (3.5, 3.5, 4.5), Acom/ACA (8.5, 8, 8)
    assert low.tolist() == [3.5, 3.5, 4.5] and high.tolist() == [8.5, 8.0, 8.0]
    labels[labels == 10] = 0  # one junction left: no box
    assert junction_box(labels) is None


def test_topcow_box_is_the_mean_of_the_centroid_and_junction_boxes_and_follows_the_vessels(prepared,
                                                                                             tmp_path: Path) -> None:
    """The box is the mean of the training ROIs' median box at the vessels' centroid plus the training offset and
    the junction box grown by the training margins, both computed here by hand; moving the predicted vessels by a
    few voxels moves the box by as many."""
    import json

    from rexmle_baselines.convert import junction_box
    from rexmle_grade.metrics.boxes import parse_roi_txt

    task_id = "topcow-track1-task2"
    public = prepared.public(task_id, cases=4)
    io = segmentation_io(task_id, task_id, public)
    gold = gold_predictions(io, prepared, task_id)
    shift = (1, -2, 3)  # (z, y, x) voxels
    moved = {case: np.roll(labels, shift, axis=(0, 1, 2)) for case, labels in gold.items()}
    io.write_submission(gold, tmp_path / "gold")
    io.write_submission(moved, tmp_path / "moved")

    offsets, sizes, lower, upper = [], [], [], []
    for case in io.training_cases():
        roi = parse_roi_txt((public / "train" / "roi" / f"{case.case_id}.txt").read_text())
        low, high = np.asarray(roi.location), np.asarray(roi.location) + np.asarray(roi.size) - 1
        where = np.nonzero(io.read_label(case))
        centroid = np.array([where[2].mean(), where[1].mean(), where[0].mean()])  # (x, y, z)
        offsets.append((low + high) / 2 - centroid)
        sizes.append(roi.size)
        junctions = junction_box(io.task_values[io.read_label(case)])
        lower.append(junctions[0] - low)
        upper.append(high - junctions[1])
    size = np.round(np.median(sizes, axis=0)).astype(int)
    for case in io.test_cases():
        name = io.column.path_for(case.case_id)
        box, box_moved = (json.loads((tmp_path / which / name).read_text()) for which in ("gold", "moved"))
        image_size = np.asarray(io.test_geometry(case).size)
        where = np.nonzero(gold[case.case_id])
        centre = np.array([where[2].mean(), where[1].mean(), where[0].mean()]) + np.median(offsets, axis=0)
        junctions = junction_box(io.task_values[gold[case.case_id]])
        low = np.floor((centre - (size - 1) / 2 + junctions[0] - np.median(lower, axis=0)) / 2 + 0.5).astype(int)
        high = np.floor((centre + (size - 1) / 2 + junctions[1] + np.median(upper, axis=0)) / 2 + 0.5).astype(int)
        low = np.clip(low, 0, image_size - 1)
        high = np.clip(high, low, image_size - 1)
        assert box["location"] == low.tolist() and box["size"] == (high - low + 1).tolist()
        inside = (low > 3) & (high < image_size - 4)
        step = np.array(box_moved["location"]) - np.array(box["location"])
        assert (step[inside] == np.array(shift[::-1])[inside]).all(), (step, shift)
        assert (np.array(box_moved["size"]) == box["size"])[inside].all()


def test_topcow_box_from_stray_voxels_falls_back_on_the_training_rois(prepared, tmp_path: Path) -> None:
    task_id = "topcow-track1-task2"
    public = prepared.public(task_id, cases=4)
    io = segmentation_io(task_id, task_id, public)
    stray = {}
    for case in io.test_cases():
        prediction = np.zeros(io.read_image(case)[1].numpy_shape, dtype=np.uint8)
        prediction[0, 0, 0] = 1  # one stray voxel in a corner: no box of the circle
        stray[case.case_id] = prediction
    io.write_submission(stray, tmp_path / "stray")
    io.write_submission({c: np.zeros_like(p) for c, p in stray.items()}, tmp_path / "empty")
    grader, private = get_grader(task_id), prepared.private(task_id)
    sample = grade_submission(grader, public / "sample_submission", public, private).metrics["iou"]
    for name in ("stray", "empty"):
        assert grade_submission(grader, tmp_path / name, public, private).metrics["iou"] > max(0.5, sample)


def test_the_topcow_fallback_box_keeps_its_size_at_the_image_edge(prepared, tmp_path: Path) -> None:
    """The fallback (nothing predicted) is the training ROIs' median box: where it would leave the image it is moved
    inside, never cut."""
    import json

    task_id = "topcow-track1-task2"
    public = prepared.public(task_id, cases=4)
    io = segmentation_io(task_id, task_id, public)
    io._offset, io._roi_size, io._roi_centre, io._margins = io.training_boxes()
    io._roi_centre = np.array([0.0, 0.0, 0.0])  # the median ROI centred on the image's corner
    case = io.test_cases()[0]
    size = np.asarray(io.test_geometry(case).size)
    io.write_prediction(case, np.zeros(io.test_geometry(case).numpy_shape, dtype=np.uint8), tmp_path / "box.json")
    box = json.loads((tmp_path / "box.json").read_text())
    assert box == {"size": np.clip(io._roi_size, 1, size).tolist(), "location": [0, 0, 0]}


def test_instances_split_touching_cells_at_their_boundary() -> None:
    semantic = np.zeros((12, 20), dtype=np.uint8)
    semantic[2:10, 2:18] = 2  # two cells sharing a boundary column
    semantic[3:9, 3:9] = 1
    semantic[3:9, 11:17] = 1
    instances = instances_from_semantic(semantic)
    assert set(np.unique(instances)) == {0, 1, 2}
    assert (instances[semantic == 0] == 0).all() and (instances[semantic > 0] > 0).all()


def test_a_prediction_on_the_wrong_grid_is_refused(prepared, tmp_path: Path) -> None:
    io = segmentation_io("ravir", "ravir", prepared.public("ravir", cases=4))
    predictions = {case.case_id: np.zeros((3, 3), dtype=np.uint8) for case in io.test_cases()}
    with pytest.raises(UserInputError, match="test image grid"):
        io.write_submission(predictions, tmp_path)


def test_a_non_segmentation_task_is_refused(prepared) -> None:
    with pytest.raises(UserInputError, match="not a segmentation task"):
        segmentation_io("ldct-iqa", "ldct-iqa", Path("/nonexistent"))


@pytest.mark.parametrize(("shape", "channels", "expected"), [
    ((5, 7), 3, (3, 5, 7)), ((5, 7, 4), 3, (3, 5, 7)), ((3, 5, 7), 3, (3, 5, 7)), ((5, 7, 3), 1, (1, 5, 7)),
    ((5, 7, 2), 1, (1, 5, 7)),
])
def test_2d_images_become_the_family_channel_count(shape, channels: int, expected) -> None:
    from rexmle_baselines.convert import _as_channels

    image = _as_channels(np.arange(np.prod(shape)).reshape(shape).astype(np.uint16), channels)
    assert image.shape == expected and image.dtype == np.float32


def test_a_stray_island_of_a_label_does_not_stretch_the_topcow_box(prepared, tmp_path: Path) -> None:
    import json

    from rexmle_baselines.convert import largest_component_per_label

    task_id = "topcow-track1-task2"
    prepared.public("topcow-track1-task1", cases=4)  # the label maps of the shared split
    io = segmentation_io(task_id, task_id, prepared.public(task_id, cases=4))
    gold = gold_predictions(io, prepared, task_id)
    noisy = {}
    for case_id, labels in gold.items():
        noisy[case_id] = labels.copy()
        value = int(labels.max())
        noisy[case_id][0, 0, 0] = value  # an island of a present label far from the circle
        assert np.array_equal(largest_component_per_label(noisy[case_id]), labels)
    io.write_submission(gold, tmp_path / "gold")
    io.write_submission(noisy, tmp_path / "noisy")
    for case_id in gold:
        boxes = [json.loads(next((tmp_path / name).rglob(f"{case_id}*")).read_text()) for name in ("gold", "noisy")]
        assert boxes[0] == boxes[1]
