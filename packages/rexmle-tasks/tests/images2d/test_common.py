"""All 2-D tasks: metadata and task folders, deterministic mirrors, and the shared 2-D helpers."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from rexmle_tasks.base import safe_extract_zip
from rexmle_tasks.families.synth2d import ZIP_TIMESTAMP, encode_image, image_size, write_zip
from rexmle_tasks.registry import get_task
from rexmle_tasks.splits import make_split

REFERENCE = Path("/work/shared/reference/leaderboards")
TASKS = ("dentex", "puma-track1-task1", "puma-track1-task2", "puma-track2-task1", "puma-track2-task2",
         "neurips-cellseg", "ldct-iqa", "usenhance", "ravir")
ONE_TASK_PER_FAMILY = ("dentex", "puma-track2-task2", "neurips-cellseg", "ldct-iqa", "usenhance", "ravir")


@pytest.mark.parametrize("task_id", TASKS)
def test_task_folder_is_complete_and_consistent(task_id: str) -> None:
    task = get_task(task_id)
    meta = task.meta
    assert meta.dim == "2d" and meta.grader == task_id and task.grader.grader_id == task_id
    template = task.description_template
    for placeholder in ("{{metrics}}", "{{conventions}}", "{{submission_format}}", "{{n_train}}", "{{n_test}}"):
        assert placeholder in template
    assert "private" not in template.lower() and str(meta.split.seed) not in template
    if task_id == "ravir":
        assert meta.leaderboard is None and not (task.folder / "leaderboard.csv").exists()
        return
    board = task.folder / meta.leaderboard.file
    if (REFERENCE / f"{task_id}.csv").is_file():
        assert board.read_bytes() == (REFERENCE / f"{task_id}.csv").read_bytes()
    header = board.read_text().splitlines()[0].split(",")
    metric_columns = [c for c in header if c not in ("rank", "team", "mean_position") and not c.endswith("_position")]
    assert metric_columns == [m.name for m in task.grader.ranked_metrics]
    release_file = f"rex-mle/rexmle/challenges/{task_id}/leaderboard.csv"
    assert meta.leaderboard.via == f"rajpurkarlab/ReX-MLE @ 477c834, {release_file}"


def _mirror(task_id: str, folder: Path, seed: int) -> dict[str, bytes]:
    folder.mkdir(parents=True)
    get_task(task_id).family().write_synthetic_download(folder, cases=4, seed=seed)
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("task_id", ONE_TASK_PER_FAMILY)
def test_mirrors_are_byte_identical_for_a_seed_and_give_the_same_split(task_id: str, tmp_path: Path) -> None:
    first = _mirror(task_id, tmp_path / "a", seed=7)
    assert first == _mirror(task_id, tmp_path / "b", seed=7)
    other = _mirror(task_id, tmp_path / "c", seed=8)
    assert other.keys() == first.keys() and other != first
    family = get_task(task_id).family()
    meta = get_task(task_id).meta
    digests = []
    for name in ("a", "b"):
        raw = tmp_path / f"raw-{name}"
        family.extract(tmp_path / name, raw)
        split = family.fixed_split(raw) or make_split(family.case_ids(raw), seed=meta.split.seed,
                                                      test_fraction=meta.split.test_fraction)
        digests.append(split.digest)
    assert digests[0] == digests[1]


def test_write_zip_is_byte_stable_with_folder_entries_and_fixed_times(tmp_path: Path) -> None:
    members = [("Top Folder/sub/a.txt", b"alpha"), ("Top Folder/b.txt", b"beta")]
    write_zip(tmp_path / "one.zip", members)
    write_zip(tmp_path / "two.zip", members)
    assert (tmp_path / "one.zip").read_bytes() == (tmp_path / "two.zip").read_bytes()
    with zipfile.ZipFile(tmp_path / "one.zip") as zf:
        assert zf.namelist() == ["Top Folder/", "Top Folder/sub/", "Top Folder/sub/a.txt", "Top Folder/b.txt"]
        assert {info.date_time for info in zf.infolist()} == {ZIP_TIMESTAMP}
    safe_extract_zip(tmp_path / "one.zip", tmp_path / "out")
    assert (tmp_path / "out" / "Top Folder" / "sub" / "a.txt").read_bytes() == b"alpha"


@pytest.mark.parametrize("suffix", [".png", ".bmp", ".tif", ".tiff"])
def test_encoded_images_read_back_unchanged_with_their_size(suffix: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, (5, 7), dtype=np.uint8)
    rgb = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    for name, array in (("grey", grey), ("rgb", rgb)):
        path = tmp_path / f"{name}{suffix}"
        path.write_bytes(encode_image(array, suffix))
        read = tifffile.imread(path) if suffix in (".tif", ".tiff") else np.asarray(Image.open(path))
        np.testing.assert_array_equal(read, array)
        assert image_size(path) == (7, 5)
    rgba = rng.integers(0, 256, (4, 6, 4), dtype=np.uint8)
    (tmp_path / "rgba.tif").write_bytes(encode_image(rgba, ".tif"))
    np.testing.assert_array_equal(tifffile.imread(tmp_path / "rgba.tif"), rgba)
    floats = rng.normal(0, 1, (3, 3)).astype(np.float32)
    (tmp_path / "float.tif").write_bytes(encode_image(floats, ".tif"))
    np.testing.assert_array_equal(tifffile.imread(tmp_path / "float.tif"), floats)
