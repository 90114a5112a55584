"""``rexmle grade``: validate, grade and rank submissions; batch grading to a versioned JSON report.

Exit codes, the same for ``validate``, ``run`` and ``files``:

* 0: the submission is valid (and was graded);
* 1: the submission is invalid or missing (every problem is printed; ``run`` still writes its report);
* 2: the command could not run: a bad argument, an unknown or unprepared task, a run folder given for a submission;
* 3: a grader error: rexmle could not grade a valid-looking submission, because of a bug in rexmle or because the
  task's private answers are unreadable (the message names the file; re-prepare the task).

``batch`` exits 0 once its report is written, whatever the entries say (each entry has its status).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from rexmle_grade.cli import make_app
from rexmle_grade.errors import InvalidSubmissionError, UserInputError
from rexmle_grade.grader import get_grader, grader_ids
from rexmle_grade.text import printable

app = make_app(help="Validate, grade and rank submissions against the human leaderboards. Exit codes: 0 valid, "
                    "1 invalid or missing submission, 2 the command could not run, 3 grader error.")
console = Console()
err_console = Console(stderr=True)
EXIT_VALID, EXIT_INVALID, EXIT_GRADER_ERROR = 0, 1, 3

Workers = Annotated[int, typer.Option("--workers", "-j", min=1, help="Processes used across cases.")]


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True, disable=not Console(stderr=True).is_terminal)


@app.command("list")
def list_command() -> None:
    """List the graders and their ranked metrics."""
    table = Table(title="rexmle graders")
    for col in ("grader", "title", "ranked metrics", "submission columns"):
        table.add_column(col, overflow="fold")
    for gid in grader_ids():
        g = get_grader(gid)
        table.add_row(gid, g.title, ", ".join(m.name for m in g.ranked_metrics), ", ".join(g.schema.column_names))
    console.print(table)


@app.command("validate")
def validate_command(
    task: Annotated[str, typer.Argument(help="Task id, e.g. topcow-track1-task1.")],
    submission_dir: Annotated[Path, typer.Argument(help="Folder with submission.csv and prediction files.")],
    workers: Workers = 1,
    shallow: Annotated[bool, typer.Option(help="Only check the CSV, ids and paths (do not read files).")] = False,
) -> None:
    """Check a submission's format using public information only (never reads private labels)."""
    from rexmle_grade.validation import validate_submission

    _refuse_run_folder(submission_dir)
    grader_id, public_dir = _validation_target(task)
    grader = get_grader(grader_id)
    with _progress() as bar:
        job = bar.add_task(f"validating {escape(task)}", total=None)
        report = validate_submission(grader, submission_dir, public_dir, deep=not shallow, workers=workers,
                                     progress=lambda n, total: bar.update(job, completed=n, total=total))
    if not report.ok:
        message = InvalidSubmissionError(report.problems).message
        err_console.print(Text.assemble(("invalid:", "bold red"), " ", message), highlight=False)
        err_console.print(Text.assemble("  ", ("hint:", "cyan"), f" see the submission format in "
                                                                f"{public_dir / 'description.md'}"), highlight=False)
        raise typer.Exit(EXIT_INVALID)
    console.print(f"[green]valid[/]: {report.n_rows} rows, every test case present, every file readable")
    _print_warnings(report.warnings)


def _validation_target(task: str) -> tuple[str, Path]:
    """The grader and public folder of ``task``: inside an agent's sandbox, from the variables the harness sets
    there (no data folder, no task package data needed); elsewhere, from the prepared task."""
    from rexmle_grade.targets import resolve_target

    if os.environ.get("REXMLE_TASK_ID") == task and os.environ.get("REXMLE_GRADER_ID") \
            and os.environ.get("REXMLE_PUBLIC_DIR"):
        return os.environ["REXMLE_GRADER_ID"], Path(os.environ["REXMLE_PUBLIC_DIR"])
    target = resolve_target(task)
    return target.grader_id, target.public_dir


