"""The realistic PUMA mirror (issue 36): deterministic per secret, the real layout, the confounders measured, and
the difficulty ladder sample < heuristic < quick trained baseline on all four tasks.

The four PUMA tasks share one download (``raw_group: puma``), so one realistic mirror serves them all; the easy
mirror's bytes are pinned in packages/rexmle-tasks/tests/test_easy_mirrors_unchanged.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tifffile

from rexmle_tasks.families.puma import (
    NUCLEI_CLASSES,
    NUCLEI_FOLDER,
    ROI_FOLDER,
    TISSUE_CLASSES,
    TISSUE_FOLDER,
    Annotation,
    rasterise_tissue,
    read_annotations,
)
from rexmle_tasks.pipeline import prepare_task, task_dirs
from rexmle_tasks.registry import get_task
from rexmle_tasks.splits import tree_digest

TASKS = ("puma-track1-task1", "puma-track2-task1", "puma-track1-task2", "puma-track2-task2")
SECRET = "puma-realistic-pin"
CASES = 16  # 12 training ROIs and 4 test ROIs (the hashed split of task.yaml)




def prepare(root: Path, task_id: str = "puma-track1-task1", *, secret: str = SECRET, cases: int = 6):
    task = get_task(task_id)
    dirs = task_dirs(task, root)
    prepare_task(task, dirs, synthetic=True, cases=cases, seed=0, difficulty="realistic", secret=secret)
    return dirs


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The extracted raw folder of a 12-ROI realistic mirror (6 primary, 6 metastatic)."""
    return prepare(tmp_path_factory.mktemp("puma-realistic"), cases=12).raw


def tissue_maps(raw: Path) -> dict[str, np.ndarray]:
    return {path.name.removesuffix("_tissue.geojson"): rasterise_tissue(read_annotations(path, TISSUE_CLASSES),
                                                                          (256, 256))
            for path in sorted((raw / TISSUE_FOLDER).glob("*_tissue.geojson"))}


def nuclei_of(raw: Path) -> dict[str, list[Annotation]]:
    return {path.name.removesuffix("_nuclei.geojson"): read_annotations(path, NUCLEI_CLASSES)
            for path in sorted((raw / NUCLEI_FOLDER).glob("*_nuclei.geojson"))}


def roi(raw: Path, stem: str) -> np.ndarray:
    return tifffile.imread(next((raw / ROI_FOLDER).glob(f"{stem}.tif*")))


# ---- determinism -------------------------------------------------------------------------------------------------
def test_the_realistic_mirror_is_fixed_by_secret_and_seed(tmp_path: Path) -> None:
    first = tree_digest(prepare(tmp_path / "a", cases=4).raw)
    assert tree_digest(prepare(tmp_path / "b", cases=4).raw) == first
    assert tree_digest(prepare(tmp_path / "c", cases=4, secret="another-secret").raw) != first


# ---- the real layout ---------------------------------------------------------------------------------------------
def test_the_realistic_mirror_keeps_the_real_layout(mirror: Path, tmp_path: Path) -> None:
    downloads = mirror / "downloads"
    assert sorted(p.name for p in downloads.iterdir()) == sorted([f"{ROI_FOLDER}.zip", f"{TISSUE_FOLDER}.zip",
                                                                  f"{NUCLEI_FOLDER}.zip"])
    rois = sorted(p.name for p in (mirror / ROI_FOLDER).iterdir())
    stems = [name.split(".")[0] for name in rois]
    assert rois == [f"training_set_metastatic_roi_00{i}.tif" for i in range(1, 6)] + [
        "training_set_metastatic_roi_006.tiff"] + [f"training_set_primary_roi_00{i}.tif" for i in range(1, 7)]
    assert sorted(p.name for p in (mirror / TISSUE_FOLDER).iterdir()) == [f"{s}_tissue.geojson" for s in stems]
    assert sorted(p.name for p in (mirror / NUCLEI_FOLDER).iterdir()) == [f"{s}_nuclei.geojson" for s in stems]
    for stem in stems:
        image = roi(mirror, stem)
        assert image.shape == (256, 256, 4) and image.dtype == np.uint8 and (image[..., 3] == 255).all()
    features = [f for p in (mirror / NUCLEI_FOLDER).iterdir() for f in json.loads(p.read_text())["features"]]
    assert {f["properties"]["classification"]["name"] for f in features} == set(NUCLEI_CLASSES)
    assert {f["geometry"]["type"] for f in features} == {"Polygon", "MultiPolygon"}  # QuPath's MultiPolygon quirk
    for feature in features[:50]:
        ring = (feature["geometry"]["coordinates"] if feature["geometry"]["type"] == "Polygon"
                else feature["geometry"]["coordinates"][0])[0]
        assert ring[0] == ring[-1] and feature["properties"]["objectType"] == "annotation"
    values = set().union(*(np.unique(m).tolist() for m in tissue_maps(mirror).values()))
    assert values == set(range(len(TISSUE_CLASSES)))


