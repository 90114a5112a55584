"""Figures of a group report (matplotlib, no display needed), each written as PNG and SVG.

* ``percentile-by-task``: mean percentile per row (agent x model ...) per task, with s.e. over seeds (the paper's
  headline figure);
* ``valid-rate-by-type``: valid-submission rate per row per task type;
* ``percentile-vs-budget``: mean percentile (95% CI) against the time budget, a line per row without the budget;
* ``percentile-vs-cost``: mean percentile against the mean cost per run (rows whose cost is unknown, a model call
  without a price, are left out and named in a note under the plot, never drawn at $0);
* ``search-<run>``: one run's search: every scored node's validation metric and the best so far, over wall time and
  over steps.

Colours are the Okabe-Ito palette (safe for the common colour-vision deficiencies), with hatching once rows
outnumber it. Every mark (bar, point) carries an SVG id ``mark-<n>``, so tests and scripts can count them. Figures
of synthetic data say so in their title; each figure holds one data variant (real, synthetic-easy,
synthetic-realistic: the file names end in it), so variants never share a figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rexmle_agents.harness.spec import data_kind_of
from rexmle_agents.results.report import GroupReport
from rexmle_agents.results.stats import TableRow
from rexmle_agents.results.trajectory import Trajectory

OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")
HATCHES = ("", "//", "..", "xx", "\\\\", "++")
FORMATS = ("png", "svg")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def style(index: int) -> dict[str, Any]:
    return {"color": OKABE_ITO[index % len(OKABE_ITO)], "hatch": HATCHES[(index // len(OKABE_ITO)) % len(HATCHES)]}


def _save(fig: Any, folder: Path, name: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in FORMATS:
        path = folder / f"{name}.{fmt}"
        fig.savefig(path, format=fmt, dpi=120, bbox_inches="tight", metadata={"Date": None} if fmt == "svg" else None)
        paths.append(path)
    _pyplot().close(fig)
    return paths


def _label(row: TableRow, skip: Sequence[str] = ()) -> str:
    return " · ".join(v for k, v in row.keys.items() if k not in skip and v != "-") or "all runs"


def _title(text: str, variant: str) -> str:
    """The figure's title, saying which data it shows (a data kind is taken as well: ``analyse`` passes one)."""
    data_kind = data_kind_of(variant)
    if data_kind == "synthetic":
        level = "" if variant == "synthetic" else f" ({variant})"
        return f"{text}\nSYNTHETIC DATA{level}: not comparable with the human leaderboard"
    return text if data_kind == "real" else f"{text}\n(data kind unknown)"


def _rows(report: GroupReport, variant: str, scope: str) -> list[TableRow]:
    return [r for r in report.rows if r.variant == variant and r.reference is None and r.scope == scope]


def _grouped_bars(ax: Any, series: list[tuple[str, list[float | None], list[float | None]]], groups: list[str],
                  *, ylabel: str) -> int:
    import numpy as np

    width = 0.8 / max(1, len(series))
    marks = 0
    for i, (label, values, errors) in enumerate(series):
        look = style(i)
        labelled = False
        for j, value in enumerate(values):
            if value is None:
                continue
            err = errors[j]
            bars = ax.bar(j - 0.4 + width * (i + 0.5), value, width, color=look["color"], hatch=look["hatch"],
                          edgecolor="#333333", linewidth=0.5, label=None if labelled else label,
                          yerr=None if err is None else [[err], [err]], capsize=2)
            bars.patches[0].set_gid(f"mark-{marks}")
            labelled = True
            marks += 1
    ax.set_xticks(np.arange(len(groups)), groups, rotation=45, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.05)
    ax.yaxis.set_major_formatter(_percent())
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=False))
    if unique:
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return marks


def _percent() -> Any:
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(1.0)


def percentile_by_task(report: GroupReport, folder: Path, variant: str) -> tuple[list[Path], int]:
    rows = _rows(report, variant, "task")
    tasks = sorted({r.scope_value for r in rows if r.mean_percentile is not None})
    series: dict[tuple[str, ...], dict[str, TableRow]] = {}
    for row in rows:
        series.setdefault(tuple(row.keys.values()), {})[row.scope_value] = row
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(tasks) * max(1, len(series)) ** 0.5 + 3), 4))
    bars = []
    for by_task in series.values():
        first = next(iter(by_task.values()))
        bars.append((_label(first), [by_task[t].mean_percentile if t in by_task else None for t in tasks],
                     [by_task[t].se_percentile if t in by_task else None for t in tasks]))
    marks = _grouped_bars(ax, bars, tasks, ylabel="mean percentile (± s.e. over seeds)")
    ax.set_title(_title("Percentile against the human leaderboard, per task", variant), fontsize=9)
    return _save(fig, folder, f"percentile-by-task-{variant}"), marks


def valid_rate_by_type(report: GroupReport, folder: Path, variant: str) -> tuple[list[Path], int]:
    rows = _rows(report, variant, "task_type")
    types = sorted({r.scope_value for r in rows})
    series: dict[tuple[str, ...], dict[str, TableRow]] = {}
    for row in rows:
        series.setdefault(tuple(row.keys.values()), {})[row.scope_value] = row
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(types) + 3), 4))
    bars = [(_label(next(iter(v.values()))), [v[t].valid_rate if t in v else None for t in types],
             [None] * len(types)) for v in series.values()]
    marks = _grouped_bars(ax, bars, types, ylabel="valid-submission rate")
    ax.set_title(_title("Valid submissions by task type", variant), fontsize=9)
    return _save(fig, folder, f"valid-rate-by-type-{variant}"), marks


