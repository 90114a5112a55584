"""TopCoW 2024, six tasks on one download: mirror layout, prepared folders, grading, learnability, determinism."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml
from scipy import ndimage

from rexmle_grade.errors import ConfigurationError
from rexmle_grade.graders.topcow import ALLOWED_LABELS, EDGE_KEYS, GROUP2_LABELS, parse_edges
from rexmle_grade.io import read_volume, read_volume_geometry
from rexmle_grade.metrics.boxes import crop_slices_zyx, parse_roi_txt
from rexmle_tasks.check import check_task
from rexmle_tasks.families.topcow import ARCHIVE, PATIENT_IDS, TopCowFamily
from rexmle_tasks.pipeline import generator_seed
from rexmle_tasks.registry import get_task

from .conftest import SECRET, TOPCOW_TASKS, Prepared, segmentation_submission

TOP = "TopCoW2024_Data_Release"
RELEASE_FOLDERS = {"imagesTr": "_0000.nii.gz", "cow_seg_labelsTr": ".nii.gz", "roi_loc_labelsTr": ".txt",
                   "antpos_edges_labelsTr": ".yml"}
PRIVATE_FOLDERS = {1: {"labels", "roi"}, 2: {"roi"}, 3: {"edges"}}
ANSWER_COLUMNS = {1: ["image_id", "label_path", "roi_path"], 2: ["image_id", "roi_path"], 3: ["image_id", "edges_path"]}


def task_number(task_id: str) -> int:
    return int(task_id[-1])


def modality_of(task_id: str) -> str:
    return "ct" if "track1" in task_id else "mr"


# ---- the synthetic download ----------------------------------------------------------------------------------
def test_the_archive_has_the_release_name_tree_and_first_real_ids(prepared) -> None:
    p = prepared("topcow-track1-task1")
    downloads = p.dirs.raw / "downloads"
    assert [f.name for f in downloads.iterdir()] == [ARCHIVE]
    with zipfile.ZipFile(downloads / ARCHIVE) as zf:
        members = [n for n in zf.namelist() if not n.endswith("/")]
    n = p.task.meta.synthetic_cases
    expected = {f"{TOP}/License.txt"}
    for folder, suffix in RELEASE_FOLDERS.items():
        expected |= {f"{TOP}/{folder}/topcow_{m}_{i}{suffix}" for m in ("ct", "mr") for i in PATIENT_IDS[:n]}
    assert set(members) == expected
    assert PATIENT_IDS[:3] == ("001", "002", "003") and PATIENT_IDS[89:92] == ("090", "131", "132")
    assert len(PATIENT_IDS) == 125


def test_the_extracted_files_follow_the_release_formats(prepared) -> None:
    root = prepared("topcow-track1-task1").dirs.raw / TOP
    assert (root / "License.txt").read_text().strip()
    for label_path in sorted((root / "cow_seg_labelsTr").iterdir()):
        case_id = label_path.name.removesuffix(".nii.gz")
        image = nib.load(root / "imagesTr" / f"{case_id}_0000.nii.gz")
        label = nib.load(label_path)
        assert image.get_data_dtype() == np.int16 and label.get_data_dtype() == np.uint8
        assert image.shape == label.shape and np.allclose(image.affine, label.affine)
        assert nib.aff2axcodes(image.affine) == ("L", "P", "S")
        values = set(np.unique(np.asarray(label.dataobj)).tolist())
        assert values <= ALLOWED_LABELS and {0, 1, 4, 6} <= values
        roi_lines = (root / "roi_loc_labelsTr" / f"{case_id}.txt").read_text().splitlines()
        assert roi_lines[0] == "--- ROI Meta Data ---"
        assert re.fullmatch(r"Size \(Voxels\): \d+ \d+ \d+", roi_lines[1])
        assert re.fullmatch(r"Location \(Voxels\): \d+ \d+ \d+", roi_lines[2])
        box = parse_roi_txt("\n".join(roi_lines))
        assert all(lo + s <= n for lo, s, n in zip(box.location, box.size, image.shape, strict=True))
        edges = yaml.safe_load((root / "antpos_edges_labelsTr" / f"{case_id}.yml").read_text())
        assert {region: set(keys) for region, keys in edges.items()} == {r: set(k) for r, k in EDGE_KEYS.items()}


def test_the_cta_and_mra_of_a_patient_carry_the_same_edge_list(prepared) -> None:
    edges = prepared("topcow-track1-task1").dirs.raw / TOP / "antpos_edges_labelsTr"
    for ct in edges.glob("topcow_ct_*.yml"):
        assert ct.read_bytes() == (edges / ct.name.replace("_ct_", "_mr_")).read_bytes()


def test_the_mirror_is_byte_stable_and_its_first_cases_do_not_depend_on_the_case_count(prepared, tmp_path) -> None:
    family = TopCowFamily(get_task("topcow-track1-task1").meta)
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        (tmp_path / name).mkdir()  # seeded as prepare_task seeds the fixture's mirror
        family.write_synthetic_download(tmp_path / name, cases=2, seed=generator_seed(SECRET, seed))
    a, b, c = ((tmp_path / name / ARCHIVE).read_bytes() for name in "abc")
    assert a == b and a != c
    with zipfile.ZipFile(tmp_path / "a" / ARCHIVE) as small, \
            zipfile.ZipFile(prepared("topcow-track1-task1").dirs.raw / "downloads" / ARCHIVE) as full:
        for info in small.infolist():
            assert full.getinfo(info.filename).CRC == info.CRC, info.filename


def test_bad_task_options_are_a_configuration_error() -> None:
    meta = get_task("topcow-track1-task1").meta.model_copy(update={"options": {"modality": "us", "task": "seg"}})
    with pytest.raises(ConfigurationError, match="modality"):
        TopCowFamily(meta)


@pytest.mark.parametrize("layout", ["top", "moved-up"])
def test_cases_are_found_with_or_without_the_top_folder_and_need_their_annotations(tmp_path, layout) -> None:
    root = tmp_path / TOP if layout == "top" else tmp_path
    for folder, suffix in RELEASE_FOLDERS.items():
        (root / folder).mkdir(parents=True)
        for case in ("topcow_ct_001", "topcow_mr_001", "topcow_ct_131"):
            (root / folder / f"{case}{suffix}").write_bytes(b"x")
    (root / "imagesTr" / "topcow_ct_166_0000.nii.gz").write_bytes(b"x")  # an unannotated image
    (root / "antpos_edges_labelsTr" / "topcow_ct_131.yml").unlink()
    seg = TopCowFamily(get_task("topcow-track1-task1").meta)
    edges = TopCowFamily(get_task("topcow-track1-task3").meta)
    assert seg.case_ids(tmp_path) == ["topcow_ct_001", "topcow_ct_131"]
    assert edges.case_ids(tmp_path) == ["topcow_ct_001"]
    assert seg.release_cases(tmp_path)["topcow_ct_131"].annotations.keys() == {"label", "roi"}


# ---- the prepared tasks -----------------------------------------------------------------------------------
@pytest.mark.parametrize("task_id", TOPCOW_TASKS)
def test_prepared_folders_hold_all_training_annotations_and_only_the_task_answers(prepared, task_id) -> None:
    p = prepared(task_id)
    modality, number = modality_of(task_id), task_number(task_id)
    n = p.task.meta.synthetic_cases
    assert (p.info.n_train, p.info.n_test) == (n - 3, 3)
    train, test_ids = p.train_ids, list(p.manifest.ids)
    assert len(train) == p.info.n_train and not set(train) & set(test_ids)
    assert all(i.startswith(f"topcow_{modality}_") for i in train + test_ids)
    public = p.dirs.public
    for folder, suffix in (("images", "_0000.nii.gz"), ("labels", ".nii.gz"), ("roi", ".txt"), ("edges", ".yml")):
        assert sorted(f.name for f in (public / "train" / folder).iterdir()) == [f"{i}{suffix}" for i in train]
    assert sorted(f.name for f in (public / "test" / "images").iterdir()) == [f"{i}_0000.nii.gz" for i in test_ids]
    assert {f.name for f in p.dirs.private.iterdir() if f.is_dir()} == PRIVATE_FOLDERS[number]
    answers = p.answers()
    assert list(answers) == test_ids
    assert list(next(iter(answers.values()))) == ANSWER_COLUMNS[number]
    for row in answers.values():
        for column in ANSWER_COLUMNS[number][1:]:
            assert (p.dirs.private / row[column]).is_file()
    for case_id, geometry in p.manifest.geometry.items():
        assert geometry == read_volume_geometry(public / "test" / "images" / f"{case_id}_0000.nii.gz")[0]
    assert check_task(p.task, p.dirs, regenerate=False) == []  # regeneration: tests/test_all_tasks.py


def test_the_six_tasks_test_the_same_patients(prepared) -> None:
    patients = {task_id: {i[-3:] for i in prepared(task_id).manifest.ids} for task_id in TOPCOW_TASKS}
    assert len({frozenset(v) for v in patients.values()}) == 1
    for track in ("track1", "track2"):
        assert len({prepared(t).info.split_digest for t in TOPCOW_TASKS if track in t}) == 1


@pytest.mark.parametrize("task_id", TOPCOW_TASKS)
def test_sample_submission_validates_and_the_gold_one_scores_best(prepared, task_id, tmp_path) -> None:
    p = prepared(task_id)
    sample = p.grade(p.dirs.public / "sample_submission")
    p.task.grader.write_gold_submission(p.dirs.private, p.dirs.public, tmp_path / "gold")
    gold = p.grade(tmp_path / "gold")
    for metric in p.task.grader.metrics:
        if metric.name == "f1_grp2":
            # pooled F1: a Group-2 label absent from every test ROI scores 0 even for a perfect submission
            assert gold.metrics[metric.name] == pytest.approx(group2_ceiling(p))
        elif metric.best is not None:
            assert gold.metrics[metric.name] == pytest.approx(metric.best), metric.name
    primary = p.task.grader.ranked_metrics[0].name
    assert sample.metrics[primary] < gold.metrics[primary]


def group2_ceiling(p: Prepared) -> float:
    seen = set()
    for row in p.answers().values():
        label = read_volume(p.dirs.private / row["label_path"])
        roi = parse_roi_txt((p.dirs.private / row["roi_path"]).read_text())
        seen |= set(np.unique(label.array[crop_slices_zyx(roi, label.geometry.size)]).tolist())
    return len(seen & set(GROUP2_LABELS)) / len(GROUP2_LABELS)


# ---- learnability: trivial models fitted on the training data beat the sample submission ---------------------------
@pytest.mark.parametrize("task_id", ["topcow-track1-task1", "topcow-track2-task1"])
def test_a_band_and_centroid_segmenter_beats_the_sample(prepared, task_id, tmp_path) -> None:
    p = prepared(task_id)
    sample = p.grade(p.dirs.public / "sample_submission")
    fitted = segmentation_submission(p, tmp_path / "model")
    assert fitted.metrics["dice"] > sample.metrics["dice"] + 0.15
    assert fitted.metrics["hd95"] < sample.metrics["hd95"]


def normalised_box(text: str, size: tuple[int, ...]) -> np.ndarray:
    box = parse_roi_txt(text)
    extent = np.asarray(size) - 1
    return np.concatenate([np.asarray(box.location) / extent, np.asarray(box.end) / extent])


@pytest.mark.parametrize("task_id", ["topcow-track1-task2", "topcow-track2-task2"])
def test_the_mean_training_box_beats_the_sample(prepared, task_id, tmp_path) -> None:
    p = prepared(task_id)
    train = p.dirs.public / "train"
    mean = np.mean([normalised_box((train / "roi" / f"{i}.txt").read_text(),
                                   read_volume_geometry(train / "images" / f"{i}_0000.nii.gz")[0].size)
                    for i in p.train_ids], axis=0)

    def write(case_id: str, path: Path) -> None:
        extent = np.asarray(p.manifest.geometry[case_id].size) - 1
        lo, hi = np.rint(mean[:3] * extent).astype(int), np.rint(mean[3:] * extent).astype(int)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"size": (hi - lo + 1).tolist(), "location": lo.tolist()}))

    fitted = p.submit(tmp_path / "model", write)
    sample = p.grade(p.dirs.public / "sample_submission")
    assert fitted.metrics["boundary_iou"] > sample.metrics["boundary_iou"] + 0.1
    assert fitted.metrics["iou"] > sample.metrics["iou"] + 0.1


class EdgeProbe:
    """One flag of the edge list, read from the image: the brightness at the place where the training masks put
    that segment, thresholded halfway between the training cases with and without it."""

    def __init__(self, key: str, label: int, near: int | None) -> None:
        self.key, self.label, self.near = key, label, near

    def place(self, labels: np.ndarray) -> np.ndarray | None:
        """Normalised centroid of the segment in a training mask (A1/P1: the part 2-5 voxels from ICA/BA)."""
        mask = labels == self.label
        if self.near is not None:
            distance = ndimage.distance_transform_edt(labels != self.near)
            mask &= (distance >= 2) & (distance <= 5)
        if not mask.any():
            return None
        return np.argwhere(mask).mean(axis=0) / (np.asarray(labels.shape) - 1)

    @staticmethod
    def brightness(smoothed: np.ndarray, place: np.ndarray) -> float:
        """Brightest voxel of the 3x3x3 box at ``place`` in a smoothed image."""
        centre = np.rint(place * (np.asarray(smoothed.shape) - 1)).astype(int)
        return float(smoothed[tuple(slice(max(0, c - 1), c + 2) for c in centre)].max())


def smoothed_image(path: Path) -> np.ndarray:
    return ndimage.gaussian_filter(read_volume(path).array.astype(np.float32), 0.7)


PROBES = (
    EdgeProbe("L-A1", 12, 6), EdgeProbe("Acom", 10, None), EdgeProbe("3rd-A2", 15, None), EdgeProbe("R-A1", 11, 4),
    EdgeProbe("L-Pcom", 9, None), EdgeProbe("L-P1", 3, 1), EdgeProbe("R-P1", 2, 1), EdgeProbe("R-Pcom", 8, None),
)


@pytest.mark.parametrize("task_id", ["topcow-track1-task3", "topcow-track2-task3"])
def test_brightness_probes_fitted_on_the_training_masks_beat_the_sample(prepared, task_id, tmp_path) -> None:
    p = prepared(task_id)
    train = p.dirs.public / "train"
    images = {i: smoothed_image(train / "images" / f"{i}_0000.nii.gz") for i in p.train_ids}
    labels = {i: read_volume(train / "labels" / f"{i}.nii.gz").array for i in p.train_ids}
    flags = {i: parse_edges(yaml.safe_load((train / "edges" / f"{i}.yml").read_text()), i) for i in p.train_ids}
    keys = [*EDGE_KEYS["anterior"], *EDGE_KEYS["posterior"]]
    rules = {}
    for probe in PROBES:
        places = [probe.place(labels[i]) for i in p.train_ids]
        found = [pl for pl in places if pl is not None]
        truth = np.array([(flags[i]["anterior"] + flags[i]["posterior"])[keys.index(probe.key)] for i in p.train_ids])
        if not found or truth.min() == truth.max():
            rules[probe.key] = (None, int(truth[0]) if found else 0)
            continue
        place = np.mean(found, axis=0)
        values = np.array([probe.brightness(images[i], place) for i in p.train_ids])
        rules[probe.key] = (place, (values[truth == 1].mean() + values[truth == 0].mean()) / 2)

    def write(case_id: str, path: Path) -> None:
        image = smoothed_image(p.dirs.public / "test" / "images" / f"{case_id}_0000.nii.gz")
        present = {}
        for key, (place, threshold) in rules.items():
            present[key] = int(threshold) if place is None else int(EdgeProbe.brightness(image, place) > threshold)
        document = {region: {k: present[k] for k in ks} for region, ks in EDGE_KEYS.items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document))

    fitted = p.submit(tmp_path / "model", write)
    sample = p.grade(p.dirs.public / "sample_submission")
    assert fitted.metrics["anterior_acc"] > sample.metrics["anterior_acc"]
    assert (fitted.metrics["anterior_acc"] + fitted.metrics["posterior_acc"]
            > sample.metrics["anterior_acc"] + sample.metrics["posterior_acc"] + 0.3)


def test_private_answers_are_the_release_files_byte_for_byte(prepared) -> None:
    p = prepared("topcow-track2-task1")
    raw = p.dirs.raw / TOP
    for case_id, row in p.answers().items():
        label = raw / "cow_seg_labelsTr" / f"{case_id}.nii.gz"
        roi = raw / "roi_loc_labelsTr" / f"{case_id}.txt"
        assert (p.dirs.private / row["label_path"]).read_bytes() == label.read_bytes()
        assert (p.dirs.private / row["roi_path"]).read_bytes() == roi.read_bytes()
