"""The paper's table from the per-run rows: padding, aggregation, standard errors and the hierarchical bootstrap.

Rules (stated once here, printed with every report, and in :data:`RULES`):

* Rows: one per value of the ``by`` keys (default agent, model, config, time budget), always split by data kind:
  synthetic and real results are never in one row or one total.
* Padding: within one data kind, every row is scored on the same grid, every task of that kind (unless ``task`` is a
  row key) times the seeds the row ran anywhere (unless ``seed`` is). A cell with no graded run (no folder, still
  running, failed before grading) counts as an invalid submission: percentile 0, last on every metric, no medal.
  When one cell holds several graded runs (the same row, task and seed), the last finished is used.
* Percentiles: an invalid submission counts as 0; a task without a human board (RAVIR) has none and is left out of
  percentile means, positions and medals (listed in ``tasks_without_board``), but counts in the valid rate.
* Mean +/- standard error: over seeds (each seed's mean over the scope's tasks), the s.e. being the seeds' standard
  deviation over sqrt(n); undefined with one seed.
* 95% CI: a hierarchical bootstrap (competitions, then tasks within each drawn competition, then seeds within each
  drawn task, all with replacement) of the mean percentile; tasks of one competition share data and are not
  independent, so competitions are the top-level unit. Percentile interval of the replicates; fixed seed.
* Normalised score: per task, ``(row - sample) / (best baseline - sample)`` on mean percentiles of the same data
  kind, where *sample* is the ``sample`` agent's runs and *best baseline* the best of the calibrated baselines
  (``rexmle baselines calibrate``) and the ``baseline`` agent's rows; averaged over the tasks where both exist and
  differ. 0 is the sample submission, 1 the best baseline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

ROW_KEYS = ("agent", "model", "config", "budget", "task", "seed")
DEFAULT_BY = ("agent", "model", "config", "budget")
SCOPES = ("all", "task_type", "dim", "task")
BOOTSTRAP_LEVELS = ("competition", "task", "seed")
RULES = {
    "rows": "one row per value of the row keys, split by data kind (synthetic and real are never totalled together)",
    "padding": "each row is scored on every task of its data kind times every seed it ran; a cell without a graded "
               "run counts as an invalid submission (percentile 0, position N+1, no medal)",
    "percentile": "an invalid or missing submission counts as percentile 0; a task without a human board (RAVIR) "
                  "is left out of percentile means, positions and medals but counts in the valid rate",
    "standard_error": "over seeds: the standard deviation of the per-seed means over sqrt(number of seeds)",
    "ci": "95% percentile interval of a hierarchical bootstrap: competitions, then tasks, then seeds, with "
          "replacement",
    "normalised": "(row - sample agent) / (best calibrated baseline - sample agent), per task on mean percentiles of "
                  "the same data kind, averaged over tasks where both references exist",
    "synthetic": "on synthetic data, percentiles and medals are computed against the human board but are not "
                 "comparable with it",
}


class TableRow(BaseModel):
    """One row of the paper's table in one scope (all tasks, a task type, a dimension or one task)."""

    model_config = ConfigDict(extra="forbid")

    data: Literal["synthetic", "real", "unknown"]
    keys: dict[str, str]
    reference: Literal["calibration"] | None = None  # an expert baseline measured by `rexmle baselines calibrate`
    scope: Literal["all", "task_type", "dim", "task"]
    scope_value: str
    n_tasks: int
    n_board_tasks: int
    n_seeds: int
    n_runs: int
    n_missing: int
    n_valid: int
    valid_rate: float
    mean_percentile: float | None
    median_percentile: float | None
    se_percentile: float | None
    ci_low: float | None
    ci_high: float | None
    mean_position: float | None
    gold: int
    silver: int
    bronze: int
    medals: int
    medal_rate: float | None
    above_median: int
    above_median_rate: float | None
    normalised: float | None
    normalised_tasks: int
    cost_per_run: float | None
    tokens_per_run: float | None
    time_used_s: float | None
    time_budget_s: float | None
    steps_per_run: float | None
    tasks_without_board: list[str]
    comparable_with_board: bool


# ---------------------------------------------------------------------------------------------------------------
# the bootstrap


