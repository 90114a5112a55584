"""``rexmle view``: one self-contained HTML file for a run or a group of runs.

Everything is inlined (styles, script, data as JSON): the file works offline and when mailed, and asks nothing of
any server. A group page holds the table (each cell links to the runs behind it); a run page holds the search tree
or the trajectory (each node's plan, code, execution output, metric, bug flag, timing, tokens and cost; the final
node highlighted; the selection-split score where used), the model calls, the budgets used and why the run ended,
and the final grade with per-case details. Long texts are cut with a pointer to the file that holds them whole
(``logs/exec/...``), so a 12-hour run's page stays small. Run text is only ever put into the page as text (never as
markup), so nothing a run wrote can script the page.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from rexmle_agents.results.loader import RunRecord, RunSet
from rexmle_agents.results.report import GroupReport, banner, raw_metric, task_note_lines
from rexmle_agents.results.rows import budget_label, config_label, cost_text, model_label
from rexmle_agents.results.stats import FEW_DATA_MARK
from rexmle_agents.results.trajectory import NodeView, Trajectory, trajectory

ASSETS = "rexmle_agents.results.assets"
OUTPUT_CHARS = 2000  # of each execution's output, on the page
CODE_CHARS = 20000
TEXT_CHARS = 4000  # plans, analyses, hypotheses
MAX_MODEL_CALLS = 1000
MAX_CASES = 200
NODE_DX, NODE_DY, MARGIN = 34, 52, 24


def _cut(text: str, limit: int, where: str) -> str:
    if len(text) <= limit:
        return text
    return text[:limit // 4] + f"\n[... {len(text) - limit:,} characters cut: the whole text is in {where} ...]\n" + \
        text[-(limit - limit // 4):]


def _tail(text: str, limit: int, where: str) -> str:
    if len(text) <= limit:
        return text
    return f"[... earlier output cut: the whole output is in {where} ...]\n" + text[-limit:]


def layout(nodes: list[NodeView]) -> tuple[dict[int, tuple[float, float]], int, int]:
    """x, y of each node (leaves side by side in depth-first order, a parent above the middle of its children)."""
    children: dict[int | None, list[int]] = {}
    ids = {n.id for n in nodes}
    for node in nodes:
        parent = node.parent if node.parent in ids else None
        children.setdefault(parent, []).append(node.id)
    place: dict[int, tuple[float, float]] = {}
    next_leaf = [0]
    depth_of: dict[int, int] = {}

    def visit(node_id: int, depth: int) -> float:
        # an explicit stack would do too; recursion depth is bounded by the chain length, so walk chains iteratively
        chain = [node_id]
        while len(children.get(chain[-1], [])) == 1:
            chain.append(children[chain[-1]][0])
        for offset, member in enumerate(chain):
            depth_of[member] = depth + offset
        last = chain[-1]
        kids = children.get(last, [])
        if kids:
            xs = [visit(kid, depth + len(chain)) for kid in kids]
            x = (min(xs) + max(xs)) / 2
        else:
            x = float(next_leaf[0])
            next_leaf[0] += 1
        for member in chain:
            place[member] = (x, float(depth_of[member]))
        return x

    for root in children.get(None, []):
        visit(root, 0)
    width = MARGIN * 2 + NODE_DX * max(1, next_leaf[0])
    height = MARGIN * 2 + NODE_DY * (max((y for _, y in place.values()), default=0) + 1)
    coords = {i: (MARGIN + NODE_DX * (x + 0.5), MARGIN + NODE_DY * (y + 0.5)) for i, (x, y) in place.items()}
    return coords, int(width), int(height)


def _node_json(node: NodeView, xy: tuple[float, float], run_dir: str) -> dict[str, Any]:
    executions = []
    for execution in node.executions:
        where = " or ".join(f"{run_dir}/{f}" for f in execution.log_files) or "the run's journal.jsonl"
        executions.append({"name": execution.name, "exit": execution.exit_code, "stopped_by": execution.stopped_by,
                           "seconds": round(execution.seconds, 2),
                           "output": _tail(execution.output_tail, OUTPUT_CHARS, where),
                           "logs": list(execution.log_files)})
    code_where = f"{run_dir}/journal.jsonl (code_written events)"
    return {
        "id": node.id, "parent": node.parent, "stage": node.stage, "status": node.status, "step": node.step,
        "x": round(xy[0], 1), "y": round(xy[1], 1), "plan": _cut(node.plan, TEXT_CHARS, code_where),
        "code": _cut(node.code, CODE_CHARS, code_where), "hypothesis": _cut(node.hypothesis, TEXT_CHARS, code_where),
        "analysis": _cut(node.analysis, TEXT_CHARS, code_where), "lesson": node.lesson[:TEXT_CHARS],
        "metric": node.metric, "lower_is_better": node.lower_is_better, "buggy": node.buggy,
        "bug_reason": node.bug_reason[:TEXT_CHARS], "valid": node.valid, "final": node.final,
        "snapshot": node.snapshot, "selection": node.selection, "seconds": node.seconds,
        "calls": node.model_calls, "tokens": node.tokens, "cost": node.cost_usd,
        "cost_text": cost_text(node.cost_usd, node.uncosted_calls, digits=4), "executions": executions,
    }


def run_page(run: RunRecord, capabilities: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run's page data; ``capabilities`` (from ``rexmle analyse``) adds each factor's verdicts and, per node, the
    evidence quoted from it."""
    path: Trajectory = trajectory(run)
    coords, width, height = layout(path.nodes)
    spec, status, grade = run.spec, run.status, run.grade
    limits = spec.limits
    budgets = [
        {"name": "time", "used": status.elapsed_s, "limit": limits.time_limit_s, "unit": "s"},
        {"name": "steps", "used": status.steps, "limit": limits.max_steps, "unit": ""},
        {"name": "tokens", "used": status.tokens, "limit": limits.max_tokens, "unit": ""},
        {"name": "cost", "used": status.cost_usd, "limit": limits.max_cost_usd, "unit": "$",
         "text": cost_text(status.cost_usd, status.uncosted_calls, digits=4)},
    ]
    calls = [{"time": round(c.time - (path.started or c.time), 2), "step": c.step, "model": c.model,
              "input": c.usage.input_tokens, "output": c.usage.output_tokens, "known": c.usage_known,
              "cost": c.cost_usd, "seconds": round(c.duration_s, 2), "retry": round(c.retry_time_s, 2)}
             for c in path.model_calls[:MAX_MODEL_CALLS]]
    return {
        "id": run.run_id, "group": run.group, "dir": str(run.run_dir), "task": spec.task_id, "agent": spec.agent,
        "model": model_label(spec.models), "config": config_label(spec.agent_config, spec.selection_cases),
        "agent_config": spec.agent_config, "seed": spec.seed, "data": run.data_kind, "variant": run.variant,
        "banner": banner(run.variant), "sandbox": spec.sandbox, "selection_k": spec.selection_cases,
        "budget": budget_label(limits.time_limit_s),
        "status": {"state": status.state, "reason": status.reason, "limit": status.limit,
                   "attempts": status.attempts, "started_at": status.started_at, "finished_at": status.finished_at,
                   "hardware": status.hardware.model_dump() if status.hardware else None},
        "budgets": budgets,
        "tree": {"kind": path.kind, "width": width, "height": height,
                 "nodes": [_node_json(n, coords.get(n.id, (MARGIN, MARGIN)), str(run.run_dir)) for n in path.nodes],
                 "knowledge": path.knowledge[:200]},
        "model_calls": calls, "model_calls_total": len(path.model_calls),
        "grade": _grade_json(grade),
        "problems": list(run.problems),
        "capabilities": capabilities,
    }


