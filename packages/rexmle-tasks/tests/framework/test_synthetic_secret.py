"""The synthetic secret: test labels of a synthetic task cannot be regenerated from public information and the
installed code, and ``rexmle tasks check`` says so when they can (a mirror written before secrets existed)."""

from __future__ import annotations

import csv
import stat
from pathlib import Path

import pytest

from rexmle_grade.errors import UserInputError
from rexmle_grade.evaluate import evaluate_submission
from rexmle_grade.grader import ANSWERS_CSV
from rexmle_tasks import pipeline
from rexmle_tasks.check import check_task
from rexmle_tasks.grading import resolve_grading_target
from rexmle_tasks.pipeline import (
    RAW_SECRET,
    SAMPLE_SUBMISSION,
    SECRET_BYTES,
    SYNTHETIC_SECRET,
    SYNTHETIC_SECRET_ENV,
    prepare_task,
    task_dirs,
)
from rexmle_tasks.registry import get_task
from rexmle_tasks.splits import file_checksums

#: ldct-iqa: scores in a CSV, plus an official test set a third the size; 90 cases give 30 test cases
TASK, CASES = "ldct-iqa", 90


def _labels(private: Path) -> dict[str, str]:
    with (private / ANSWERS_CSV).open(newline="") as fh:
        return {row["image_id"]: row["quality_score"] for row in csv.DictReader(fh)}


def test_the_secret_is_drawn_private_and_never_public(tmp_path: Path) -> None:
    task = get_task(TASK)
    dirs = task_dirs(task, tmp_path)
    prepare_task(task, dirs, synthetic=True, cases=CASES)
    secret = (dirs.private / SYNTHETIC_SECRET).read_bytes()
    assert len(secret) == SECRET_BYTES and (dirs.raw / RAW_SECRET).read_bytes() == secret
    for path in (dirs.private / SYNTHETIC_SECRET, dirs.raw / RAW_SECRET):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for path in dirs.public.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert secret not in data and secret.hex().encode() not in data, path
    assert check_task(task, dirs) == []  # the regeneration check included


def test_same_secret_and_seed_give_identical_data_and_another_secret_other_labels(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    task = get_task(TASK)
    made = {}
    for name, secret, seed in (("a", b"pinned", 0), ("b", None, 0), ("c", b"pinned", 1), ("d", None, 0)):
        if name == "b":
            monkeypatch.setenv(SYNTHETIC_SECRET_ENV, "pinned")  # the environment pins it as secret= does
        else:
            monkeypatch.delenv(SYNTHETIC_SECRET_ENV, raising=False)
        dirs = task_dirs(task, tmp_path / name)
        prepare_task(task, dirs, synthetic=True, cases=CASES, seed=seed, secret=secret)
        made[name] = (file_checksums(dirs.public), file_checksums(dirs.private), _labels(dirs.private))
    assert made["a"][:2] == made["b"][:2]  # byte-identical public and private folders
    for other in ("c", "d"):  # another seed, or a drawn secret: other labels for the same test ids
        assert made[other][2].keys() == made["a"][2].keys()
        assert sum(made[other][2][i] == made["a"][2][i] for i in made["a"][2]) < len(made["a"][2]) / 2


def test_a_pinned_secret_that_differs_from_the_prepared_one_needs_force(tmp_path: Path) -> None:
    task = get_task(TASK)
    dirs = task_dirs(task, tmp_path)
    prepare_task(task, dirs, synthetic=True, cases=CASES, secret=b"first")
    with pytest.raises(UserInputError, match="another secret"):
        prepare_task(task, dirs, synthetic=True, cases=CASES, secret=b"second")
    with pytest.raises(UserInputError, match="empty"):
        prepare_task(task, dirs, synthetic=True, cases=CASES, secret=b"")
    prepare_task(task, dirs, synthetic=True, cases=CASES, secret=b"second", force=True)
    assert (dirs.private / SYNTHETIC_SECRET).read_bytes() == b"second"


def _legacy_preparation(task_id: str, root: Path, *, seed: int, monkeypatch, cases: int = CASES) -> pipeline.TaskDirs:
    """A task prepared as before synthetic secrets: the generators seeded with ``--seed`` alone, no secret kept."""
    task = get_task(task_id)
    dirs = task_dirs(task, root)
    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "generator_seed", lambda secret, seed: seed)
        prepare_task(task, dirs, synthetic=True, cases=cases, seed=seed)
    (dirs.raw / RAW_SECRET).unlink()
    return dirs


