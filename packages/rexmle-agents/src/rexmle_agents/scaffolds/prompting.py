"""Prompt templates (package data in ``prompts/``, ``string.Template`` placeholders) and the pieces they share.

``$name`` placeholders are used rather than ``str.format`` because prompts embed code and JSON full of braces.
"""

from __future__ import annotations

import functools
from importlib.resources import files
from string import Template
from typing import TYPE_CHECKING, Any

from rexmle_grade.errors import ConfigurationError

if TYPE_CHECKING:
    from rexmle_agents.harness.context import RunContext
    from rexmle_agents.scaffolds.node import Node
    from rexmle_agents.scaffolds.tree import Tree

EXPERT_REPORT_FILENAME = "expert_report.md"


@functools.cache
def template(name: str) -> Template:
    resource = files("rexmle_agents.scaffolds.prompts") / f"{name}.md"
    if not resource.is_file():
        raise ConfigurationError(f"no prompt template {name!r} in rexmle_agents/scaffolds/prompts",
                                 hint="operators name templates by file stem; add prompts/<name>.md")
    return Template(resource.read_text(encoding="utf-8"))


def render(name: str, **values: Any) -> str:
    """Fill a template; a placeholder without a value is an error, never left in the prompt."""
    try:
        return template(name).substitute({k: "" if v is None else str(v) for k, v in values.items()})
    except KeyError as exc:
        raise ConfigurationError(f"prompt template {name!r} needs a value for {exc.args[0]!r}",
                                 hint="pass it from the operator that renders the template") from exc


def expert_report(task_folder: Any) -> str:
    """The task's winning-method summary (``<task folder>/expert_report.md``) as a prompt section."""
    from pathlib import Path

    path = Path(str(task_folder)) / EXPERT_REPORT_FILENAME
    if not path.is_file():
        return render("no_expert_report")
    return render("expert_report", report=path.read_text(encoding="utf-8").strip())


def system_prompt(ctx: RunContext, *, expert_report_mode: bool, domain_pack: bool) -> str:
    report = ""
    if expert_report_mode:
        from rexmle_tasks.registry import get_task

        report = expert_report(get_task(ctx.task.task_id).folder)
    pack = template("domain_pack").template if domain_pack else ""
    return render("system", instructions=ctx.instructions.strip(), expert_report=report, domain_pack=pack)


def remaining_text(ctx: RunContext, *, with_time: bool = True) -> str:
    left = ctx.remaining()
    parts = [f"time: {_duration(left.time_s)}" if with_time else
             f"time: the run's limit is {_duration(ctx.spec.limits.time_limit_s)} in all"]
    if left.steps is not None:
        parts.append(f"steps: {left.steps}")
    if left.tokens is not None:
        parts.append(f"tokens: {left.tokens}")
    if left.cost_usd is not None:
        parts.append(f"money: ${left.cost_usd:.2f}")
    return ", ".join(parts)


def memory_text(tree: Tree, node: Node, *, limit: int) -> str:
    """Summaries the new node's author should know: its ancestors, its siblings, then the best other nodes."""
    chosen: list[Node] = []
    if node.parent is not None:
        chosen += tree.path_to_root(tree[node.parent])
    chosen += [s for s in tree.siblings(node) if s.done]
    rest = sorted((n for n in tree.done if n not in chosen and n.id != node.id),
                  key=lambda n: (not n.is_valid, -(n.score or 0.0), n.id))
    chosen += rest
    chosen = chosen[:limit]
    if not chosen:
        return "None yet."
    return "\n".join(n.summary() for n in chosen)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min {rest % 60} s"
