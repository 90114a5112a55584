"""Benchmark of the results layer: `rexmle report` over 1,000 run folders and `rexmle view` of a 500-node run.

Usage: .venv/bin/python tools/bench_results.py [--runs 1000] [--nodes 500] [--keep DIR]

1. Writes N run folders in the published run format (spec, status, journal, grade; a paper-like grid: 3 scaffolds
   x 3 models x 20 tasks x 5 seeds, plus the sample agent on 20 tasks x 5 seeds, about 10% invalid submissions),
   then times `rexmle report` on them as a user runs it (a new process, 2,000 bootstrap replicates), alone and with
   the tidy tables.
2. Writes one scaffold run of M nodes the way the engine writes it (the tree saved as ``agent_state``: a full state
   every ``FULL_STATE_EVERY`` saves, deltas of the changed nodes in between, twice per node; code and output tails
   of 2,000 characters per node), then
   times `rexmle view` on it and reports the page's size.

Targets (issue 20): report < 10 s on 2 cores including the bootstrap; view < 2 s and < 5 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rexmle_agents.harness.spec import Limits, RunSpec
from rexmle_agents.results.records import RunStatus
from rexmle_agents.scaffolds.engine import FULL_STATE_EVERY
from rexmle_grade.report import ReportEntry

ROOT = Path(__file__).resolve().parents[1]
REXMLE = str(Path(sys.executable).with_name("rexmle"))
TASKS = ["topcow-track1-task1", "topcow-track1-task2", "topcow-track1-task3", "topcow-track2-task1",
         "topcow-track2-task2", "topcow-track2-task3", "topbrain-track1", "topbrain-track2", "panther-task1",
         "panther-task2", "puma-track1-task1", "puma-track1-task2", "puma-track2-task1", "puma-track2-task2",
         "isles22", "seg_a", "dentex", "neurips-cellseg", "ldct-iqa", "usenhance"]
MODELS = ["openai/gpt-5", "anthropic/claude-sonnet-4-5", "google/gemini-2.5-pro"]
VERSIONS = {"rexmle-agents": "0.1.0", "rexmle-grade": "0.1.0", "rexmle-tasks": "0.1.0"}
HARDWARE = {"cpus": 16, "cpu_model": "bench CPU", "memory_gb": 120.0, "gpus": 1, "gpu_ids": ["0"],
            "gpu_names": ["NVIDIA H100"]}


def _line(event: dict) -> str:
    return json.dumps(event, ensure_ascii=False) + "\n"


def write_run(root: Path, *, task: str, agent: str, model: str | None, seed: int, rng: random.Random) -> None:
    from rexmle_agents.results.loader import task_facts

    facts = task_facts(task)
    spec = RunSpec(task_id=task, task_version="1.0.0", split_digest="bench", agent=agent, agent_version="0.1.0",
                   agent_config={"num_drafts": 5} if model else {}, models={"default": model} if model else {},
                   seed=seed, limits=Limits(time_limit_s=24 * 3600), group="bench", data_root="",
                   rexmle_versions=VERSIONS)
    run = root / "bench" / spec.run_id
    run.mkdir(parents=True)
    (run / "spec.json").write_text(spec.model_dump_json(indent=2))
    start = 1.8e9 + rng.random() * 1e5
    valid = agent == "sample" or rng.random() > 0.1
    board = facts.board_rows
    pct = (rng.random() ** 3 if agent != "sample" else 0.0) if valid and board else None
    calls = rng.randint(20, 200) if model else 0
    cost = round(calls * 0.02, 4)
    status = RunStatus(format_version=1, state="finished", reason="the agent finished", attempts=1, steps=10,
                       elapsed_s=rng.uniform(3600, 86400), run_id=spec.run_id, task_id=task, agent=agent, seed=seed,
                       started_at="2027-01-15T00:00:00.000+00:00", updated_at="2027-01-15T12:00:00.000+00:00",
                       finished_at="2027-01-15T12:00:00.000+00:00", pid=1, host="bench", hardware=HARDWARE,
                       model_calls=calls, tokens=calls * 5000, input_tokens=calls * 4000, output_tokens=calls * 1000,
                       cost_usd=cost, uncosted_calls=0, unknown_usage_calls=0, model_retry_s=0.0)
    (run / "status.json").write_text(status.model_dump_json(indent=2))
    position = None if pct is None else 1 + (1 - pct) * board
    entry = ReportEntry(task_id=task, task_version="1.0.0", grader_id=task, task_type=facts.task_type, dim=facts.dim,
                        submission_path=str(run / "final" / "submission"), submission_exists=True,
                        valid_submission=valid, status="valid" if valid else "invalid_submission",
                        problems=[] if valid else ["row 3: missing prediction"], metrics={"dice": rng.random()},
                        leaderboard_version="1.0.0" if board else None, leaderboard_rows=board, score=position,
                        percentile=pct, gold_medal=bool(pct and pct > 0.95), above_median=bool(pct and pct > 0.5),
                        any_medal=bool(pct and pct > 0.95), labels={"agent": agent, "seed": str(seed)},
                        synthetic=False)
    (run / "grade.json").write_text(entry.model_dump_json(indent=2))
    events = [{"kind": "run_started", "time": start, "attempt": 1, "pid": 1, "host": "bench", "consumed_s": 0.0,
               "steps_done": 0, "sandbox": "bwrap", "isolating": True, "limits_mechanism": "cgroup-v2",
               "gpus": ["0"], "rexmle_versions": VERSIONS}]
    for step in range(1, 11):
        t = start + step * 60
        events.append({"kind": "step_started", "time": t, "step": step, "step_kind": "node", "info": {}})
        events.append({"kind": "step_finished", "time": t + 50, "step": step, "step_kind": "node", "status": "ok",
                       "seconds": 50.0, "result": {}, "model_usage": {"calls": 2}})
    events += [{"kind": "final_collected", "time": start + 700, "snapshot": None},
               {"kind": "run_finished", "time": start + 701, "state": "finished", "reason": "the agent finished",
                "limit": None, "seconds": 701.0, "steps": 10, "model_calls": calls, "cost_usd": cost,
                "model_retry_s": 0.0}]
    (run / "journal.jsonl").write_text("".join(_line(e) for e in events))


def write_runs(root: Path, n: int) -> int:
    rng = random.Random(0)
    cells = [(task, agent, model) for agent in ("aide", "mcts", "rdloop") for model in MODELS for task in TASKS]
    cells += [(task, "sample", None) for task in TASKS]
    made = 0
    seed = 0
    while made < n:
        for task, agent, model in cells:
            if made == n:
                break
            write_run(root, task=task, agent=agent, model=model, seed=seed, rng=rng)
            made += 1
        seed += 1
    return made


def _node(i: int, parent: int | None, done: bool, code: str, output: str) -> dict:
    return {"id": i, "stage": "draft" if parent is None else "improve", "parent": parent, "children": [],
            "status": "done" if done else "pending", "plan": f"plan of node {i}: " + "p" * 300 if done else "",
            "code": code if done else "", "hypothesis": "", "lesson": "",
            "execution": {"exit_code": 0, "stopped_by": None, "output_tail": output, "seconds": 12.0} if done else None,
            "sample_execution": None, "analysis": "looks fine" if done else "",
            "metric": 0.5 + i / 2000 if done else None,
            "lower_is_better": False if done else None, "is_buggy": not done or i % 7 == 0,
            "bug_reason": "exit status 1" if done and i % 7 == 0 else "", "submission_valid": done and i % 7 != 0,
            "snapshot_id": f"{i + 1:04d}-step{i + 1:04d}" if done and i % 7 != 0 else None, "debug_depth": 0,
            "visits": 0, "value_sum": 0.0, "reward": None, "worker": 0, "step": i + 1}


def _tree_save(t: float, step: int, before: list[str], changed: list[str], saves: int) -> str:
    """An ``agent_state`` line as the engine writes it: a full tree on the first save and every
    ``FULL_STATE_EVERY`` saves, else a delta with the changed nodes."""
    if saves % FULL_STATE_EVERY == 0:
        state = f'{{"format": 1, "nodes": [{",".join([*before, *changed])}], "knowledge": []}}'
    else:
        state = f'{{"format": 1, "delta": true, "nodes": [{",".join(changed)}], "knowledge_from": 0, "knowledge": []}}'
    return f'{{"kind": "agent_state", "time": {t}, "step": {step}, "key": "scaffold", "state": {state}}}\n'


def write_big_run(root: Path, nodes: int, chars: int = 2000) -> Path:
    spec = RunSpec(task_id="isles22", task_version="1.0.0", split_digest="bench", agent="aide", agent_version="0.1.0",
                   models={"default": "openai/gpt-5"}, seed=0, group="big", data_root="", rexmle_versions=VERSIONS)
    run = root / "big" / spec.run_id
    run.mkdir(parents=True)
    (run / "spec.json").write_text(spec.model_dump_json(indent=2))
    start = 1.8e9
    code = ("import numpy as np\n" + "x = np.zeros(10)  # training code\n" * 60)[:chars]
    output = ("epoch 1/10 loss 0.5\n" * 200)[:chars]
    done: list[str] = []
    saves = 0
    with (run / "journal.jsonl").open("w", encoding="utf-8") as journal:
        journal.write(_line({"kind": "run_started", "time": start, "attempt": 1, "pid": 1, "host": "bench",
                             "consumed_s": 0.0, "steps_done": 0, "sandbox": "bwrap", "isolating": True,
                             "limits_mechanism": None, "gpus": [], "rexmle_versions": VERSIONS}))
        totals = {"calls": 0, "usage": {"input_tokens": 0, "output_tokens": 0}, "cost_usd": 0.0}
        for i in range(nodes):
            t = start + i * 100
            step = i + 1
            parent = None if i < 5 else (i - 1)
            journal.write(_line({"kind": "step_started", "time": t, "step": step, "step_kind": "node",
                                 "info": {"stage": "improve", "parent": parent, "node": i}}))
            pending = json.dumps(_node(i, parent, False, code, output))
            journal.write(_tree_save(t + 1, step, done, [pending], saves))
            saves += 1
            for call in range(2):
                totals = {"calls": totals["calls"] + 1, "usage": {
                    "input_tokens": totals["usage"]["input_tokens"] + 3000,
                    "output_tokens": totals["usage"]["output_tokens"] + 800}, "cost_usd": totals["cost_usd"] + 0.012}
                journal.write(json.dumps({"kind": "model_call", "time": t + 2 + call, "step": step,
                                          "model": "openai/gpt-5", "response_id": None, "finish_reason": "stop",
                                          "usage": {"input_tokens": 3000, "output_tokens": 800}, "usage_known": True,
                                          "cost_usd": 0.012, "duration_s": 20.0, "retry_time_s": 0.0,
                                          "step_totals": None, "run_totals": totals}) + "\n")
            name = f"step{step:04d}-exec001-node{i}"
            journal.write(_line({"kind": "code_written", "time": t + 5, "step": step, "file": f"node_{i:04d}.py",
                                 "code": code, "node": i}))
            journal.write(_line({"kind": "exec_started", "time": t + 6, "step": step, "name": name,
                                 "argv": ["python", f"node_{i:04d}.py"], "timeout_s": 3600.0}))
            journal.write(_line({"kind": "exec_finished", "time": t + 60, "step": step, "name": name, "exit_code": 0,
                                 "stopped_by": None, "wall_s": 54.0, "cpu_s": 50.0, "stdout_tail": output,
                                 "stderr_tail": ""}))
            if i % 7:
                journal.write(_line({"kind": "snapshot", "time": t + 70, "step": step,
                                     "snapshot": f"{i + 1:04d}-step{step:04d}", "label": f"node{i}",
                                     "score": 0.5 + i / 2000, "valid": True, "has_code": True,
                                     "metadata": {"node": i, "lower_is_better": False}, "selection": None}))
            done.append(json.dumps(_node(i, parent, True, code, output)))
            journal.write(_tree_save(t + 80, step, done[:-1], [done[-1]], saves))
            saves += 1
            journal.write(_line({"kind": "step_finished", "time": t + 90, "step": step, "step_kind": "node",
                                 "status": "ok", "seconds": 90.0, "result": {},
                                 "model_usage": {"calls": 2, "usage": {"input_tokens": 6000, "output_tokens": 1600},
                                                 "cost_usd": 0.024}}))
        last = f"{nodes - 1:04d}-step{nodes - 1:04d}" if (nodes - 2) % 7 else None
        journal.write(_line({"kind": "final_collected", "time": start + nodes * 100, "snapshot": last}))
    status = RunStatus(format_version=1, state="finished", reason="step limit reached", limit="steps", attempts=1,
                       steps=nodes, elapsed_s=nodes * 100.0, hardware=HARDWARE, model_calls=2 * nodes,
                       tokens=3800 * 2 * nodes, cost_usd=0.024 * nodes)
    (run / "status.json").write_text(status.model_dump_json(indent=2))
    return run


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall-clock and CPU seconds (user + system) of a command run as a user runs it: a new process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--keep", type=Path, help="write here and keep (default: a temporary folder)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="rexmle-bench-results-"))
    rows = []
    try:
        started = time.perf_counter()
        made = write_runs(root, args.runs)
        rows.append(("write run folders", f"{made} runs", f"{time.perf_counter() - started:.1f} s", ""))
        (report, report_cpu) = timed([REXMLE, "report", str(root / "bench"), "--format", "json", "-o",
                                      str(root / "report.json")])
        size = (root / "report.json").stat().st_size / 1e6
        rows.append(("rexmle report (2,000 bootstrap replicates)", f"{made} runs",
                     f"{report:.2f} s ({report_cpu:.2f} s CPU)", "PASS (< 10 s)" if report < 10 else "FAIL (>= 10 s)"))
        data = json.loads((root / "report.json").read_text())
        rows.append(("  report.json", f"{len(data['rows'])} table rows", f"{size:.1f} MB", ""))
        tables, tables_cpu = timed([REXMLE, "report", str(root / "bench"), "--format", "csv", "-o",
                                    str(root / "t.csv"), "--tables", str(root / "tables")])
        rows.append(("rexmle report + tidy tables (5 CSV)", f"{made} runs", f"{tables:.2f} s ({tables_cpu:.2f} s CPU)",
                     ""))
        started = time.perf_counter()
        big = write_big_run(root, args.nodes)
        journal = (big / "journal.jsonl").stat().st_size / 1e6
        rows.append(("write a scaffold run", f"{args.nodes} nodes", f"{time.perf_counter() - started:.1f} s",
                     f"journal {journal:,.0f} MB"))
        view, view_cpu = timed([REXMLE, "view", str(big), "-o", str(root / "big.html")])
        page = (root / "big.html").stat().st_size / 1e6
        rows.append(("rexmle view", f"{args.nodes} nodes", f"{view:.2f} s ({view_cpu:.2f} s CPU)",
                     "PASS (< 2 s)" if view < 2 else "FAIL (>= 2 s)"))
        rows.append(("  page size", "", f"{page:.2f} MB", "PASS (< 5 MB)" if page < 5 else "FAIL (>= 5 MB)"))
        rows.append(("machine", f"{os.cpu_count()} cores", f"load {os.getloadavg()[0]:.1f}", ""))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    for what, size_, seconds, verdict in rows:
        print(f"{what:<{width}}  {size_:>16}  {seconds:>10}  {verdict}")
    return 0 if all("FAIL" not in r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
