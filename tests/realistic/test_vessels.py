"""TopCoW and TopBrain realistic synthetic mirrors (issue 36): deterministic for a secret and seed, the real
releases' layout, the confounders of real CTA/MRA measured, and the difficulty ladder sample < heuristic (< the
trained rung in the slow tests)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from rexmle_grade.graders.topcow import ALLOWED_LABELS, parse_edges
from rexmle_grade.io import read_volume
from rexmle_grade.metrics.boxes import crop_slices_zyx, parse_roi_txt
from rexmle_grade.metrics.topology import label_adjacency
from rexmle_grade.settings import TaskDirs
from rexmle_tasks.check import check_task
from rexmle_tasks.families import topbrain, topcow
from rexmle_tasks.families.vessels import (
    BONE,
    HYPOPLASTIC,
    TOPCOW_LABEL_MAP,
    HeadPose,
    make_patient,
    make_realistic_patient,
    realistic_angiogram,
    realistic_tissues,
    render_vessels,
    roi_box,
)
from rexmle_tasks.pipeline import prepare_task, task_dirs
from rexmle_tasks.registry import get_task
from rexmle_tasks.splits import tree_digest

from .mirrors import assert_reproducible

SECRET = "vessels-realistic"
TOPCOW_TOP = topcow.TOP_FOLDER
TOPBRAIN_TOP = topbrain.TOP_FOLDER
LADDER_TASKS = ("topcow-track1-task1", "topcow-track1-task2", "topcow-track1-task3", "topcow-track2-task1",
                "topcow-track2-task2", "topcow-track2-task3", "topbrain-track1", "topbrain-track2")


def prepare(root: Path, task_id: str, *, cases: int, seed: int = 0, secret: str = SECRET,
            difficulty: str = "realistic") -> TaskDirs:
    task = get_task(task_id)
    dirs = task_dirs(task, root)
    prepare_task(task, dirs, synthetic=True, cases=cases, seed=seed, difficulty=difficulty, secret=secret)
    return dirs




def members(archive: Path) -> list[str]:
    with zipfile.ZipFile(archive) as zf:
        return sorted(n for n in zf.namelist() if not n.endswith("/"))


@pytest.fixture(scope="module")
def topcow_mirror(tmp_path_factory: pytest.TempPathFactory) -> TaskDirs:
    return prepare(tmp_path_factory.mktemp("topcow"), "topcow-track1-task1", cases=5, seed=2)


@pytest.fixture(scope="module")
def topbrain_mirror(tmp_path_factory: pytest.TempPathFactory) -> TaskDirs:
    return prepare(tmp_path_factory.mktemp("topbrain"), "topbrain-track2", cases=3, seed=2)


# ---- determinism and layout ----------------------------------------------------------------------------------------
def test_the_realistic_mirrors_are_deterministic_for_a_secret_and_seed(topcow_mirror: TaskDirs,
                                                                       topbrain_mirror: TaskDirs,
                                                                       tmp_path: Path) -> None:
    for mirror, task_id, cases in ((topcow_mirror, "topcow-track1-task1", 5), (topbrain_mirror, "topbrain-track2", 3)):
        assert_reproducible(mirror, prepare(tmp_path / f"again-{task_id}", task_id, cases=cases, seed=2),
                            prepare(tmp_path / f"other-{task_id}", task_id, cases=cases, seed=2,
                                    secret="another secret"), task_id)
        assert tree_digest(mirror.raw) != tree_digest(tmp_path)  # not vacuous: the raw tree has files
        easy = prepare(tmp_path / f"easy-{task_id}", task_id, cases=cases, seed=2, difficulty="easy")
        assert tree_digest(easy.raw) != tree_digest(mirror.raw)
        # the same files by name as the easy mirror, i.e. as the real release
        assert members(next((easy.raw / "downloads").iterdir())) == members(next((mirror.raw / "downloads").iterdir()))


def test_the_topcow_mirror_has_the_release_formats(topcow_mirror: TaskDirs) -> None:
    root = topcow_mirror.raw / TOPCOW_TOP
    for image_path in sorted((root / "imagesTr").glob("*_0000.nii.gz")):
        case_id = image_path.name[: -len("_0000.nii.gz")]
        image = read_volume(image_path, what="image")
        label = read_volume(root / "cow_seg_labelsTr" / f"{case_id}.nii.gz", what="label", integer=True)
        assert image.array.dtype == np.int16 and label.array.dtype == np.uint8
        assert image.geometry == label.geometry
        assert image.geometry.direction == (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)  # LPS+, identity
        assert set(np.unique(label.array).tolist()) <= ALLOWED_LABELS
        box = parse_roi_txt((root / "roi_loc_labelsTr" / f"{case_id}.txt").read_text())
        assert all(lo >= 0 for lo in box.location)
        assert all(e < n for e, n in zip(box.end, image.geometry.size, strict=True))
        crop = label.array[crop_slices_zyx(box, image.geometry.size)]
        for communicating in (8, 9, 10):  # the communicating arteries lie wholly inside the ROI
            assert (crop == communicating).sum() == (label.array == communicating).sum()
        edges = parse_edges(yaml.safe_load((root / "antpos_edges_labelsTr" / f"{case_id}.yml").read_text()), "yml")
        present = {int(v) for v in np.unique(crop) if v}
        from rexmle_grade.graders.topcow import edge_lists

        # the task-1 mask and the task-3 edge list describe the same variant
        assert edge_lists(present, label_adjacency(crop)) == edges, case_id
        # left vessels at larger x than their right twins (the official flip check)
        if (label.array == 4).any() and (label.array == 6).any():
            assert np.median(np.nonzero(label.array == 4)[2]) < np.median(np.nonzero(label.array == 6)[2])
    task = get_task("topcow-track1-task1")
    assert check_task(task, topcow_mirror, regenerate=False) == []


def test_the_topbrain_mirror_has_the_release_formats(topbrain_mirror: TaskDirs) -> None:
    root = topbrain_mirror.raw / TOPBRAIN_TOP
    for modality in ("ct", "mr"):
        allowed = {0, *topbrain.TOPBRAIN_LABEL_NAMES[modality]}
        labels = sorted((root / topbrain.labels_folder(modality)).glob("*.nii.gz"))
        assert labels
        for path in labels:
            label = read_volume(path, what="label", integer=True)
            image = read_volume(root / topbrain.images_folder(modality) / path.name.replace(".nii.gz", "_0000.nii.gz"),
                                what="image")
            assert image.array.dtype == np.int16 and image.geometry == label.geometry
            assert set(np.unique(label.array).tolist()) <= allowed
    task = get_task("topbrain-track2")
    assert check_task(task, topbrain_mirror, regenerate=False) == []


# ---- confounders ---------------------------------------------------------------------------------------------------
def scans(n: int, modality: str, *, realistic: bool, seed: int = 17):
    """(patient as seen, frame, rendering, pose or None) of ``n`` synthetic TopCoW scans."""
    out = []
    for k in range(n):
        rng = np.random.default_rng([seed, k])
        if realistic:
            patient = make_realistic_patient(rng)
            frame = topcow.REALISTIC_FRAMES[modality].sample(rng)
            pose = HeadPose.sample(rng)
            seen = pose.seen(patient)
        else:
            patient = seen = make_patient(rng)
            frame, pose = topcow.FRAMES[modality].sample(rng), None
        out.append((seen, frame, render_vessels(seen, frame, TOPCOW_LABEL_MAP), pose))
    return out


def roi_centre_spread(cases) -> float:
    """How far the CoW ROI's centre wanders between scans, in voxels (mean over axes of the spread of the centre as
    a fraction of the image, times the image size)."""
    centres = []
    for patient, frame, _, _ in cases:
        box = roi_box(patient, frame, np.random.default_rng(0))
        centres.append((np.asarray(box.location) + np.asarray(box.size) / 2) / np.asarray(frame.grid.size))
    return float(np.mean(np.std(centres, axis=0) * np.asarray(cases[0][1].grid.size)))


def test_pose_and_field_of_view_move_the_circle_in_realistic_scans_only() -> None:
    easy, realistic = roi_centre_spread(scans(16, "ct", realistic=False)), roi_centre_spread(
        scans(16, "ct", realistic=True))
    assert easy < 1.5 and realistic > 2.0 * easy
    # thick slices: the realistic slices are up to 1.8 times the in-plane spacing
    ratios = [frame.grid.spacing[2] / frame.grid.spacing[0] for _, frame, _, _ in scans(16, "mr", realistic=True)]
    assert max(ratios) > 1.5 and min(ratios) < 1.3


def test_realistic_spacing_is_what_the_field_of_view_makes_it() -> None:
    """As in a real scanner, millimetres follow anatomy: a voxel's spacing is its step in head coordinates times one
    constant per scanner kind, the same on every axis, so resampling to one spacing gives every head one scale."""
    for modality in ("ct", "mr"):
        frames = [frame for _, frame, _, _ in scans(12, modality, realistic=True)]
        per_unit = [np.asarray(f.grid.spacing) / ((np.asarray(f.fov_hi) - np.asarray(f.fov_lo))
                                                  / (np.asarray(f.grid.size) - 1)) for f in frames]
        assert np.allclose(per_unit, per_unit[0][0], rtol=1e-4)
        inplane = [f.grid.spacing[0] for f in frames]
        assert max(inplane) > 1.1 * min(inplane)  # zoom and matrix size still vary the spacing


def test_realistic_patients_have_variants_hypoplasia_and_varying_calibre() -> None:
    patients = [make_realistic_patient(np.random.default_rng([5, k])) for k in range(60)]
    anterior = {tuple(p.variant.edge_lists()["anterior"].values()) for p in patients}
    posterior = {tuple(p.variant.edge_lists()["posterior"].values()) for p in patients}
    assert len(anterior) >= 3 and len(posterior) >= 5
    thin = [v.radius for p in patients for v in p.vessels if v.name in HYPOPLASTIC]
    assert min(thin) < 0.8 and sum(r < 0.9 for r in thin) > 0.2 * len(thin)
    basilar = [next(v.radius for v in p.vessels if v.name == "BA") for p in patients]
    assert np.ptp(basilar) > 0.3


def test_realistic_cta_has_bone_beside_the_circle_and_site_dependent_contrast() -> None:
    arteries, rims = [], 0
    for k, (patient, frame, rendering, pose) in enumerate(scans(8, "ct", realistic=True)):
        image = realistic_angiogram(rendering, frame, pose, "ct", np.random.default_rng(k)).astype(float)
        tissue, _ = realistic_tissues(frame, pose)
        box = crop_slices_zyx(roi_box(patient, frame, np.random.default_rng(0)), frame.grid.size)
        assert (tissue[box] == BONE).any()  # skull-base bone inside the CoW box
        core = rendering.artery > 0.99
        arteries.append(float(np.median(image[core])))
        # partial-volume rims of bone take the arteries' values: a threshold window cannot tell them apart
        low, high = np.percentile(image[core], [10, 90])
        rims += int(((image >= low) & (image <= high) & (rendering.artery == 0) & (rendering.vein == 0)
                     & (tissue != 3)).sum())
    assert np.ptp(arteries) > 100  # HU: contrast timing differs by site
    assert rims > 100


def test_realistic_mra_scales_differ_between_sites_and_distal_arteries_fade() -> None:
    brains, fades = [], []
    for k, (_, frame, rendering, pose) in enumerate(scans(8, "mr", realistic=True)):
        image = realistic_angiogram(rendering, frame, pose, "mr", np.random.default_rng(k)).astype(float)
        tissue, height = realistic_tissues(frame, pose)
        brains.append(float(np.median(image[tissue == 3])))
        core = rendering.artery > 0.99
        low, high = core & (height < 0.42), core & (height > 0.6)
        if low.sum() > 20 and high.sum() > 20:
            fades.append(float(np.median(image[high]) / np.median(image[low])))
    assert max(brains) > 1.6 * min(brains)
    assert fades and np.median(fades) < 0.9


# ---- the ladder: sample < heuristic (fast) -------------------------------------------------------------------------
#: task -> (patients, margin in the validation metric's units). Task 3 needs about 20 patients for a test set of 4
#: that holds more than one anterior variant (a single variant would give the majority vote a perfect score); the
#: empty sample scores Dice 0, the central half-image box about 0.25 boundary IoU, and the no-edge lists 0.
FAST_LADDER = {
    "topcow-track1-task1": (12, 0.05), "topcow-track2-task1": (12, 0.05),
    "topcow-track1-task2": (12, 0.1), "topcow-track2-task2": (12, 0.1),
    "topcow-track1-task3": (20, 0.1), "topcow-track2-task3": (20, 0.1),
    "topbrain-track1": (8, 0.05), "topbrain-track2": (8, 0.05),
}


@pytest.mark.parametrize("task_id", sorted(FAST_LADDER))
def test_the_heuristic_beats_the_sample_on_the_realistic_mirror(task_id: str, tmp_path: Path) -> None:
    from rexmle_baselines.ladder import measure_ladder

    cases, margin = FAST_LADDER[task_id]
    ladder = measure_ladder(task_id, tmp_path, cases=cases, seed=0, secret=SECRET, rungs=("sample", "heuristic"))
    assert all(r.valid for r in ladder.rungs.values())
    assert ladder.ordered(margin), {n: r.value for n, r in ladder.rungs.items()}


# ---- the ladder with the trained rung (slow) -----------------------------------------------------------------------
#: task -> (patients, margin, measured shortfall or None). The margin, 0.05 Dice / boundary IoU / balanced
#: accuracy, is about one test case's share of the score on test sets of 3-8 scans: a smaller gap is noise. A
#: shortfall marks the test xfail (not strict: a better trained rung turns it into an XPASS to notice) with what was
#: measured on 2 shared CPU cores, seed 0, with the vessel ladders' monai-seg (heuristics/vessels.py
#: ``ladder_overrides``: about 17 CPU minutes per TopCoW task, 50 per TopBrain track).
_BENCH = "tools/bench_synthetic.py, 24 patients (5 test scans), a freshly drawn secret"
SLOW_LADDER: dict[str, tuple[int, float, str | None]] = {
    # measured by the bench: sample 0.0 < heuristic 0.440 < monai-seg 0.642 Dice on CTA, 0.0 < 0.503 < 0.606 on MRA;
    # task 2 (the box from the labels' junctions and centroid): 0.204 < 0.572 < 0.633 boundary IoU on CTA; task 3
    # (the no-edge sample): 0.0 < 0.333 < 0.444 anterior balanced accuracy on CTA, 0.0 < 0.333 < 0.556 on MRA
    "topcow-track1-task1": (24, 0.05, None),
    "topcow-track2-task1": (24, 0.05, None),
    "topcow-track1-task2": (24, 0.05, None),
    "topcow-track2-task2": (24, 0.05, "holds, but thinner than the margin: sample 0.293 < heuristic 0.496 < "
                                      f"monai-seg 0.519 boundary IoU ({_BENCH})"),
    "topcow-track1-task3": (24, 0.05, None),
    "topcow-track2-task3": (24, 0.05, None),
    # measured by the bench (12 patients, a fresh secret): sample 0.0 < heuristic 0.254 < monai-seg 0.627 Dice on
    # CTA, 0.0 < 0.314 < 0.637 on MRA (about 50 CPU minutes each); this secret not yet run
    "topbrain-track1": (10, 0.05, None),
    "topbrain-track2": (10, 0.05, None),
}


def _slow_ladder_params() -> list[object]:
    params = []
    for task_id, (_, _, shortfall) in sorted(SLOW_LADDER.items()):
        marks = [pytest.mark.xfail(reason=shortfall, strict=False)] if shortfall else []
        params.append(pytest.param(task_id, marks=marks))
    return params


@pytest.mark.slow
@pytest.mark.parametrize("task_id", _slow_ladder_params())
def test_the_trained_rung_clearly_beats_the_heuristic_on_the_realistic_mirror(task_id: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from rexmle_baselines.ladder import measure_ladder

    cases, margin, _ = SLOW_LADDER[task_id]
    ladder = measure_ladder(task_id, tmp_path, cases=cases, seed=0, secret=SECRET)
    assert all(r.valid for r in ladder.rungs.values())
    assert ladder.ordered(margin), {n: r.value for n, r in ladder.rungs.items()}
