"""``rexmle demo``: the benchmark's main job on built-in synthetic data — offline, no API key, no GPU.

For a 3-D segmentation task and a 2-D task of another type (by default ISLES'22 and LDCT-IQA): write the synthetic
mirror of the download (``realistic`` by default: the real data's confounders, where a trained model and a
heuristic stand apart), prepare the task, check it for leaks, then run three agents through the harness, each in
the sandbox — ``baseline`` (an expert pipeline of rexmle-baselines, quick configuration), ``heuristic`` (the
``baseline`` agent running the task's simple heuristic: a threshold or an image statistic) and ``sample`` (the
sample submission, the floor) — grade every run outside the sandbox, rank it against the human leaderboard and
print one report. ``--graders-only`` runs the older grading check instead: every task's sample and gold
submissions graded and ranked, without agents.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from rexmle_grade.errors import RexmleError
from rexmle_grade.text import printable

if TYPE_CHECKING:  # imported when a demo runs, not when any `rexmle` command starts
    from rexmle_agents.harness.runner import RunOutcome
    from rexmle_agents.results.live import LiveRuns

console = Console()
DEFAULT_TASKS = "isles22,ldct-iqa"  # a 3-D segmentation task and a 2-D regression task
DEFAULT_AGENTS = "baseline,heuristic,sample"
# shorthands of --agents: the ``baseline`` agent running a named pipeline
AGENT_SHORTHANDS = {"heuristic": {"baseline": "heuristic"}}


def demo_command(
    tasks: Annotated[str, typer.Option(help="Comma-separated task ids ('all' with --graders-only).")] = DEFAULT_TASKS,
    agents: Annotated[str, typer.Option(help="Agents to run on every task.")] = DEFAULT_AGENTS,
    config: Annotated[str, typer.Option(help="Baseline configuration: quick (CPU, minutes) or full (GPU).")] = "quick",
    cases: Annotated[int | None, typer.Option(help="Synthetic cases per task (default: each task's own).")] = None,
    difficulty: Annotated[str, typer.Option(help="Synthetic mirror: realistic (the real data's confounders) or "
                                                 "easy (clean contrasts, faster).")] = "realistic",
    seed: Annotated[int, typer.Option(help="Seed of the synthetic data and of the runs.")] = 0,
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Runs at once.")] = 1,
    sandbox: Annotated[str, typer.Option(help="auto | bwrap | apptainer | docker | none.")] = "auto",
    allow_unsandboxed: Annotated[bool, typer.Option(help="Needed for --sandbox none.")] = False,
    time_limit: Annotated[str, typer.Option(help="Wall-clock limit per run.")] = "30m",
    runs_dir: Annotated[Path | None, typer.Option(help="Run folders (default: <data>/demo-runs).")] = None,
    force: Annotated[bool, typer.Option(help="Re-prepare the data and start the runs afresh.")] = False,
    graders_only: Annotated[bool, typer.Option(help="Grade sample and gold submissions only (no agents).")] = False,
    out: Annotated[Path | None, typer.Option(help="Report path (default: <runs>/demo/report.json).")] = None,
) -> None:
    """The main job: prepare synthetic data, run a baseline and the sample agent through the harness, grade, rank."""
    from rexmle_grade.report import render_report
    from rexmle_grade.settings import data_dir
    from rexmle_tasks.registry import get_task, task_ids

    root = data_dir()
    started = time.perf_counter()
    ids = task_ids() if tasks == "all" else [t.strip() for t in tasks.split(",") if t.strip()]
    for task_id in ids:
        get_task(task_id)  # a typo fails now, naming close matches
    if graders_only:
        from rexmle_tasks.demo import run_demo

        report = run_demo(ids, root=root, cases=cases, seed=seed, workers=workers, force=force)
        render_report(report, console)
        path = report.write(out or root / "demo_report.json")
        console.print(f"report: {escape(str(path))}  ({time.perf_counter() - started:.0f} s in all)")
        return
    outcomes = run_main_job(ids, [a.strip() for a in agents.split(",") if a.strip()], root=root,
                            runs_dir=runs_dir or root / "demo-runs", config=config, cases=cases, seed=seed,
                            difficulty=difficulty,
                            workers=workers, sandbox=sandbox, allow_unsandboxed=allow_unsandboxed,
                            time_limit=time_limit, force=force)
    from rexmle_agents.cli import write_group_report

    group_dir = (runs_dir or root / "demo-runs") / "demo"
    write_group_report(group_dir, out or group_dir / "report.json")
    console.print(f"main job: {len(outcomes)} run(s) on {len(ids)} task(s) in {time.perf_counter() - started:.0f} s")
    console.print(f"the runs: rexmle runs status --runs-dir {escape(str(group_dir.parent))} · one run: rexmle runs "
                  f"show RUN_DIR · pages: rexmle view {escape(str(group_dir))}")
    bad = [o for o in outcomes if o.state != "finished" or o.grade is None or o.grade.status != "valid"]
    if bad:
        raise RexmleError(f"{len(bad)} run(s) did not end with a valid graded submission: "
                          + "; ".join(f"{o.run_id} ({o.state}: {o.reason})" for o in bad),
                          hint="see each run's journal.jsonl and logs/ under the runs folder")


def run_main_job(task_ids: list[str], agents: list[str], *, root: Path, runs_dir: Path, config: str,
                 cases: int | None, seed: int, workers: int, sandbox: str, allow_unsandboxed: bool,
                 time_limit: str, force: bool, difficulty: str = "realistic") -> list[RunOutcome]:
    import shutil

    from rexmle_agents.executors import run_specs
    from rexmle_agents.harness.runner import build_spec
    from rexmle_agents.harness.spec import Limits, parse_duration
    from rexmle_agents.results.live import LiveRuns
    from rexmle_tasks.check import check_task
    from rexmle_tasks.pipeline import prepare_task, prepared_info, task_dirs
    from rexmle_tasks.registry import get_task

    for n, task_id in enumerate(task_ids, start=1):
        task = get_task(task_id)
        dirs = task_dirs(task, root)
        step_started = time.perf_counter()
        info = prepared_info(dirs)
        if force or info is None or not info.synthetic or (info.difficulty or "easy") != difficulty:
            console.print(f"[bold]({n}/{len(task_ids)}) {escape(task_id)}[/]: preparing synthetic data ({difficulty})")
            info = prepare_task(task, dirs, synthetic=True, cases=cases, seed=seed, force=True,
                                difficulty=difficulty)
        problems = check_task(task, dirs)
        if problems:
            raise RexmleError(f"leak check failed for {task_id}: " + "; ".join(problems))
        console.print(f"    {escape(task_id)}: {info.n_train} train / {info.n_test} test cases, leak check passed "
                      f"({time.perf_counter() - step_started:.1f} s)")
    if force and (runs_dir / "demo").exists():
        shutil.rmtree(runs_dir / "demo")
    limits = Limits(time_limit_s=parse_duration(time_limit))
    specs = []
    for task_id in task_ids:
        for agent in agents:
            shorthand = AGENT_SHORTHANDS.get(agent)
            agent_config = ({"config": config, **(shorthand or {})} if agent == "baseline" or shorthand else {})
            specs.append(build_spec(task_id, agent="baseline" if shorthand else agent, agent_config=agent_config,
                                    seed=seed, limits=limits,
                                    sandbox=sandbox, allow_unsandboxed=allow_unsandboxed, data_root=root,
                                    group="demo"))
    console.print(f"running {len(specs)} run(s) through the harness ({escape(specs[0].sandbox)} sandbox) in "
                  f"{escape(str(runs_dir / 'demo'))}")
    for spec in specs:
        if spec.agent == "baseline":
            named = spec.agent_config.get("baseline") or baseline_name(spec.task_id)
            console.print(f"    baseline agent on {escape(spec.task_id)}: {escape(str(named))} "
                          f"({escape(config)} configuration)")

    def progress(outcome: RunOutcome) -> None:
        grade = outcome.grade
        pct = "-" if grade is None or grade.percentile is None else f"{grade.percentile:.1%}"
        console.print(f"    {escape(outcome.state)} {escape(outcome.run_id)} · {outcome.seconds:.0f} s · "
                      f"percentile {pct}")

    watch = LiveRuns([(runs_dir / spec.group / spec.run_id, spec.limits.time_limit_s, spec.limits.max_steps)
                      for spec in specs])
    with follow_epochs(watch):
        return run_specs(specs, runs_dir, executor="local", workers=workers, progress=progress)


def baseline_name(task_id: str, config: str = "quick") -> str:
    """The baseline the ``baseline`` agent runs on a task by default (the strongest installed one for ``config``)."""
    try:
        from rexmle_baselines.base import preferred_baseline
    except ImportError:
        return "none: rexmle-baselines is not installed"
    try:
        return preferred_baseline(task_id, config)
    except RexmleError as exc:
        return f"none: {exc.message}"


@contextlib.contextmanager
def follow_epochs(watch: LiveRuns, interval_s: float = 1.0) -> Iterator[None]:
    """A bar per run while the runs go on: epochs of a training baseline (from its ``epoch N/M`` lines), else
    steps. On a terminal the bars move; in a log, a line is printed whenever a run reaches a new epoch or state."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bars = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[detail]}"),
                    TimeElapsedColumn(), console=console, transient=False, disable=not console.is_terminal)
    ids: dict[str, Any] = {}
    said: dict[str, tuple[Any, ...]] = {}
    stop = threading.Event()

    def update() -> None:
        for run in watch.poll():
            if run.state == "pending" and run.attempt_started is None:
                continue
            what = printable(f"{run.run_id.split('.')[0]} {run.run_id.split('.')[1]}"
                             + (f" ({run.baseline})" if run.baseline else ""), one_line=True)
            done, total = run.epoch if run.epoch else (run.steps, run.max_steps or max(run.steps, 1))
            detail = (f"epoch {done}/{total}" if run.epoch else f"{run.steps} step(s)") + f" · {run.state}"
            if run.run_id not in ids:
                ids[run.run_id] = bars.add_task(escape(what), total=total, detail=detail)
            bars.update(ids[run.run_id], completed=done, total=total, detail=detail, description=escape(what))
            if not console.is_terminal and said.get(run.run_id) != (run.epoch, run.state, run.baseline):
                said[run.run_id] = (run.epoch, run.state, run.baseline)
                console.print(f"    {escape(what)}: {escape(detail)}", highlight=False)

    def loop() -> None:
        while not stop.wait(interval_s):
            update()

    thread = threading.Thread(target=loop, name="demo-progress", daemon=True)
    with bars:
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            update()