def _grade_json(grade: Any) -> dict[str, Any] | None:
    if grade is None:
        return None
    medal = "gold" if grade.gold_medal else "silver" if grade.silver_medal else "bronze" if grade.bronze_medal else ""
    return {"status": grade.status, "percentile": grade.percentile, "score": grade.score,
            "board_rows": grade.leaderboard_rows, "inserted_rank": grade.inserted_rank, "medal": medal,
            "above_median": grade.above_median, "metrics": grade.metrics, "positions": grade.positions,
            "problems": grade.problems[:50], "warnings": grade.warnings[:50], "error": grade.error,
            "per_case": grade.per_case[:MAX_CASES], "cases_total": len(grade.per_case)}


def group_page(report: GroupReport) -> dict[str, Any]:
    """The table: per data variant, each row's overall numbers and, per task, the runs behind each cell."""
    runs_by_cell: dict[tuple[str, tuple[str, ...], str], list[dict[str, Any]]] = {}
    for run in report.runs:
        keys = tuple(str(getattr(run, "task_id" if k == "task" else k)) for k in report.group_by)
        runs_by_cell.setdefault((run.variant, keys, run.task_id), []).append(
            {"id": run.run_id, "seed": run.seed, "valid": run.valid, "pct": run.percentile_counted,
             "state": run.state})
    kinds = []
    for variant in report.variants:
        rows = [r for r in report.rows if r.variant == variant and r.reference is None]
        tasks = sorted({r.scope_value for r in rows if r.scope == "task"})
        table = []
        for row in (r for r in rows if r.scope == "all"):
            key = tuple(row.keys.get(k, "-") for k in report.group_by)
            per_task = {r.scope_value: r for r in rows if r.scope == "task" and tuple(r.keys.values()) == key}
            table.append({
                "keys": list(key), "runs": row.n_runs, "missing": row.n_missing, "valid": row.valid_rate,
                "mean": row.mean_percentile, "se": row.se_percentile, "ci": [row.ci_low, row.ci_high],
                "median": row.median_percentile, "medals": row.medals, "normalised": row.normalised,
                "cost": row.cost_per_run, "cost_text": cost_text(row.cost_per_run, row.uncosted_calls),
                "warnings": row.interval_warnings,
                "se_few": any(w.startswith("s.e.") for w in row.interval_warnings),
                "ci_few": any(w.startswith("95% CI") for w in row.interval_warnings),
                "tasks": {t: {"mean": per_task[t].mean_percentile if t in per_task else None,
                              "valid": per_task[t].valid_rate if t in per_task else None,
                              "raw": raw_metric(per_task[t]) if t in per_task else "-",
                              "normalised": per_task[t].normalised if t in per_task else None,
                              "runs": sorted(runs_by_cell.get((variant, key, t), []), key=lambda r: r["seed"])}
                          for t in tasks},
            })
        kinds.append({"data": variant, "banner": banner(variant), "tasks": tasks, "rows": table})
    return {"group_by": report.group_by, "kinds": kinds, "rules": report.rules, "few_data_mark": FEW_DATA_MARK,
            "caveats": [c.model_dump() for c in report.caveats], "task_notes": task_note_lines(report),
            "refused": [r.model_dump() for r in report.refused]}