def hierarchical_bootstrap(tasks: Sequence[tuple[str, np.ndarray]], competition: Mapping[str, str], *,
                           replicates: int, rng: np.random.Generator) -> np.ndarray:
    """Replicates of the mean over tasks of each task's mean over seeds, resampling competitions, then tasks within
    each drawn competition, then seeds within each drawn task (all with replacement)."""
    groups: dict[str, list[np.ndarray]] = {}
    for task, values in tasks:
        groups.setdefault(competition.get(task, task), []).append(np.asarray(values, dtype=float))
    names = list(groups)
    picks = rng.integers(0, len(names), size=(replicates, len(names)))
    total = np.zeros(replicates)
    count = np.zeros(replicates)
    for c, name in enumerate(names):
        arrays = groups[name]
        drawn = (picks == c).sum(axis=1)  # how often each replicate drew this competition
        draws = int(drawn.sum())
        if draws == 0:
            continue
        owner = np.repeat(np.arange(replicates), drawn)  # the replicate each draw belongs to
        k = len(arrays)
        lengths = np.array([len(a) for a in arrays])
        width = int(lengths.max())
        table = np.zeros((k, width))
        for i, values in enumerate(arrays):
            table[i, :len(values)] = values
        task_pick = rng.integers(0, k, size=(draws, k))  # each draw of the competition redraws its k tasks
        if width == 1:  # one seed per task: nothing to resample below the task
            task_means = table[task_pick, 0]
        elif lengths.min() == width:  # the padded grid: every task has the row's seeds
            seed_pick = rng.integers(0, width, size=(draws, k, width))
            task_means = table[task_pick[..., None], seed_pick].mean(axis=-1)
        else:
            n_seeds = lengths[task_pick][..., None]
            seed_pick = (rng.random((draws, k, width)) * n_seeds).astype(int)
            in_task = np.arange(width) < n_seeds
            values = np.where(in_task, table[task_pick[..., None], seed_pick], 0.0)
            task_means = values.sum(axis=-1) / lengths[task_pick]
        total += np.bincount(owner, weights=task_means.sum(axis=-1), minlength=replicates)
        count += drawn * k
    return total / count


# ---------------------------------------------------------------------------------------------------------------
# padding and aggregation


def pad_grid(runs: Any, by: Sequence[str], facts: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """The per-run frame completed to each row's grid (see the module docstring); returns it with a ``padded``
    column, and the run ids left out as duplicates of a later run of the same cell."""
    import pandas as pd

    frame = runs.copy()
    frame["padded"] = False
    frame["task"], frame["seed_key"] = frame["task_id"], frame["seed"].astype(str)
    keys = [*_key_columns(by), "data"]
    cell = [*keys, *(c for c in ("task_id", "seed_key") if c not in keys)]
    graded_last = frame.assign(_order=frame["graded"].astype(int)).sort_values(["_order", "finished_at"],
                                                                               na_position="first")
    duplicated = graded_last.duplicated(subset=cell, keep="last")
    dropped = list(graded_last.loc[duplicated, "run_id"])
    frame = graded_last.loc[~duplicated].drop(columns="_order")
    padding: list[dict[str, Any]] = []
    for data_kind, of_kind in frame.groupby("data", sort=False):
        all_tasks = sorted(of_kind["task_id"].unique())
        for key, row_runs in of_kind.groupby(keys, sort=False, dropna=False):
            key_values = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
            task_axis = [key_values["task"]] if "task" in key_values else all_tasks
            seed_axis = [key_values["seed_key"]] if "seed_key" in key_values else sorted(row_runs["seed_key"].unique())
            present = set(zip(row_runs["task_id"], row_runs["seed_key"], strict=True))
            template = row_runs.iloc[0].to_dict()
            for task in task_axis:
                for seed in seed_axis:
                    if (task, seed) not in present:
                        padding.append(_padded_cell(template, task, seed, facts[task], data_kind))
    if padding:
        frame = pd.concat([frame, pd.DataFrame(padding)], ignore_index=True)
    return frame.reset_index(drop=True), dropped


def _key_columns(by: Sequence[str]) -> list[str]:
    return ["seed_key" if k == "seed" else k for k in by]


def _padded_cell(template: dict[str, Any], task: str, seed: str, facts: Any, data_kind: str) -> dict[str, Any]:
    board = facts.board_rows
    cell = {k: template[k] for k in ("agent", "agent_version", "model", "config", "agent_config", "budget",
                                     "time_budget_s", "sandbox", "network", "heldout_reachable", "selection_k")}
    cell.update(
        run_id="", group=template["group"], run_dir="", data=data_kind, synthetic=template["synthetic"],
        task_id=task, task=task, task_version="", competition=facts.competition, task_type=facts.task_type,
        dim=facts.dim, seed=int(seed), seed_key=seed, state="missing", reason="no graded run for this cell",
        graded=False, grade_status="missing", valid=False, percentile=None,
        percentile_counted=0.0 if board else None, mean_position=None,
        position_counted=float(board + 1) if board else None, board_rows=board, gold=False, silver=False,
        bronze=False, any_medal=False, above_median=False, padded=True)
    return cell


class _Cells:
    """The padded cells of one row as numpy columns (pandas only groups the rows; every scope is a mask here)."""

    NUMBERS = ("percentile_counted", "position_counted", "cost_usd", "tokens", "time_used_s", "time_budget_s", "steps")
    FLAGS = ("valid", "graded", "padded", "gold", "silver", "bronze", "any_medal", "above_median")
    TEXTS = ("task_id", "task_type", "dim")

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.columns = columns

    @classmethod
    def of(cls, frame: Any) -> _Cells:
        import pandas as pd

        columns = {name: pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float) for name in cls.NUMBERS}
        columns |= {name: frame[name].fillna(False).to_numpy(dtype=bool) for name in cls.FLAGS}
        columns |= {name: frame[name].astype(str).to_numpy() for name in cls.TEXTS}
        columns["seed"] = frame["seed"].to_numpy(dtype=int)
        return cls(columns)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def subset(self, mask: np.ndarray) -> _Cells:
        return _Cells({name: values[mask] for name, values in self.columns.items()})


