"""DENTEX: synthetic mirror layout, preparation (incl. a variant of the real layout), grading, learnability."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from rexmle_grade.errors import TaskDataMissingError
from rexmle_tasks.base import safe_extract_zip
from rexmle_tasks.families.dentex import ARCHIVE, DentexFamily
from rexmle_tasks.registry import get_task

DISEASE = "training_data/quadrant-enumeration-disease"


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare("dentex")


def test_mirror_has_the_real_archive_tree(prepared, kit) -> None:
    downloads = prepared.dirs.raw / "downloads"
    assert [p.name for p in downloads.iterdir()] == [ARCHIVE]
    members = kit.zip_members(downloads / ARCHIVE)
    folders = {m.split("/")[1] for m in members}
    assert {m.split("/")[0] for m in members} == {"training_data"}
    assert folders == {"quadrant", "quadrant_enumeration", "quadrant-enumeration-disease", "unlabelled"}
    disease_images = [m for m in members if m.startswith(f"{DISEASE}/xrays/")]
    assert len(disease_images) == 10 and all(Path(m).stem.startswith("train_") for m in disease_images)
    assert f"{DISEASE}/train_quadrant_enumeration_disease.json" in members
    assert "training_data/quadrant_enumeration/train_quadrant_enumeration.json" in members
    assert "training_data/quadrant/train_quadrant.json" in members
    with zipfile.ZipFile(downloads / ARCHIVE) as zf:
        doc = json.loads(zf.read(f"{DISEASE}/train_quadrant_enumeration_disease.json"))
        quadrant_doc = json.loads(zf.read("training_data/quadrant/train_quadrant.json"))
    assert [c["id"] for c in doc["categories_1"]] == [0, 1, 2, 3]
    assert [c["id"] for c in doc["categories_2"]] == list(range(8))
    assert [c["name"] for c in doc["categories_3"]] == ["Impacted", "Caries", "Periapical Lesion", "Deep Caries"]
    assert {"categories"} <= set(quadrant_doc) and "category_id" in quadrant_doc["annotations"][0]
    for annotation in doc["annotations"]:
        assert 0 <= annotation["category_id_1"] <= 3 and 0 <= annotation["category_id_2"] <= 7
        assert 0 <= annotation["category_id_3"] <= 3 and len(annotation["bbox"]) == 4
    image = Image.open(prepared.dirs.raw / DISEASE / "xrays" / doc["images"][0]["file_name"])
    assert image.mode == "L" and image.size == (doc["images"][0]["width"], doc["images"][0]["height"])


def test_prepared_folders(prepared) -> None:
    public, test_ids = prepared.dirs.public, prepared.test_ids
    assert (prepared.info.n_train, prepared.info.n_test) == (8, 2)
    assert sorted(p.stem for p in (public / "test" / "images").iterdir()) == sorted(test_ids)
    train_doc = json.loads((public / "train" / "annotations.json").read_text())
    train_stems = sorted(Path(i["file_name"]).stem for i in train_doc["images"])
    assert train_stems == sorted(p.stem for p in (public / "train" / "images").iterdir())
    assert {a["image_id"] for a in train_doc["annotations"]} <= {i["id"] for i in train_doc["images"]}
    answers = prepared.answers()
    assert list(answers) == list(test_ids) and {r["coco_json"] for r in answers.values()} == {"test_annotations.json"}
    truth = json.loads((prepared.dirs.private / "test_annotations.json").read_text())
    assert sorted(Path(i["file_name"]).stem for i in truth["images"]) == sorted(test_ids)
    assert truth["annotations"] and {"categories_1", "categories_2", "categories_3"} <= set(truth)
    for case_id in test_ids:
        assert prepared.manifest.geometry[case_id].size == (256, 128)
    prepared.assert_no_leaks()


def test_sample_and_gold_submissions(prepared, tmp_path: Path) -> None:
    assert prepared.grade_sample().metrics["ap_mean"] == 0.0
    prepared.assert_gold_is_best(prepared.grade_gold(tmp_path / "gold"))


def test_images_listed_but_missing_are_left_out_and_the_json_is_found_by_search(prepared, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    safe_extract_zip(prepared.dirs.raw / "downloads" / ARCHIVE, raw)
    subset = raw / DISEASE
    (subset / "train_quadrant_enumeration_disease.json").rename(subset / "annotations.json")
    first = sorted((subset / "xrays").iterdir())[0]
    first.unlink()
    ids = DentexFamily(get_task("dentex").meta).case_ids(raw)
    assert len(ids) == 9 and first.stem not in ids
    (subset / "extra.json").write_text("{}")
    with pytest.raises(TaskDataMissingError, match="one annotation JSON"):
        DentexFamily(get_task("dentex").meta).case_ids(raw)


def _teeth(image: np.ndarray) -> list[tuple[list[int], np.ndarray]]:
    """Tooth components of an X-ray with a feature vector each: dark pixels in the central columns (caries),
    dark pixels beyond the root tip (periapical lesion) and the box's width/height ratio (a tilted tooth)."""
    bright = ndimage.binary_opening(ndimage.gaussian_filter(image.astype(float), 1.0) > 135)
    blobs, _ = ndimage.label(bright)
    teeth = []
    for index, (rows, cols) in enumerate(ndimage.find_objects(blobs), start=1):
        if (blobs[rows, cols] == index).sum() < 80:
            continue
        y0, y1, x0, x1 = rows.start, rows.stop, cols.start, cols.stop
        centre = (x0 + x1) // 2
        cavity = (image[y0:y1, centre - 1:centre + 2] < 110).sum()
        upper = (y0 + y1) / 2 < image.shape[0] / 2
        beyond_root = image[max(0, y0 - 8):y0, x0:x1] if upper else image[y1:y1 + 8, x0:x1]
        teeth.append(([x0, y0, x1 - x0, y1 - y0], np.array([cavity, (beyond_root < 50).sum(), 10 * (x1 - x0) /
                                                            (y1 - y0)], dtype=float)))
    return teeth


