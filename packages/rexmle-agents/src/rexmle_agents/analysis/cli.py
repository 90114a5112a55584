"""``rexmle analyse``: the capability analysis of run folders, agreement with human labels, and the shipped examples.

```
rexmle analyse RUNS... [--judge MODEL] [--factors all|LIST] [--max-cost USD] [-o OUT]
rexmle analyse agreement OUT --labels labels.csv [--format table|csv|json] [-o FILE]
rexmle analyse examples DIR
```

``rexmle analyse RUNS...`` is the ``runs`` sub-command, run when the first argument is not a sub-command's name.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from rexmle_grade.errors import BudgetExceededError, ConfigurationError, UserInputError
from rexmle_grade.text import printable

console = Console()
NO_JUDGE = "none"
FORMATS = ("table", "csv", "json")


class _RunsByDefault(TyperGroup):
    """A group whose ``runs`` command needs no name: ``rexmle analyse runs/paper`` is ``rexmle analyse runs
    runs/paper``."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["runs", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(cls=_RunsByDefault, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Capability analysis: the 13 success factors with verified evidence, deterministic detectors, "
                       "failure analysis, agreement with human raters.")


def _note(text: str) -> None:
    Console(stderr=True).print(Text(text, style="dim"))


def make_judge(judge: str, *, max_cost: float | None, out: Path, record: Path | None, replay: Path | None,
               chunk_chars: int, attempts: int, temperature: float | None) -> Any:
    """The judge for ``--judge MODEL`` (None for ``none``): its calls journaled in ``OUT/judge-calls.jsonl`` and
    counted against ``--max-cost``; ``--replay`` serves them from a cassette instead of the provider."""
    if judge == NO_JUDGE:
        if max_cost is not None or record is not None or replay is not None:
            raise UserInputError("--max-cost, --record and --replay need a judge",
                                 hint="add --judge MODEL, e.g. --judge anthropic/claude-sonnet-4-5")
        return None
    from rexmle_agents.analysis.factors import load_rubrics
    from rexmle_agents.analysis.judge import Judge
    from rexmle_agents.models import Budget, Model, ReplayBackend, UsageLedger, get_model

    ledger = UsageLedger(journal=out / "judge-calls.jsonl",
                         budget=Budget(max_cost_usd=max_cost) if max_cost is not None else None)
    if replay is not None:
        if record is not None:
            raise UserInputError("--record and --replay exclude each other: a call is either recorded or replayed")
        model = Model(ReplayBackend(replay, judge), ledger=ledger)
    else:
        from rexmle_agents.models.probe import require_reachable

        model = get_model(judge, ledger=ledger, record_to=record)
        require_reachable([judge])  # a wrong URL is one line now, not minutes of retries on the first call
    out.mkdir(parents=True, exist_ok=True)  # only once the judge can be made: a missing key writes nothing
    return Judge(model, load_rubrics(), chunk_chars=chunk_chars, max_attempts=attempts, temperature=temperature)


