"""Ranking a submission against a human leaderboard.

Definitions (CHALLENGES.md §2, fixed here once for all 20 challenges):

* per ranked metric m with N leaderboard rows: ``position_m = 1 + #{rows strictly better than the submission}``
  (ties go to the better position, like ``pandas.rank(method="min")``);
* ``mean_position`` = mean of the per-metric positions; ``percentile = 1 - (mean_position - 1) / N``
  (1.0: better than or tied with every row on every metric; 0.0: last on every metric);
* medals compare the submission's mean position with the leaderboard rows' mean positions, rows sorted by rank:
  gold if ``<= mp[0]``, silver if ``<= mp[1]``, bronze if ``<= mp[2]``; ``above_median`` if ``<= mp[N // 2]``.
  ``mp`` is recomputed from the rows' values (exactly what the CSV's ``mean_position`` records, but unrounded: the
  CSVs round to 2 decimals, so a submission tying the top row on every metric would otherwise miss gold by 0.003);
* ``inserted_rank``: the submission's rank when it is added to the board and every row's mean position is
  recomputed among the N+1 entries (ties share the better rank).

NaN handling (explicit): a NaN or missing submission metric takes the worst position N+1 for that metric and is
listed in ``nan_metrics``; NaN cells of the leaderboard never count as better than the submission.
"""

from __future__ import annotations

import csv
import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rexmle_grade.errors import RexmleError, UserInputError
from rexmle_grade.grader import Direction

LEADERBOARD_FIXED_COLUMNS = ("rank", "team", "mean_position")


@dataclass(frozen=True)
class LeaderboardProvenance:
    source_url: str = ""
    via: str = ""
    retrieved: str = ""
    phase: str = ""
    notes: str = ""


@dataclass(frozen=True)
class Leaderboard:
    """Human leaderboard rows (sorted by rank) with the ranked metrics and their directions."""

    teams: tuple[str, ...]
    mean_positions: tuple[float, ...]
    values: Mapping[str, tuple[float, ...]]  # metric -> one value per row
    directions: Mapping[str, Direction]
    recorded_positions: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    provenance: LeaderboardProvenance = field(default_factory=LeaderboardProvenance)
    version: str = ""

    @property
    def metrics(self) -> list[str]:
        return list(self.values)

    @property
    def n_rows(self) -> int:
        return len(self.teams)

    @classmethod
    def from_csv(cls, path: Path, directions: Mapping[str, Direction], *,
                 provenance: LeaderboardProvenance | None = None, version: str = "") -> Leaderboard:
        """Read ``rank, team, mean_position, <m>, <m>_position, ...``; ranked metrics = columns with a direction."""
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        if not rows:
            raise RexmleError(f"leaderboard {path} has no rows")
        header = list(rows[0])
        missing = [c for c in LEADERBOARD_FIXED_COLUMNS if c not in header]
        if missing:
            raise RexmleError(f"leaderboard {path} lacks columns {missing}")
        rows.sort(key=lambda r: float(r["rank"]))
        metrics = [c for c in header if c not in LEADERBOARD_FIXED_COLUMNS and not c.endswith("_position")]
        unknown = [m for m in metrics if m not in directions]
        if unknown:
            raise RexmleError(f"leaderboard {path} has metric columns {unknown} without a direction")
        return cls(
            teams=tuple(r["team"] for r in rows),
            mean_positions=tuple(float(r["mean_position"]) for r in rows),
            values={m: tuple(_float(r[m]) for r in rows) for m in metrics},
            directions={m: Direction(directions[m]) for m in metrics},
            recorded_positions={m: tuple(_float(r[f"{m}_position"]) for r in rows)
                                for m in metrics if f"{m}_position" in header},
            provenance=provenance or LeaderboardProvenance(),
            version=version,
        )