def _forge(task_id: str, root: Path, *, seed: int, legacy: bool) -> Path:
    """What an agent with the installed code and the public files submits: the answers of a task it prepares itself
    (the same cases and seed), either through prepare_task or through the generators seeded the old way."""
    task = get_task(task_id)
    dirs = task_dirs(task, root)
    if legacy:
        family = task.family()
        downloads = dirs.raw / "downloads"
        downloads.mkdir(parents=True)
        family.write_synthetic_download(downloads, cases=CASES, seed=seed)
        family.extract(downloads, dirs.raw)
        split = family.fixed_split(dirs.raw)
        assert split is not None  # ldct-iqa's mirror writes the official test set
        dirs.public.mkdir()
        dirs.private.mkdir()
        pipeline.build_prepared(task, family, split, dirs.public, dirs.private, raw=dirs.raw)
    else:
        prepare_task(task, dirs, synthetic=True, cases=CASES, seed=seed)
    forged = root / "forged"
    forged.mkdir()
    (forged / "submission.csv").write_bytes((dirs.private / ANSWERS_CSV).read_bytes())
    return forged


def test_check_flags_a_mirror_made_without_a_secret_and_force_repairs_it(tmp_path: Path, monkeypatch) -> None:
    task = get_task(TASK)
    dirs = _legacy_preparation(TASK, tmp_path / "data", seed=5, monkeypatch=monkeypatch)  # 5: not a default guess
    problems = check_task(task, dirs)
    assert len(problems) == 1 and "seed 5 (the seed alone as the generator seed)" in problems[0]
    assert "reproduces the private labels of 30 of 30 test case(s) (and the inputs of 30)" in problems[0]
    assert "--force" in problems[0]
    # the forgery that check found: regenerated answers grade perfect on the legacy preparation
    target = resolve_grading_target(TASK, tmp_path / "data")
    forged = evaluate_submission(target, _forge(TASK, tmp_path / "forger", seed=5, legacy=True))
    assert forged.metrics["plcc"] == pytest.approx(1.0)
    with pytest.raises(UserInputError, match="without a secret"):  # the raw mirror is refused for a new preparation
        pipeline.acquire_raw(task, dirs, synthetic=True, cases=CASES, seed=5, force=False)
    prepare_task(task, dirs, synthetic=True, cases=CASES, seed=5, force=True)
    assert (dirs.raw / RAW_SECRET).is_file() and check_task(task, dirs) == []


@pytest.mark.parametrize("legacy", [True, False], ids=["generators-seeded-the-old-way", "prepare_task"])
def test_regenerated_labels_grade_no_better_than_chance(tmp_path: Path, legacy: bool) -> None:
    task = get_task(TASK)
    prepare_task(task, task_dirs(task, tmp_path / "data"), synthetic=True, cases=CASES)
    target = resolve_grading_target(TASK, tmp_path / "data")
    sample = evaluate_submission(target, task_dirs(task, tmp_path / "data").public / SAMPLE_SUBMISSION)
    forged = evaluate_submission(target, _forge(TASK, tmp_path / "forger", seed=0, legacy=legacy))
    assert forged.valid_submission, forged.problems
    # 30 test cases: a chance correlation beyond 0.8 has p ~ 1e-7
    for metric in ("plcc", "srocc", "krocc"):
        assert abs(forged.metrics[metric]) < 0.8 and forged.metrics[metric] < sample.metrics[metric] + 0.8, metric


@pytest.mark.parametrize("task_id", ["ldct-iqa", "isles22"])
def test_check_flags_a_small_mirror_made_without_a_secret(task_id: str, tmp_path: Path, monkeypatch) -> None:
    """A handful of test cases with coarse labels is enough: the regenerated inputs match too."""
    dirs = _legacy_preparation(task_id, tmp_path, seed=0, monkeypatch=monkeypatch, cases=8)
    problems = check_task(get_task(task_id), dirs)
    assert problems and all("the seed alone" in p and "and the inputs of" in p for p in problems), problems