def test_the_four_tasks_prepare_from_one_realistic_download(tmp_path: Path) -> None:
    for task_id in TASKS:
        dirs = prepare(tmp_path, task_id)
        assert (dirs.public / "sample_submission").is_dir()
        answers = (dirs.private / "answers.csv").read_text().splitlines()
        assert answers[0] == ("case_id,label_path" if task_id.endswith("task1") else "case_id,nuclei_path")
    assert len(list((tmp_path / "puma-shared" / "raw" / ROI_FOLDER).iterdir())) == 6


# ---- the confounders ---------------------------------------------------------------------------------------------
def test_stain_varies_between_rois_so_one_tissue_has_many_colours(mirror: Path) -> None:
    maps = tissue_maps(mirror)
    stroma_colours = np.array([roi(mirror, stem)[..., :3][m == 1].mean(axis=0) for stem, m in maps.items()])
    assert stroma_colours.std(axis=0).max() > 8  # grey levels, across ROIs
    # the spread of one class across ROIs is as large as the gap between the stroma and tumour means
    tumour_colours = np.array([roi(mirror, stem)[..., :3][m == 3].mean(axis=0) for stem, m in maps.items()
                               if (m == 3).sum() > 500])
    gap = np.linalg.norm(stroma_colours.mean(axis=0) - tumour_colours.mean(axis=0))
    assert np.linalg.norm(stroma_colours - stroma_colours.mean(axis=0), axis=1).max() > 0.5 * gap


def test_primary_and_metastatic_rois_differ_and_rare_classes_are_absent_from_some(mirror: Path) -> None:
    maps = tissue_maps(mirror)
    fraction = {kind: np.array([(m[..., None] == np.arange(6)).mean(axis=(0, 1)) for s, m in maps.items()
                                if kind in s]) for kind in ("primary", "metastatic")}
    assert fraction["primary"][:, 4].mean() > 2 * fraction["metastatic"][:, 4].mean()  # epidermis in primaries
    assert fraction["metastatic"][:, 3].mean() > fraction["primary"][:, 3].mean()  # tumour sheets in metastases
    every = np.concatenate(list(fraction.values()))
    assert (every[:, 5] == 0).any() and (every[:, 4] == 0).any()  # necrosis and epidermis: not in every ROI
    counts = {name: sum(a.name == name for rois in nuclei_of(mirror).values() for a in rois) for name in NUCLEI_CLASSES}
    assert max(counts, key=counts.get) == "nuclei_tumor"  # imbalance: tumour nuclei dominate
    assert min(counts.values()) < 0.1 * counts["nuclei_tumor"]
    per_roi = [{a.name for a in rois} for rois in nuclei_of(mirror).values()]
    assert any(len(names) < len(NUCLEI_CLASSES) for names in per_roi)


