"""Leak checks: a clean preparation passes; every planted leak is reported."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from rexmle_grade.errors import TaskDataMissingError
from rexmle_grade.settings import TaskDirs
from rexmle_tasks.check import check_private_copies, check_task
from rexmle_tasks.pipeline import SPLIT_MANIFEST, prepare_task, task_dirs
from rexmle_tasks.splits import file_checksums


@pytest.fixture
def prepared(toy, tmp_path: Path) -> TaskDirs:
    dirs = task_dirs(toy.task, tmp_path)
    prepare_task(toy.task, dirs, synthetic=True)
    return dirs


def split_ids(dirs: TaskDirs) -> tuple[list[str], list[str]]:
    doc = json.loads((dirs.public / SPLIT_MANIFEST).read_text())
    return doc["train_ids"], doc["test_ids"]


def reseal(dirs: TaskDirs) -> None:
    """Re-record the public checksums, as a preparation that itself wrote the leak would have."""
    doc = json.loads((dirs.public / SPLIT_MANIFEST).read_text())
    doc["sha256"] = file_checksums(dirs.public, exclude=[SPLIT_MANIFEST])
    (dirs.public / SPLIT_MANIFEST).write_text(json.dumps(doc))


def test_clean_preparation_passes(toy, prepared: TaskDirs) -> None:
    assert check_task(toy.task, prepared) == []


def test_unprepared_task_is_an_error_naming_prepare(toy, tmp_path: Path) -> None:
    with pytest.raises(TaskDataMissingError, match="rexmle prepare toy-task"):
        check_task(toy.task, task_dirs(toy.task, tmp_path))


def test_symlink_into_private_is_reported(toy, prepared: TaskDirs) -> None:
    (prepared.public / "train" / "answers").symlink_to(prepared.private)
    problems = check_task(toy.task, prepared)
    assert any("public/train/answers is a symbolic link into private/" in p for p in problems)


def test_copied_test_label_is_reported(toy, prepared: TaskDirs) -> None:
    _, test = split_ids(prepared)
    (prepared.public / "extra").mkdir()
    shutil.copy(prepared.private / "labels" / f"{test[0]}.txt", prepared.public / "extra" / "notes.txt")
    reseal(prepared)
    assert check_task(toy.task, prepared) == [
        f"public/extra/notes.txt has the same bytes as private/labels/{test[0]}.txt"]


def test_test_id_in_a_train_file_name_is_reported(toy, prepared: TaskDirs) -> None:
    _, test = split_ids(prepared)
    shutil.copy(prepared.public / "test" / "images" / f"{test[0]}.txt",
                prepared.public / "train" / "images" / f"{test[0]}.txt")
    reseal(prepared)
    assert check_task(toy.task, prepared) == [
        f"public/train/images/{test[0]}.txt is not a test input but names test case {test[0]!r}"]


def test_test_id_inside_a_train_index_is_reported(toy, prepared: TaskDirs) -> None:
    _, test = split_ids(prepared)
    with (prepared.public / "train" / "labels.csv").open("a", newline="") as fh:
        csv.writer(fh).writerow([test[1], "12.5"])
    reseal(prepared)
    assert check_task(toy.task, prepared) == [f"public/train/labels.csv mentions test case(s) {test[1]!r}"]


def test_ids_are_matched_as_whole_tokens(toy, prepared: TaskDirs) -> None:
    _, test = split_ids(prepared)
    (prepared.public / "train" / "images" / f"{test[0]}0.txt").write_text("1.0\n")  # case_0010 is not case_001
    (prepared.public / "train" / "notes.json").write_text(json.dumps({"x": f"prefix{test[0]}", "n": 3.0}))
    reseal(prepared)
    assert check_task(toy.task, prepared) == []


def test_copied_leaderboard_is_reported_by_content_and_by_name(toy, prepared: TaskDirs) -> None:
    shutil.copy(toy.task.folder / "leaderboard.csv", prepared.public / "board.csv")
    (prepared.public / "leaderboard_notes.txt").write_text("nothing\n")
    reseal(prepared)
    assert check_task(toy.task, prepared) == [
        "public/board.csv is a copy of the task's leaderboard.csv",
        "public/leaderboard_notes.txt is named like a grading file (leaderboard_notes.txt); it does not belong in "
        "public/",
    ]


def test_split_seed_in_the_description_is_reported(toy, prepared: TaskDirs) -> None:
    seed = toy.task.meta.split.seed
    with (prepared.public / "description.md").open("a") as fh:
        fh.write(f"\nThe split used seed {seed}.\n")
    reseal(prepared)
    assert check_task(toy.task, prepared) == [f"public/description.md contains the split seed {seed}"]


def test_files_changed_after_preparation_are_reported(toy, prepared: TaskDirs) -> None:
    train, _ = split_ids(prepared)
    (prepared.public / "train" / "images" / f"{train[0]}.txt").write_text("99\n")
    (prepared.private / "labels" / "stray.txt").write_text("1\n")
    problems = check_task(toy.task, prepared)
    assert len(problems) == 2
    assert f"public/train/images/{train[0]}.txt changed since preparation (sha256 differs from split_manifest.json)" \
        in problems
    assert "private/labels/stray.txt is not listed in split_manifest.json" in problems


def test_inconsistent_manifests_are_reported(toy, prepared: TaskDirs) -> None:
    _, test = split_ids(prepared)
    manifest = json.loads((prepared.public / "test_manifest.json").read_text())
    manifest["ids"] = list(reversed(manifest["ids"]))
    (prepared.public / "test_manifest.json").write_text(json.dumps(manifest))
    rows = (prepared.private / "answers.csv").read_text().splitlines()
    (prepared.private / "answers.csv").write_text("\n".join(r for r in rows if not r.startswith(test[0])) + "\n")
    problems = check_task(toy.task, prepared)
    assert any("test_manifest.json lists 2 ids that differ" in p for p in problems)
    assert any(f"answers.csv does not cover exactly the test ids (missing [{test[0]!r}]" in p for p in problems)


def test_identical_label_of_a_train_case_is_not_a_leak() -> None:
    private = {"labels/case_009.yml": "h1", "answers.csv": "h2"}
    public = {"train/edges/case_002.yml": "h1", "train/other.yml": "h1", "sample_submission/submission.csv": "h2"}
    assert check_private_copies(public, private, ["case_002"]) == [
        "public/train/other.yml has the same bytes as private/labels/case_009.yml"]
