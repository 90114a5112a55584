"""Submission and user text is printed as written (never as rich markup), one bad line never costs `grade batch`
its report, root options work after the sub-command, and rank_submission refuses a misspelt metric."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rexmle_grade import cli, targets
from rexmle_grade.errors import UnknownNameError, UserInputError
from rexmle_grade.grader import TestManifest, get_grader
from rexmle_grade.ranking import Leaderboard, rank_submission
from rexmle_grade.report import GradingReport, ReportEntry, render_report
from rexmle_grade.settings import DATA_DIR_ENV
from rexmle_grade.targets import GradingTarget

IDS = ("i0", "i1", "i2", "i3")
MARKUP_IDS = ("zz[/]bad", "[x, y]", "[bold]loud[/bold]")


@pytest.fixture
def value_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A prepared LDCT image-quality task (values only) that `rexmle grade` resolves under the id `ldct-iqa`."""
    public, private = tmp_path / "task" / "public", tmp_path / "task" / "private"
    public.mkdir(parents=True)
    private.mkdir(parents=True)
    TestManifest(ids=IDS).write(public)
    (private / "answers.csv").write_text("image_id,quality_score\n" + "".join(f"{i},{n}\n" for n, i in enumerate(IDS)))
    target = GradingTarget(task_id="ldct-iqa", task_version="1", grader_id="ldct-iqa", public_dir=public,
                           private_dir=private, leaderboard=None)

    def resolve(task_id: str, data_root: str | Path | None = None) -> GradingTarget:
        if task_id != "ldct-iqa":
            raise UnknownNameError("task", task_id, ["ldct-iqa"])
        return target

    monkeypatch.setattr(targets, "resolve_target", resolve)
    return tmp_path


def write_submission(folder: Path, ids: tuple[str, ...]) -> Path:
    folder.mkdir(parents=True)
    rows = "".join(f'"{i}",{n * 0.5}\n' for n, i in enumerate(ids))
    (folder / "submission.csv").write_text("image_id,quality_score\n" + rows)
    return folder


def test_validate_prints_markup_ids_verbatim(value_task: Path, capsys: pytest.CaptureFixture[str]) -> None:
    submission = write_submission(value_task / "bad", IDS + MARKUP_IDS)
    assert cli.main(["grade", "validate", "ldct-iqa", str(submission)]) == 1  # invalid: exit 1 (cli_grade)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "MarkupError" not in err
    unwrapped = " ".join(err.split())  # the console folds long lines at its width
    for text in MARKUP_IDS:
        assert text in unwrapped, err


def test_run_prints_markup_ids_verbatim(value_task: Path, capsys: pytest.CaptureFixture[str]) -> None:
    submission = write_submission(value_task / "bad", IDS + MARKUP_IDS)
    out = value_task / "report.json"
    assert cli.main(["grade", "run", "ldct-iqa", str(submission), "-o", str(out)]) == 1  # invalid: exit 1
    printed = " ".join(capsys.readouterr().out.split())
    entry = GradingReport.read(out).entries[0]
    assert entry.status == "invalid_submission"
    assert any("zz[/]bad" in p and "[x, y]" in p for p in entry.problems), entry.problems
    assert "zz[/]bad" in printed and "[x, y]" in printed


def test_one_bad_line_never_costs_the_batch_its_report(value_task: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write_submission(value_task / "good", IDS)
    markup = write_submission(value_task / "markup", IDS + MARKUP_IDS)
    runs = value_task / "runs.jsonl"
    lines = [{"task_id": "ldct-iqa", "submission_dir": str(good), "agent": "a[/]b"},
             {"task_id": "ldct-iqa", "submission_dir": str(markup)},
             {"task_id": "zz[/]bad", "submission_dir": str(good)}]
    runs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = value_task / "batch.json"
    assert cli.main(["grade", "batch", str(runs), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    entries = GradingReport.read(out).entries
    assert [e.status for e in entries] == ["valid", "invalid_submission", "grader_error"]
    assert entries[0].labels == {"agent": "a[/]b"}
    assert "unknown task 'zz[/]bad'" in entries[2].problems[0]
    assert "unknown task 'zz[/]bad'" in printed


def test_render_report_shows_warnings_and_text_as_written() -> None:
    from rich.console import Console

    entry = ReportEntry(task_id="t[/]1", grader_id="g", submission_path="s", submission_exists=True,
                        valid_submission=True, status="valid", metrics={"dice": 0.5},
                        warnings=["mask of '[x, y]': origin differs"])
    assert ReportEntry(task_id="t", grader_id="g", submission_path="s", submission_exists=False,
                       valid_submission=False, status="missing").warnings == []
    console = Console(record=True, width=200)
    render_report(GradingReport.build([entry]), console)
    text = console.export_text()
    assert "t[/]1" in text and "1 warning(s)" in text and "mask of '[x, y]': origin differs" in text


def test_data_dir_is_accepted_after_the_sub_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert cli.main(["version", "--data-dir", str(tmp_path / "after")]) == 0
    assert os.environ[DATA_DIR_ENV] == str((tmp_path / "after").resolve())
    assert cli.main(["version", f"--data-dir={tmp_path / 'equals'}"]) == 0
    assert os.environ[DATA_DIR_ENV] == str((tmp_path / "equals").resolve())
    assert cli.hoist_root_options(["grade", "run", "T", "S", "--data-dir", "D", "--", "--data-dir", "x"]) == [
        "--data-dir", "D", "grade", "run", "T", "S", "--", "--data-dir", "x"]


def test_data_dir_after_the_sub_command_reaches_the_resolver(value_task: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    submission = write_submission(value_task / "good", IDS)
    seen = []
    resolve = targets.resolve_target
    monkeypatch.setattr(targets, "resolve_target",
                        lambda task_id, root=None: seen.append(os.environ.get(DATA_DIR_ENV)) or resolve(task_id))
    data = value_task / "data"
    assert cli.main(["grade", "run", "ldct-iqa", str(submission), "--data-dir", str(data)]) == 0
    assert seen == [str(data.resolve())]


def test_rank_submission_refuses_a_misspelt_metric(tmp_path: Path) -> None:
    from rexmle_grade.grader import Direction

    path = tmp_path / "lb.csv"
    path.write_text("rank,team,mean_position,dice,hd\n1,A,1.0,0.9,2.0\n2,B,2.0,0.8,3.0\n")
    board = Leaderboard.from_csv(path, {"dice": Direction.HIGHER_BETTER, "hd": Direction.LOWER_BETTER})
    with pytest.raises(UserInputError, match="'dicee'") as caught:
        rank_submission(board, {"dicee": 0.95, "hd": 1.0})
    assert "did you mean 'dice'" in (caught.value.hint or "")
    # a grader's unranked metrics beside every board column are fine, and so is a column left out on purpose
    assert rank_submission(board, {"dice": 0.95, "hd": 1.0, "hd95": 0.5}).gold
    assert rank_submission(board, {"hd": 1.0}).nan_metrics == ["dice"]


def test_rank_result_documents_unrounded_thresholds() -> None:
    from rexmle_grade.ranking import RankResult

    assert "unrounded" in (RankResult.__doc__ or "")
    assert get_grader("ldct-iqa").grader_id == "ldct-iqa"