def _print_warnings(warnings: list[str]) -> None:
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)


@app.command("run")
def run_command(
    task: Annotated[str, typer.Argument(help="Task id.")],
    submission_dir: Annotated[Path, typer.Argument(help="Folder with submission.csv and prediction files.")],
    workers: Workers = max(1, min(4, os.cpu_count() or 1)),
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Where to write the JSON report.")] = None,
) -> None:
    """Grade and rank one submission; print a table and write a JSON report."""
    from rexmle_grade.evaluate import evaluate_submission
    from rexmle_grade.report import GradingReport, render_report
    from rexmle_grade.targets import resolve_target

    _refuse_run_folder(submission_dir)
    target = resolve_target(task)
    with _progress() as bar:
        job = bar.add_task(f"grading {escape(task)}", total=None)
        entry = evaluate_submission(target, submission_dir, workers=workers,
                                    progress=lambda n, total: bar.update(job, completed=n, total=total))
    report = GradingReport.build([entry])
    render_report(report, console)
    path = report.write(out or submission_dir.parent / f"{submission_dir.name}.grading_report.json")
    console.print(f"report: {path}", markup=False, highlight=False)
    if entry.status == "grader_error":
        print_grader_error(entry.error or "; ".join(entry.problems), task=task)
        raise typer.Exit(EXIT_GRADER_ERROR)
    if not entry.valid_submission:
        raise typer.Exit(EXIT_INVALID)


def _refuse_run_folder(path: Path) -> None:
    """A run folder of ``rexmle run`` given where its submission belongs: name the submission's folder."""
    if (path / "spec.json").is_file() and (path / "journal.jsonl").is_file():
        submission = path / "final" / "submission"
        raise UserInputError(f"{path} is a run folder: the submission is {submission}",
                             hint=f"pass {submission}")


# what the grader's message starts with when the task's private answers (not rexmle, not the submission) are at fault
_TASK_DATA = "TaskDataMissingError: "


def print_grader_error(error: str, *, task: str | None = None) -> None:
    """A grader error, blaming what is at fault: the task's private data when a file of it is unreadable (each
    named), else rexmle (with the traceback)."""
    data_problems = [line.split(_TASK_DATA, 1)[1].replace("invalid submission: ", "")  # the reader's own words
                     for line in error.splitlines() if _TASK_DATA in line]
    if data_problems:
        err_console.print(Text("grader error: the task's private answers are unreadable (the submission is not at "
                               "fault):", style="bold red"), highlight=False)
        for problem in data_problems[:10]:
            err_console.print(Text(f"  - {printable(problem, one_line=True)}"), highlight=False)
        err_console.print(Text.assemble("  ", ("hint:", "cyan"), f" re-prepare the task: rexmle prepare "
                                                                f"{task or 'TASK'} --force (with --synthetic for "
                                                                "synthetic data)"), highlight=False)
        return
    err_console.print(Text("grader error (a bug in rexmle, not in the submission):", style="bold red"),
                      highlight=False)
    err_console.print(Text(printable(error)), highlight=False)


@app.command("batch")
def batch_command(
    runs: Annotated[Path, typer.Argument(help="JSONL: one {\"task_id\", \"submission_dir\", ...labels} per line.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the JSON report.")] = Path(
        "grading_report.json"),
    workers: Workers = max(1, min(4, os.cpu_count() or 1)),
) -> None:
    """Grade many submissions (e.g. agents x tasks x seeds) into one versioned report with totals."""
    from rexmle_grade.evaluate import evaluate_submission, failed_entry
    from rexmle_grade.report import GradingReport, render_report
    from rexmle_grade.targets import resolve_target

    jobs = _read_runs(runs)
    entries = []
    with _progress() as bar:
        job = bar.add_task("grading", total=len(jobs))
        for line in jobs:
            labels = {k: str(v) for k, v in line.items() if k not in ("task_id", "submission_dir")}
            # one bad line (unknown task, unprepared task, a grader bug) becomes its entry, never the batch's end
            try:
                target = resolve_target(line["task_id"])
                entry = evaluate_submission(target, line["submission_dir"], workers=workers, labels=labels)
            except Exception as exc:
                entry = failed_entry(str(line["task_id"]), line["submission_dir"], exc, labels=labels)
            entries.append(entry)
            bar.advance(job)
    report = GradingReport.build(entries)
    render_report(report, console)
    console.print(f"report: {report.write(out)}", markup=False, highlight=False)