@app.command("runs")
def runs_command(
    paths: Annotated[list[Path], typer.Argument(help="Run folders, group folders (runs/<group>) or runs folders.")],
    judge: Annotated[str, typer.Option(help="The judge model (e.g. anthropic/claude-sonnet-4-5), or 'none': "
                                            "detectors and failure analysis only.")] = NO_JUDGE,
    factors: Annotated[str, typer.Option(help="all, or a comma-separated list of factor ids.")] = "all",
    max_cost: Annotated[float | None, typer.Option(min=0.0, help="Dollar budget of the judge's calls; the analysis "
                                                                  "stops when it is spent, with what it made "
                                                                  "written.")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (verdicts, tables, figures, view.html); "
                                                          "verdicts already in it are reused.")] = Path("analysis"),
    record: Annotated[Path | None, typer.Option(help="Record every judge call to this cassette.")] = None,
    replay: Annotated[Path | None, typer.Option(help="Answer judge calls from this cassette (offline).")] = None,
    chunk_chars: Annotated[int, typer.Option(min=1000, help="Characters of code and output per judge call.")] = 48_000,
    attempts: Annotated[int, typer.Option(min=1, help="Calls per chunk before an unusable answer is an error.")] = 3,
    temperature: Annotated[float | None, typer.Option(help="The judge's temperature (default: the provider's).")] \
        = None,
    fresh: Annotated[bool, typer.Option(help="Judge everything again: reuse no earlier verdict.")] = False,
    view: Annotated[bool, typer.Option(help="Write view.html (the runs with each factor's evidence).")] = True,
    figures: Annotated[bool, typer.Option(help="Draw the figures (PNG and SVG) into OUT/figures.")] = True,
) -> None:
    """Which success factors each run demonstrates (judge with verified quotes, and detectors), and why runs fail."""
    from rexmle_agents.analysis.factors import load_rubrics
    from rexmle_agents.analysis.pipeline import analyse_runs
    from rexmle_agents.results.loader import load_runs

    chosen = load_rubrics().select(factors)
    runs = load_runs(paths)
    made = make_judge(judge, max_cost=max_cost, out=out, record=record, replay=replay, chunk_chars=chunk_chars,
                      attempts=attempts, temperature=temperature)
    if made is not None:
        _note(f"judging {len(runs)} run(s) x {len(chosen)} factor(s) with {made.settings.model} (at least one call "
              f"each; earlier verdicts in {out} are reused)")
    with console.status("analysing", spinner="dots") as status:
        result = analyse_runs(runs, out, factors=chosen, judge=made, reuse=not fresh, max_cost_usd=max_cost,
                              view=view, figures=figures,
                              progress=lambda what: status.update(f"judging {printable(what)}"))
    print_summary(result)
    if not result.manifest.complete:
        stopped = f"the analysis stopped early: {result.manifest.stopped}; what it made is written in {out}"
        if isinstance(made.stop_error, BudgetExceededError):
            raise BudgetExceededError(stopped, hint="run the same command again with a larger --max-cost: "
                                                    "verdicts already made are reused")
        raise ConfigurationError(stopped, hint=getattr(made.stop_error, "hint", None))


