"""DENTEX's realistic synthetic mirror (issue 36): deterministic for a secret and seed, the real release's layout,
the confounders of real panoramic X-rays measured, and the difficulty ladder sample < heuristic < detector."""

from __future__ import annotations

import json
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rexmle_tasks.check import check_task
from rexmle_tasks.families.dentex import ARCHIVE, SUBSET, realistic_xray, synthetic_xray
from rexmle_tasks.pipeline import prepare_task, task_dirs
from rexmle_tasks.registry import get_task

from .mirrors import assert_reproducible

DISEASE = f"training_data/{SUBSET}"
DISEASE_JSON = f"{DISEASE}/train_quadrant_enumeration_disease.json"
#: the ladder's case count (the task's realistic_cases): 76 training and 20 test X-rays
LADDER_CASES = 96
#: secrets the slow ladder test measures, each drawing a different mirror
LADDER_SECRETS = ("dentex-ladder", "s1", "try")


def prepare(root: Path, *, cases: int, seed: int = 0, secret: str = "dentex-realistic") -> Path:
    """Prepare the realistic mirror under ``root``; returns the task's data folder."""
    task = get_task("dentex")
    dirs = task_dirs(task, root)
    prepare_task(task, dirs, synthetic=True, cases=cases, seed=seed, difficulty="realistic", secret=secret)
    return dirs.root




@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare(tmp_path_factory.mktemp("realistic"), cases=12, seed=4)


def test_the_realistic_mirror_is_deterministic_for_a_secret_and_seed(mirror: Path, tmp_path: Path) -> None:
    assert_reproducible(mirror, prepare(tmp_path / "again", cases=12, seed=4),
                        prepare(tmp_path / "other", cases=12, seed=4, secret="another secret"))


def test_the_realistic_mirror_has_the_release_layout(mirror: Path) -> None:
    archive = mirror / "raw" / "downloads" / ARCHIVE
    with zipfile.ZipFile(archive) as zf:
        members = [m for m in zf.namelist() if not m.endswith("/")]
        doc = json.loads(zf.read(DISEASE_JSON))
        quadrant_doc = json.loads(zf.read("training_data/quadrant/train_quadrant.json"))
        enumeration_doc = json.loads(zf.read("training_data/quadrant_enumeration/train_quadrant_enumeration.json"))
    assert {m.split("/")[0] for m in members} == {"training_data"}
    assert {m.split("/")[1] for m in members} == {"quadrant", "quadrant_enumeration", SUBSET, "unlabelled"}
    assert all(Path(m).name.startswith("train_") and m.endswith(".png") for m in members if "/xrays/" in m)
    assert set(doc) == {"images", "annotations", "categories_1", "categories_2", "categories_3"}
    assert [c["id"] for c in doc["categories_1"]] == [0, 1, 2, 3]
    assert [c["id"] for c in doc["categories_2"]] == list(range(8))
    assert [c["name"] for c in doc["categories_3"]] == ["Impacted", "Caries", "Periapical Lesion", "Deep Caries"]
    assert set(quadrant_doc) == {"images", "annotations", "categories"}
    assert {"category_id_1", "category_id_2"} <= set(enumeration_doc["annotations"][0])
    assert len(doc["images"]) == 12 and {a["image_id"] for a in doc["annotations"]} <= {i["id"] for i in
                                                                                         doc["images"]}
    for annotation in doc["annotations"]:
        assert set(annotation) == {"id", "image_id", "bbox", "area", "iscrowd", "category_id_1", "category_id_2",
                                   "category_id_3"}
        assert 0 <= annotation["category_id_1"] <= 3 and 0 <= annotation["category_id_2"] <= 7
        assert 0 <= annotation["category_id_3"] <= 3 and min(annotation["bbox"][2:]) > 1
    sizes = set()
    with zipfile.ZipFile(archive) as zf:
        for info in doc["images"]:
            with zf.open(f"{DISEASE}/xrays/{info['file_name']}") as fh:
                image = Image.open(fh)
                image.load()
            assert image.mode == "L" and image.size == (info["width"], info["height"])
            x, y, w, h = np.array([a["bbox"] for a in doc["annotations"] if a["image_id"] == info["id"]]).T
            assert x.min() >= 0 and y.min() >= 0 and (x + w).max() <= info["width"] and (y + h).max() <= info["height"]
            sizes.add(image.size)
            # about 2:1 like the release's 1976-3076 x 976-1536 px X-rays, at about a tenth of their size
            assert 232 <= image.size[0] <= 320 and 0.46 <= image.size[1] / image.size[0] <= 0.54
    assert len(sizes) > 6  # sizes vary from X-ray to X-ray
    task = get_task("dentex")
    assert check_task(task, task_dirs(task, mirror.parent), regenerate=False) == []
    train = json.loads((mirror / "public" / "train" / "annotations.json").read_text())
    assert len(train["images"]) + len(json.loads((mirror / "public" / "test_manifest.json").read_text())["ids"]) == 12


def draw(make: object, n: int, seed: int = 11) -> list[tuple[np.ndarray, list[dict]]]:
    rng = np.random.default_rng(seed)
    return [make(rng) for _ in range(n)]  # type: ignore[operator]