def _float(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def _better(a: float, b: float, direction: Direction) -> bool:
    """Is ``a`` strictly better than ``b``? NaN is never better."""
    if math.isnan(a):
        return False
    if math.isnan(b):
        return True
    return a > b if direction is Direction.HIGHER_BETTER else a < b


def position(value: float | None, column: Sequence[float], direction: Direction) -> int:
    """1 + number of leaderboard values strictly better than ``value`` (NaN/None: worst, len+1)."""
    if value is None or math.isnan(value):
        return len(column) + 1
    return 1 + sum(1 for v in column if _better(v, value, direction))


@dataclass(frozen=True)
class RankResult:
    """Where a submission lands on a leaderboard.

    ``thresholds`` (gold, silver, bronze, median) are the mean positions of the board's rows recomputed from their
    unrounded metric values, not the 2-decimal ``mean_position`` column of the leaderboard CSV; medals and
    ``above_median`` compare the submission's mean position with them.
    """

    positions: dict[str, int]
    mean_position: float
    percentile: float
    gold: bool
    silver: bool
    bronze: bool
    above_median: bool
    inserted_rank: int
    n_rows: int
    nan_metrics: list[str]
    thresholds: dict[str, float]

    @property
    def any_medal(self) -> bool:
        return self.gold or self.silver or self.bronze

    @property
    def medal(self) -> str | None:
        return "gold" if self.gold else "silver" if self.silver else "bronze" if self.bronze else None

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "any_medal": self.any_medal, "medal": self.medal}


def rank_submission(leaderboard: Leaderboard, metrics: Mapping[str, float | None]) -> RankResult:
    """Rank one submission's metrics against ``leaderboard`` (see module docstring).

    ``metrics`` may hold a grader's unranked metrics beside the board columns, and may leave out a board column
    (which counts as NaN: the worst position). Both at once is taken for a misspelling, which would otherwise rank
    last silently: a name that is not a board column while a board column is missing raises
    :class:`UserInputError`.
    """
    unknown = sorted(set(metrics) - set(leaderboard.metrics))
    if unknown and any(m not in metrics for m in leaderboard.metrics):
        close = {name: difflib.get_close_matches(name, leaderboard.metrics, n=1) for name in unknown}
        hint = "; ".join(f"{name!r}: did you mean {match[0]!r}?" for name, match in close.items() if match)
        raise UserInputError(f"metric(s) {unknown} are not columns of the leaderboard; its columns are "
                             f"{leaderboard.metrics}", hint=hint or "pass only the leaderboard's ranked metrics")
    n = leaderboard.n_rows
    positions: dict[str, int] = {}
    nan_metrics: list[str] = []
    for m in leaderboard.metrics:
        value = metrics.get(m)
        if value is None or math.isnan(value):
            nan_metrics.append(m)
        positions[m] = position(value, leaderboard.values[m], leaderboard.directions[m])
    mean_pos = sum(positions.values()) / len(positions)
    mp = rerank(leaderboard)
    thresholds = {"gold": mp[0], "silver": mp[min(1, n - 1)], "bronze": mp[min(2, n - 1)], "median": mp[n // 2]}
    gold = mean_pos <= thresholds["gold"]
    silver = not gold and mean_pos <= thresholds["silver"]
    bronze = not (gold or silver) and mean_pos <= thresholds["bronze"]
    return RankResult(
        positions=positions, mean_position=mean_pos, percentile=1.0 - (mean_pos - 1.0) / n,
        gold=gold, silver=silver, bronze=bronze, above_median=mean_pos <= thresholds["median"],
        inserted_rank=inserted_rank(leaderboard, metrics), n_rows=n, nan_metrics=nan_metrics,
        thresholds=thresholds,
    )


def rerank(leaderboard: Leaderboard, extra: Mapping[str, float | None] | None = None) -> list[float]:
    """Mean positions of every row (and of ``extra`` appended last) recomputed among the rows present."""
    columns = {m: list(v) for m, v in leaderboard.values.items()}
    if extra is not None:
        for m in columns:
            value = extra.get(m)
            columns[m].append(math.nan if value is None else float(value))
    size = leaderboard.n_rows + (extra is not None)
    means = []
    for i in range(size):
        total = 0
        for m, col in columns.items():
            direction = leaderboard.directions[m]
            total += position(col[i], col[:i] + col[i + 1:], direction)
        means.append(total / len(columns))
    return means


def inserted_rank(leaderboard: Leaderboard, metrics: Mapping[str, float | None]) -> int:
    """Rank of the submission among the N+1 entries after re-ranking everything (ties share the better rank)."""
    means = rerank(leaderboard, metrics)
    mine = means[-1]
    return 1 + sum(1 for v in means[:-1] if v < mine - 1e-12)
