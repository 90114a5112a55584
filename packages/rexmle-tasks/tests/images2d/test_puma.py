"""PUMA 2024: ground-truth conversions (hand-computed), synthetic mirror layout, the four tasks end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tifffile
from scipy import ndimage

from rexmle_grade.errors import TaskDataMissingError
from rexmle_tasks.base import PrepareContext, reset_dir, safe_extract_zip
from rexmle_tasks.families.puma import (
    NUCLEI_CLASSES,
    TISSUE_CLASSES,
    Annotation,
    PumaFamily,
    find_rois,
    nuclei_class_name,
    nuclei_document,
    polygon_mask,
    rasterise_tissue,
    read_annotations,
)
from rexmle_tasks.registry import get_task
from rexmle_tasks.splits import Split

TASKS = ("puma-track1-task1", "puma-track2-task1", "puma-track1-task2", "puma-track2-task2")


def square(x0: float, y0: float, x1: float, y1: float) -> list[tuple[float, float]]:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)]


# ---- ground-truth conversions ----------------------------------------------------------------------------------
def test_polygon_fill_uses_pixel_centres_and_honours_holes() -> None:
    # a pixel (row r, col c) is inside when (c + 0.5, r + 0.5) is: the square [1, 5] covers rows/cols 1..4
    outer = polygon_mask([square(1, 1, 5, 5)], (8, 8))
    assert outer.sum() == 16 and outer[1:5, 1:5].all()
    with_hole = polygon_mask([square(1, 1, 5, 5), square(2, 2, 4, 4)], (8, 8))
    assert with_hole.sum() == 12 and not with_hole[2:4, 2:4].any()
    # x + y < 4.6 at the centres: c + r <= 3
    triangle = polygon_mask([[(0, 0), (4.6, 0), (0, 4.6), (0, 0)]], (4, 4))
    expected = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=bool)
    np.testing.assert_array_equal(triangle, expected)


def test_tissue_rasterisation_paints_in_file_order() -> None:
    annotations = [
        Annotation("tissue_stroma", ([square(0, 0, 6, 6)],)),
        Annotation("tissue_tumor", ([square(0, 0, 2, 2)], [square(4, 4, 6, 6)])),  # a MultiPolygon
        Annotation("tissue_white_background", ([square(5, 5, 6, 6)],)),
        Annotation("tissue_necrosis", ([square(0, 3, 6, 4), square(2, 3, 3, 4)],)),  # a band with a hole
    ]
    expected = np.array([
        [3, 3, 1, 1, 1, 1],
        [3, 3, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
        [5, 5, 1, 5, 5, 5],
        [1, 1, 1, 1, 3, 3],
        [1, 1, 1, 1, 3, 0],
    ], dtype=np.uint8)
    np.testing.assert_array_equal(rasterise_tissue(annotations, (6, 6)), expected)
    assert TISSUE_CLASSES.index("tissue_necrosis") == 5


def test_nuclei_conversion_drops_closing_vertex_keeps_largest_part_and_groups_track1() -> None:
    lymphocyte_ring = [(10.0, 12.0), (18.0, 12.0), (18.0, 20.0), (10.0, 12.0)]
    annotations = [
        Annotation("nuclei_plasma_cell", ([lymphocyte_ring],)),
        Annotation("nuclei_histiocyte", ([square(0, 0, 1, 1)], [square(30, 30, 36, 36)])),
        Annotation("nuclei_tumor", ([square(50, 50, 60, 60)],)),
    ]
    track1 = nuclei_document(annotations, classes=3)
    assert track1["type"] == "Multiple polygons"
    first, second, third = track1["polygons"]
    assert first == {"name": "nuclei_lymphocyte", "path_points": [[10.0, 12.0, 0.5], [18.0, 12.0, 0.5],
                                                                   [18.0, 20.0, 0.5]]}
    assert second["name"] == "nuclei_other"
    assert [p[:2] for p in second["path_points"]] == [[30.0, 30.0], [36.0, 30.0], [36.0, 36.0], [30.0, 36.0]]
    assert third["name"] == "nuclei_tumor"
    track2 = nuclei_document(annotations, classes=10)
    assert [p["name"] for p in track2["polygons"]] == ["nuclei_plasma_cell", "nuclei_histiocyte", "nuclei_tumor"]


def test_annotations_with_unknown_class_names_are_refused(tmp_path: Path) -> None:
    doc = {"type": "FeatureCollection", "features": [
        {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [square(0, 0, 2, 2)]},
         "properties": {"classification": {"name": "stroma"}}}]}  # the release's un-prefixed name
    path = tmp_path / "x_tissue.geojson"
    path.write_text(json.dumps(doc))
    with pytest.raises(TaskDataMissingError, match="tissue_stroma"):
        read_annotations(path, TISSUE_CLASSES)


# ---- the synthetic mirror and variants of the real layout -------------------------------------------------------
@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    downloads = tmp_path_factory.mktemp("puma") / "downloads"
    downloads.mkdir()
    PumaFamily(get_task("puma-track1-task1").meta).write_synthetic_download(downloads, cases=6, seed=5)
    return downloads


def test_mirror_has_the_real_archives_names_and_formats(mirror: Path, tmp_path: Path, kit) -> None:
    assert sorted(p.name for p in mirror.iterdir()) == [
        "01_training_dataset_geojson_nuclei.zip", "01_training_dataset_geojson_tissue.zip",
        "01_training_dataset_tif_ROIs.zip"]
    rois = kit.zip_members(mirror / "01_training_dataset_tif_ROIs.zip")
    assert rois == [f"01_training_dataset_tif_ROIs/training_set_primary_roi_00{i}.tif" for i in (1, 2, 3)] + [
        "01_training_dataset_tif_ROIs/training_set_metastatic_roi_001.tif",
        "01_training_dataset_tif_ROIs/training_set_metastatic_roi_002.tif",
        "01_training_dataset_tif_ROIs/training_set_metastatic_roi_003.tiff"]
    stems = [Path(r).stem for r in rois]
    assert kit.zip_members(mirror / "01_training_dataset_geojson_tissue.zip") == [
        f"01_training_dataset_geojson_tissue/{s}_tissue.geojson" for s in stems]
    assert kit.zip_members(mirror / "01_training_dataset_geojson_nuclei.zip") == [
        f"01_training_dataset_geojson_nuclei/{s}_nuclei.geojson" for s in stems]
    for archive in mirror.iterdir():
        safe_extract_zip(archive, tmp_path)
    roi = tifffile.imread(tmp_path / "01_training_dataset_tif_ROIs" / "training_set_metastatic_roi_003.tiff")
    assert roi.shape == (256, 256, 4) and roi.dtype == np.uint8 and (roi[..., 3] == 255).all()
    tissue = [json.loads(p.read_text()) for p in (tmp_path / "01_training_dataset_geojson_tissue").iterdir()]
    nuclei = [json.loads(p.read_text()) for p in (tmp_path / "01_training_dataset_geojson_nuclei").iterdir()]
    for doc in tissue + nuclei:
        assert doc["type"] == "FeatureCollection"
    tissue_features = [f for d in tissue for f in d["features"]]
    nuclei_features = [f for d in nuclei for f in d["features"]]
    assert {f["properties"]["classification"]["name"] for f in tissue_features} <= set(TISSUE_CLASSES)
    assert {f["properties"]["classification"]["name"] for f in nuclei_features} == set(NUCLEI_CLASSES)
    assert any(len(f["geometry"]["coordinates"]) > 1 for f in tissue_features if f["geometry"]["type"] == "Polygon")
    assert {f["geometry"]["type"] for f in tissue_features} == {"Polygon", "MultiPolygon"} or any(
        f["geometry"]["type"] == "MultiPolygon" for f in nuclei_features)
    assert {f["geometry"]["type"] for f in nuclei_features} == {"Polygon", "MultiPolygon"}
    ring = nuclei_features[0]["geometry"]["coordinates"][0]
    assert ring[0] == ring[-1]  # GeoJSON rings are closed


def _context(raw: Path, root: Path, family: PumaFamily, split: Split) -> PrepareContext:
    return PrepareContext(raw=raw, public=reset_dir(root / "public"), private=reset_dir(root / "private"),
                          split=split, options=family.options)


def test_prepare_accepts_rois_without_top_folder_and_loose_geojson(mirror: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    for archive in mirror.iterdir():
        safe_extract_zip(archive, raw)
    for folder in ("01_training_dataset_tif_ROIs", "01_training_dataset_geojson_nuclei"):
        for path in (raw / folder).iterdir():
            path.rename(raw / path.name)
        (raw / folder).rmdir()
    family = PumaFamily(get_task("puma-track2-task2").meta)
    ids = family.case_ids(raw)
    assert len(ids) == 6 and "training_set_metastatic_roi_003" in ids  # the .tiff ROI is not lost
    split = Split(train=tuple(ids[1:]), test=(ids[0],))
    manifest = family.prepare(_context(raw, tmp_path, family, split))
    assert manifest.ids == (ids[0],) and manifest.geometry[ids[0]].size == (256, 256)
    assert (tmp_path / "private" / "nuclei" / f"{ids[0]}.json").is_file()


def test_two_copies_of_one_roi_are_refused(mirror: Path, tmp_path: Path) -> None:
    safe_extract_zip(mirror / "01_training_dataset_tif_ROIs.zip", tmp_path)
    folder = tmp_path / "01_training_dataset_tif_ROIs"
    shutil.copy(folder / "training_set_primary_roi_001.tif", tmp_path / "training_set_primary_roi_001.tiff")
    with pytest.raises(TaskDataMissingError, match="training_set_primary_roi_001"):
        find_rois(tmp_path)


# ---- the four tasks end to end --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tasks(prepare) -> dict:
    return {task_id: prepare(task_id) for task_id in TASKS}


def test_the_four_tasks_share_one_download_and_one_split(tasks: dict) -> None:
    raws = {p.dirs.raw for p in tasks.values()}
    assert len(raws) == 1 and next(iter(raws)).name == "raw" and next(iter(raws)).parent.name == "puma-shared"
    assert len({p.info.split_digest for p in tasks.values()}) == 1
    for prepared in tasks.values():
        assert (prepared.info.n_train, prepared.info.n_test) == (8, 2)


@pytest.mark.parametrize("task_id", TASKS)
def test_prepared_folders(tasks: dict, task_id: str) -> None:
    prepared = tasks[task_id]
    public, private = prepared.dirs.public, prepared.dirs.private
    test_ids = prepared.test_ids
    assert sorted(p.stem for p in (public / "test" / "images").iterdir()) == sorted(test_ids)
    train_images = sorted((public / "train" / "images").iterdir())
    assert len(train_images) == 8 and all(p.suffix == ".tif" for p in train_images)
    assert len(list((public / "train" / "geojson").iterdir())) == 16
    for case_id in test_ids:
        assert prepared.manifest.geometry[case_id].size == (256, 256)
    answers = prepared.answers()
    assert list(answers) == list(test_ids)
    raw = prepared.dirs.raw
    if task_id.endswith("task1"):
        assert len(list((public / "train" / "labels").iterdir())) == 8
        for case_id in test_ids:
            label = tifffile.imread(private / answers[case_id]["label_path"])
            geojson = raw / "01_training_dataset_geojson_tissue" / f"{case_id}_tissue.geojson"
            np.testing.assert_array_equal(label, rasterise_tissue(read_annotations(geojson, TISSUE_CLASSES),
                                                                  (256, 256)))
            assert label.dtype == np.uint8 and set(np.unique(label)) >= {1, 2, 3, 4, 5}
    else:
        assert len(list((public / "train" / "nuclei").iterdir())) == 8
        names = {"nuclei_tumor", "nuclei_lymphocyte", "nuclei_other"} if "track1" in task_id else set(NUCLEI_CLASSES)
        for case_id in test_ids:
            doc = json.loads((private / answers[case_id]["nuclei_path"]).read_text())
            assert {p["name"] for p in doc["polygons"]} == names
    prepared.assert_no_leaks()


@pytest.mark.parametrize("task_id", TASKS)
def test_sample_and_gold_submissions(tasks: dict, task_id: str, tmp_path: Path) -> None:
    prepared = tasks[task_id]
    assert prepared.grade_sample().metrics[prepared.task.grader.ranked_metrics[0].name] == 0.0
    gold = prepared.grade_gold(tmp_path / "gold")
    prepared.assert_gold_is_best(gold)
    # every class occurs in every synthetic ROI, so even the nuclei F1 (no general best value) reaches 1
    assert gold.metrics["dice" if task_id.endswith("task1") else "f1"] == pytest.approx(1.0)


def _smoothed_rgb(path: Path) -> np.ndarray:
    return ndimage.uniform_filter(tifffile.imread(path)[..., :3].astype(float), size=(7, 7, 1))


@pytest.mark.parametrize("task_id", ["puma-track1-task1"])
def test_a_colour_nearest_centroid_beats_the_sample_tissue_map(tasks: dict, task_id: str, tmp_path: Path,
                                                               kit) -> None:
    prepared = tasks[task_id]
    train = prepared.dirs.public / "train"
    pixels, labels = [], []
    for image in sorted((train / "images").iterdir()):
        pixels.append(_smoothed_rgb(image).reshape(-1, 3))
        labels.append(tifffile.imread(train / "labels" / image.name).ravel())
    centroids = kit.class_means(np.concatenate(pixels), np.concatenate(labels), range(6))

    def predict(case_id: str, path: Path) -> None:
        rgb = _smoothed_rgb(prepared.dirs.public / "test" / "images" / f"{case_id}.tif")
        tifffile.imwrite(path, kit.nearest_centroid(rgb, centroids).astype(np.uint8))

    model = prepared.grade(prepared.write_files(tmp_path / "model", predict)).metrics["dice"]
    assert model > 0.7 > prepared.grade_sample().metrics["dice"]


@pytest.mark.parametrize("task_id", ["puma-track1-task2", "puma-track2-task2"])
def test_a_colour_nearest_centroid_detector_beats_the_empty_sample(tasks: dict, task_id: str, tmp_path: Path,
                                                                   kit) -> None:
    """Pixels are split into tissue and nucleus pixels by the nearest colour centroid (tissue classes and nucleus
    classes, learned from the training annotations); each connected group of nucleus pixels is one nucleus,
    classified by the nearest centroid of (mean colour, area) learned from the training nuclei."""
    prepared = tasks[task_id]
    train = prepared.dirs.public / "train"
    pixel_features, pixel_labels, blob_features, blob_labels = [], [], [], []
    for image in sorted((train / "images").iterdir()):
        rgb = tifffile.imread(image)[..., :3].astype(float)
        tissue = rasterise_tissue(read_annotations(train / "geojson" / f"{image.stem}_tissue.geojson",
                                                   TISSUE_CLASSES), rgb.shape[:2]).astype(int)
        label = tissue - len(TISSUE_CLASSES)  # tissue classes -6..-1, nucleus classes 0..9
        for annotation in read_annotations(train / "geojson" / f"{image.stem}_nuclei.geojson", NUCLEI_CLASSES):
            inside = polygon_mask(annotation.polygons[0], rgb.shape[:2])
            label[inside] = NUCLEI_CLASSES.index(annotation.name)
            blob_features.append([*rgb[inside].mean(axis=0), inside.sum()])
            blob_labels.append(NUCLEI_CLASSES.index(annotation.name))
        pixel_features.append(rgb.reshape(-1, 3))
        pixel_labels.append(label.ravel())
    codes = np.arange(-len(TISSUE_CLASSES), len(NUCLEI_CLASSES))
    features, labels = np.concatenate(pixel_features), np.concatenate(pixel_labels)
    present = [c for c in codes if (labels == c).any()]
    pixel_centroids = kit.class_means(features, labels, present)
    blob_centroids = kit.class_means(np.array(blob_features), np.array(blob_labels), range(len(NUCLEI_CLASSES)))
    classes = 3 if "track1" in task_id else 10

    def predict(case_id: str, path: Path) -> None:
        rgb = tifffile.imread(prepared.dirs.public / "test" / "images" / f"{case_id}.tif")[..., :3].astype(float)
        nucleus = np.asarray(present)[kit.nearest_centroid(rgb, pixel_centroids)] >= 0
        blobs, _ = ndimage.label(ndimage.binary_opening(nucleus))
        polygons = []
        for index, found in enumerate(ndimage.find_objects(blobs), start=1):
            member = blobs[found] == index
            if member.sum() < 6:
                continue
            feature = np.array([*rgb[found][member].mean(axis=0), member.sum()])
            name = NUCLEI_CLASSES[int(kit.nearest_centroid(feature, blob_centroids))]
            row, col = ndimage.center_of_mass(member)
            x, y = col + found[1].start + 0.5, row + found[0].start + 0.5
            polygons.append({"name": nuclei_class_name(name, classes),
                             "path_points": [[x - 2, y - 2], [x + 2, y - 2], [x + 2, y + 2], [x - 2, y + 2]]})
        path.write_text(json.dumps({"type": "Multiple polygons", "polygons": polygons}))

    model = prepared.grade(prepared.write_files(tmp_path / "model", predict)).metrics["f1"]
    assert model > 0.6 > prepared.grade_sample().metrics["f1"]
