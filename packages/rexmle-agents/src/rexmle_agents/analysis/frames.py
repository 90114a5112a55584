"""Tidy tables (pandas) of an analysis, and their aggregates per agent x model x task type.

```python
f = analysis_frames(result.analyses)
f.verdicts       # one row per run x factor x source (judge, detector): status, demonstrated, evidence counts
f.comparison     # one row per run x factor: the judge's and the detector's verdicts side by side, agreeing or not
f.runs           # one row per run: keys and the failure analysis (why it ended, crash share, time split, final valid)
f.steps          # one row per node or step: outcome and error type (with the validator's reason)
capability_table(f.verdicts)   # share of runs demonstrating each factor, per source and group, with the share
                               # of the judge's claims that were rejected (unverified) beside it
failure_table(f.runs, f.steps) # crash share, error types, end reasons, time shares, valid rate, per group
```

The run keys (agent, model label, config, task type, data kind) are the results layer's (:func:`rexmle_agents.
results.rows.run_row`), so these tables join ``tidy_tables(...).runs`` on ``run_id``. Synthetic and real runs are
kept apart by the ``data`` key of every group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rexmle_agents.analysis.records import RunAnalysis
from rexmle_grade.csvsafe import frame_to_csv

DEFAULT_BY = ("data", "agent", "model", "task_type")
_KEYS = ("run_id", "data", "agent", "model", "config", "task_id", "task_type", "seed")


def _key(analysis: RunAnalysis) -> dict[str, Any]:
    return {k: getattr(analysis, k) for k in _KEYS}


@dataclass
class AnalysisFrames:
    verdicts: Any
    comparison: Any
    runs: Any
    steps: Any

    def write(self, folder: Path) -> list[Path]:
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for name in ("verdicts", "comparison", "runs", "steps"):
            path = folder / f"{name}.csv"
            frame_to_csv(getattr(self, name), path)  # agent text never runs as a spreadsheet formula
            written.append(path)
        return written


def analysis_frames(analyses: Sequence[RunAnalysis]) -> AnalysisFrames:
    import pandas as pd

    verdicts, comparison, runs, steps = [], [], [], []
    for analysis in analyses:
        key = _key(analysis)
        for v in analysis.verdicts:
            verdicts.append({**key, "factor": v.factor, "source": v.source, "status": v.status,
                             "demonstrated": v.demonstrated, "judged": v.judged,
                             "quotes": len(v.evidence), "verified_quotes": sum(q.verified for q in v.evidence),
                             "unverified_claims": v.unverified_claims, "chunks": len(v.chunks),
                             "detector": v.detector, "judge_model": v.judge.model if v.judge else None,
                             "prompt_version": v.judge.prompt_version if v.judge else None,
                             "rubric_version": v.rubric_version})
        for factor in dict.fromkeys(v.factor for v in analysis.verdicts):
            judge, detector = analysis.verdict(factor, "judge"), analysis.verdict(factor, "detector")
            both = judge is not None and detector is not None and judge.judged and detector.judged
            comparison.append({**key, "factor": factor, "judge": judge.status if judge else None,
                               "detector": detector.status if detector else None,
                               "agree": (judge.demonstrated == detector.demonstrated) if both else None})  # type: ignore[union-attr]
        f = analysis.failures
        total = f.time_s or 0.0
        runs.append({**key, "state": f.state, "end": f.end, "limit": f.limit, "steps": f.steps,
                     "executed": f.executed, "crashed": f.crashed, "invalid": f.invalid,
                     "crash_share": f.crashed / f.executed if f.executed else None,
                     "time_s": f.time_s, "exec_s": f.exec_s, "model_s": f.model_s, "idle_s": f.idle_s,
                     "exec_share": min(1.0, f.exec_s / total) if total else None,
                     "model_share": min(1.0, f.model_s / total) if total else None,
                     "idle_share": f.idle_s / total if total else None, "retry_s": f.retry_s,
                     "final_valid": f.final_valid, "final_source": f.final_source})
        steps += [{**key, "node": o.node, "stage": o.stage, "outcome": o.outcome, "error_type": o.error_type,
                   "detail": o.detail, "exit_code": o.exit_code, "stopped_by": o.stopped_by} for o in f.outcomes]
    return AnalysisFrames(verdicts=pd.DataFrame(verdicts, columns=[*_KEYS, "factor", "source", "status",
                                                                   "demonstrated", "judged", "quotes",
                                                                   "verified_quotes", "unverified_claims", "chunks",
                                                                   "detector", "judge_model", "prompt_version",
                                                                   "rubric_version"]),
                          comparison=pd.DataFrame(comparison, columns=[*_KEYS, "factor", "judge", "detector",
                                                                       "agree"]),
                          runs=pd.DataFrame(runs), steps=pd.DataFrame(steps))


def unverified_dominates(demonstrated: int, unverified: int) -> bool:
    """Most of the judge's claims were rejected (no quote found in the code that ran): its share then says more
    about its quoting than about the runs."""
    return unverified > demonstrated


def capability_table(verdicts: Any, by: Sequence[str] = DEFAULT_BY) -> Any:
    """Per group x factor x source: runs, judged runs (errors and unjudged runs left out), demonstrated, their
    share, unverified claims beside it (count, share of the judged runs, and ``unverified_dominates`` when they
    outnumber the demonstrated ones: a judge whose claims were all rejected must not read as one that found
    nothing), errors."""
    import pandas as pd

    columns = [*by, "factor", "source", "runs", "judged", "demonstrated", "share", "unverified", "unverified_share",
               "unverified_dominates", "errors", "not_run"]
    if verdicts.empty:
        return pd.DataFrame(columns=columns)
    frame = verdicts[verdicts["status"] != "not_applicable"]
    rows = []
    for keys, group in frame.groupby([*by, "factor", "source"], sort=True, dropna=False):
        judged = int(group["judged"].sum())
        shown = int(group["demonstrated"].sum())
        unverified = int((group["status"] == "unverified").sum())
        rows.append({**dict(zip([*by, "factor", "source"], keys, strict=True)), "runs": len(group),
                     "judged": judged, "demonstrated": shown, "share": shown / judged if judged else None,
                     "unverified": unverified, "unverified_share": unverified / judged if judged else None,
                     "unverified_dominates": unverified_dominates(shown, unverified),
                     "errors": int((group["status"] == "error").sum()),
                     "not_run": int((group["status"] == "not_run").sum())})
    return pd.DataFrame(rows, columns=columns)


def failure_table(runs: Any, steps: Any, by: Sequence[str] = DEFAULT_BY) -> Any:
    """Per group: runs, steps, the share of executed steps that crashed and that gave an invalid submission, the
    share of each error type among failed steps, why runs ended, the time shares and the final valid rate."""
    import pandas as pd

    if runs.empty:
        return pd.DataFrame(columns=[*by, "runs"])
    rows = []
    for keys, group in runs.groupby(list(by), sort=True, dropna=False):
        record: dict[str, Any] = dict(zip(by, keys if isinstance(keys, tuple) else (keys,), strict=True))
        executed = int(group["executed"].sum())
        record.update(runs=len(group), steps=int(group["steps"].sum()), executed=executed,
                      crash_share=group["crashed"].sum() / executed if executed else None,
                      invalid_share=group["invalid"].sum() / executed if executed else None,
                      final_valid_rate=float(group["final_valid"].fillna(False).astype(bool).mean()),
                      exec_share=group["exec_share"].mean(), model_share=group["model_share"].mean(),
                      idle_share=group["idle_share"].mean(), mean_time_s=group["time_s"].mean())
        for end, count in group["end"].value_counts().sort_index().items():
            record[f"end:{end}"] = int(count)
        if not steps.empty:
            failed = steps[steps["run_id"].isin(group["run_id"]) & steps["error_type"].notna()]
            for kind, count in failed["error_type"].value_counts().sort_index().items():
                record[f"error:{kind}"] = count / len(failed)
        rows.append(record)
    return pd.DataFrame(rows)
