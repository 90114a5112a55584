"""Capability analysis of runs: which of the 13 ReX-MLE success factors a run demonstrates, proven by quotes from
its own code and outputs, and why runs fail.

```python
from rexmle_agents.analysis import Judge, analyse_runs, load_rubrics
from rexmle_agents.models import Budget, UsageLedger, get_model
from rexmle_agents.results import load_runs

ledger = UsageLedger(journal=Path("analysis/judge-calls.jsonl"), budget=Budget(max_cost_usd=20))
judge = Judge(get_model("anthropic/claude-sonnet-4-5", ledger=ledger), load_rubrics())
result = analyse_runs(load_runs(["runs/paper"]), Path("analysis"), judge=judge)   # judge=None: detectors only
result.manifest.complete, result.analyses[0].verdicts
```

Modules: ``factors`` (the rubrics, package data), ``evidence`` (a run's code and outputs, quote checks, chunks),
``detectors`` (deterministic verdicts), ``judge`` (the model judge), ``failures`` (why runs fail), ``records`` (what
is written), ``pipeline`` (``analyse_runs``), ``frames`` (tidy tables and aggregates), ``figures``, ``agreement``
(Cohen's kappa against human labels), ``examples`` (labelled example runs), ``cli`` (``rexmle analyse``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Judge", "analyse_runs", "load_analyses", "load_rubrics"]


def __getattr__(name: str) -> Any:  # pandas and matplotlib are imported on first use only
    if name == "Judge":
        from rexmle_agents.analysis.judge import Judge

        return Judge
    if name in ("analyse_runs", "load_analyses"):
        from rexmle_agents.analysis import pipeline

        return getattr(pipeline, name)
    if name == "load_rubrics":
        from rexmle_agents.analysis.factors import load_rubrics

        return load_rubrics
    raise AttributeError(name)
