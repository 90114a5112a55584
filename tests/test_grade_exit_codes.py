"""`rexmle grade validate | run | files` share one exit-code convention (0 valid, 1 invalid or missing submission,
2 the command could not run, 3 grader error); a run folder given for a submission names the submission's folder; a
corrupt answer key is blamed on the task's data, naming the file, with the message rendered (never raw markup)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rexmle_grade.cli import main

TASK = "ravir"  # small 2-D label images: an answer key with one file per case


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    root = tmp_path_factory.mktemp("grade-exit-data")
    task = get_task(TASK)
    prepare_task(task, task_dirs(task, root), synthetic=True, cases=6, seed=0, force=False)
    return root


def sample(data: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "submission"
    shutil.copytree(data / TASK / "public" / "sample_submission", folder)
    return folder


def grade(data: Path, *args: str) -> int:
    return main(["--data-dir", str(data), "grade", *args])


def test_valid_is_0_invalid_and_missing_are_1(data: Path, tmp_path: Path, capsys) -> None:
    good = sample(data, tmp_path)
    assert grade(data, "validate", TASK, str(good)) == 0
    assert grade(data, "run", TASK, str(good), "-o", str(tmp_path / "r.json")) == 0
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    (bad / "submission.csv").write_text("image_id,prediction_path\nnobody,nothing.png\n")
    capsys.readouterr()
    assert grade(data, "validate", TASK, str(bad)) == 1
    assert "invalid:" in capsys.readouterr().err
    assert grade(data, "run", TASK, str(bad), "-o", str(tmp_path / "r.json")) == 1
    assert json.loads((tmp_path / "r.json").read_text())["entries"][0]["status"] == "invalid_submission"
    assert grade(data, "run", TASK, str(tmp_path / "absent"), "-o", str(tmp_path / "r.json")) == 1
    labels = data / TASK / "private"
    assert grade(data, "files", TASK, "--truth", str(labels / "labels"), "--pred", str(tmp_path / "empty")) in (1, 2)
    assert grade(data, "run", "no-such-task", str(good)) == 2


def test_a_run_folder_given_for_a_submission_names_its_submission(data: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "runs" / "g" / "ravir.sample.s0.abc"
    (run / "final" / "submission").mkdir(parents=True)
    (run / "spec.json").write_text("{}")
    (run / "journal.jsonl").write_text("")
    for command in ("run", "validate"):
        assert grade(data, command, TASK, str(run)) == 2
        err = "".join(capsys.readouterr().err.split())  # the console folds long paths at its width
        assert f"isarunfolder:thesubmissionis{run}/final/submission" in err


def test_a_corrupt_answer_key_is_blamed_on_the_task_data_and_named(data: Path, tmp_path: Path, capsys) -> None:
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    answers = sorted((copy / TASK / "private" / "labels").iterdir())
    answers[0].write_bytes(answers[0].read_bytes()[:40])  # truncated
    good = sample(copy, tmp_path)
    capsys.readouterr()
    assert grade(copy, "run", TASK, str(good), "-o", str(tmp_path / "r.json")) == 3
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert "[red]" not in captured.err + captured.out and "[/]" not in captured.err
    assert "the task's private answers are unreadable" in err and answers[0].name in "".join(err.split())
    assert "a bug in rexmle" not in err and "rexmle prepare ravir --force" in err