def _iou(a: list[float], b: list[float]) -> float:
    w = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    return w * h / (a[2] * a[3] + b[2] * b[3] - w * h)


def test_a_tooth_component_nearest_centroid_model_beats_the_empty_sample(prepared, tmp_path: Path, kit) -> None:
    """Teeth are bright connected components; quadrant and tooth number follow from their position; the
    diagnosis (or 'healthy', -1) is the nearest centroid of features learned from the training boxes."""
    public = prepared.dirs.public
    doc = json.loads((public / "train" / "annotations.json").read_text())
    features, labels = [], []
    for info in doc["images"]:
        image = np.asarray(Image.open(public / "train" / "images" / info["file_name"]))
        boxes = [a for a in doc["annotations"] if a["image_id"] == info["id"]]
        for box, feature in _teeth(image):
            match = max(boxes, key=lambda a: _iou(a["bbox"], box), default=None)
            labels.append(match["category_id_3"] if match and _iou(match["bbox"], box) > 0.5 else -1)
            features.append(feature)
    classes = sorted(set(labels))
    centroids = kit.class_means(np.array(features), np.array(labels), classes)

    def predict(case_id: str, path: Path) -> None:
        image = np.asarray(Image.open(public / "test" / "images" / f"{case_id}.png"))
        height, width = image.shape
        found = []
        for box, feature in _teeth(image):
            centre_x, centre_y = box[0] + box[2] / 2, box[1] + box[3] / 2
            quadrant = (0 if centre_x < width / 2 else 1) if centre_y < height / 2 else (3 if centre_x < width / 2
                                                                                          else 2)
            found.append((quadrant, abs(centre_x - width / 2), box, classes[int(kit.nearest_centroid(feature,
                                                                                                    centroids))]))
        boxes = []
        for quadrant, distance, box, diagnosis in found:
            tooth = sum(1 for q, d, _, _ in found if q == quadrant and d < distance)
            if diagnosis >= 0:
                boxes.append({"bbox": box, "category_id_1": quadrant, "category_id_2": min(tooth, 7),
                              "category_id_3": diagnosis, "score": 1.0})
        path.write_text(json.dumps(boxes))

    model = prepared.grade(prepared.write_files(tmp_path / "model", predict)).metrics
    assert model["ap50_diagnosis"] > 0.3 and model["ap_mean"] > 0.1 > prepared.grade_sample().metrics["ap_mean"]
