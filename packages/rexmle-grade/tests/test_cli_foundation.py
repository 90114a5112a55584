"""The rexmle command root: plugins, versions, errors, data folders, and the no-torch rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from rexmle_grade import cli
from rexmle_grade.errors import InvalidSubmissionError, RexmleError, UnknownNameError
from rexmle_grade.settings import DATA_DIR_ENV, TaskDirs, data_dir


def test_help_lists_contributed_verbs(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for verb in ("version", "grade"):
        assert verb in out


def test_version_lists_installed_packages(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    out = capsys.readouterr().out
    for package in ("rexmle-grade", "rexmle-tasks", "rexmle-agents", "rexmle-baselines"):
        assert f"{package} " in out
    assert "workspace" not in out  # the development workspace is not a rexmle package


def test_unknown_command_names_close_match(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verson"]) == 2
    err = capsys.readouterr().err
    assert "verson" in err and "version" in err


def test_rexmle_error_is_one_line_without_traceback(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    sub = cli.make_app()

    @sub.command("boom")
    def boom() -> None:
        raise UnknownNameError("task", "isles23", ["isles22", "seg_a"])

    @sub.command("other")
    def other() -> None:  # a second command keeps "boom" a named sub-command
        pass

    cli.app.add_typer(sub, name="testing-errors")
    try:
        assert cli.main(["testing-errors", "boom"]) == 2
        err = capsys.readouterr().err
        assert "unknown task 'isles23'" in err and "isles22" in err
        assert "Traceback" not in err
        assert cli.main(["--verbose", "testing-errors", "boom"]) == 2
        assert "Traceback" in capsys.readouterr().err
    finally:
        cli.app.registered_groups = [g for g in cli.app.registered_groups if g.name != "testing-errors"]


def test_error_messages_carry_hint_and_problems() -> None:
    exc = InvalidSubmissionError(["a is missing", "b is extra"], hint="see description.md")
    assert "a is missing" in str(exc) and "b is extra" in str(exc) and "see description.md" in str(exc)
    assert isinstance(exc, RexmleError) and exc.exit_code == 2
    unknown = UnknownNameError("task", "topcow-track1-taks1", ["topcow-track1-task1", "isles22"])
    assert "topcow-track1-task1" in (unknown.hint or "")


def test_data_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert "rexmle" in str(data_dir())
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "env"))
    assert data_dir() == (tmp_path / "env").resolve()
    assert data_dir(tmp_path / "flag") == (tmp_path / "flag").resolve()
    dirs = TaskDirs.for_task("topcow-track1-task1", raw_group="topcow", root=tmp_path)
    assert dirs.raw == tmp_path.resolve() / "topcow-shared" / "raw"
    assert dirs.public == tmp_path.resolve() / "topcow-track1-task1" / "public"
    assert TaskDirs.for_task("isles22", root=tmp_path).raw == tmp_path.resolve() / "isles22" / "raw"


def test_data_dir_option_sets_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert cli.main(["--data-dir", str(tmp_path), "version"]) == 0
    import os

    assert os.environ[DATA_DIR_ENV] == str(tmp_path.resolve())
    monkeypatch.delenv(DATA_DIR_ENV)


def test_make_app_defaults() -> None:
    sub = cli.make_app(help="x")
    assert isinstance(sub, typer.Typer)
