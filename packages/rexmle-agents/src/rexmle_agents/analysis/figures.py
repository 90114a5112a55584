"""Figures of an analysis, drawn with the results layer's look (Okabe-Ito, PNG and SVG, synthetic data named in the
title, synthetic and real runs never in one figure):

* ``capability-comparison-<data>``: the 13 factors x agent (and model): the share of runs demonstrating each factor,
  one panel per source (the judge, the detectors), each cell annotated ``k/n`` and, for the judge, the number of its
  claims that were rejected (``u unverified``); a cell where they outnumber the demonstrated runs is outlined and
  marked ``!`` (its share says more about the judge's quoting than about the runs);
* ``failure-types-<data>``: per agent (and model), how executed steps ended: ok, invalid submission, or each error
  type;
* ``time-split-<data>``: per agent (and model), the mean share of a run's time in agent code, model calls and the rest.

Every cell or bar carries an SVG id ``mark-<n>``; every unverified note ``unverified-<n>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rexmle_agents.analysis.frames import unverified_dominates
from rexmle_agents.results.figures import OKABE_ITO, figure_title, pyplot, save_figure

ROW_KEYS = ("agent", "model")


def _column(keys: Sequence[str]) -> str:
    return " · ".join(str(k) for k in keys if str(k) not in ("-", ""))


def capability_comparison(verdicts: Any, factors: Sequence[str], names: dict[str, str], folder: Path,
                          data_kind: str) -> tuple[list[Path], int]:
    """The share of runs demonstrating each factor (rows) per agent and model (columns), one panel per source."""
    import numpy as np

    frame = verdicts[(verdicts["data"] == data_kind) & (verdicts["status"] != "not_applicable")]
    sources = [s for s in ("judge", "detector") if s in set(frame["source"])]
    columns = sorted({tuple(str(r[k]) for k in ROW_KEYS) for _, r in frame.iterrows()})
    plt = pyplot()
    fig, axes = plt.subplots(1, max(1, len(sources)), figsize=(2.2 + 1.1 * max(1, len(columns)) * max(1, len(sources)),
                                                              0.42 * len(factors) + 2.2), squeeze=False)
    marks = notes = 0
    for panel, (ax, source) in enumerate(zip(axes[0], sources or ["judge"], strict=False)):
        shares = np.full((len(factors), len(columns)), np.nan)
        labels: dict[tuple[int, int], str] = {}
        unverified: dict[tuple[int, int], tuple[int, bool]] = {}
        part = frame[frame["source"] == source]
        for (i, factor) in enumerate(factors):
            for j, column in enumerate(columns):
                cell = part[(part["factor"] == factor)
                            & np.logical_and.reduce([part[k].astype(str) == v for k, v in zip(ROW_KEYS, column,
                                                                                                strict=True)])]
                judged = int(cell["judged"].sum())
                if judged:
                    shown = int(cell["demonstrated"].sum())
                    shares[i, j] = shown / judged
                    labels[(i, j)] = f"{shown}/{judged}"
                    if source == "judge":
                        rejected = int((cell["status"] == "unverified").sum())
                        unverified[(i, j)] = (rejected, unverified_dominates(shown, rejected))
        image = ax.imshow(np.ma.masked_invalid(shares), vmin=0, vmax=1, cmap="cividis", aspect="auto")
        image.set_gid(f"panel-{source}")
        for (i, j), text in labels.items():
            colour = "black" if shares[i, j] > 0.5 else "white"
            shift = -0.18 if (i, j) in unverified else 0.0
            ax.text(j, i + shift, text, ha="center", va="center", fontsize=7, color=colour).set_gid(f"mark-{marks}")
            marks += 1
            if (i, j) in unverified:
                rejected, dominates = unverified[(i, j)]
                ax.text(j, i + 0.22, f"{rejected} unverified" + (" !" if dominates else ""), ha="center",
                        va="center", fontsize=5.5, color=colour,
                        fontweight="bold" if dominates else "normal").set_gid(f"unverified-{notes}")
                notes += 1
                if dominates:
                    ax.add_patch(plt.Rectangle((j - 0.48, i - 0.48), 0.96, 0.96, fill=False, edgecolor="#D55E00",
                                               linewidth=1.5))
        for i in range(len(factors)):
            for j in range(len(columns)):
                if (i, j) not in labels:
                    ax.text(j, i, "-", ha="center", va="center", fontsize=7, color="#777777")
        ax.set_xticks(range(len(columns)), [_column(c) for c in columns], rotation=35, ha="right", fontsize=7)
        ax.set_yticks(range(len(factors)), [names.get(f, f) for f in factors] if panel == 0 else [], fontsize=7)
        ax.set_title("judge (verified quotes)" if source == "judge" else "deterministic detectors (their scope only)",
                     fontsize=8)
    bar = fig.colorbar(image, ax=axes[0].tolist(), fraction=0.03, pad=0.02)
    bar.set_label("share of runs demonstrating the factor", fontsize=7)
    fig.suptitle(figure_title("Capabilities: share of runs demonstrating each success factor", data_kind),
                 fontsize=9)
    # below the tick labels (the figure is saved with a tight bounding box, which takes it in)
    fig.text(0.01, -0.06, "unverified: the judge claimed the factor but no quote of it was found in code that ran or "
                          "in an output (counted as not demonstrated);\n! and an outline: unverified claims outnumber "
                          "the demonstrated runs", fontsize=6, color="#444444", va="top")
    return save_figure(fig, folder, f"capability-comparison-{data_kind}"), marks


def failure_types(steps: Any, folder: Path, data_kind: str) -> tuple[list[Path], int]:
    """Stacked bars per agent and model: how executed steps ended (shares)."""
    frame = steps[(steps["data"] == data_kind) & (steps["outcome"] != "no_code")] if not steps.empty else steps
    frame = frame.assign(kind=frame["error_type"].fillna("ok")) if not frame.empty else frame
    groups = sorted({tuple(str(r[k]) for k in ROW_KEYS) for _, r in frame.iterrows()}) if not frame.empty else []
    kinds = ["ok", *sorted({k for k in (frame["kind"] if not frame.empty else []) if k != "ok"})]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.5 * max(1, len(groups)) + 1.8))
    marks = 0
    left = [0.0] * len(groups)
    for k, kind in enumerate(kinds):
        values = []
        for group in groups:
            part = frame[frame["agent"].astype(str).eq(group[0]) & frame["model"].astype(str).eq(group[1])]
            values.append(float((part["kind"] == kind).mean()) if len(part) else 0.0)
        colour = "#bbbbbb" if kind == "ok" else OKABE_ITO[(k - 1) % len(OKABE_ITO)]
        bars = ax.barh(range(len(groups)), values, left=left, color=colour, edgecolor="#333333", linewidth=0.4,
                       label=kind)
        for patch in bars.patches:
            patch.set_gid(f"mark-{marks}")
            marks += 1
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_yticks(range(len(groups)), [_column(g) for g in groups], fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of executed steps")
    if groups:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(figure_title("How executed steps ended", data_kind), fontsize=9)
    return save_figure(fig, folder, f"failure-types-{data_kind}"), marks


def time_split(runs: Any, folder: Path, data_kind: str) -> tuple[list[Path], int]:
    """Stacked bars per agent and model: mean share of run time in agent code, model calls and the rest."""
    frame = runs[runs["data"] == data_kind] if not runs.empty else runs
    groups = sorted({tuple(str(r[k]) for k in ROW_KEYS) for _, r in frame.iterrows()}) if not frame.empty else []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.5 * max(1, len(groups)) + 1.8))
    marks = 0
    left = [0.0] * len(groups)
    for k, (column, label) in enumerate((("exec_share", "agent code (training, inference)"),
                                         ("model_share", "model calls"), ("idle_share", "the rest (idle)"))):
        values = []
        for group in groups:
            part = frame[frame["agent"].astype(str).eq(group[0]) & frame["model"].astype(str).eq(group[1])]
            values.append(float(part[column].fillna(0.0).mean()) if len(part) else 0.0)
        bars = ax.barh(range(len(groups)), values, left=left, color=OKABE_ITO[k], edgecolor="#333333",
                       linewidth=0.4, label=label)
        for patch in bars.patches:
            patch.set_gid(f"mark-{marks}")
            marks += 1
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_yticks(range(len(groups)), [_column(g) for g in groups], fontsize=7)
    ax.set_xlabel("mean share of a run's wall-clock (parallel workers can exceed 1)")
    if groups:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(figure_title("Where the time went", data_kind), fontsize=9)
    return save_figure(fig, folder, f"time-split-{data_kind}"), marks


def write_figures(frames: Any, factors: Sequence[str], names: dict[str, str], folder: Path) -> dict[str, int]:
    """Every figure, per data kind present; returns each file stem with its number of marks."""
    written: dict[str, int] = {}
    kinds = sorted(set(frames.runs["data"])) if not frames.runs.empty else []
    for data_kind in kinds:
        for paths, marks in (capability_comparison(frames.verdicts, factors, names, folder, data_kind),
                             failure_types(frames.steps, folder, data_kind),
                             time_split(frames.runs, folder, data_kind)):
            written[paths[0].stem] = marks
    return written