def render_html(runs: RunSet, report: GroupReport | None = None, *, title: str | None = None,
                capabilities: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The page of one run (a single run, no report) or of a group (the table and every run's page)."""
    data: dict[str, Any] = {
        "generated": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "runs": {run.run_id: run_page(run, (capabilities or {}).get(run.run_id)) for run in runs.runs},
        "group": group_page(report) if report is not None else None,
    }
    title = title or (f"rexmle run {runs.runs[0].run_id}" if report is None and runs.runs else "rexmle runs")
    data["title"] = title
    folder = resources.files(ASSETS)
    page = folder.joinpath("view.html").read_text(encoding="utf-8")
    payload = json.dumps(_finite(data), ensure_ascii=False, allow_nan=False, default=str)
    # no "<" at all inside the data block (JSON escapes it in strings): nothing can close it or change its parsing
    payload = payload.replace("<", "\\u003c")
    return (page.replace("@@TITLE@@", html.escape(title))
                .replace("@@CSS@@", folder.joinpath("view.css").read_text(encoding="utf-8"))
                .replace("@@JS@@", folder.joinpath("view.js").read_text(encoding="utf-8"))
                .replace("@@DATA@@", payload))


def _finite(value: Any) -> Any:
    """The data with NaN and infinities (which JSON cannot hold) as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_view(runs: RunSet, out: Path, report: GroupReport | None = None, *,
               capabilities: Mapping[str, Mapping[str, Any]] | None = None) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(runs, report, capabilities=capabilities), encoding="utf-8")
    return out


def serve(path: Path, *, port: int = 0, host: str = "127.0.0.1") -> Any:
    """An HTTP server on this machine's loopback that serves the page at ``/`` (``port=0``: any free port); call
    ``serve_forever()`` on it, ``server_address`` tells where it listens."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = path.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return ThreadingHTTPServer((host, port), Handler)
