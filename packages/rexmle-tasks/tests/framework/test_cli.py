"""``rexmle tasks ...`` and ``rexmle prepare`` through the real command root, including a real-data prepare
against the loopback Zenodo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rexmle_grade import grader as grader_module
from rexmle_grade.cli import main
from rexmle_grade.settings import TaskDirs
from rexmle_tasks import base, registry
from rexmle_tasks.check import check_task
from rexmle_tasks.metadata import DataSource, RemoteFile
from rexmle_tasks.pipeline import (
    PREPARED_MARKER,
    SPLIT_MANIFEST,
    generator_seed,
    prepare_task,
    prepared_info,
    task_dirs,
)


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "data"
    monkeypatch.setenv("REXMLE_DATA_DIR", str(root))  # restored after the test, even though --data-dir sets it
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps at 80 columns without a terminal
    return root


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_unknown_task_is_one_line_with_close_matches(toy, data_dir: Path, capsys) -> None:
    for command in (["prepare", "toy-tsk", "--synthetic"], ["tasks", "info", "toy-tsk"], ["tasks", "check", "toy-tsk"]):
        code, _, err = run(capsys, *command)
        assert code == 2
        assert "unknown task 'toy-tsk'" in err and "did you mean 'toy-task'" in err and "Traceback" not in err


def test_synthetic_prepare_list_info_check(toy, data_dir: Path, tmp_path: Path, capsys) -> None:
    code, out, _ = run(capsys, "--data-dir", str(tmp_path / "elsewhere"), "prepare", "toy-task", "--synthetic",
                       "--cases", "6", "--seed", "2")
    assert code == 0 and "toy-task" in out and "4 train / 2 test" in out
    info = prepared_info(TaskDirs.for_task("toy-task", root=tmp_path / "elsewhere"))
    assert info is not None and (info.synthetic, info.cases, info.seed) == (True, 6, 2)

    toy.monkeypatch.setenv("REXMLE_DATA_DIR", str(data_dir))  # --data-dir set it for the rest of this process
    code, out, _ = run(capsys, "prepare", "toy-task", "--synthetic")
    assert code == 0 and (data_dir / "toy-task" / PREPARED_MARKER).is_file()
    code, out, _ = run(capsys, "tasks", "list")
    assert code == 0
    line = next(ln for ln in out.splitlines() if "toy-task" in ln)
    assert "synthetic" in line and "8/2" in line
    code, out, _ = run(capsys, "tasks", "info", "toy-task")
    digest = prepared_info(task_dirs(toy.task)).split_digest
    for expected in ("Zenodo record 424242", "toy_data.zip", "mae (lower better)", "3 rows", "final test phase",
                     "synthetic data (10 cases, seed 0)", digest):
        assert expected in out, expected
    code, out, _ = run(capsys, "tasks", "check", "toy-task")
    assert (code, out.strip()) == (0, "toy-task: clean")


def test_check_reports_leaks_with_exit_1_and_skips_unprepared_tasks(toy, data_dir: Path, capsys) -> None:
    other = toy.add("toy-other")
    run(capsys, "prepare", "toy-task", "--synthetic")
    dirs = task_dirs(toy.task)
    test_id = json.loads((dirs.public / SPLIT_MANIFEST).read_text())["test_ids"][0]
    (dirs.public / "train" / "images" / f"{test_id}.txt").write_text("1\n")
    code, out, _ = run(capsys, "tasks", "check", "all")
    assert code == 1
    assert "toy-task: 2 problem(s)" in out and f"names test case {test_id!r}" in out
    assert f"{other.id}: not prepared, skipped" in out


def test_prepare_options_are_checked(toy, data_dir: Path, capsys) -> None:
    code, _, err = run(capsys, "prepare", "toy-task", "--cases", "4")
    assert code == 2 and "synthetic data only" in err
    code, _, err = run(capsys, "prepare", "toy-task", "--synthetic", "--cases", "1")
    assert code == 2 and "--cases" in err
    code, out, _ = run(capsys, "prepare", "toy-task", "--synthetic")
    assert code == 0 and "toy-task: prepared from" in out
    code, out, _ = run(capsys, "prepare", "toy-task", "--synthetic")
    assert code == 0 and "toy-task: already prepared" in out
    code, _, err = run(capsys, "prepare", "toy-task", "--synthetic", "--cases", "6")
    assert code == 2 and "already prepared" in err and "--force" in err
    code, out, _ = run(capsys, "prepare", "toy-task", "--synthetic", "--cases", "6", "--force")
    assert code == 0 and "4 train / 2 test" in out


def test_real_prepare_downloads_from_zenodo(toy, zenodo, data_dir: Path, tmp_path: Path, capsys) -> None:
    synthetic = tmp_path / "synthetic-downloads"
    synthetic.mkdir()
    toy.task.family().write_synthetic_download(synthetic, cases=10, seed=generator_seed(TWIN_SECRET, 0))
    zenodo.add_record("424242", {"toy_data.zip": (synthetic / "toy_data.zip").read_bytes()})
    code, _, err = run(capsys, "prepare", "toy-task")
    assert code == 0, err
    real = prepared_info(task_dirs(toy.task))
    assert real is not None and not real.synthetic
    assert zenodo.file_requests("424242", "toy_data.zip") == [None]
    assert check_task(toy.task, task_dirs(toy.task)) == []
    # the real path gives what the synthetic path gives from the same archive
    twin = prepare_task(toy.task, task_dirs(toy.task, tmp_path / "twin"), synthetic=True, secret=TWIN_SECRET)
    assert twin.split_digest == real.split_digest


def test_prepare_all_goes_on_after_a_failure(toy, zenodo, data_dir: Path, tmp_path: Path, capsys) -> None:
    synthetic = tmp_path / "synthetic-downloads"
    synthetic.mkdir()
    toy.task.family().write_synthetic_download(synthetic, cases=10, seed=0)
    zenodo.add_record("424242", {"toy_data.zip": (synthetic / "toy_data.zip").read_bytes()})
    manual = toy.add("toy-manual").folder / "task.yaml"
    manual.write_text(manual.read_text().replace(
        'kind: zenodo\n    record: "424242"',
        'kind: manual\n    instructions: "ask the toy organisers"'))
    toy.monkeypatch.setattr(registry, "_task_folders", lambda: toy.folders)  # only the two toy tasks
    registry.all_tasks.cache_clear()
    code, out, _ = run(capsys, "prepare", "all")
    assert code == 1
    assert "toy-manual: failed" in out and "ask the toy organisers" in out and "1 of 2 task(s) failed" in out
    assert str(data_dir / "toy-manual" / "raw" / "downloads" / "toy_data.zip") in out
    assert prepared_info(task_dirs(toy.task)) is not None


# ---- a real family, end to end through the real-data path -----------------------------------------------------
REAL_FAMILY_TASKS = ["topcow-track1-task1", "isles22"]
REAL_FAMILY_CASES = 4  # the fewest a mirror makes; enough for a split
TWIN_SECRET = b"test-secret-of-the-synthetic-twin"


@pytest.mark.parametrize("task_id", REAL_FAMILY_TASKS)
def test_real_family_prepares_unchanged_from_a_zenodo_download(task_id: str, zenodo, data_dir: Path,
                                                               tmp_path: Path, capsys,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    task = registry.all_tasks().get(task_id)
    if task is None:
        pytest.skip(f"task {task_id} is not defined yet")
    try:
        base.family_class(task.meta.family)
        grader_module.get_grader(task.meta.grader)
    except (KeyError, LookupError):
        pytest.skip(f"the family or grader of {task_id} is not written yet")
    synthetic = tmp_path / "synthetic-downloads"
    synthetic.mkdir()
    # the mirror prepare_task writes with a pinned secret, so that the synthetic twin below is the same data
    task.family().write_synthetic_download(synthetic, cases=REAL_FAMILY_CASES, seed=generator_seed(TWIN_SECRET, 0))
    files = {p.name: p.read_bytes() for p in sorted(synthetic.iterdir())}
    zenodo.add_record("100001", files)
    # the task's real data sources, pointed at the loopback record (its pinned checksums are the real archives')
    mirrored = type(task)(folder=task.folder, meta=task.meta.model_copy(update={"data_sources": (
        DataSource(kind="zenodo", record="100001", files=tuple(RemoteFile(name=n) for n in files)),)}))
    tasks = {**registry.all_tasks(), task_id: mirrored}
    monkeypatch.setattr(registry, "all_tasks", lambda: tasks)
    code, _, err = run(capsys, "prepare", task_id)
    assert code == 0, err
    dirs = task_dirs(mirrored)
    real = prepared_info(dirs)
    assert real is not None and not real.synthetic
    assert check_task(mirrored, dirs) == []
    twin_dirs = task_dirs(mirrored, tmp_path / "twin")
    twin = prepare_task(mirrored, twin_dirs, synthetic=True, cases=REAL_FAMILY_CASES, secret=TWIN_SECRET)
    assert twin.split_digest == real.split_digest
    assert sorted(p.relative_to(dirs.public) for p in dirs.public.rglob("*")) == \
        sorted(p.relative_to(twin_dirs.public) for p in twin_dirs.public.rglob("*"))
