"""SEG.A.'s realistic synthetic mirror (issue 36): deterministic for a secret and seed, the real AVT release's
layout, the confounders of real multi-centre CTA measured, and the difficulty ladder sample < heuristic (an HU band
and the largest component) < the quick trained network."""

from __future__ import annotations

import itertools
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
from scipy import ndimage

from rexmle_tasks.check import check_task
from rexmle_tasks.families.sega import INSTITUTIONS, PROTOCOLS, _aorta_cta, _realistic_aorta_cta
from rexmle_tasks.pipeline import prepare_task, task_dirs
from rexmle_tasks.registry import get_task

from .mirrors import assert_reproducible

TASK = "seg_a"
SECRET = "sega-realistic"
#: the ladder's case count: 19 training and 5 test scans, on which the quick network trains in about 5 CPU minutes
LADDER_CASES = 24
NESTED = {"Dongyang.zip": ("Dongyang", "D"), "KiTS.zip": ("KiTS", "K"), "Rider.zip": ("Rider", "R")}


def prepare(root: Path, *, cases: int, seed: int = 4, secret: str = SECRET) -> Path:
    """Prepare the realistic mirror under ``root``; returns the task's data folder."""
    task = get_task(TASK)
    dirs = task_dirs(task, root)
    prepare_task(task, dirs, synthetic=True, cases=cases, seed=seed, difficulty="realistic", secret=secret)
    return dirs.root




@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare(tmp_path_factory.mktemp("realistic"), cases=12)


def test_the_realistic_mirror_is_deterministic_for_a_secret_and_seed(tmp_path: Path) -> None:
    assert_reproducible(prepare(tmp_path / "first", cases=4), prepare(tmp_path / "again", cases=4),
                        prepare(tmp_path / "other", cases=4, secret="another secret"))


def test_the_realistic_mirror_has_the_release_layout(mirror: Path, tmp_path: Path) -> None:
    downloads = mirror / "raw" / "downloads"
    assert [p.name for p in downloads.iterdir()] == ["avt_dataset.zip"]
    with zipfile.ZipFile(downloads / "avt_dataset.zip") as outer:
        assert sorted(n for n in outer.namelist() if not n.endswith("/")) == sorted(NESTED)
        outer.extractall(tmp_path)
    for zip_name, (folder, prefix) in NESTED.items():
        with zipfile.ZipFile(tmp_path / zip_name) as inner:
            members = [n for n in inner.namelist() if not n.endswith("/")]
        assert len(members) == 2 * 4  # 12 cases over three centres, an image and a segmentation each
        for name in members:
            match = re.fullmatch(rf"{folder}/([^/]+)/({prefix}\d+)(\.seg)?\.nrrd", name)
            assert match, name
            assert (match.group(1) == match.group(2)) == (folder != "Rider"), name
    for label_path in sorted((mirror / "raw").rglob("*.seg.nrrd")):
        header = label_path.read_bytes().split(b"\n\n", 1)[0].decode()
        assert "Segment0_ID:=" in header and "Segment0_LabelValue:=1" in header  # a 3D Slicer segmentation
        label = sitk.ReadImage(str(label_path))
        image = sitk.ReadImage(str(label_path.with_name(label_path.name.replace(".seg.nrrd", ".nrrd"))))
        assert label.GetPixelID() == sitk.sitkUInt8 and image.GetPixelID() == sitk.sitkInt16
        assert label.GetSize() == image.GetSize() and label.GetSpacing() == image.GetSpacing()
        assert label.GetOrigin() == image.GetOrigin() and label.GetDirection() == image.GetDirection()
        assert set(np.unique(sitk.GetArrayFromImage(label))) == {0, 1}
    public = mirror / "public"
    train = sorted(p.name for p in (public / "train" / "images").iterdir())
    assert train and all(re.fullmatch(r"[DKR]\d+\.nrrd", name) for name in train)
    assert sorted(p.name for p in (public / "train" / "labels").iterdir()) == [
        name.replace(".nrrd", ".seg.nrrd") for name in train]
    assert len(list((public / "test" / "images").glob("*.nrrd"))) == 3
    task = get_task(TASK)
    assert check_task(task, task_dirs(task, mirror.parent), regenerate=False) == []


def draw(per_centre: int, seed: int = 5) -> list[tuple[str, np.ndarray, np.ndarray, object]]:
    rng = np.random.default_rng(seed)
    return [(centre, *_realistic_aorta_cta(rng, centre)) for centre in PROTOCOLS for _ in range(per_centre)]


def lumen_hu(image: np.ndarray, label: np.ndarray) -> float:
    """The median CT number of the lumen's core (a voxel in from the mask's edge)."""
    core = ndimage.binary_erosion(label > 0)
    return float(np.median(image[core]))


