"""``rexmle report``, ``rexmle view``, and what ``rexmle runs status`` / ``rexmle runs show`` print.

Every command reads run folders through :mod:`rexmle_agents.results.loader`; nothing is read from an earlier report.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from rexmle_grade.errors import UserInputError
from rexmle_grade.text import printable

console = Console()
FORMATS = ("table", "csv", "md", "json")
DEFAULT_RUNS_DIR = Path("runs")


def report_command(
    paths: Annotated[list[Path] | None, typer.Argument(
        help="Run folders, group folders (runs/<group>) or runs folders; default: the --plan's group.")] = None,
    by: Annotated[str | None, typer.Option(
        help="Row keys, from agent, model, config, budget, task, seed (default agent,model,config,budget).")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table | csv | md | json.")] = "table",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the report here (default: print it).")] = None,
    figures: Annotated[Path | None, typer.Option(help="Write the figures (PNG and SVG) into this folder.")] = None,
    tables: Annotated[Path | None, typer.Option(help="Write the tidy tables (runs, nodes, model calls, grades, "
                                                     "metrics) into this folder.")] = None,
    table_format: Annotated[str, typer.Option(help="csv | parquet (needs pyarrow).")] = "csv",
    bootstrap: Annotated[int, typer.Option(min=0, help="Bootstrap replicates of the 95% CI (0: none).")] = 2000,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap.")] = 0,
    plan: Annotated[str | None, typer.Option(help="A plan (name or file): report its group, grouped its way.")] = None,
    runs_dir: Annotated[Path, typer.Option(help="Where run folders are (with --plan).")] = DEFAULT_RUNS_DIR,
    max_curves: Annotated[int, typer.Option(min=0, help="Search-curve figures for at most this many runs.")] = 24,
) -> None:
    """The paper's table (and figures, tidy tables) rebuilt from run folders, whatever order they were run in."""
    from rexmle_agents.results.loader import load_runs
    from rexmle_agents.results.report import build_group_report, render_terminal, to_csv, to_markdown
    from rexmle_agents.results.stats import DEFAULT_BY

    if fmt not in FORMATS:
        raise UserInputError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    row_keys: list[str] | str = by or list(DEFAULT_BY)
    if plan is not None:
        from rexmle_agents.plans import load_plan

        loaded = load_plan(plan)
        paths = paths or [runs_dir / loaded.group]
        row_keys = by or loaded.report.by
    if not paths:
        raise UserInputError("which runs? pass run, group or runs folders", hint="e.g. rexmle report runs/paper")
    started = time.perf_counter()
    runs = load_runs(paths)
    report = build_group_report(runs, by=row_keys, replicates=bootstrap, seed=seed)
    if fmt == "table":
        render_terminal(report, console)
        if out is not None:
            console.print(f"report: {escape(str(report.write(out)))}")
    else:
        text = {"csv": to_csv, "md": to_markdown}.get(fmt, lambda r: r.model_dump_json(indent=1) + "\n")(report)
        if out is None:  # on a terminal, run text must not act on it (csv and md hold it as written)
            sys.stdout.write(printable(text) if sys.stdout.isatty() else text)
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
    if tables is not None:
        from rexmle_agents.results.tables import tidy_tables

        written = tidy_tables(runs).write(tables, table_format)
        _note(f"tables: {', '.join(p.name for p in written)} in {tables}")
    if figures is not None:
        from rexmle_agents.results.figures import write_figures

        made = write_figures(report, runs, figures, max_curves=max_curves)
        _note(f"figures: {len(made)} in {figures} (PNG and SVG)")
    _note(f"{len(runs)} run(s), {len(runs.refused)} refused, in {time.perf_counter() - started:.1f} s")


def _note(text: str) -> None:
    Console(stderr=True).print(Text(text, style="dim"))