def aggregate(frame: Any, by: Sequence[str], *, competition: Mapping[str, str],
              references: Mapping[tuple[str, str], tuple[float, float]], replicates: int,
              seed: int = 0) -> list[TableRow]:
    """Every (row, scope) of a padded frame (:func:`pad_grid`); ``references`` maps (data, task) to the
    (sample, best baseline) mean percentiles of the normalised score."""
    rng = np.random.default_rng(seed)
    keys = [*_key_columns(by), "data"]
    rows: list[TableRow] = []
    for key, group in frame.groupby(keys, sort=True, dropna=False):
        key_values = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        data_kind = str(key_values.pop("data"))
        shown = {("seed" if k == "seed_key" else k): str(v) for k, v in key_values.items()}
        cells = _Cells.of(group)
        scopes: list[tuple[str, str, _Cells]] = [("all", "all", cells)]
        for scope, column in (("task_type", "task_type"), ("dim", "dim"), ("task", "task_id")):
            if scope == "task" and "task" in by:
                continue
            scopes += [(scope, str(value), cells.subset(cells[column] == value)) for value in np.unique(cells[column])]
        for scope, value, part in scopes:
            rows.append(_stats(part, data_kind, shown, scope, value, competition, references, replicates, rng))
    return rows


def _stats(part: _Cells, data_kind: str, keys: dict[str, str], scope: str, value: str,
           competition: Mapping[str, str], references: Mapping[tuple[str, str], tuple[float, float]],
           replicates: int, rng: np.random.Generator) -> TableRow:
    n_runs = len(part["seed"])
    on_board = ~np.isnan(part["percentile_counted"])
    pct = part["percentile_counted"][on_board]
    tasks, task_index = np.unique(part["task_id"][on_board], return_inverse=True)
    se = ci_low = ci_high = None
    normalised: list[float] = []
    if len(pct):
        _, seed_index = np.unique(part["seed"][on_board], return_inverse=True)
        per_seed = np.bincount(seed_index, weights=pct) / np.bincount(seed_index)
        if len(per_seed) >= 2:
            se = float(per_seed.std(ddof=1) / np.sqrt(len(per_seed)))
        if replicates > 0:
            by_task = [(str(t), pct[task_index == i]) for i, t in enumerate(tasks)]
            reps = hierarchical_bootstrap(by_task, competition, replicates=replicates, rng=rng)
            ci_low, ci_high = (float(x) for x in np.percentile(reps, [2.5, 97.5]))
        task_means = np.bincount(task_index, weights=pct) / np.bincount(task_index)
        for task, mean in zip(tasks, task_means, strict=True):
            ref = references.get((data_kind, str(task)))
            if ref is not None and ref[1] > ref[0]:
                normalised.append(float((mean - ref[0]) / (ref[1] - ref[0])))
    real = ~part["padded"]
    n_board = int(on_board.sum())

    def count(flag: str) -> int:
        return int(part[flag][on_board].sum())

    return TableRow(
        data=data_kind, keys=keys, scope=scope, scope_value=value,  # type: ignore[arg-type]
        n_tasks=len(np.unique(part["task_id"])), n_board_tasks=len(tasks), n_seeds=len(np.unique(part["seed"])),
        n_runs=n_runs, n_missing=int((~part["graded"]).sum()), n_valid=int(part["valid"].sum()),
        valid_rate=float(part["valid"].mean()) if n_runs else 0.0, mean_percentile=_mean(pct),
        median_percentile=float(np.median(pct)) if len(pct) else None, se_percentile=se, ci_low=ci_low,
        ci_high=ci_high, mean_position=_mean(part["position_counted"][on_board]), gold=count("gold"),
        silver=count("silver"), bronze=count("bronze"), medals=count("any_medal"),
        medal_rate=count("any_medal") / n_board if n_board else None, above_median=count("above_median"),
        above_median_rate=count("above_median") / n_board if n_board else None,
        normalised=float(np.mean(normalised)) if normalised else None, normalised_tasks=len(normalised),
        cost_per_run=_mean(part["cost_usd"][real]), tokens_per_run=_mean(part["tokens"][real]),
        time_used_s=_mean(part["time_used_s"][real]), time_budget_s=_mean(part["time_budget_s"]),
        steps_per_run=_mean(part["steps"][real]),
        tasks_without_board=sorted(set(part["task_id"][~on_board].tolist()) - set(tasks.tolist())),
        comparable_with_board=data_kind == "real",
    )


