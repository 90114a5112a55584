#!/usr/bin/env python
"""Through SLURM: does a run get its GPUs from the job, and see no others? (about 2 minutes)

Starts the one-node cluster of ``tools/slurm_local.py`` (with a ``gpu`` gres for each GPU ``nvidia-smi`` lists),
installs a probe agent as a plug-in (SLURM's jobs are fresh processes that only know installed agents), prepares a
synthetic task, and submits with ``rexmle run --executor slurm``:

* a run with ``--gpus-per-run 0``: the sandbox sees no NVIDIA device, and the CUDA driver finds none;
* on a GPU machine, a run with ``--gpus-per-run 1``: the job asks for ``--gres=gpu:1``, the run uses the GPU SLURM
  granted (``SLURM_JOB_GPUS``), and inside the sandbox the device nodes, ``nvidia-smi -L`` and the CUDA driver show
  exactly that GPU (with ``CUDA_VISIBLE_DEVICES`` unset, so only the bound nodes limit it); a tiny model trains on it
  when torch is installed;
* a run asking for one GPU more than the node has: SLURM refuses the array, and rexmle says why.

Without GPUs the first and last checks run (the middle one needs a GPU). Exit status 0 when every check holds.

    sudo python tools/gpu_slurm_check.py        # as root, the harness drops agent code to the sandbox user
    python tools/gpu_slurm_check.py --no-gpus   # the checks without GPUs only (the test suite runs this)

Seen holding on one NVIDIA H200 (2026-11-26; Debian 12's SLURM 22.05 unpacked on Ubuntu 24.04):
docs/gpu/2026-11-26-h200-slurm.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from rexmle_agents.harness.agent import BaseAgent
from rexmle_agents.harness.context import RunContext

HERE = Path(__file__).resolve().parent
TASK = "ldct-iqa"
DIST_NAME = "rexmle_gpu_slurm_probe"
ENTRY_POINTS = "[rexmle.agents]\ngpu-slurm-probe = gpu_slurm_check:ProbeAgent\n"


def _inside_code() -> str:
    """What ``tools/gpu_check.py`` runs inside the sandbox: its device nodes, nvidia-smi, the CUDA driver (that file
    lies next to this one, in ``tools/`` and in the probe's plug-in folder alike)."""
    from gpu_check import INSIDE

    return str(INSIDE)


class ProbeAgent(BaseAgent):
    """Submits the sample submission, then reports what its sandbox sees of the GPUs (in ``step_finished``)."""

    name: ClassVar[str] = "gpu-slurm-probe"
    version: ClassVar[str] = "1.0.0"
    description: ClassVar[str] = "check agent: the sample submission, then what the sandbox sees of the GPUs"
    defaults: ClassVar[dict[str, Any]] = {"train": True}

    def run(self, ctx: RunContext) -> None:
        with ctx.step("probe") as step:
            ws = ctx.workspace
            ctx.execute(f"cp -R {ws}/data/sample_submission/. {ws}/submission/")
            ctx.select_final(ctx.snapshot_submission("sample submission"), reason="the only candidate")
            env = ctx.execute("echo \"CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}\"; env | grep -c '^SLURM_'")
            lines = env.stdout_tail.split()
            code = ("import os\nos.environ['TRAIN'] = '1'\n" if self.config["train"] else "") + _inside_code()
            seen = ctx.run_python(code, filename="probe.py", timeout_s=300)
            step.result.update(visible=lines[0].split("=", 1)[1] if lines else None,
                               slurm_vars=int(lines[1]) if len(lines) > 1 and lines[1].isdigit() else None,
                               seen=json.loads(seen.stdout_tail.strip().splitlines()[-1]) if seen.ok else
                               {"error": seen.stderr_tail[-2000:]})


def _open_folder(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    return folder


def _install_probe(site: Path) -> None:
    for name in ("gpu_slurm_check.py", "gpu_check.py"):
        shutil.copy(HERE / name, site / name)
    dist = site / f"{DIST_NAME}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)


def _rexmle(*argv: str) -> tuple[int, str]:
    from rexmle_grade.cli import main

    said = io.StringIO()
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):  # its tables, errors and all
        code = main(list(argv))
    return code, " ".join(said.getvalue().split())


def _probe_run(data: Path, runs: Path, group: str, gpus: int) -> tuple[int, str, Path | None]:
    code, said = _rexmle("--data-dir", str(data), "run", "--executor", "slurm", "--runs-dir", str(runs), "--group",
                         group, "--agent", "gpu-slurm-probe", "--task", TASK, "--gpus-per-run", str(gpus),
                         "--agent-config", json.dumps({"train": gpus > 0}), "--time-limit", "8m",
                         "--slurm-timeout-min", "15")
    folders = [p.parent for p in (runs / group).glob("*/spec.json")]
    return code, said, folders[0] if folders else None


def _check_run(run_dir: Path, gpus: int, failures: list[str]) -> None:
    from rexmle_agents.executors.slurm_accounting import read_cluster
    from rexmle_agents.harness.journal import Journal
    from rexmle_agents.harness.paths import RunPaths
    from rexmle_agents.harness.runner import read_status
    from rexmle_agents.sandbox.identity import driver_gpus

    label = f"the run with --gpus-per-run {gpus}"
    paths = RunPaths(run_dir)
    status = read_status(paths)
    events = Journal(paths.journal).events()
    started = next(e for e in events if e["kind"] == "run_started")
    probe = next((e for e in events if e["kind"] == "step_finished"), {}).get("result", {})
    cluster = read_cluster(run_dir)
    job = cluster.last if cluster is not None else None
    script = next(run_dir.parent.glob(".slurm/*/job.sh")).read_text()
    if job is None:
        failures.append(f"{label}: its folder has no SLURM job record (cluster.json)")
        return
    print(f"{label}: state {status['state']}; job {job.job_id} granted {job.gpus} GPU(s); the harness "
          f"used {started.get('gpus')}; inside: CUDA_VISIBLE_DEVICES={probe.get('visible')}, "
          f"{probe.get('slurm_vars')} SLURM_* variables, {json.dumps(probe.get('seen'))}")
    if status["state"] != "finished":
        failures.append(f"{label} ended {status['state']}: {status.get('reason')}")
        for log in sorted(run_dir.parent.glob(".slurm/*/*.log")):
            print(f"== {log.name}\n{log.read_text(errors='replace')[-3000:]}")
    seen = probe.get("seen") or {}
    if probe.get("slurm_vars"):
        failures.append(f"{label}: the sandbox sees SLURM_* variables")
    if not gpus:
        if "--gres" in script or seen.get("nodes") or seen.get("cuda_devices"):
            failures.append(f"{label} asked for a GPU or sees one: {seen}")
        return
    if f"--gres=gpu:{gpus}" not in script or job.gpus != gpus:
        failures.append(f"{label}: the job did not ask SLURM for {gpus} GPU(s)")
    used = [str(g) for g in started.get("gpus") or []]
    granted = [d for d in driver_gpus() if str(d.minor) in used or d.uuid in used]
    if len(used) != gpus or len(granted) != gpus:
        failures.append(f"{label}: the harness used {started.get('gpus')}, not {gpus} granted GPU(s)")
    nodes = [n for n in seen.get("nodes", []) if n.removeprefix("nvidia").isdigit()]
    if len(nodes) != gpus or seen.get("cuda_devices") != gpus or len(seen.get("smi", [])) != gpus:
        failures.append(f"{label}: the sandbox does not see exactly {gpus} GPU(s): {seen}")
    if granted and not all(any(d.uuid in line for line in seen.get("smi", [])) for d in granted):
        failures.append(f"{label}: nvidia-smi inside does not show the granted GPU(s) {[d.uuid for d in granted]}")
    trained = seen.get("trained")
    if isinstance(trained, str) and trained.startswith("FAILED"):
        failures.append(f"{label} could not train: {trained}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-gpus", action="store_true", help="leave this machine's GPUs out of the cluster")
    args = parser.parse_args(argv)
    import slurm_local as tool  # next to this file, like gpu_check.py
    missing = tool.missing_packages()
    if missing:
        print(f"SLURM is not installed: apt-get install -y {' '.join(missing)}")
        return 2
    from rexmle_agents.executors.slurm_accounting import cluster_config

    saved = {name: os.environ.get(name) for name in ("SLURM_CONF", "PYTHONPATH")}
    try:
        with tempfile.TemporaryDirectory(prefix="rexmle-gpu-slurm-") as tmp:
            root = Path(tmp)
            root.chmod(0o755)
            config = tool.ClusterConfig(max_time="1:00:00", **({"gpus": 0} if args.no_gpus else {}))
            print(f"this machine: {config.gpus} GPU(s), {config.cpus} CPUs, {config.memory_mb} MB for the node")
            cluster_dir = _open_folder(root, "cluster")
            try:
                cluster = tool.start(cluster_dir, config)
            except tool.ClusterError as exc:
                print(f"the one-node cluster could not start: {exc}")
                return 2
            os.environ["SLURM_CONF"] = str(cluster.conf)
            cluster_config.cache_clear()
            try:
                failures = _check(root, config.gpus)
            finally:
                tool.stop(cluster_dir)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        cluster_config.cache_clear()
    print("\n" + ("every check holds" if not failures else "FAILED:\n  " + "\n  ".join(failures)))
    return 0 if not failures else 1


def _check(root: Path, node_gpus: int) -> list[str]:
    from rexmle_agents.harness.agent import register_agent
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    failures: list[str] = []
    _install_probe(_open_folder(root, "site"))
    register_agent(ProbeAgent)  # this process does not rescan PYTHONPATH; the jobs find the plug-in
    data, runs = _open_folder(root, "data"), _open_folder(root, "runs")
    task = get_task(TASK)
    prepare_task(task, task_dirs(task, data), synthetic=True, cases=10, seed=0)
    for gpus in ([0, 1] if node_gpus else [0]):
        code, said, run_dir = _probe_run(data, runs, f"gpus{gpus}", gpus)
        if code != 0 or run_dir is None:
            failures.append(f"rexmle run --gpus-per-run {gpus} exited {code}: {said[-1500:]}")
            continue
        _check_run(run_dir, gpus, failures)
    code, said, run_dir = _probe_run(data, runs, "too-many", node_gpus + 1)
    refusal = said[said.find("SLURM refused"):][:600] if "SLURM refused" in said else said[-600:]
    print(f"a run asking for {node_gpus + 1} GPU(s): rexmle exited {code}: {refusal}")
    if code != 2 or "SLURM refused the job array" not in said:
        failures.append(f"a request for {node_gpus + 1} GPU(s) on a node with {node_gpus} was not refused with "
                        "SLURM's reason")
    return failures


if __name__ == "__main__":
    sys.exit(main())
