"""``rexmle demo``: the whole benchmark pipeline on built-in synthetic data, offline, with no API key.

For each task: write the synthetic mirror of its download, prepare it (split, public/private folders, description,
sample submission), check it for leaks, then grade and rank two reference submissions — the public sample
submission (a trivial lower bound) and a gold submission made from the private labels (the upper bound) — and
write one grading report. This is the README's first command until the agent harness lands.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from rexmle_grade.errors import RexmleError
from rexmle_grade.evaluate import evaluate_submission
from rexmle_grade.report import GradingReport, ReportEntry, render_report
from rexmle_grade.settings import data_dir

console = Console()


def run_demo(task_ids: list[str], *, root: Path, cases: int | None, seed: int, workers: int,
             force: bool) -> GradingReport:
    from rexmle_grade.targets import resolve_target
    from rexmle_tasks.check import check_task
    from rexmle_tasks.pipeline import SAMPLE_SUBMISSION, prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    entries: list[ReportEntry] = []
    for n, task_id in enumerate(task_ids, start=1):
        task = get_task(task_id)
        dirs = task_dirs(task, root)
        started = time.perf_counter()
        console.print(f"[bold]({n}/{len(task_ids)}) {escape(task_id)}[/]: preparing synthetic data")
        info = prepare_task(task, dirs, synthetic=True, cases=cases, seed=seed, force=force)
        problems = check_task(task, dirs)
        if problems:
            raise RexmleError(f"leak check failed for {task_id}: " + "; ".join(problems))
        target = resolve_target(task_id, root)
        gold = dirs.root / "gold_submission"
        task.grader.write_gold_submission(dirs.private, dirs.public, gold)
        for name, folder in (("sample", dirs.public / SAMPLE_SUBMISSION), ("gold", gold)):
            entries.append(evaluate_submission(target, folder, workers=workers,
                                               labels={"submission": name}))
        console.print(f"    {info.n_train} train / {info.n_test} test cases, "
                      f"{time.perf_counter() - started:.1f} s")
    return GradingReport.build(entries)


def demo_command(
    tasks: Annotated[str, typer.Option(help="Comma-separated task ids, or 'all'.")] = "all",
    cases: Annotated[int | None, typer.Option(help="Synthetic cases per task (default: each task's own).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic data.")] = 0,
    workers: Annotated[int, typer.Option("--workers", "-j", min=1, help="Grading processes.")] = 1,
    force: Annotated[bool, typer.Option(help="Regenerate and re-prepare even if already prepared.")] = False,
    out: Annotated[Path | None, typer.Option(help="Report path (default: <data>/demo_report.json).")] = None,
) -> None:
    """Run the whole pipeline offline on synthetic data: prepare, check, grade and rank every task."""
    from rexmle_tasks.registry import get_task, task_ids

    ids = task_ids() if tasks == "all" else [t.strip() for t in tasks.split(",") if t.strip()]
    for task_id in ids:
        get_task(task_id)  # fail fast on a typo, naming close matches
    root = data_dir()
    started = time.perf_counter()
    report = run_demo(ids, root=root, cases=cases, seed=seed, workers=workers, force=force)
    render_report(report, console)
    path = report.write(out or root / "demo_report.json")
    console.print(f"report: {path}  ({time.perf_counter() - started:.0f} s in all)", markup=False)
    broken = [e for e in report.entries if e.status != "valid"]
    if broken:
        raise RexmleError(f"{len(broken)} reference submission(s) did not grade as valid: "
                          + ", ".join(f"{e.task_id} ({e.labels.get('submission')}: {e.status})" for e in broken))