def print_summary(result: Any) -> None:
    from rexmle_agents.analysis.factors import load_rubrics
    from rexmle_agents.analysis.frames import analysis_frames, capability_table, failure_table

    frames = analysis_frames(result.analyses)
    names = {f.id: f.name for f in load_rubrics().factors}
    caps = capability_table(frames.verdicts, by=("data", "agent", "model"))
    groups = sorted({(r.data, r.agent, r.model) for r in caps.itertuples()})
    table = Table(title="share of runs demonstrating each factor (judge · detector; k/n; u?: the judge's claims "
                        "whose quotes were not found, ! where they outnumber k)", title_justify="left")
    flagged = []
    table.add_column("factor")
    for data, agent, model in groups:
        table.add_column(printable(f"{agent} · {model}" + (" †" if data == "synthetic" else ""), one_line=True),
                         justify="right")
    for factor in result.manifest.factors:
        cells = []
        for group in groups:
            part = caps[(caps["data"] == group[0]) & (caps["agent"] == group[1]) & (caps["model"] == group[2])
                        & (caps["factor"] == factor)]
            shown = []
            for source in ("judge", "detector"):
                row = part[part["source"] == source]
                cell = "-" if row.empty else f"{int(row['demonstrated'].sum())}/{int(row['judged'].sum())}"
                if source == "judge" and not row.empty:
                    cell += f" {int(row['unverified'].sum())}u?" + (" !" if row["unverified_dominates"].any() else "")
                    if row["unverified_dominates"].any():
                        flagged.append(f"{names.get(factor, factor)} ({group[1]} · {group[2]})")
                shown.append(cell)
            cells.append(" · ".join(shown))
        table.add_row(names.get(factor, factor), *cells)
    console.print(table)
    if flagged:
        console.print(Text("the judge's unverified claims outnumber its demonstrated ones (its share there says more "
                           f"about its quoting than about the runs): {printable('; '.join(flagged), one_line=True)}",
                           style="yellow"))
    failures = failure_table(frames.runs, frames.steps)
    ftable = Table(title="failure analysis (per data kind x agent x model x task type)", title_justify="left")
    for column in ("group", "runs", "steps run", "crashed", "invalid", "top errors", "valid final", "time: code / "
                   "model / rest"):
        ftable.add_column(column)
    for row in failures.to_dict("records"):
        errors = sorted(((k[6:], v) for k, v in row.items() if k.startswith("error:") and v == v),
                        key=lambda kv: -kv[1])
        ftable.add_row(printable(" · ".join(str(row[k]) for k in ("data", "agent", "model", "task_type")),
                                 one_line=True),
                       str(row["runs"]), str(row["executed"]), _pct(row["crash_share"]), _pct(row["invalid_share"]),
                       ", ".join(f"{k} {v:.0%}" for k, v in errors[:3]) or "-", _pct(row["final_valid_rate"]),
                       " / ".join(_pct(row[k]) for k in ("exec_share", "model_share", "idle_share")))
    console.print(ftable)
    manifest = result.manifest
    disagreements = int(frames.comparison["agree"].eq(False).sum()) if not frames.comparison.empty else 0
    usage = manifest.usage
    judge = manifest.judge.model if manifest.judge else "none"
    cost = f"${usage.cost_usd:.4f}" + (f" (+{usage.uncosted_calls} call(s) of unknown cost)" if usage.uncosted_calls
                                        else "")
    statuses = frames.verdicts.loc[frames.verdicts["source"] == "judge", "status"].value_counts()
    console.print(Text(f"judge {judge}: {usage.calls} call(s), {usage.usage.total_tokens:,} tokens, {cost}; "
                       f"{manifest.reused_verdicts} verdict(s) reused; {statuses.get('unverified', 0)} unverified "
                       f"claim(s), {statuses.get('error', 0)} error(s), {statuses.get('not_run', 0)} not judged; "
                       "judge/detector disagreements: "
                       f"{disagreements} (disagreements.csv); rubric {manifest.rubric_version}, prompt "
                       f"{manifest.prompt_version or '-'}, detectors {manifest.detectors_version}"))
    console.print(Text(f"written: {result.out} (runs/*.json, manifest.json, tables"
                       + (", figures/" if result.figures else "")
                       + (", view.html" if any(p.name == "view.html" for p in result.written) else "") + ")"))
    for path, why in ((r["run_dir"], r["reason"]) for r in manifest.refused):
        console.print(Text(f"refused: {printable(path, one_line=True)}: {printable(why, one_line=True)}",
                           style="yellow"))


def _pct(value: Any) -> str:
    return "-" if value is None or value != value else f"{value:.0%}"


@app.command("agreement")
def agreement_command(
    analysis: Annotated[Path, typer.Argument(help="The folder `rexmle analyse ... -o OUT` wrote.")],
    labels: Annotated[list[Path], typer.Option("--labels", "-l", help="Human label files (CSV: rater, run, factor, "
                                                                         "demonstrated, node, quote, note).")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="table | csv | json.")] = "table",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the rows here (CSV; JSON with --format json) "
                                                                 "instead of printing them.")] = None,
    bootstrap: Annotated[int, typer.Option(min=0, help="Bootstrap replicates of the 95% CI (0: none).")] = 1000,
) -> None:
    """Cohen's kappa per factor and overall between the judge, the detectors and each human rater."""
    from rexmle_agents.analysis.agreement import agreement_report, read_labels, to_csv
    from rexmle_agents.analysis.factors import load_rubrics
    from rexmle_agents.analysis.pipeline import load_analyses

    if fmt not in FORMATS:
        raise UserInputError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    manifest, analyses = load_analyses(analysis)
    if not analyses:
        raise UserInputError(f"no run analyses in {analysis}", hint="run `rexmle analyse RUNS -o OUT` first")
    ids = load_rubrics().ids
    report = agreement_report(analyses, read_labels(labels, ids), ids, manifest, replicates=bootstrap)
    if fmt == "table":
        print_agreement(report)
    text = {"table": to_csv, "csv": to_csv, "json": lambda r: r.model_dump_json(indent=1) + "\n"}[fmt](report)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        console.print(Text(f"agreement: {out}"))
    elif fmt != "table":
        sys.stdout.write(text)