def view_command(
    path: Annotated[Path, typer.Argument(help="A run folder, a group folder (runs/<group>) or a runs folder.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="The HTML file (default: PATH/view.html).")] = None,
    serve: Annotated[bool, typer.Option(help="Also serve it on this machine's loopback until Ctrl-C.")] = False,
    port: Annotated[int, typer.Option(help="Port for --serve (0: any free one).")] = 0,
    by: Annotated[str, typer.Option(help="Row keys of the group table.")] = "agent,model,config,budget",
) -> None:
    """One self-contained HTML page (no network needed) of a run, or of a group with its table and every run."""
    from rexmle_agents.results.loader import SPEC_FILE, load_runs
    from rexmle_agents.results.report import build_group_report
    from rexmle_agents.results.view import serve as make_server
    from rexmle_agents.results.view import write_view

    started = time.perf_counter()
    single = (path / SPEC_FILE).is_file()
    runs = load_runs([path], strict=single)
    report = None if single else build_group_report(runs, by=by)
    target = write_view(runs, out or path / "view.html", report)
    size = target.stat().st_size
    console.print(f"view: {escape(str(target))} ({size / 1e6:.2f} MB, {len(runs)} run(s), "
                  f"{time.perf_counter() - started:.1f} s)")
    if serve:
        server = make_server(target, port=port)
        host, bound = server.server_address[:2]
        console.print(f"serving on http://{host}:{bound}/ (Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


# ---------------------------------------------------------------------------------------------------------------
# rexmle runs status / show


def status_tables(runs_dir: Path, group: str | None, *, cluster_note: str | None = None) -> tuple[list[Any], int]:
    """A table per group of every run folder under ``runs_dir`` (or one group): model, state, steps, time, tokens,
    cost, percentile (and for runs of the SLURM executor their job: id, SLURM's state or pending reason), with the
    group's total as its caption and, below, why runs that did not finish ended. ``cluster_note``: where the job
    states come from (said under groups with SLURM jobs)."""
    from rexmle_agents.results.live import LiveRuns, format_seconds
    from rexmle_agents.results.loader import load_runs
    from rexmle_agents.results.rows import cost_text, model_label

    roots = [runs_dir / group] if group else [runs_dir]
    if not all(r.is_dir() for r in roots):
        return [], 0
    try:
        runs = load_runs(roots)
    except UserInputError:
        return [], 0
    running = [r for r in runs.runs if r.status.state in ("pending", "running")]
    live = {r.run_dir: r for r in LiveRuns([(run.run_dir, run.spec.limits.time_limit_s, run.spec.limits.max_steps)
                                            for run in running]).poll()}
    out: list[Any] = []
    groups = sorted({r.group for r in runs.runs} | {p.parent.name for p, _ in runs.refused})
    for name in groups:
        table = Table(title=f"group {name} ({escape(str(runs_dir / name))})", title_justify="left")
        members = [r for r in runs.runs if r.group == name]
        with_jobs = any(r.cluster is not None and r.cluster.last is not None for r in members)
        columns = ("run", "model", "state", *(("SLURM job",) if with_jobs else ()), "steps", "time", "tokens", "cost",
                   "percentile")
        for column in columns:
            folds = column in ("run", "model", "SLURM job")
            table.add_column(column, overflow="fold" if folds else "ellipsis", no_wrap=not folds)
        states: dict[str, int] = {}
        tokens_total, cost_total, uncosted_total, notes = 0, 0.0, 0, []
        for run in sorted(members, key=lambda r: r.run_id):
            status, now = run.status, live.get(run.run_dir)
            tokens = status.tokens if status.tokens is not None else (now.tokens if now else None)
            cost = status.cost_usd if status.cost_usd is not None else (now.cost_usd if now else None)
            uncosted = status.uncosted_calls if status.cost_usd is not None else (now.uncosted_calls if now else None)
            active = now is not None and status.state == "running"
            pct = "-" if run.grade is None or run.grade.percentile is None else f"{run.grade.percentile:.1%}"
            table.add_row(Text(run.run_id), Text(printable(model_label(run.spec.models), one_line=True)),
                          Text(status.state + (" (cluster)" if status.cluster_stop else "")),
                          *((Text(job_cell(run)),) if with_jobs else ()),
                          str(now.steps if active else status.steps),
                          format_seconds(now.elapsed() if active else status.elapsed_s),
                          "-" if tokens is None else f"{tokens:,}", cost_text(cost, uncosted),
                          pct + (" †" if run.synthetic and pct != "-" else ""))
            states[status.state] = states.get(status.state, 0) + 1
            tokens_total += tokens or 0
            cost_total += cost or 0.0
            uncosted_total += uncosted or 0
            if status.state not in ("finished", "running", "pending") or status.limit:
                notes.append(f"{run.run_id}: {status.state}" + (f" (limit {status.limit})" if status.limit else "")
                             + f": {printable(status.reason, one_line=True)}")
        refused = [(p, why) for p, why in runs.refused if p.parent.name == name]
        for folder, why in refused:
            table.add_row(Text(printable(folder.name, one_line=True)), "", Text("refused", style="red"),
                          *[""] * (len(columns) - 3))
            notes.append(f"{printable(folder.name, one_line=True)}: refused: {printable(why, one_line=True)}")
        count = sum(states.values()) + len(refused)
        table.caption = (f"total: {count} run(s) · " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
                         + f" · {tokens_total:,} tokens · {cost_text(cost_total, uncosted_total)}"
                         + (" · † synthetic data: not comparable with the human board" if any(
                             r.synthetic for r in runs.runs if r.group == name) else ""))
        out.append(table)
        if with_jobs and cluster_note:
            out.append(Text(f"SLURM job states: {cluster_note}", style="dim"))
        out += [Text(note, style="dim") for note in notes]
    return out, len(runs) + len(runs.refused)


def job_cell(run: Any) -> str:
    """``12_3 RUNNING on node7``, ``12_4 PENDING (Resources)``, ``12_5 COMPLETED 0:0`` (and its requeues)."""
    job = run.cluster.last if run.cluster is not None else None
    if job is None:
        return "-"
    detail = (f"({job.reason})" if job.state == "PENDING" and job.reason else
              f"on {job.node}" if job.state == "RUNNING" and job.node else
              job.exit_code or "" if job.state not in ("PENDING", "RUNNING") else "")
    requeues = sum(j.requeues for j in run.cluster.jobs)
    return " ".join(x for x in (job.job_id, job.state or "?", detail,
                                f"requeued {requeues}x" if requeues else "") if x)


def find_run(reference: Path, runs_dir: Path) -> Path:
    """A run folder from a path, or from a run id (or its unique prefix) under ``runs_dir``."""
    if reference.is_dir():
        return reference
    matches = sorted(p.parent for p in runs_dir.glob(f"*/{reference.name}*/spec.json"))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UserInputError(f"no run folder {reference} (nor a run id under {runs_dir})",
                             hint="pass runs/<group>/<run_id>, or see `rexmle runs status`")
    raise UserInputError(f"{reference.name!r} matches {len(matches)} runs under {runs_dir}: "
                         + ", ".join(p.name for p in matches[:5]), hint="give more of the run id")


def show_run(run_dir: Path, out: Console) -> None:
    """One run's trajectory in the terminal: budgets, why it ended, every node or step, the grade."""
    from rexmle_agents.results.live import format_seconds
    from rexmle_agents.results.loader import load_run
    from rexmle_agents.results.report import banner
    from rexmle_agents.results.rows import config_label, cost_text, model_label
    from rexmle_agents.results.trajectory import trajectory

    run = load_run(run_dir)
    spec, status = run.spec, run.status
    out.print(Text(printable(f"{spec.task_id} · {spec.agent} · {model_label(spec.models)} · seed {spec.seed} · "
                             f"{config_label(spec.agent_config, spec.selection_cases)}", one_line=True), style="bold"))
    out.print(Text(f"data: {run.variant}", style="dim"))
    if banner(run.variant):
        out.print(Text(banner(run.variant) or "", style="yellow"))
    out.print(Text(f"{run.run_dir}\n{status.state}" + (f" (limit: {status.limit})" if status.limit else "")
                   + f": {printable(status.reason or '-', one_line=True)} · {status.attempts} attempt(s)"))
    warnings = run.journal().of_kind("warning")  # e.g. a stalled model relay, code run without a sandbox
    for event in warnings[:5]:
        out.print(Text(f"warning: {printable(event.message, one_line=True)}", style="yellow"))
    if len(warnings) > 5:
        out.print(Text(f"... {len(warnings) - 5} more warning(s) in the journal", style="dim"))
    jobs = run.cluster.jobs if run.cluster is not None else []
    if jobs:
        earlier = f" (after {', '.join(j.job_id for j in jobs[:-1])})" if len(jobs) > 1 else ""
        out.print(Text(f"SLURM job {job_cell(run)}{earlier} · recorded from {jobs[-1].source}", style="dim"))
    limits = spec.limits
    budget = Table(title="budgets", title_justify="left")
    for column in ("budget", "used", "limit"):
        budget.add_column(column)
    budget.add_row("time", format_seconds(status.elapsed_s), format_seconds(limits.time_limit_s))
    budget.add_row("steps", str(status.steps), str(limits.max_steps or "none"))
    budget.add_row("tokens", "-" if status.tokens is None else f"{status.tokens:,}",
                   "none" if limits.max_tokens is None else f"{limits.max_tokens:,}")
    budget.add_row("cost", cost_text(status.cost_usd, status.uncosted_calls, digits=4),
                   "none" if limits.max_cost_usd is None else f"${limits.max_cost_usd:.2f}")
    out.print(budget)
    path = trajectory(run)
    tree = Tree(Text(f"{'search tree' if path.kind == 'tree' else 'steps'}: {len(path.nodes)} "
                     f"{'node' if path.kind == 'tree' else 'step'}(s)"))
    branches: dict[int, Any] = {}
    for node in path.nodes:
        parent = branches.get(node.parent) if path.kind == "tree" and node.parent is not None else None
        metric = "" if node.metric is None else f" · metric {node.metric:.6g}"
        flag = " · BUGGY" if node.buggy else " · valid" if node.valid else f" · {node.status}"
        line = Text(f"{'node' if path.kind == 'tree' else 'step'} {node.id} {printable(node.stage, one_line=True)}"
                    f"{metric}{flag} · "
                    f"{format_seconds(node.seconds)} · {node.model_calls} call(s), {node.tokens:,} tok, "
                    f"{cost_text(node.cost_usd, node.uncosted_calls, digits=4)}",
                    style="bold green" if node.final else "red" if node.buggy else "")
        if node.final:
            line.append("  ← FINAL", style="bold")
        branch = (parent or tree).add(line)
        if node.buggy and node.bug_reason:
            branch.add(Text(printable(node.bug_reason[:300], one_line=True), style="dim"))
        if node.selection:
            branch.add(Text(f"selection split: K={node.selection.get('k')}, score {node.selection.get('score')}",
                            style="dim"))
        branches[node.id] = branch
    out.print(tree)
    grade = run.grade
    if grade is None:
        out.print("not graded (yet)")
    else:
        pct = "-" if grade.percentile is None else f"{grade.percentile:.1%}"
        medal = "gold" if grade.gold_medal else "silver" if grade.silver_medal else "bronze" if grade.bronze_medal \
            else "no medal"
        out.print(Text(f"grade: {grade.status} · percentile {pct} · mean position "
                       f"{'-' if grade.score is None else f'{grade.score:.2f}'} of {grade.leaderboard_rows or '-'} · "
                       f"{medal} · " + ", ".join(f"{k} {v:.4g}" for k, v in list(grade.metrics.items())[:6])))
        for problem in grade.problems[:5]:
            out.print(Text(f"  - {printable(problem, one_line=True)}", style="red"))
    for problem in run.problems:
        out.print(Text(f"not read: {printable(problem, one_line=True)}", style="yellow"))