def test_tumour_nuclei_touch_and_nuclei_classes_share_one_colour(mirror: Path) -> None:
    touching, tumour = 0, 0
    darkness: dict[str, list[float]] = {}
    for stem, drawn in nuclei_of(mirror).items():
        image = roi(mirror, stem)[..., :3].astype(float)
        rings = [np.asarray(a.polygons[0][0]) for a in drawn]
        centres = np.array([r.mean(axis=0) for r in rings])
        radii = np.array([np.sqrt(np.ptp(r[:, 0]) * np.ptp(r[:, 1])) / 2 for r in rings])
        distance = np.hypot(*(centres[:, None] - centres[None]).transpose(2, 0, 1)) + np.eye(len(rings)) * 1e9
        for i, annotation in enumerate(drawn):
            if annotation.name == "nuclei_tumor":
                tumour += 1
                touching += bool((distance[i] < 1.05 * (radii[i] + radii)).any())
            x, y = np.round(centres[i]).astype(int)
            if 0 <= x < 256 and 0 <= y < 256:
                darkness.setdefault(annotation.name, []).append(float(image[y, x].mean()))
    assert touching > 0.3 * tumour
    # tumour, histiocyte and epithelium nuclei overlap in brightness: colour alone does not class them
    spread = {name: (np.percentile(v, 10), np.percentile(v, 90)) for name, v in darkness.items()}
    low, high = spread["nuclei_tumor"]
    for other in ("nuclei_histiocyte", "nuclei_epithelium"):
        assert spread[other][0] < high and spread[other][1] > low


# ---- the ladder ----------------------------------------------------------------------------------------------------
# Measured on this mirror (LADDER_SECRET, 16 ROIs, seed 0; 4 test ROIs) with quick monai-seg and the heuristics'
# overrides (tissue: 120 epochs, class-balanced patches; nuclei: 120 epochs), 3.5-5.7 CPU minutes each:
#   tissue (both tracks) dice     sample 0.000 < heuristic 0.342 < monai-seg 0.421
#   nuclei track 1 f1             sample 0.000 < heuristic 0.527 < monai-seg 0.667
#   nuclei track 2 f1             sample 0.000 < heuristic 0.232 < monai-seg 0.469
# The trained tissue rung misses the epidermis (Dice 0.003: rare, and told from stroma by texture only) and no test
# ROI holds necrosis (Dice 0 for every rung, the official rule), so 0.8 is the ceiling there.
LADDER_SECRET = "try"


@pytest.fixture(scope="module")
def ladder_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("puma-ladder")


@pytest.mark.parametrize("task_id", TASKS)
def test_the_heuristic_beats_the_sample_on_the_realistic_mirror(task_id: str, ladder_root: Path) -> None:
    from rexmle_baselines.ladder import measure_ladder

    ladder = measure_ladder(task_id, ladder_root, cases=CASES, secret=LADDER_SECRET, rungs=("sample", "heuristic"))
    # the sample is an empty map / no nuclei (0); the heuristic finds most tissue and nuclei
    assert ladder.rungs["sample"].valid and ladder.rungs["heuristic"].valid
    assert ladder.ordered(margin=0.1), ladder.rungs


# Margins (metric units): the heuristic clears the empty sample by 0.2 or more everywhere, hence 0.1 for that step
# in the fast test; the trained rung is deterministic (seed 0) and clears the heuristic by 0.079 (tissue) and 0.14
# (nuclei track 1) and 0.24 (track 2), so 0.05 leaves room for torch/CPU numerical drift without accepting a tie.
LADDER_MARGIN = 0.05


@pytest.mark.slow
@pytest.mark.parametrize("task_id", TASKS)
def test_the_ladder_is_ordered_on_the_realistic_mirror(task_id: str, ladder_root: Path) -> None:
    from rexmle_baselines.ladder import measure_ladder

    ladder = measure_ladder(task_id, ladder_root, cases=CASES, secret=LADDER_SECRET)
    assert ladder.ordered(margin=LADDER_MARGIN), ladder.rungs
