"""The paper's table from the per-run rows: padding, aggregation, standard errors and the hierarchical bootstrap.

Rules (stated once here, printed with every report, and in :data:`RULES`):

* Rows: one per value of the ``by`` keys (default agent, model, config, time budget), always split by data variant
  (real, synthetic-easy, synthetic-realistic): results of two variants are never in one row or one total.
* Padding: within one data variant, every row is scored on the same grid, every task of that variant (unless
  ``task`` is a row key) times the seeds the row ran anywhere (unless ``seed`` is). A cell with no graded run (no
  folder, still running, failed before grading) counts as an invalid submission: percentile 0, last on every
  metric, no medal.
  When one cell holds several graded runs (the same row, task and seed), the last finished is used.
* Percentiles: an invalid submission counts as 0; a task without a human board (RAVIR) has none and is left out of
  percentile means, positions and medals (listed in ``tasks_without_board``), but counts in the valid rate.
* Mean +/- standard error: over seeds (each seed's mean over the scope's tasks), the s.e. being the seeds' standard
  deviation over sqrt(n); undefined with one seed.
* 95% CI: a hierarchical bootstrap (competitions, then tasks within each drawn competition, then seeds within each
  drawn task, all with replacement) of the mean percentile; tasks of one competition share data and are not
  independent, so competitions are the top-level unit. Percentile interval of the replicates; each row draws from
  its own generator, seeded by the report's seed and the row's own keys, so adding rows never moves another's.
* Too little data: an interval over fewer than :data:`MIN_INTERVAL_UNITS` competitions (within one competition:
  seeds) only restates the few task means it was drawn from, and a standard error over fewer than
  :data:`MIN_SE_SEEDS` seeds says next to nothing (two equal seeds give 0); such rows carry
  ``interval_warnings`` and are marked ‡ wherever they are shown.
* Raw metric: per task, the mean of the task's primary metric over the row's valid runs is shown beside the
  percentile (a board of few rows gives widely different scores one percentile).
* Task versions: a task run at two versions (task.yaml ``version``) never shares a row: its runs of each version go
  to a row of their own (labelled with the version), and the rest of the row's tasks to another.
* Normalised score: per task, ``(row - sample) / (expert - sample)`` on mean percentiles of the same data variant and
  task version, where *sample* is the ``sample`` agent's runs and *expert* the task's pinned expert bound
  (:class:`ExpertPin`: one named baseline, config and budget, at a pinned version) measured as the mean over all
  its calibration seeds (``rexmle baselines calibrate``); never the best single record of any config. Averaged over
  the tasks where both exist and differ. 0 is the sample submission, 1 the pinned expert.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

ROW_KEYS = ("agent", "model", "config", "budget", "task", "seed")
DEFAULT_BY = ("agent", "model", "config", "budget")
SCOPES = ("all", "task_type", "dim", "task")
BOOTSTRAP_LEVELS = ("competition", "task", "seed")
# fewer independent units than this and a 95% interval only restates the values it was drawn from
MIN_INTERVAL_UNITS = 5
MIN_SE_SEEDS = 3
FEW_DATA_MARK = "‡"
RULES = {
    "rows": "one row per value of the row keys, split by data variant (real, synthetic-easy, synthetic-realistic: "
            "two variants are never totalled together)",
    "padding": "each row is scored on every task of its data variant times every seed it ran; a cell without a graded "
               "run counts as an invalid submission (percentile 0, position N+1, no medal)",
    "percentile": "an invalid or missing submission counts as percentile 0; a task without a human board (RAVIR) "
                  "is left out of percentile means, positions and medals but counts in the valid rate",
    "standard_error": "over seeds: the standard deviation of the per-seed means over sqrt(number of seeds)",
    "ci": "95% percentile interval of a hierarchical bootstrap: competitions, then tasks, then seeds, with "
          "replacement; each row seeded by its own keys, so adding rows never moves it",
    "few_data": f"{FEW_DATA_MARK}: the 95% CI rests on fewer than {MIN_INTERVAL_UNITS} competitions (within one "
                f"competition: seeds), or the s.e. on fewer than {MIN_SE_SEEDS} seeds; too few to be informative",
    "raw_metric": "per task, the mean of the task's primary metric over valid runs is shown beside the percentile: "
                  "on a board of few rows, different scores share one percentile",
    "cost": "cost is unknown (not $0.00) for a row with any model call without a price; the count of such calls "
            "is shown",
    "task_version": "a task run at two versions never shares a row: each version's runs go to a row of their own",
    "normalised": "(row - sample agent) / (pinned expert bound - sample agent), per task on mean percentiles of the "
                  "same data variant and task version; the expert bound is one named baseline, config and budget "
                  "(stated per task under the leaderboards), the mean over all its calibration seeds, never the best "
                  "single record; averaged over tasks where both references exist",
    "synthetic": "on synthetic data, percentiles and medals are computed against the human board but are not "
                 "comparable with it",
}


class TableRow(BaseModel):
    """One row of the paper's table in one scope (all tasks, a task type, a dimension or one task)."""

    model_config = ConfigDict(extra="forbid")

    data: Literal["synthetic", "real", "unknown"]
    variant: str  # real, synthetic-easy, synthetic-realistic, synthetic-unknown or unknown
    keys: dict[str, str]
    reference: Literal["calibration"] | None = None  # an expert baseline measured by `rexmle baselines calibrate`
    # "": every task at one version; else the task run at several versions whose runs at one version this row holds
    task_versions: str = ""
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
    n_competitions: int = 0
    interval_warnings: list[str] = Field(default_factory=list)  # why the s.e. or the CI says little (marked ‡)
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
    # the mean of the task's primary metric over the valid runs (one-task scopes only: metrics differ between tasks)
    primary_metric: str | None = None
    primary_mean: float | None = None
    primary_runs: int = 0
    cost_per_run: float | None  # None: unknown (a run of the row made calls without a price) or nothing recorded
    uncosted_calls: int = 0
    tokens_per_run: float | None
    # what one seed of the row cost: the row's runs' sums divided by its seeds (None: unknown, as cost_per_run)
    cost_per_seed: float | None = None
    gpu_hours_per_seed: float | None = None
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
    frame["task_versions"] = version_split(frame)
    keys = [*_key_columns(by), "data", "variant", "task_versions"]
    cell = [*keys, *(c for c in ("task_id", "seed_key") if c not in keys)]
    graded_last = frame.assign(_order=frame["graded"].astype(int)).sort_values(["_order", "finished_at"],
                                                                               na_position="first")
    duplicated = graded_last.duplicated(subset=cell, keep="last")
    dropped = list(graded_last.loc[duplicated, "run_id"])
    frame = graded_last.loc[~duplicated].drop(columns="_order")
    padding: list[dict[str, Any]] = []
    for (data_kind, variant, _split), of_kind in frame.groupby(["data", "variant", "task_versions"], sort=False):
        all_tasks = sorted(of_kind["task_id"].unique())
        versions = dict(zip(of_kind["task_id"], of_kind["task_version"].fillna("").astype(str), strict=True))
        for key, row_runs in of_kind.groupby(keys, sort=False, dropna=False):
            key_values = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
            task_axis = [key_values["task"]] if "task" in key_values else all_tasks
            seed_axis = [key_values["seed_key"]] if "seed_key" in key_values else sorted(row_runs["seed_key"].unique())
            present = set(zip(row_runs["task_id"], row_runs["seed_key"], strict=True))
            template = row_runs.iloc[0].to_dict()
            for task in task_axis:
                for seed in seed_axis:
                    if (task, seed) not in present:
                        padding.append(_padded_cell(template, task, seed, facts[task], data_kind, variant,
                                                    versions.get(task, "")))
    if padding:
        frame = pd.concat([frame, pd.DataFrame(padding)], ignore_index=True)
    return frame.reset_index(drop=True), dropped