def print_agreement(report: Any) -> None:
    pairs = list(dict.fromkeys((r.rater_a, r.rater_b) for r in report.rows))
    table = Table(title="Cohen's kappa (n items; 95% CI by bootstrap over runs)", title_justify="left")
    table.add_column("factor")
    for a, b in pairs:
        table.add_column(printable(f"{a} vs {b}", one_line=True), justify="right")
    factors = list(dict.fromkeys(r.factor for r in report.rows))
    for factor in factors:
        cells = []
        for a, b in pairs:
            row = next(r for r in report.rows if r.factor == factor and (r.rater_a, r.rater_b) == (a, b))
            cells.append(_kappa_cell(row))
        table.add_row(Text(factor, style="bold" if factor == "all" else ""), *cells)
    console.print(table)
    console.print(Text("'undef.' = kappa undefined (both raters gave one answer throughout; raw agreement shown); "
                       "cells with n < 10 are too small to trust and show no interval", style="dim"))
    console.print(Text(f"raters: {', '.join(f'{r} ({report.items.get(r, 0)} items)' for r in report.raters)}; "
                       f"disagreements: {len(report.disagreements)} (use --format json to list them with their "
                       f"evidence)"))
    if report.judge_model:
        console.print(Text(f"judge {report.judge_model}, prompt {report.prompt_version}, "
                           f"rubric {report.rubric_version}"))
    for item in report.unmatched[:10]:
        console.print(Text(f"label for no analysed run: {printable(item, one_line=True)}", style="yellow"))


def _kappa_cell(row: Any) -> str:
    if row.n == 0:
        return "-"
    if row.kappa is None:
        return f"undef. ({row.agreement:.0%} agree, n {row.n})"
    ci = "" if row.ci_low is None or row.n < 10 else f" [{row.ci_low:.2f}, {row.ci_high:.2f}]"
    return f"{row.kappa:.2f}{ci} (n {row.n})"


@app.command("examples")
def examples_command(
    folder: Annotated[Path, typer.Argument(help="Where to put the example runs, labels and analysis.")],
) -> None:
    """Unpack the labelled example runs (synthetic, scripted agents), analyse them with the scripted example judge
    and print the agreement table: the whole method, offline, in seconds."""
    from rexmle_agents.analysis.agreement import agreement_report, read_labels
    from rexmle_agents.analysis.examples import EXAMPLE_JUDGE, ExampleJudge, example_labels, unpack
    from rexmle_agents.analysis.factors import load_rubrics
    from rexmle_agents.analysis.judge import Judge
    from rexmle_agents.analysis.pipeline import analyse_runs
    from rexmle_agents.models import Model, ScriptedBackend, UsageLedger
    from rexmle_agents.results.loader import load_runs

    group = unpack(folder / "runs")
    labels = example_labels(folder / "labels.csv")
    out = folder / "analysis"
    rubrics = load_rubrics()
    judge = Judge(Model(ScriptedBackend(ExampleJudge(), name=EXAMPLE_JUDGE),
                        ledger=UsageLedger(journal=out / "judge-calls.jsonl")), rubrics)
    result = analyse_runs(load_runs([group]), out, judge=judge, reuse=False)
    print_summary(result)
    print_agreement(agreement_report(result.analyses, read_labels([labels], rubrics.ids), rubrics.ids,
                                     result.manifest))
    console.print(Text(f"next: rexmle analyse agreement {out} --labels {labels} --format json   (the disagreements "
                       f"with their evidence)\n      open {out / 'view.html'} (each factor's evidence next to its "
                       "node)"))