def _mean(values: np.ndarray) -> float | None:
    """The mean of the known values (NaN stands for unknown), None when none is known."""
    known = values[~np.isnan(values)]
    return float(known.mean()) if len(known) else None


def reference_percentiles(frame: Any, calibration: Sequence[Any]) -> dict[tuple[str, str], tuple[float, float]]:
    """(data, task) -> (the sample agent's mean percentile, the best calibrated baseline's), where both exist."""
    graded = frame[frame["graded"].astype(bool) & frame["percentile_counted"].notna()]
    low = graded[graded["agent"] == "sample"].groupby(["data", "task_id"])["percentile_counted"].mean().to_dict()
    high: dict[tuple[str, str], float] = {}
    baselines = graded[graded["agent"] == "baseline"]
    for (data_kind, task, _config), cells in baselines.groupby(["data", "task_id", "config"]):
        high[(data_kind, task)] = max(high.get((data_kind, task), -1.0), float(cells["percentile_counted"].mean()))
    for record in calibration:
        if record.percentile is None:
            continue
        key = ("synthetic" if record.synthetic else "real", record.task_id)
        high[key] = max(high.get(key, -1.0), float(record.percentile))
    return {key: (float(low[key]), high[key]) for key in low if key in high}


def calibration_rows(calibration: Sequence[Any], facts: Mapping[str, Any]) -> list[TableRow]:
    """The calibrated expert baselines as reference rows of their task: one row per (data, task, baseline, config)
    over its seeds (mean, median, s.e. over seeds; an invalid run counts as percentile 0 on a board), never padded."""
    groups: dict[tuple[bool, str, str, str], list[Any]] = {}
    for record in calibration:
        groups.setdefault((bool(record.synthetic), record.task_id, record.baseline, record.config), []).append(record)
    rows = []
    for (synthetic, task_id, baseline, config), records in groups.items():
        board = facts[task_id].board_rows
        counted = [r.percentile if r.valid and r.percentile is not None else 0.0 for r in records] if board else []
        pct = np.array(counted, dtype=float)
        seeds = {r.seed for r in records}
        n_valid = sum(bool(r.valid) for r in records)
        seconds = np.array([float(r.seconds) for r in records], dtype=float)
        rows.append(TableRow(
            data="synthetic" if synthetic else "real", reference="calibration",
            keys={"agent": f"baseline:{baseline}", "model": "-", "config": f"config={config}", "budget": "-"},
            scope="task", scope_value=task_id, n_tasks=1, n_board_tasks=1 if board else 0, n_seeds=len(seeds),
            n_runs=len(records), n_missing=0, n_valid=n_valid, valid_rate=n_valid / len(records),
            mean_percentile=_mean(pct), median_percentile=float(np.median(pct)) if len(pct) else None,
            se_percentile=float(pct.std(ddof=1) / np.sqrt(len(pct))) if len(pct) >= 2 else None, ci_low=None,
            ci_high=None, mean_position=None, gold=0, silver=0, bronze=0, medals=0, medal_rate=None, above_median=0,
            above_median_rate=None, normalised=None, normalised_tasks=0, cost_per_run=None, tokens_per_run=None,
            time_used_s=_mean(seconds), time_budget_s=None, steps_per_run=None,
            tasks_without_board=[] if board else [task_id], comparable_with_board=not synthetic))
    return rows