def test_realistic_x_rays_have_the_confounders_of_real_ones() -> None:
    xrays = draw(realistic_xray, 40)
    # missing teeth: most X-rays lack some, and a third molar is absent more often than an incisor
    counts = [len(teeth) for _, teeth in xrays]
    assert sum(c < 32 for c in counts) > 30 and min(counts) < 26
    present = Counter((t["quadrant"], t["tooth"]) for _, teeth in xrays for t in teeth)
    assert sum(present[(q, 7)] for q in range(4)) < 0.8 * sum(present[(q, 0)] for q in range(4))
    # class imbalance: caries commonest, periapical lesions rarest, impacted teeth are third molars (or, through
    # the label noise, a neighbour's number)
    findings = Counter(t["diagnosis"] for _, teeth in xrays for t in teeth if t["diagnosis"] is not None)
    assert findings[1] > findings[3] > findings[2] and findings[1] > 0.4 * sum(findings.values())
    assert findings[2] < 0.15 * sum(findings.values())
    impacted = [t["tooth"] for _, teeth in xrays for t in teeth if t["diagnosis"] == 0]
    assert impacted and all(tooth >= 6 for tooth in impacted)
    # exposure: the brightness of the teeth and of the background varies widely between X-rays
    medians = [np.median(image) for image, _ in xrays]
    assert np.ptp(medians) > 40
    # restorations and implants: saturated pixels in most X-rays
    assert sum((image >= 250).sum() > 5 for image, _ in xrays) > 20


def centre_spread(xrays: list[tuple[np.ndarray, list[dict]]]) -> float:
    """The mean over teeth of the spread of a tooth's box centre (as a fraction of the image width): how far the
    same tooth moves from X-ray to X-ray."""
    centres: dict[tuple[int, int], list[float]] = {}
    for image, teeth in xrays:
        for t in teeth:
            centres.setdefault((t["quadrant"], t["tooth"]), []).append((t["bbox"][0] + t["bbox"][2] / 2)
                                                                       / image.shape[1])
    return float(np.mean([np.std(v) for v in centres.values() if len(v) > 3]))


def test_a_tooth_wanders_across_realistic_x_rays_and_stands_still_in_easy_ones() -> None:
    easy, realistic = centre_spread(draw(synthetic_xray, 20)), centre_spread(draw(realistic_xray, 20))
    assert easy < 0.012 and realistic > 2.5 * easy


def rung(data: Path, name: str, submission: Path) -> float:
    from rexmle_grade.evaluate import evaluate_submission
    from rexmle_grade.targets import resolve_target

    entry = evaluate_submission(resolve_target("dentex", data), submission)
    assert entry.valid_submission, name
    return float(entry.metrics["ap_mean"])


def test_the_heuristic_clearly_beats_the_sample_on_the_realistic_mirror(tmp_path: Path) -> None:
    """The empty sample scores 0; the atlas of abnormal teeth, registered to each X-ray's dentition, finds some.
    Margin 0.004 ap_mean: below the lowest the heuristic measured (0.0068 for this secret; 0.007-0.022 over four
    secrets at this case count)."""
    from rexmle_baselines.api import run_baseline

    data = tmp_path / "data"
    prepare(data, cases=LADDER_CASES, secret="dentex-ladder")
    public = data / "dentex" / "public"
    sample = rung(data, "sample", public / "sample_submission")
    run = run_baseline("heuristic", "dentex", public_dir=public, work_dir=tmp_path / "work", config="quick",
                       device="cpu", seed=0)
    heuristic = rung(data, "heuristic", run.submission_dir)
    assert sample == 0.0 and heuristic > sample + 0.004


@pytest.mark.slow
@pytest.mark.parametrize("secret", LADDER_SECRETS)
def test_the_realistic_ladder_is_ordered_with_the_trained_detector(tmp_path: Path, secret: str) -> None:
    """sample < heuristic < detector (quick config, eight epochs at 160-320 px on the ladder's 76 training X-rays,
    on the CPU: about 10 min on a thread shared with other jobs). Measured (sample / heuristic / detector ap_mean):
    'dentex-ladder' 0 / 0.0068 / 0.0685, 's1' 0 / 0.0216 / 0.0705, 'try' 0 / 0.0095 / 0.0770; also 's2' 0 / 0.0155 /
    0.0619 and a freshly drawn secret (tools/bench_synthetic.py) 0 / 0.0117 / 0.0437. The detector must beat the
    atlas clearly: by 0.02 ap_mean and by half again its score (it measured 3.3-10 times it, 0.032-0.067 above); the
    sample scores exactly 0 and the atlas at least 0.004 above it."""
    pytest.importorskip("torchvision")
    from rexmle_baselines.ladder import measure_ladder

    ladder = measure_ladder("dentex", tmp_path / "data", difficulty="realistic", cases=LADDER_CASES, seed=0,
                            secret=secret)
    assert list(ladder.rungs) == ["sample", "heuristic", "detector"]
    assert ladder.cases == 20 and ladder.ordered(0.004), ladder.rungs
    heuristic, detector = ladder.rungs["heuristic"].score, ladder.rungs["detector"].score
    assert detector > heuristic + 0.02 and detector > 1.5 * heuristic, ladder.rungs
