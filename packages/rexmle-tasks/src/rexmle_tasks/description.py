"""Agent-facing task descriptions.

``challenges/<id>/description.md`` is written by us and may use these placeholders, filled at prepare time:
``{{submission_format}}`` (generated from the grader's schema, so description and grader never disagree),
``{{metrics}}`` (the grader's metric table), ``{{conventions}}`` (the grader's documented conventions),
``{{validation_metric}}`` (the one metric an agent should measure on its own validation cases, from the grader),
``{{n_train}}``, ``{{n_test}}``. A template without ``{{submission_format}}`` or ``{{validation_metric}}`` gets
that section appended.
"""

from __future__ import annotations

import re

from rexmle_grade.errors import RexmleError
from rexmle_grade.grader import Direction, Grader, TestManifest
from rexmle_tasks.base import Task

_PLACEHOLDER = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")


def render_description(task: Task, manifest: TestManifest, *, n_train: int) -> str:
    grader = task.grader
    fields = {
        "submission_format": grader.schema.to_markdown(list(manifest.ids)),
        "metrics": grader.describe_metrics_markdown(),
        "conventions": "\n".join(f"- {c}" for c in grader.conventions) or "- none",
        "n_train": str(n_train),
        "n_test": str(len(manifest.ids)),
        "validation_metric": validation_metric_text(grader),
    }
    text = task.description_template
    used = {m.group(1) for m in _PLACEHOLDER.finditer(text)}
    if used - set(fields):
        raise RexmleError(f"{task.folder / 'description.md'} uses unknown placeholder(s) {sorted(used - set(fields))}"
                          f"; known: {sorted(fields)}")
    if "validation_metric" not in used:
        text += "\n\n## Validation metric\n\n{{validation_metric}}\n"
    if "submission_format" not in used:
        text += "\n\n## Submission format\n\n{{submission_format}}\n"
    # one pass, so that text inserted for one placeholder is never searched for another
    text = _PLACEHOLDER.sub(lambda m: fields[m.group(1)], text)
    return text.rstrip() + "\n"


def validation_metric_text(grader: Grader) -> str:
    """The sentence that names the metric to report while developing (agents compare their solutions by it)."""
    metric = grader.validation_metric
    better = "higher" if metric.direction is Direction.HIGHER_BETTER else "lower"
    others = [m.name for m in grader.ranked_metrics if m.name != metric.name]
    ranked = (f" The leaderboard also ranks by {', '.join(f'`{m}`' for m in others)}; `{metric.name}` is the one "
              "to report." if others else "")
    return (f"Measure `{metric.name}` ({better} is better: {metric.description}) on training cases you hold out, "
            f"and report that number as your validation metric.{ranked}")
