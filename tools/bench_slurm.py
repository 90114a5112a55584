#!/usr/bin/env python
"""SLURM executor benchmark: the two targets of the SLURM issue, measured on a one-node cluster on this machine.

1. N sample runs (default 100) through SLURM: ``run_specs(executor="slurm")``, from submission to the last outcome
   read back (every job's harness start-up, the sandboxed copy, snapshot, grading, and the queue in between);
2. submission of an M-run job array (default 1,000): manifest, ``sbatch``, and each run's ``spec.json`` and
   ``cluster.json``; submitted on hold and cancelled, so nothing runs.

    python tools/bench_slurm.py [--runs 100] [--array 1000] [--node-cpus N]

Starts its own cluster with ``tools/slurm_local.py`` (stopped at the end), unless SLURM_CONF names one already
running. Needs Debian's slurmctld slurmd slurm-client munge (``tools/setup.sh --dev``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TASK = "ldct-iqa"
HERE = Path(__file__).resolve().parent


def load_slurm_local() -> Any:
    spec = importlib.util.spec_from_file_location("slurm_local", HERE / "slurm_local.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["slurm_local"] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def cluster(cpus: int | None) -> Iterator[str]:
    if os.environ.get("SLURM_CONF"):
        yield f"the cluster of {os.environ['SLURM_CONF']}"
        return
    tool = load_slurm_local()
    root = Path(tempfile.mkdtemp(prefix="rexmle-bench-slurm-"))
    started = time.perf_counter()
    config = tool.ClusterConfig(gpus=0)
    config.cpus = cpus or config.cpus
    one = tool.start(root, config)
    os.environ["SLURM_CONF"] = str(one.conf)
    try:
        yield (f"a one-node cluster started by tools/slurm_local.py in {time.perf_counter() - started:.1f} s "
               f"(the node offers {config.cpus} CPUs on {tool.machine_cpus()} cores: {config.cpus} runs at once)")
    finally:
        tool.stop(root, remove=True)
        os.environ.pop("SLURM_CONF", None)


def open_folder(prefix: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)  # agent code runs as the unprivileged sandbox user
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="sample runs through SLURM (0: skip)")
    parser.add_argument("--array", type=int, default=1000, help="runs of the array whose submission is timed (0: skip)")
    parser.add_argument("--node-cpus", type=int, default=None, help="CPUs the node offers (default: this machine's "
                                                                    "cores; a sample run needs far less than one)")
    args = parser.parse_args()

    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    data, runs = open_folder("rexmle-bench-data-"), open_folder("rexmle-bench-runs-")
    try:
        task = get_task(TASK)
        prepare_task(task, task_dirs(task, data), synthetic=True, cases=10, seed=0, force=False)
        with cluster(args.node_cpus) as where:
            print(f"rexmle SLURM benchmark on {platform.node()} ({os.cpu_count()} cores, load average "
                  f"{os.getloadavg()[0]:.1f} before), {where}")
            if args.runs:
                bench_runs(args.runs, data, runs)
            if args.array:
                bench_submission(args.array, data, runs)
    finally:
        shutil.rmtree(runs, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)
    return 0


def bench_runs(count: int, data: Path, runs: Path) -> None:
    from rexmle_agents.executors import run_specs
    from rexmle_agents.executors.common import SlurmOptions
    from rexmle_agents.harness.runner import build_spec
    from rexmle_agents.harness.spec import Limits

    started = time.perf_counter()
    specs = [build_spec(TASK, agent="sample", data_root=data, seed=s, group="bench", limits=Limits(time_limit_s=600))
             for s in range(count)]
    built = time.perf_counter() - started
    started = time.perf_counter()
    outcomes = run_specs(specs, runs, executor="slurm", slurm=SlurmOptions(poll_s=2.0, array_parallelism=None))
    took = time.perf_counter() - started
    valid = sum(o.state == "finished" and o.grade is not None and o.grade.status == "valid" for o in outcomes)
    print(f"1. {count} sample runs through SLURM: {took:.1f} s from submission to the last outcome "
          f"({count / took * 60:.0f} runs/min; {valid}/{count} finished and graded valid; their specs built in "
          f"{built:.1f} s; load average {os.getloadavg()[0]:.1f} after) — target < 180 s: "
          f"{'met' if took < 180 else 'NOT met'}")


def bench_submission(count: int, data: Path, runs: Path) -> None:
    from rexmle_agents.executors.common import SlurmOptions
    from rexmle_agents.executors.slurm import submit
    from rexmle_agents.executors.slurm_accounting import slurm
    from rexmle_agents.harness.runner import build_spec, run_paths
    from rexmle_agents.harness.spec import Limits

    started = time.perf_counter()
    specs = [build_spec(TASK, agent="sample", data_root=data, seed=s, group="array", limits=Limits(time_limit_s=600))
             for s in range(count)]
    built = time.perf_counter() - started
    folders = {s.run_id: run_paths(s, runs).run_dir for s in specs}
    started = time.perf_counter()
    jobs = submit(specs, folders, runs, SlurmOptions(extra={"hold": ""}))  # held: timed, then cancelled
    took = time.perf_counter() - started
    arrays = sorted({job.split("_")[0] for job in jobs.values()})
    slurm("scancel", *arrays)
    print(f"2. submission of a {count}-run job array: {took:.2f} s ({len(arrays)} array(s), {len(jobs)} tasks; "
          f"manifest, job script, sbatch, and each run's spec.json and cluster.json) — target < 10 s: "
          f"{'met' if took < 10 else 'NOT met'}; building the {count} specs before it (rexmle run does it for any "
          f"executor) took {built:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