def version_split(frame: Any) -> Any:
    """Per run: "" when its task was run at one version in its data variant, else ``"<task> <version>"``, the
    label of the row its runs of that version go to."""
    versions = frame["task_version"].fillna("").astype(str)
    counts = frame.assign(_v=versions).groupby(["variant", "task_id"])["_v"].transform("nunique")
    return (frame["task_id"] + " " + versions).where(counts > 1, "")


def _per_seed(values: np.ndarray, n_seeds: int) -> float | None:
    """The sum over a row's runs per seed; None when no run recorded the value."""
    known = values[~np.isnan(values)]
    return float(known.sum() / n_seeds) if len(known) and n_seeds else None


def _key_columns(by: Sequence[str]) -> list[str]:
    return ["seed_key" if k == "seed" else k for k in by]


def _padded_cell(template: dict[str, Any], task: str, seed: str, facts: Any, data_kind: str,
                 variant: str, task_version: str) -> dict[str, Any]:
    board = facts.board_rows
    cell = {k: template[k] for k in ("agent", "agent_version", "model", "config", "agent_config", "budget",
                                     "time_budget_s", "sandbox", "network", "heldout_reachable", "selection_k")}
    cell.update(
        run_id="", group=template["group"], run_dir="", data=data_kind, variant=variant,
        synthetic=template["synthetic"],
        task_id=task, task=task, task_version=task_version, task_versions=template["task_versions"],
        competition=facts.competition, task_type=facts.task_type,
        dim=facts.dim, seed=int(seed), seed_key=seed, state="missing", reason="no graded run for this cell",
        graded=False, grade_status="missing", valid=False, percentile=None,
        percentile_counted=0.0 if board else None, mean_position=None,
        position_counted=float(board + 1) if board else None, board_rows=board, gold=False, silver=False,
        bronze=False, any_medal=False, above_median=False, padded=True)
    return cell