def percentile_vs_budget(report: GroupReport, folder: Path, variant: str) -> tuple[list[Path], int]:
    rows = [r for r in _rows(report, variant, "all") if r.mean_percentile is not None and r.time_budget_s]
    lines: dict[str, list[TableRow]] = {}
    for row in rows:
        lines.setdefault(_label(row, skip=("budget",)), []).append(row)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    marks = 0
    for i, (label, points) in enumerate(sorted(lines.items())):
        points.sort(key=lambda r: r.time_budget_s or 0.0)
        hours = [(r.time_budget_s or 0.0) / 3600 for r in points]
        ax.plot(hours, [r.mean_percentile for r in points], color=style(i)["color"], linewidth=1, label=label)
        for r, x in zip(points, hours, strict=True):
            low = (r.mean_percentile or 0) - (r.ci_low if r.ci_low is not None else r.mean_percentile or 0)
            high = (r.ci_high if r.ci_high is not None else r.mean_percentile or 0) - (r.mean_percentile or 0)
            container = ax.errorbar([x], [r.mean_percentile], yerr=[[low], [high]], fmt="o",
                                    color=style(i)["color"], capsize=3)
            container.lines[0].set_gid(f"mark-{marks}")
            marks += 1
    ax.set_xlabel("time budget per run (hours)")
    ax.set_ylabel("mean percentile (95% CI)")
    ax.yaxis.set_major_formatter(_percent())
    ax.set_ylim(0, 1.05)
    if lines:
        ax.legend(fontsize=7)
    ax.set_title(_title("Percentile against the time budget", variant), fontsize=9)
    return _save(fig, folder, f"percentile-vs-budget-{variant}"), marks


def percentile_vs_cost(report: GroupReport, folder: Path, variant: str) -> tuple[list[Path], int]:
    scored = [r for r in _rows(report, variant, "all") if r.mean_percentile is not None]
    rows = [r for r in scored if r.cost_per_run is not None]
    unknown = [r for r in scored if r.cost_per_run is None and r.uncosted_calls]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    if unknown:  # an unpriced model's runs have no cost to draw: named, not plotted at $0
        names = "; ".join(f"{_label(r)} ({r.uncosted_calls} uncosted calls)" for r in unknown)
        fig.text(0.01, 0.01, f"left out, cost unknown: {names}", fontsize=6, wrap=True)
    for i, row in enumerate(rows):
        points = ax.scatter([row.cost_per_run], [row.mean_percentile], color=style(i)["color"], s=40,
                            edgecolors="#333333", linewidths=0.5, label=_label(row), zorder=3)
        points.set_gid(f"mark-{i}")
    ax.set_xlabel("mean model cost per run (USD)")
    ax.set_ylabel("mean percentile")
    ax.yaxis.set_major_formatter(_percent())
    ax.set_ylim(0, 1.05)
    if rows:
        ax.legend(fontsize=7)
    ax.set_title(_title("Percentile against model cost", variant), fontsize=9)
    return _save(fig, folder, f"percentile-vs-cost-{variant}"), len(rows)


def search_curve(path: Trajectory, folder: Path, name: str, *, title: str = "") -> tuple[list[Path], int]:
    """Every scored node (a point) and the best metric so far (a step line), over wall time and over steps."""
    curve = path.search_curve()
    plt = _pyplot()
    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for i, (node, seconds, _best) in enumerate(curve):
        colour = OKABE_ITO[4] if not node.final else OKABE_ITO[5]
        by_time.scatter([seconds / 60], [node.metric], color=colour, s=18, zorder=3).set_gid(f"mark-{i}")
        by_step.scatter([node.step or 0], [node.metric], color=colour, s=18, zorder=3).set_gid(f"step-mark-{i}")
    if curve:
        by_time.step([s / 60 for _, s, _ in curve], [b for _, _, b in curve], where="post", color=OKABE_ITO[0],
                     label="best so far")
        by_step.step([n.step or 0 for n, _, _ in curve], [b for _, _, b in curve], where="post", color=OKABE_ITO[0])
        by_time.legend(fontsize=7)
    by_time.set_xlabel("wall time (minutes)")
    by_step.set_xlabel("step")
    direction = "lower is better" if curve and curve[0][0].lower_is_better else "higher is better"
    by_time.set_ylabel(f"validation metric ({direction})")
    fig.suptitle(title or "search curve", fontsize=9)
    return _save(fig, folder, f"search-{name}"), len(curve)


def write_figures(report: GroupReport, runs: Any, folder: Path, *, max_curves: int = 24) -> dict[str, int]:
    """Every figure of ``report`` (and search curves of up to ``max_curves`` runs of ``runs`` with scored nodes,
    the most nodes first); returns each file stem with its number of marks."""
    from rexmle_agents.results.trajectory import trajectory

    written: dict[str, int] = {}
    for variant in report.variants:
        for make in (percentile_by_task, valid_rate_by_type, percentile_vs_budget, percentile_vs_cost):
            paths, marks = make(report, folder, variant)
            written[paths[0].stem] = marks
    paths_by_run = [(run, trajectory(run)) for run in runs.runs]
    scored = sorted(((r, p) for r, p in paths_by_run if p.search_curve()), key=lambda rp: -len(rp[1].nodes))
    for run, path in scored[:max_curves]:
        title = f"{run.run_id} ({run.variant} data)"
        paths, marks = search_curve(path, folder, run.run_id, title=title)
        written[paths[0].stem] = marks
    return written


# the same look and files for the figures of other reports (rexmle analyse)
pyplot, save_figure, figure_title = _pyplot, _save, _title