def test_contrast_timing_differs_between_centres_across_the_reported_range() -> None:
    cases = draw(5)
    lumen = {centre: [lumen_hu(image, label) for c, image, label, _ in cases if c == centre] for centre in PROTOCOLS}
    everything = [v for values in lumen.values() for v in values]
    assert min(everything) < 230 and max(everything) > 450  # the brief's 150-500+ HU
    assert max(lumen["KiTS"]) < 300 < min(lumen["Dongyang"])  # nephrographic abdomen vs bolus-tracked CTA


def test_scanners_differ_in_spacing_field_of_view_origin_and_range() -> None:
    cases = draw(5)
    slices = [grid.spacing[2] for *_, grid in cases]
    assert max(slices) - min(slices) > 0.8 and len({grid.spacing[0] for *_, grid in cases}) == len(cases)
    reach = {centre: [grid.size[2] * grid.spacing[2] for c, *_, grid in cases if c == centre] for centre in PROTOCOLS}
    assert max(reach["KiTS"]) < 130 < 165 < min(reach["Dongyang"])  # KiTS: the abdomen only, no aortic arch
    origins = [grid.origin[2] for *_, grid in cases]
    assert max(origins) - min(origins) > 300  # the table position
    # metal beyond the 12-bit CT range, as in Dongyang D3 (6484) and D17 (14542)
    assert max(int(image.max()) for _, image, _, _ in cases) > 3071


def test_bone_heart_and_kidneys_are_as_bright_as_the_lumen_and_touch_it() -> None:
    """Within the lumen's own band of CT numbers, the component that holds the lumen also holds much that is not
    the vessel tree in most scans; and thin branches fade by partial volume."""
    cases = draw(3)
    leaks, faded = [], []
    for _, image, label, _ in cases:
        vessel = label > 0
        low, high = np.percentile(image[vessel], [10, 90])
        components, _ = ndimage.label((image >= low) & (image <= high))
        holding = np.isin(components, np.setdiff1d(np.unique(components[vessel]), [0]))
        leaks.append((holding & ~vessel).sum() / vessel.sum())
        faded.append(np.mean(image[vessel] < 0.7 * lumen_hu(image, label)))
    assert np.median(leaks) > 0.3, leaks
    assert np.median(faded) > 0.1, faded


def best_band_dice(cases: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """The best median Dice any one HU band (and its largest component) reaches, fitted on these very cases."""
    from rexmle_baselines.heuristics.sega import LOWER, UPPER, dice, predict

    return max(float(np.median([dice(predict(image.astype(float), lo, hi), label > 0) for image, label in cases]))
               for lo, hi in itertools.product(LOWER, UPPER))


def test_on_realistic_cases_no_hu_band_finds_the_vessel_tree() -> None:
    rng = np.random.default_rng(2)
    easy = [_aorta_cta(rng, INSTITUTIONS[centre][3])[:2] for centre in PROTOCOLS for _ in range(2)]
    realistic = [_realistic_aorta_cta(rng, centre)[:2] for centre in PROTOCOLS for _ in range(2)]
    assert best_band_dice(easy) > 0.95
    assert best_band_dice(realistic) < 0.75


def test_the_heuristic_clearly_beats_the_sample_on_the_realistic_mirror(mirror: Path) -> None:
    """The sample (empty masks) scores 0; the fitted HU band finds most of the lumen. Margin 0.3 dsc_50pc: about
    half of what the heuristic measured on this mirror."""
    from rexmle_baselines.ladder import measure_ladder

    ladder = measure_ladder(TASK, mirror.parent, difficulty="realistic", cases=12, seed=4, secret=SECRET,
                            rungs=("sample", "heuristic"))
    sample, heuristic = ladder.rungs["sample"].value, ladder.rungs["heuristic"].value
    assert ladder.cases == 3 and sample == 0.0 and heuristic > sample + 0.3, ladder.rungs


@pytest.mark.slow
def test_the_realistic_ladder_is_ordered_with_the_trained_network(tmp_path: Path) -> None:
    """sample < heuristic < quick monai-seg (CPU, 60 epochs), each by 0.1 dsc_50pc: measured 0 / 0.575 / 0.758 for
    this secret, seed and 24 cases; 0.1 is about half of the network's lead, above the median's jitter over five
    test scans (at the default 40 epochs the lead was 0.12 here and 0.18 for another secret)."""
    from rexmle_baselines.ladder import measure_ladder

    ladder = measure_ladder(TASK, tmp_path / "data", difficulty="realistic", cases=LADDER_CASES, seed=0,
                            secret="sega-ladder")
    assert ladder.cases == 5 and ladder.ordered(0.1), ladder.rungs
