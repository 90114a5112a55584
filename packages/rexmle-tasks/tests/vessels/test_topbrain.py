"""TopBrain 2025, CTA and MRA tracks on one download: mirror layout, prepared folders, grading, learnability."""

from __future__ import annotations

import json
import zipfile

import nibabel as nib
import numpy as np
import pytest

from rexmle_grade.graders.topbrain import valid_neighbours
from rexmle_grade.io import read_volume, read_volume_geometry
from rexmle_grade.metrics.topology import label_adjacency
from rexmle_tasks.check import check_task
from rexmle_tasks.families.topbrain import ARCHIVE, PATIENT_IDS, TopBrainFamily
from rexmle_tasks.registry import get_task

from .conftest import TOPBRAIN_TASKS, Prepared, segmentation_submission

TOP = "TopBrain_Data_Release_Batches1n2_081425"
N_LABELS = {"ct": 40, "mr": 42}
SIDE_ROADS = {"ct": (8, 9, 10, 15, 16, *range(25, 35), 37, 38, 39), "mr": (8, 9, 10, 15, 16, *range(25, 35), 41, 42)}


def modality_of(task_id: str) -> str:
    return "ct" if task_id.endswith("1") else "mr"


def test_the_archive_has_the_release_name_and_tree(prepared) -> None:
    p = prepared("topbrain-track1")
    downloads = p.dirs.raw / "downloads"
    assert [f.name for f in downloads.iterdir()] == [ARCHIVE]
    with zipfile.ZipFile(downloads / ARCHIVE) as zf:
        members = {n for n in zf.namelist() if not n.endswith("/")}
    ids = PATIENT_IDS[: p.task.meta.synthetic_cases]
    expected = {f"{TOP}/License.txt", f"{TOP}/itksnap_labelmap_txt/labelmap_topbrain_ct.txt",
                f"{TOP}/itksnap_labelmap_txt/labelmap_topbrain_mr.txt"}
    for m in ("ct", "mr"):
        expected |= {f"{TOP}/imagesTr_topbrain_{m}/topcow_{m}_{i}_0000.nii.gz" for i in ids}
        expected |= {f"{TOP}/labelsTr_topbrain_{m}/topcow_{m}_{i}.nii.gz" for i in ids}
    assert members == expected
    assert len(PATIENT_IDS) == 25 and "009" not in PATIENT_IDS and "019" not in PATIENT_IDS
    assert PATIENT_IDS[-1] == "027"


def test_the_itksnap_label_description_names_every_label(prepared) -> None:
    folder = prepared("topbrain-track1").dirs.raw / TOP / "itksnap_labelmap_txt"
    text = (folder / "labelmap_topbrain_mr.txt").read_text()
    rows = [line.split() for line in text.splitlines() if not line.startswith("#")]
    assert [int(r[0]) for r in rows] == list(range(43))
    assert rows[4][-1] == '"R-ICA"' and rows[42][-1] == '"L-MMA"'
    assert all(0 <= int(v) <= 255 for r in rows for v in r[1:4])


@pytest.mark.parametrize("modality", ["ct", "mr"])
def test_the_extracted_scans_are_lps_int16_with_the_track_labels(prepared, modality) -> None:
    root = prepared("topbrain-track1").dirs.raw / TOP
    valid = valid_neighbours(modality)
    for label_path in sorted((root / f"labelsTr_topbrain_{modality}").iterdir()):
        image = nib.load(root / f"imagesTr_topbrain_{modality}" / label_path.name.replace(".nii.gz", "_0000.nii.gz"))
        label = nib.load(label_path)
        assert image.get_data_dtype() == np.int16 and label.get_data_dtype() == np.uint8
        assert image.shape == label.shape and np.allclose(image.affine, label.affine)
        assert nib.aff2axcodes(label.affine) == ("L", "P", "S")
        array = np.asarray(label.dataobj)
        values = set(np.unique(array).tolist())
        assert values <= set(range(N_LABELS[modality] + 1)) and len(values) > 30
        assert values & set(range(35, N_LABELS[modality] + 1))  # the track's own labels (veins / ECA branches)
        # a perfect prediction must score neighbor_error 0
        assert all(touching <= valid[lab] for lab, touching in label_adjacency(array).items())


def test_the_mirror_is_byte_stable_for_a_seed(tmp_path) -> None:
    family = TopBrainFamily(get_task("topbrain-track2").meta)
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        (tmp_path / name).mkdir()
        family.write_synthetic_download(tmp_path / name, cases=1, seed=seed)
    a, b, c = ((tmp_path / name / ARCHIVE).read_bytes() for name in "abc")
    assert a == b and a != c


@pytest.mark.parametrize("task_id", TOPBRAIN_TASKS)
def test_prepared_folders_and_answers(prepared, task_id) -> None:
    p = prepared(task_id)
    modality = modality_of(task_id)
    n = p.task.meta.synthetic_cases
    assert (p.info.n_train, p.info.n_test) == (n - 2, 2)
    train, test_ids = p.train_ids, list(p.manifest.ids)
    assert not set(train) & set(test_ids) and all(i.startswith(f"topcow_{modality}_") for i in train + test_ids)
    public = p.dirs.public
    assert sorted(f.name for f in (public / "train" / "labels").iterdir()) == [f"{i}.nii.gz" for i in train]
    assert sorted(f.name for f in (public / "test" / "images").iterdir()) == [f"{i}_0000.nii.gz" for i in test_ids]
    assert not (public / "train" / "roi").exists()
    table = json.loads((public / "valid_neighbors.json").read_text())
    assert {int(k): frozenset(v) for k, v in table.items()} == valid_neighbours(modality)
    answers = p.answers()
    assert list(answers) == test_ids
    assert all(list(row) == ["image_id", "label_path"] for row in answers.values())
    assert sorted(f.name for f in (p.dirs.private / "labels").iterdir()) == [f"{i}.nii.gz" for i in sorted(test_ids)]
    for case_id, geometry in p.manifest.geometry.items():
        assert geometry == read_volume_geometry(public / "test" / "images" / f"{case_id}_0000.nii.gz")[0]
    assert check_task(p.task, p.dirs, regenerate=False) == []  # regeneration: tests/test_all_tasks.py


def side_road_ceiling(p: Prepared, modality: str) -> float:
    seen = set()
    for row in p.answers().values():
        seen |= set(np.unique(read_volume(p.dirs.private / row["label_path"]).array).tolist())
    return len(seen & set(SIDE_ROADS[modality])) / len(SIDE_ROADS[modality])


@pytest.mark.parametrize("task_id", TOPBRAIN_TASKS)
def test_sample_validates_gold_scores_best_and_a_band_centroid_model_beats_the_sample(prepared, task_id,
                                                                                       tmp_path) -> None:
    p = prepared(task_id)
    sample = p.grade(p.dirs.public / "sample_submission")
    p.task.grader.write_gold_submission(p.dirs.private, p.dirs.public, tmp_path / "gold")
    gold = p.grade(tmp_path / "gold")
    for metric in p.task.grader.metrics:
        if metric.name == "f1_side_road":
            # pooled F1: side-road labels absent from every test case score 0 even for a perfect submission
            assert gold.metrics[metric.name] == pytest.approx(side_road_ceiling(p, modality_of(task_id)))
        elif metric.best is not None:
            assert gold.metrics[metric.name] == pytest.approx(metric.best), metric.name
    fitted = segmentation_submission(p, tmp_path / "model")
    assert fitted.metrics["dice"] > sample.metrics["dice"] + 0.1
    assert fitted.metrics["hd95"] < sample.metrics["hd95"]