class _Cells:
    """The padded cells of one row as numpy columns (pandas only groups the rows; every scope is a mask here)."""

    NUMBERS = ("percentile_counted", "position_counted", "cost_usd", "uncosted_calls", "tokens", "time_used_s",
               "time_budget_s", "steps", "primary_value", "gpu_hours")
    FLAGS = ("valid", "graded", "padded", "gold", "silver", "bronze", "any_medal", "above_median")
    TEXTS = ("task_id", "task_type", "dim", "primary_metric", "competition", "task_version")

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.columns = columns

    @classmethod
    def of(cls, frame: Any) -> _Cells:
        import pandas as pd

        missing = pd.Series(np.nan, index=frame.index)  # a frame from before a column existed: all unknown
        columns = {name: pd.to_numeric(frame.get(name, missing), errors="coerce").to_numpy(dtype=float)
                   for name in cls.NUMBERS}
        columns |= {name: frame[name].fillna(False).to_numpy(dtype=bool) for name in cls.FLAGS}
        columns |= {name: frame.get(name, missing).fillna("").astype(str).to_numpy() for name in cls.TEXTS}
        columns["seed"] = frame["seed"].to_numpy(dtype=int)
        return cls(columns)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def subset(self, mask: np.ndarray) -> _Cells:
        return _Cells({name: values[mask] for name, values in self.columns.items()})


