"""Results a researcher can publish: run folders read through one typed loader, validated against the published
run-format schema, turned into tidy tables, the paper's table (with standard errors and hierarchical-bootstrap
CIs), figures and a self-contained HTML viewer.

```python
from rexmle_agents.results import build_group_report, load_runs, tidy_tables

runs = load_runs(["runs/paper"])          # run folders, group folders or runs roots
tables = tidy_tables(runs)                # pandas: runs, nodes, model_calls, grades, metrics
report = build_group_report(runs)         # the table in every scope, its rules, caveats, the entries
```

Modules: ``records`` (the run format as typed records), ``schemas`` (the published JSON Schema files), ``loader``,
``rows`` (one row per run), ``stats`` (padding, aggregation, bootstrap), ``report`` (the group report and its
rendering), ``tables``, ``trajectory`` (a run node by node), ``figures``, ``view`` (HTML), ``live`` (progress of
running runs), ``cli`` (``rexmle report``, ``rexmle view``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_group_report", "load_run", "load_runs", "tidy_tables"]


def __getattr__(name: str) -> Any:  # heavy modules (pandas, matplotlib) are imported on first use only
    if name in ("load_run", "load_runs"):
        from rexmle_agents.results import loader

        return getattr(loader, name)
    if name == "build_group_report":
        from rexmle_agents.results.report import build_group_report

        return build_group_report
    if name == "tidy_tables":
        from rexmle_agents.results.tables import tidy_tables

        return tidy_tables
    raise AttributeError(name)
