"""Prompt templates (package data in ``prompts/``, ``string.Template`` placeholders) and the pieces they share.

``$name`` placeholders are used rather than ``str.format`` because prompts embed code and JSON full of braces.
"""

from __future__ import annotations

import functools
import re
from importlib.resources import files
from string import Template
from typing import TYPE_CHECKING, Any

from rexmle_grade.errors import ConfigurationError

if TYPE_CHECKING:
    from rexmle_agents.harness.context import RunContext
    from rexmle_agents.scaffolds.node import Node
    from rexmle_agents.scaffolds.tree import Tree

EXPERT_REPORT_FILENAME = "expert_report.md"
# a workspace path ending in /submission (the harness's instructions name the workspace's own folder)
_WORKSPACE_SUBMISSION = re.compile(r"[^\s`]*/submission\b(?![./_-]?\w)")
THINKING_CHARS = 1500  # of a parent's reasoning fed to its children (adaptive memory)


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
    return render("system", instructions=one_submission_location(ctx.instructions.strip()), expert_report=report,
                  domain_pack=pack)


def one_submission_location(instructions: str) -> str:
    """The harness's instructions with the workspace's submission folder replaced by ``$SUBMISSION_DIR``: a
    scaffold's scripts write into the folder that variable names (one per worker), and the prompt says so once,
    in the script rules, so that no script hard-codes a folder another worker writes too."""
    return _WORKSPACE_SUBMISSION.sub("$SUBMISSION_DIR", instructions).replace(
        "python -m rexmle_agents.validate`", "python -m rexmle_agents.validate $SUBMISSION_DIR`")


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


def adaptive_memory_text(tree: Tree, node: Node, *, limit: int) -> str:
    """ML-Master's adaptive memory: what the branch being extended learned, not the whole tree. The ancestors'
    results (nearest first), the reasoning the model returned with the parent's code, and the siblings' results
    (what was already tried from the same parent, so that it is not repeated)."""
    sections = []
    if node.parent is not None:
        ancestors = tree.path_to_root(tree[node.parent])
        sections.append("The branch this node extends (nearest first):\n"
                        + "\n".join(a.summary() for a in ancestors[:limit]))
        parent = tree[node.parent]
        if parent.thinking:
            sections.append(f"The reasoning behind node {parent.id}'s code:\n{_cut(parent.thinking, THINKING_CHARS)}")
        if node.merged_with is not None:
            sections.append("The second solution being merged:\n" + tree[node.merged_with].summary())
    siblings = [s for s in tree.siblings(node) if s.done][:limit]
    if siblings:
        where = "from the same parent" if node.parent is not None else "as other first drafts"
        sections.append(f"Already tried {where}:\n" + "\n".join(s.summary() for s in siblings))
    return "\n\n".join(sections) or "None yet."


def _cut(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 6].rstrip() + " [...]"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min {rest % 60} s"
