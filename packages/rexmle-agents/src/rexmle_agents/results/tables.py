"""Tidy tables of a set of runs (pandas), for notebooks and for ``rexmle report --tables DIR``.

```python
from rexmle_agents.results import load_runs, tidy_tables

t = tidy_tables(load_runs(["runs/paper"]))
t.runs          # one row per run: keys, data variant, score and raw primary metric, comparability columns
                # (hardware, budgets, tokens, cost: empty when a call had no price, see uncosted_calls; versions)
t.nodes         # one row per search node (scaffolds) or step (other agents): stage, metric, bug, time, tokens, cost
t.model_calls   # one row per model call: time, step, model, tokens, cost, duration, retry time
t.grades        # one row per graded run: status, percentile, position, medals, board size
t.metrics       # one row per (graded run, metric): the metric values, long form
```

``runs`` is cheap (three small files per run); the other tables read the journals.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rexmle_agents.results.loader import RunSet
from rexmle_agents.results.rows import run_row
from rexmle_agents.results.trajectory import trajectory
from rexmle_grade.csvsafe import frame_to_csv
from rexmle_grade.errors import ConfigurationError

TABLE_NAMES = ("runs", "nodes", "model_calls", "grades", "metrics")


@dataclass
class TidyTables:
    runs: Any
    nodes: Any
    model_calls: Any
    grades: Any
    metrics: Any

    def write(self, folder: Path, fmt: str = "csv") -> list[Path]:
        """Each table as ``<folder>/<name>.csv`` (or ``.parquet``, which needs pyarrow)."""
        if fmt not in ("csv", "parquet"):
            raise ConfigurationError(f"table format {fmt!r} is not csv or parquet")
        if fmt == "parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError as exc:
                raise ConfigurationError("Parquet tables need pyarrow, which is not installed",
                                         hint="pip install pyarrow -c constraints.txt, or use --table-format csv") \
                    from exc
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for name in TABLE_NAMES:
            frame = getattr(self, name)
            path = folder / f"{name}.{fmt}"
            if fmt == "csv":
                frame_to_csv(frame, path)  # agent text in a cell never runs as a spreadsheet formula
            else:
                frame.to_parquet(path, index=False)
            written.append(path)
        return written


def tidy_tables(runs: RunSet) -> TidyTables:
    import pandas as pd

    run_rows = [run_row(run).model_dump() for run in runs.runs]
    nodes: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    grades: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    for run in runs.runs:
        key = {"run_id": run.run_id, "variant": run.variant, "task_id": run.spec.task_id, "agent": run.spec.agent,
               "seed": run.spec.seed}
        path = trajectory(run)
        for node in path.nodes:
            nodes.append({**key, "kind": path.kind, "node": node.id, "parent": node.parent, "stage": node.stage,
                          "status": node.status, "step": node.step, "metric": node.metric,
                          "lower_is_better": node.lower_is_better, "buggy": node.buggy, "valid": node.valid,
                          "final": node.final, "snapshot": node.snapshot,
                          "selection_score": (node.selection or {}).get("score"),
                          "started": node.started, "finished": node.finished, "seconds": node.seconds,
                          "model_calls": node.model_calls, "tokens": node.tokens, "cost_usd": node.cost_usd,
                          "uncosted_calls": node.uncosted_calls,
                          "executions": len(node.executions)})
        for call in path.model_calls:
            calls.append({**key, "time": call.time, "step": call.step, "model": call.model,
                          "input_tokens": call.usage.input_tokens, "output_tokens": call.usage.output_tokens,
                          "cached_input_tokens": call.usage.cached_input_tokens, "usage_known": call.usage_known,
                          "cost_usd": call.cost_usd, "duration_s": call.duration_s,
                          "retry_time_s": call.retry_time_s, "finish_reason": call.finish_reason})
        grade = run.grade
        if grade is None:
            continue
        grades.append({**key, "data": run.data_kind, "status": grade.status, "valid": grade.valid_submission,
                       "percentile": grade.percentile, "mean_position": grade.score,
                       "board_rows": grade.leaderboard_rows, "inserted_rank": grade.inserted_rank,
                       "gold": grade.gold_medal, "silver": grade.silver_medal, "bronze": grade.bronze_medal,
                       "above_median": grade.above_median, "grader_id": grade.grader_id,
                       "task_version": grade.task_version, "leaderboard_version": grade.leaderboard_version,
                       "problems": len(grade.problems), "seconds": grade.seconds})
        metrics += [{**key, "metric": name, "value": value,
                     "position": (grade.positions or {}).get(name)} for name, value in grade.metrics.items()]
    return TidyTables(runs=pd.DataFrame(run_rows), nodes=pd.DataFrame(nodes), model_calls=pd.DataFrame(calls),
                      grades=pd.DataFrame(grades), metrics=pd.DataFrame(metrics))