def aggregate(frame: Any, by: Sequence[str], *, competition: Mapping[str, str],
              references: Mapping[tuple[str, str, str], tuple[float, float]], replicates: int,
              seed: int = 0) -> list[TableRow]:
    """Every (row, scope) of a padded frame (:func:`pad_grid`); ``references`` maps (variant, task, task version)
    to the (sample, pinned expert) mean percentiles of the normalised score. ``seed`` seeds every row's bootstrap
    together with the row's own keys (:func:`row_rng`)."""
    keys = [*_key_columns(by), "data", "variant", "task_versions"]
    rows: list[TableRow] = []
    for key, group in frame.groupby(keys, sort=True, dropna=False):
        key_values = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        data_kind = str(key_values.pop("data"))
        variant = str(key_values.pop("variant"))
        split = str(key_values.pop("task_versions"))
        shown = {("seed" if k == "seed_key" else k): str(v) for k, v in key_values.items()}
        cells = _Cells.of(group)
        scopes: list[tuple[str, str, _Cells]] = [("all", "all", cells)]
        for scope, column in (("task_type", "task_type"), ("dim", "dim"), ("task", "task_id")):
            if scope == "task" and "task" in by:
                continue
            scopes += [(scope, str(value), cells.subset(cells[column] == value)) for value in np.unique(cells[column])]
        for scope, value, part in scopes:
            # a row of one task version seeds its own bootstrap; rows without a split keep their seeds
            rng = row_rng(seed, f"{variant} {split}" if split else variant, shown, scope, value)
            rows.append(_stats(part, data_kind, variant, shown, scope, value, competition, references, replicates,
                               rng).model_copy(update={"task_versions": split}))
    return rows


