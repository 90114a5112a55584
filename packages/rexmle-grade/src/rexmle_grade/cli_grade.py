"""``rexmle grade``: validate, grade and rank submissions; batch grading to a versioned JSON report."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rexmle_grade.cli import make_app
from rexmle_grade.errors import InvalidSubmissionError, UserInputError
from rexmle_grade.grader import get_grader, grader_ids

app = make_app(help="Validate, grade and rank submissions against the human leaderboards.")
console = Console()

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
    from rexmle_grade.targets import resolve_target
    from rexmle_grade.validation import validate_submission

    target = resolve_target(task)
    grader = get_grader(target.grader_id)
    with _progress() as bar:
        job = bar.add_task(f"validating {task}", total=None)
        report = validate_submission(grader, submission_dir, target.public_dir, deep=not shallow, workers=workers,
                                     progress=lambda n, total: bar.update(job, completed=n, total=total))
    if not report.ok:
        raise InvalidSubmissionError(report.problems, hint=f"see the submission format in "
                                                          f"{target.public_dir / 'description.md'}")
    console.print(f"[green]valid[/]: {report.n_rows} rows, every test case present, every file readable")


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

    target = resolve_target(task)
    with _progress() as bar:
        job = bar.add_task(f"grading {task}", total=None)
        entry = evaluate_submission(target, submission_dir, workers=workers,
                                    progress=lambda n, total: bar.update(job, completed=n, total=total))
    report = GradingReport.build([entry])
    render_report(report, console)
    path = report.write(out or submission_dir.parent / f"{submission_dir.name}.grading_report.json")
    console.print(f"report: {path}")
    if entry.status == "grader_error":
        console.print(f"[red]grader error (a bug in rexmle, not in the submission):[/]\n{entry.error}", markup=False)
        raise typer.Exit(1)


@app.command("batch")
def batch_command(
    runs: Annotated[Path, typer.Argument(help="JSONL: one {\"task_id\", \"submission_dir\", ...labels} per line.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the JSON report.")] = Path(
        "grading_report.json"),
    workers: Workers = max(1, min(4, os.cpu_count() or 1)),
) -> None:
    """Grade many submissions (e.g. agents x tasks x seeds) into one versioned report with totals."""
    from rexmle_grade.evaluate import evaluate_submission
    from rexmle_grade.report import GradingReport, render_report
    from rexmle_grade.targets import resolve_target

    jobs = _read_runs(runs)
    entries = []
    with _progress() as bar:
        job = bar.add_task("grading", total=len(jobs))
        for line in jobs:
            target = resolve_target(line["task_id"])
            labels = {k: str(v) for k, v in line.items() if k not in ("task_id", "submission_dir")}
            entries.append(evaluate_submission(target, line["submission_dir"], workers=workers, labels=labels))
            bar.advance(job)
    report = GradingReport.build(entries)
    render_report(report, console)
    console.print(f"report: {report.write(out)}")


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
