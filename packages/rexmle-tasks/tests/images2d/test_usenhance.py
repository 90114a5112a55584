"""USenhance: synthetic mirror layout, preparation (incl. another top folder), grading, learnability."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from rexmle_tasks.base import safe_extract_zip
from rexmle_tasks.families.usenhance import ORGANS, find_pairs


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare("usenhance")


def test_mirror_has_the_manual_archive_with_the_real_tree(prepared, kit) -> None:
    downloads = prepared.dirs.raw / "downloads"
    assert [p.name for p in downloads.iterdir()] == ["train_dataset.zip"]
    members = kit.zip_members(downloads / "train_dataset.zip")
    assert len(members) == 20
    for member in members:
        top, organ, quality, name = member.split("/")
        assert (top, organ in ORGANS, quality in ("low_quality", "high_quality"), name.endswith(".png")) == (
            "train_datasets", True, True, True)
    for organ in ORGANS:
        folder = prepared.dirs.raw / "train_datasets" / organ
        low, high = sorted((folder / "low_quality").iterdir()), sorted((folder / "high_quality").iterdir())
        assert [p.name for p in low] == [p.name for p in high] and len(low) == 2
        for a, b in zip(low, high, strict=True):
            assert Image.open(a).mode == Image.open(b).mode == "L" and Image.open(a).size == Image.open(b).size


def test_prepared_folders(prepared) -> None:
    public, test_ids = prepared.dirs.public, prepared.test_ids
    assert (prepared.info.n_train, prepared.info.n_test) == (8, 2)
    assert all(i.split("_")[0] in ORGANS for i in test_ids)
    train_low = sorted(p.name for p in (public / "train" / "low_quality").iterdir())
    assert train_low == sorted(p.name for p in (public / "train" / "high_quality").iterdir()) and len(train_low) == 8
    assert sorted(p.stem for p in (public / "test" / "low_quality").iterdir()) == sorted(test_ids)
    assert not (public / "test" / "high_quality").exists()
    for case_id in test_ids:
        assert prepared.manifest.geometry[case_id].size == (128, 128)
    prepared.assert_no_leaks()


def test_sample_and_gold_submissions(prepared, tmp_path: Path) -> None:
    assert prepared.grade_sample().metrics["lncc"] == pytest.approx(0.0, abs=1e-9)
    prepared.assert_gold_is_best(prepared.grade_gold(tmp_path / "gold"))


def test_pairs_are_found_under_another_top_folder_and_unpaired_images_are_left_out(prepared, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    safe_extract_zip(prepared.dirs.raw / "downloads" / "train_dataset.zip", raw)
    shutil.move(raw / "train_datasets", raw / "USenhance_train")
    next((raw / "USenhance_train" / "liver" / "high_quality").iterdir()).unlink()
    pairs = find_pairs(raw)
    assert len(pairs) == 9 and all(p.low.parent.parent.name == i.split("_")[0] for i, p in pairs.items())


def test_a_linear_filter_fitted_on_training_pairs_beats_the_flat_sample(prepared, tmp_path: Path) -> None:
    """high ≈ a + b·low + c·blur(low, 1) + d·blur(low, 2.5), least squares over the training pixels."""
    public = prepared.dirs.public

    def features(path: Path) -> np.ndarray:
        low = np.asarray(Image.open(path), dtype=float)
        return np.stack([np.ones_like(low), low, ndimage.gaussian_filter(low, 1), ndimage.gaussian_filter(low, 2.5)],
                        axis=-1)

    inputs, targets = [], []
    for low in sorted((public / "train" / "low_quality").iterdir()):
        inputs.append(features(low).reshape(-1, 4))
        targets.append(np.asarray(Image.open(public / "train" / "high_quality" / low.name), dtype=float).ravel())
    weights, *_ = np.linalg.lstsq(np.concatenate(inputs), np.concatenate(targets), rcond=None)

    def predict(case_id: str, path: Path) -> None:
        enhanced = features(public / "test" / "low_quality" / f"{case_id}.png") @ weights
        Image.fromarray(np.clip(np.rint(enhanced), 0, 255).astype(np.uint8)).save(path)

    model = prepared.grade(prepared.write_files(tmp_path / "model", predict)).metrics
    sample = prepared.grade_sample().metrics
    assert model["lncc"] > 0.4 and all(model[m] > sample[m] for m in ("lncc", "ssim", "psnr"))