def row_rng(seed: int, variant: str, keys: Mapping[str, str], scope: str, value: str) -> np.random.Generator:
    """The bootstrap generator of one (row, scope): from the report's seed and what names the row, never from how
    many rows came before it."""
    name = json.dumps([variant, dict(keys), scope, value], sort_keys=True)
    return np.random.default_rng([seed, int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")])


def interval_warnings(n_competitions: int, n_seeds: int, *, has_ci: bool, has_se: bool) -> list[str]:
    """Why a row's s.e. or 95% CI says little (see the module docstring); empty when both rest on enough data."""
    warnings = []
    units, unit = (n_competitions, "competition") if n_competitions >= 2 else (n_seeds, "seed")
    if has_ci and units < MIN_INTERVAL_UNITS:
        warnings.append(f"95% CI from {units} {unit}(s) (fewer than {MIN_INTERVAL_UNITS}): it only spans the "
                        f"{unit} means it was drawn from")
    if has_se and n_seeds < MIN_SE_SEEDS:
        warnings.append(f"s.e. from {n_seeds} seeds (fewer than {MIN_SE_SEEDS})")
    return warnings


def _stats(part: _Cells, data_kind: str, variant: str, keys: dict[str, str], scope: str, value: str,
           competition: Mapping[str, str], references: Mapping[tuple[str, str, str], tuple[float, float]],
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
        board_versions = part["task_version"][on_board]
        for i, (task, mean) in enumerate(zip(tasks, task_means, strict=True)):
            ref = references.get((variant, str(task), str(board_versions[task_index == i][0])))
            if ref is not None and ref[1] > ref[0]:
                normalised.append(float((mean - ref[0]) / (ref[1] - ref[0])))
    real = ~part["padded"]
    n_board = int(on_board.sum())
    n_competitions = len({competition.get(str(t), str(t)) for t in tasks})
    n_seeds = len(np.unique(part["seed"]))
    uncosted = int(np.nansum(part["uncosted_calls"][real]))
    scored = real & part["valid"] & ~np.isnan(part["primary_value"])
    metric_names = set(part["primary_metric"][scored].tolist())
    one_metric = len(np.unique(part["task_id"])) == 1 and len(metric_names) == 1

    def count(flag: str) -> int:
        return int(part[flag][on_board].sum())

    return TableRow(
        keys=keys, scope=scope, scope_value=value,  # type: ignore[arg-type]
        data=data_kind, variant=variant,  # type: ignore[arg-type]
        n_tasks=len(np.unique(part["task_id"])), n_board_tasks=len(tasks), n_seeds=n_seeds,
        n_runs=n_runs, n_missing=int((~part["graded"]).sum()), n_valid=int(part["valid"].sum()),
        valid_rate=float(part["valid"].mean()) if n_runs else 0.0, mean_percentile=_mean(pct),
        median_percentile=float(np.median(pct)) if len(pct) else None, se_percentile=se, ci_low=ci_low,
        ci_high=ci_high, n_competitions=n_competitions,
        interval_warnings=interval_warnings(n_competitions, n_seeds, has_ci=ci_low is not None,
                                            has_se=se is not None),
        mean_position=_mean(part["position_counted"][on_board]), gold=count("gold"),
        silver=count("silver"), bronze=count("bronze"), medals=count("any_medal"),
        medal_rate=count("any_medal") / n_board if n_board else None, above_median=count("above_median"),
        above_median_rate=count("above_median") / n_board if n_board else None,
        normalised=float(np.mean(normalised)) if normalised else None, normalised_tasks=len(normalised),
        primary_metric=metric_names.pop() if one_metric else None,
        primary_mean=_mean(part["primary_value"][scored]) if one_metric else None,
        primary_runs=int(scored.sum()) if one_metric else 0,
        cost_per_run=None if uncosted else _mean(part["cost_usd"][real]), uncosted_calls=uncosted,
        tokens_per_run=_mean(part["tokens"][real]),
        cost_per_seed=None if uncosted else _per_seed(part["cost_usd"][real], n_seeds),
        gpu_hours_per_seed=_per_seed(part["gpu_hours"][real], n_seeds),
        time_used_s=_mean(part["time_used_s"][real]), time_budget_s=_mean(part["time_budget_s"]),
        steps_per_run=_mean(part["steps"][real]),
        tasks_without_board=sorted(set(part["task_id"][~on_board].tolist()) - set(tasks.tolist())),
        comparable_with_board=data_kind == "real",
    )


def _mean(values: np.ndarray) -> float | None:
    """The mean of the known values (NaN stands for unknown), None when none is known."""
    known = values[~np.isnan(values)]
    return float(known.mean()) if len(known) else None


class ExpertPin(BaseModel):
    """The normalised score's 1 for one task: a named baseline, config and budget, pinned at a version. Changing any
    of these is a new pin (a new ``version``), so two reports that state the same pin used the same reference."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    baseline: str
    config: str
    time_budget_s: float | None = None  # None: the config's own budget (no --time-budget override)
    version: str = "1"

    @property
    def name(self) -> str:
        budget = "config budget" if self.time_budget_s is None else f"budget {self.time_budget_s:g} s"
        return f"{self.baseline}/{self.config} ({budget}) pin v{self.version}"


class ExpertBound(BaseModel):
    """A pinned expert measured: every calibration seed of the pin on one data variant and task version."""

    model_config = ConfigDict(extra="forbid")

    pin: ExpertPin
    variant: str
    task_version: str
    seeds: list[int]
    seed_percentiles: list[float]  # per calibration record, an invalid submission counted as 0
    mean_percentile: float

    def describe(self) -> str:
        seeds = ", ".join(f"s{s} {p:.1%}" for s, p in zip(self.seeds, self.seed_percentiles, strict=True))
        few = "" if len(self.seeds) >= MIN_SE_SEEDS else f"; only {len(self.seeds)} seed(s), fewer than " \
                                                          f"{MIN_SE_SEEDS}: not enough for a claim"
        return (f"{self.pin.name}, task {self.task_version}, {self.variant}: mean {self.mean_percentile:.1%} over "
                f"{len(self.seeds)} seed(s) ({seeds}){few}")


def expert_bounds(calibration: Sequence[Any], pins: Mapping[str, ExpertPin]) -> list[ExpertBound]:
    """Each pin measured on each (data variant, task version) it has calibration records of: the mean over all of
    them. Records of another baseline, config or budget are never the bound, however high they scored."""
    groups: dict[tuple[str, str, str], list[Any]] = {}
    for record in calibration:
        pin = pins.get(record.task_id)
        if pin is None or (record.baseline, record.config) != (pin.baseline, pin.config) \
                or record.time_budget_s != pin.time_budget_s or (record.percentile is None and record.valid):
            continue
        groups.setdefault((record.task_id, calibration_variant(record), record.task_version), []).append(record)
    bounds = []
    for (task_id, variant, version), records in sorted(groups.items()):
        records.sort(key=lambda r: r.seed)
        values = [float(r.percentile) if r.valid else 0.0 for r in records]
        bounds.append(ExpertBound(pin=pins[task_id], variant=variant, task_version=version,
                                  seeds=[r.seed for r in records], seed_percentiles=values,
                                  mean_percentile=float(np.mean(values))))
    return bounds


def reference_percentiles(frame: Any, bounds: Sequence[ExpertBound]) -> dict[tuple[str, str, str],
                                                                           tuple[float, float]]:
    """(variant, task, task version) -> (the sample agent's mean percentile, the pinned expert's), where both
    exist."""
    graded = frame[frame["graded"].astype(bool) & frame["percentile_counted"].notna()]
    sample = graded[graded["agent"] == "sample"]
    low = sample.groupby(["variant", "task_id", "task_version"])["percentile_counted"].mean().to_dict()
    high = {(b.variant, b.pin.task_id, b.task_version): b.mean_percentile for b in bounds}
    return {key: (float(low[key]), high[key]) for key in low if key in high}


def calibration_variant(record: Any) -> str:
    """The data variant of a calibration record: as loaded with it (:class:`Calibrated`), else ``real`` or
    ``synthetic-unknown`` (a record says only whether its data was synthetic, not at which difficulty)."""
    variant = getattr(record, "variant", None)
    if isinstance(variant, str) and variant:
        return variant
    return "synthetic-unknown" if record.synthetic else "real"


class Calibrated:
    """A calibration record with the data variant it was measured on (the prepared task beside it)."""

    def __init__(self, record: Any, variant: str) -> None:
        self.record, self.variant = record, variant

    def __getattr__(self, name: str) -> Any:
        return getattr(self.record, name)


def calibration_rows(calibration: Sequence[Any], facts: Mapping[str, Any]) -> list[TableRow]:
    """The calibrated expert baselines as reference rows of their task: one row per (data, task, task version,
    baseline, config, budget) over all its seeds (mean, median, s.e. over seeds; an invalid run counts as percentile
    0 on a board), never padded."""
    groups: dict[tuple[str, str, str, str, str, float | None], list[Any]] = {}
    for record in calibration:
        groups.setdefault((calibration_variant(record), record.task_id, getattr(record, "task_version", ""),
                           record.baseline, record.config, getattr(record, "time_budget_s", None)), []).append(record)
    rows = []
    for (variant, task_id, version, baseline, config, budget), records in groups.items():
        synthetic = variant != "real"
        board = facts[task_id].board_rows
        counted = [r.percentile if r.valid and r.percentile is not None else 0.0 for r in records] if board else []
        pct = np.array(counted, dtype=float)
        seeds = {r.seed for r in records}
        n_valid = sum(bool(r.valid) for r in records)
        seconds = np.array([float(r.seconds) for r in records], dtype=float)
        rows.append(TableRow(
            data="synthetic" if synthetic else "real", variant=variant, reference="calibration",
            keys={"agent": f"baseline:{baseline}", "model": "-", "config": f"config={config}",
                  "budget": "-" if budget is None else f"{budget:g}s"}, task_versions=f"{task_id} {version}",
            scope="task", scope_value=task_id, n_tasks=1, n_board_tasks=1 if board else 0, n_seeds=len(seeds),
            n_runs=len(records), n_missing=0, n_valid=n_valid, valid_rate=n_valid / len(records),
            mean_percentile=_mean(pct), median_percentile=float(np.median(pct)) if len(pct) else None,
            se_percentile=float(pct.std(ddof=1) / np.sqrt(len(pct))) if len(pct) >= 2 else None, ci_low=None,
            ci_high=None, interval_warnings=interval_warnings(0, len(seeds), has_ci=False, has_se=len(pct) >= 2),
            mean_position=None, gold=0, silver=0, bronze=0, medals=0, medal_rate=None, above_median=0,
            above_median_rate=None, normalised=None, normalised_tasks=0, cost_per_run=None, tokens_per_run=None,
            time_used_s=_mean(seconds), time_budget_s=None, steps_per_run=None,
            tasks_without_board=[] if board else [task_id], comparable_with_board=not synthetic))
    return rows
