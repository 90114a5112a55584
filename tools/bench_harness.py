#!/usr/bin/env python
"""Harness benchmark: the three targets of the harness issue, measured on this machine.

1. overhead per executed step: sandbox start-up plus harness work (journal events fsynced, budget checks, output
   capture) for a step that runs `true` in the sandbox — the command itself takes ~1 ms;
2. N trivial runs (the `sample` agent: one sandboxed copy, snapshot, validation, grading) through the local
   executor with W workers, wall-clock including worker start-up;
3. resume of a run whose journal holds 1,000 events: from `execute_run` being called to the agent running again
   with its state reloaded;
4. the safe snapshot of a large valid submission (``--snapshot-gb`` of prediction files named by submission.csv,
   written by the sandbox's user) against `cp -r` of the same folder, and the workspace usage scan of the disk
   limit over it.

    python tools/bench_harness.py [--steps 50] [--runs 100] [--workers 2] [--sandbox bwrap] [--snapshot-gb 2]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from rexmle_agents.executors import run_specs
from rexmle_agents.harness.agent import BaseAgent, register_agent
from rexmle_agents.harness.context import RunContext
from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.runner import build_spec, execute_run, run_paths
from rexmle_agents.harness.spec import Limits, RunSpec
from rexmle_tasks.pipeline import prepare_task, task_dirs
from rexmle_tasks.registry import get_task

TASK = "ldct-iqa"


@register_agent
class TrueStepsAgent(BaseAgent):
    name: ClassVar[str] = "bench-true-steps"
    defaults: ClassVar[dict[str, Any]] = {"steps": 50}

    def run(self, ctx: RunContext) -> None:
        for _ in range(self.config["steps"]):
            with ctx.step("true"):
                ctx.execute(["true"])


@register_agent
class StatefulAgent(BaseAgent):
    """Fills the journal with state events, or, on resume, records when it got its state back."""

    name: ClassVar[str] = "bench-stateful"
    defaults: ClassVar[dict[str, Any]] = {"events": 1000}
    resumed_at: ClassVar[float | None] = None

    def run(self, ctx: RunContext) -> None:
        state = ctx.load_state()
        if state is not None:
            StatefulAgent.resumed_at = time.perf_counter()
            return
        for i in range(self.config["events"] // 3):
            with ctx.step("tick"):
                ctx.save_state({"node": i, "tree": list(range(20))})
        ctx.log("journal filled")
        time.sleep(3600)  # the benchmark kills the harness here (SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--snapshot-gb", type=float, default=2.0)
    parser.add_argument("--only", type=int, choices=(1, 2, 3, 4), help="run one measurement")
    parser.add_argument("--fill-journal", nargs=2, metavar=("SPEC_JSON", "RUNS_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fill_journal:  # the first attempt of [3], killed by the parent
        execute_run(RunSpec.model_validate_json(args.fill_journal[0]), Path(args.fill_journal[1]), grade=False)
        return 0
    with tempfile.TemporaryDirectory(prefix="rexmle-bench-") as tmp:
        root = Path(tmp)
        task = get_task(TASK)
        prepare_task(task, task_dirs(task, root / "data"), synthetic=True, cases=10, seed=0, force=False)
        data = root / "data"

        wanted = {args.only} if args.only else {1, 2, 3, 4}
        if 4 in wanted:
            snapshot_benchmark(root, args.snapshot_gb)
        if 1 in wanted:
            step_benchmark(data, root, args)
        if 2 in wanted:
            runs_benchmark(data, root, args)
        if 3 in wanted:
            resume_benchmark(data, root, args)
    return 0


def step_benchmark(data: Path, root: Path, args: argparse.Namespace) -> None:
    spec = build_spec(TASK, agent="bench-true-steps", agent_config={"steps": args.steps}, data_root=data,
                      sandbox=args.sandbox, group="steps")
    started = time.perf_counter()
    outcome = execute_run(spec, root / "runs", grade=False)
    total = time.perf_counter() - started
    events = Journal(outcome.run_dir / "journal.jsonl").events()
    per_step = [e["seconds"] for e in events if e["kind"] == "step_finished"]
    command = [e["wall_s"] for e in events if e["kind"] == "exec_finished"]
    p90 = sorted(per_step)[int(0.9 * len(per_step))]
    print(f"[1] per executed step ({args.sandbox}, `true`, {len(per_step)} steps): median "
          f"{statistics.median(per_step) * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms, "
          f"max {max(per_step) * 1000:.1f} ms "
          f"(sandboxed process alone: median "
          f"{statistics.median(command) * 1000:.1f} ms); whole run incl. set-up {total:.2f} s   target < 200 ms")


def runs_benchmark(data: Path, root: Path, args: argparse.Namespace) -> None:
    specs = [build_spec(TASK, agent="sample", data_root=data, seed=s, sandbox=args.sandbox, group="many")
             for s in range(args.runs)]
    started = time.perf_counter()
    outcomes = run_specs(specs, root / "runs", executor="local", workers=args.workers)
    wall = time.perf_counter() - started
    valid = sum(o.grade is not None and o.grade.status == "valid" for o in outcomes)
    print(f"[2] {args.runs} trivial runs (sample agent, graded), {args.workers} workers: {wall:.1f} s "
          f"({wall / args.runs:.2f} s/run), {valid}/{args.runs} valid   target < 120 s")


def resume_benchmark(data: Path, root: Path, args: argparse.Namespace) -> None:
    spec = build_spec(TASK, agent="bench-stateful", data_root=data, sandbox=args.sandbox, group="resume",
                      limits=Limits(time_limit_s=3600))
    journal = run_paths(spec, root / "runs").journal
    first = subprocess.Popen([sys.executable, __file__, "--fill-journal", spec.model_dump_json(),
                              str(root / "runs")])
    while not (journal.exists() and any(e.get("message") == "journal filled"
                                        for e in Journal(journal).iter_events())):
        time.sleep(0.2)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    n_events = len(Journal(journal).events())
    started = time.perf_counter()
    execute_run(spec, root / "runs", grade=False)
    assert StatefulAgent.resumed_at is not None
    print(f"[3] resume of a {n_events}-event journal: agent running again after "
          f"{StatefulAgent.resumed_at - started:.3f} s (whole resumed attempt "
          f"{time.perf_counter() - started:.3f} s)   target < 1 s")


def snapshot_benchmark(root: Path, gigabytes: float) -> None:
    """[4]: 20 prediction files totalling ``gigabytes``, named by submission.csv, collected by the safe copy."""
    from rexmle_agents.safe_workspace import Workspace

    workspace = root / "snap" / "workspace"
    submission = workspace / "submission"
    submission.mkdir(parents=True)
    files = 20
    size = int(gigabytes * 1024**3 / files)
    chunk = os.urandom(1024 * 1024)
    rows = ["case,prediction"]
    for i in range(files):
        with open(submission / f"case{i:02d}.nii", "wb") as fh:
            for _ in range(size // len(chunk)):
                fh.write(chunk)
        rows.append(f"case{i:02d},case{i:02d}.nii")
    (submission / "submission.csv").write_text("\n".join(rows) + "\n")
    os.sync()
    fs = Workspace(workspace)
    timings = {"safe": [], "cp": []}
    for attempt in range(3):
        dest = root / "snap" / f"safe{attempt}" / "submission"
        started = time.perf_counter()
        got = fs.collect_submission("submission", dest, file_columns=["prediction"])
        timings["safe"].append(time.perf_counter() - started)
        assert got.files == files and not got.refused, got.refused
        started = time.perf_counter()
        subprocess.run(["cp", "-r", str(submission), str(root / "snap" / f"cp{attempt}")], check=True)
        timings["cp"].append(time.perf_counter() - started)
    started = time.perf_counter()
    usage = fs.usage()
    scan = time.perf_counter() - started
    total = files * size / 1024**3
    print(f"[4] snapshot of a {total:.1f} GB submission ({files} files named by submission.csv): safe copy median "
          f"{statistics.median(timings['safe']):.2f} s, `cp -r` median {statistics.median(timings['cp']):.2f} s "
          f"(3 each); workspace usage scan {scan * 1000:.1f} ms for {usage.entries} entries   target: about cp")


if __name__ == "__main__":
    sys.exit(main())