@app.command("files")
def files_command(
    grader_id: Annotated[str, typer.Argument(metavar="GRADER", help="Grader id (see `rexmle grade list`).")],
    truth: Annotated[Path, typer.Option("--truth", help="Ground-truth folder (or one file).")],
    pred: Annotated[Path, typer.Option("--pred", help="Prediction folder (or one file), paired by case id.")],
    extra: Annotated[list[str] | None, typer.Option(
        "--extra", help="Further answers the grader needs, NAME=DIR_OR_FILE (TopCoW task 1: roi_path=DIR).")] = None,
    workers: Workers = 1,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Where to write the JSON report.")] = None,
) -> None:
    """Score prediction files against ground-truth files directly, without a prepared task (pairs by case id)."""
    from rexmle_grade.files import score_files
    from rexmle_grade.report import GradingReport, ReportEntry, render_report

    extras = {}
    for item in extra or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise UserInputError(f"--extra {item!r} is not NAME=DIR_OR_FILE", hint="e.g. --extra roi_path=rois/")
        extras[name.strip()] = Path(value.strip())
    grader = get_grader(grader_id)
    with _progress() as bar:
        job = bar.add_task(f"scoring {escape(grader_id)}", total=None)
        result = score_files(grader, truth, pred, workers=workers,
                             progress=lambda n, total: bar.update(job, completed=n, total=total), **extras)
    entry = ReportEntry(task_id=grader.grader_id, grader_id=grader.grader_id, submission_path=str(pred),
                        submission_exists=True, valid_submission=result.valid, status=result.status,
                        problems=result.problems, warnings=result.warnings, error=result.error,
                        metrics=result.metrics, per_case=result.per_case, conventions=list(grader.conventions),
                        seconds=result.seconds, labels={"truth": str(truth)})
    report = GradingReport.build([entry])
    render_report(report, console)
    if result.valid:
        for name, value in result.metrics.items():
            console.print(f"{name} = {value:.6g}", markup=False, highlight=False)
    if out is not None:
        console.print(f"report: {report.write(out)}", markup=False, highlight=False)
    if result.status == "grader_error":
        err_console.print(Text("grader error (a bug in rexmle, or ground truth it cannot read):", style="bold red"),
                          highlight=False)
        err_console.print(Text(printable(result.error or "; ".join(result.problems))), highlight=False)
        raise typer.Exit(EXIT_GRADER_ERROR)
    if not result.valid:
        raise typer.Exit(EXIT_INVALID)


def _read_runs(path: Path) -> list[dict]:
    if not path.is_file():
        raise UserInputError(f"runs file {path} does not exist", hint="write one JSON object per line")
    jobs = []
    for lineno, text in enumerate(path.read_text().splitlines(), start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserInputError(f"{path}:{lineno} is not JSON: {exc}") from None
        if not isinstance(obj, dict) or "task_id" not in obj or "submission_dir" not in obj:
            raise UserInputError(f"{path}:{lineno} needs the keys 'task_id' and 'submission_dir'",
                                 hint='e.g. {"task_id": "isles22", "submission_dir": "runs/aide/isles22/submission"}')
        sub = Path(obj["submission_dir"])
        obj["submission_dir"] = str(sub if sub.is_absolute() else path.parent / sub)
        jobs.append(obj)
    if not jobs:
        raise UserInputError(f"runs file {path} is empty")
    return jobs
