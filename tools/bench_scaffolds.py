#!/usr/bin/env python
"""Scaffold benchmark: a scripted N-node run of each preset on the synthetic LDCT-IQA task, in bubblewrap.

The model is the scripted stand-in of the scaffold tests (``packages/rexmle-agents/tests/scaffolds/fakes.py``): it
answers instantly, so the time is the harness, the sandbox, the scaffold's bookkeeping and the scripts themselves
(a small numpy fit per node, one crashing draft to exercise the debug path). Target of the scaffolds issue: a
20-node ``aide`` run in under 2 minutes on 2 cores.

    python tools/bench_scaffolds.py [--nodes 20] [--presets aide,mcts,rdloop,evo] [--sandbox bwrap]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from rexmle_agents.harness.runner import build_spec, execute_run
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import Model, RetryPolicy, ScriptedBackend
from rexmle_tasks.pipeline import prepare_task, task_dirs
from rexmle_tasks.registry import get_task

TASK = "ldct-iqa"
FAKES = Path(__file__).resolve().parents[1] / "packages" / "rexmle-agents" / "tests" / "scaffolds" / "fakes.py"


def load_fakes():
    spec = importlib.util.spec_from_file_location("scaffold_fakes", FAKES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--presets", default="aide,mcts,rdloop,evo")
    parser.add_argument("--sandbox", default="bwrap")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("rexmle_agents.models.base").setLevel(logging.ERROR)  # "scripted/model has no price"
    fakes = load_fakes()
    with tempfile.TemporaryDirectory(prefix="rexmle-bench-scaffolds-") as tmp:
        root = Path(tmp)
        task = get_task(TASK)
        prepare_task(task, task_dirs(task, root / "data"), synthetic=True, cases=10, seed=0)
        for preset in args.presets.split(","):
            fake = fakes.FakeModel([fakes.CRASH_SCRIPT, fakes.good(1.0)])
            spec = build_spec(TASK, agent=preset, agent_config={}, models={"code": "scripted/model"}, seed=0,
                              limits=Limits(time_limit_s=600, max_steps=args.nodes, exec_timeout_s=30),
                              sandbox=args.sandbox, data_root=root / "data", group="bench")
            model = Model(ScriptedBackend(fake), retry=RetryPolicy(max_attempts=1))
            started = time.monotonic()
            outcome = execute_run(spec, root / "runs", models={"code": model}, grace_s=5.0)
            seconds = time.monotonic() - started
            valid = outcome.grade is not None and outcome.grade.valid_submission
            ended = outcome.limit or outcome.reason
            print(f"{preset:7s} {outcome.steps} steps ({args.sandbox}): {seconds:6.1f} s, "
                  f"{seconds / max(1, outcome.steps):.2f} s per step, {outcome.state} ({ended}), "
                  f"final submission valid: {valid}"
                  + ("   target < 120 s" if preset == "aide" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
