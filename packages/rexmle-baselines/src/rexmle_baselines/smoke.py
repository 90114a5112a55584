"""The GPU smoke check: every family's ``smoke`` config on a synthetic task, each in its own process under a time
limit, with what it measured and what that implies for ``budget`` and ``full``.

``smoke`` keeps the ``full`` networks, patch sizes, resolutions, batch sizes and sampler steps and cuts only
epochs, iterations and folds, so one run goes through every code path a ``full`` run takes (planning, mixed
precision, augmentation, validation, post-processing, sliding-window or test-time inference, the submission) in
minutes. From its measured seconds per optimiser step, :func:`extrapolate` estimates a ``full`` run's training time
on the real dataset's size (task.yaml's training cases): an estimate, labelled as one, that leaves out inference
and data loading beyond what the smoke steps included, and whose seconds per step include the first steps' warm-up
(allocation, cuDNN autotuning), so it leans high. nnU-Net plans its patch from the data, and the synthetic volumes
are smaller than the real ones, so its per-step time leans low.

``rexmle baselines smoke --data-dir D --out O`` (what ``tools/gpu_smoke.sh`` runs) writes ``smoke_results.json`` and
``smoke_results.md``; the ``gpu``-marked tests run the same runs one by one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rexmle_baselines.base import DEFAULT_TIME_BUDGET_S, get_baseline


@dataclass(frozen=True)
class SmokeRun:
    baseline: str
    task_id: str
    cases: int  # synthetic cases to prepare
    why: str


SMOKE_RUNS: tuple[SmokeRun, ...] = (
    SmokeRun("nnunet", "isles22", 8, "3-D, two channels, mirroring and mirror TTA, CV post-processing"),
    SmokeRun("nnunet", "topcow-track1-task1", 8, "3-D, 14 lateralised labels: no mirroring, no mirror TTA"),
    SmokeRun("nnunet", "ravir", 8, "2-D"),
    SmokeRun("monai-seg", "topcow-track1-task1", 8, "SegResNet, median spacing, class-balanced crops, AMP"),
    SmokeRun("monai-seg", "ravir", 8, "2-D SegResNet with flips"),
    SmokeRun("detector", "dentex", 10, "three Faster R-CNNs at 1024-2048 px, flips with quadrant swap"),
    SmokeRun("timm-regress", "ldct-iqa", 24, "ResNet-50, two folds ensembled"),
    SmokeRun("timm-cls", "topcow-track1-task3", 12, "ResNet-50 on 256 px MIPs, two folds"),
    SmokeRun("diffusion-enhance", "usenhance", 10, "UNet2DModel 64-512 with attention, 50 DDIM steps"),
    SmokeRun("unet-enhance", "usenhance", 10, "BasicUNet 32-512"),
)


def prepare(run: SmokeRun, data_root: Path) -> Path:
    """The run's synthetic task under ``data_root`` (prepared once); returns its public folder."""
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    task = get_task(run.task_id)
    root = data_root / f"cases{run.cases}"
    dirs = task_dirs(task, root)
    if not (dirs.public / "test_manifest.json").is_file():
        prepare_task(task, dirs, synthetic=True, cases=run.cases, seed=0)
    return dirs.public


def steady_seconds_per_step(per_step: dict[str, float]) -> float:
    """One figure from a run's seconds per step by phase: the folds of one network train the same model, and the
    first also pays for CUDA's start and cuDNN autotuning (4.7 s a step in fold 0 of a ResNet-50 smoke on an H200,
    0.03 s in fold 1), so folds count by their fastest; different networks (the detector's three levels) by their
    mean."""
    folds = [seconds for phase, seconds in per_step.items() if phase.startswith("fold ")]
    if folds and len(folds) == len(per_step):
        return min(folds)
    return sum(per_step.values()) / len(per_step)


def extrapolate(record: dict[str, Any], run: SmokeRun) -> dict[str, Any]:
    """Estimated training GPU-hours of ``full`` and ``budget`` on the real dataset, from the smoke's seconds per
    step (None where the smoke measured none)."""
    from rexmle_tasks.registry import get_task

    per_step = record.get("measurements", {}).get("seconds_per_step") or {}
    if not per_step:
        return {"full_gpu_hours_estimate": None, "budget_gpu_hours_estimate": None}
    baseline = get_baseline(run.baseline)
    n_train = get_task(run.task_id).meta.cases.train
    steps = baseline.estimated_steps(baseline.configs["full"], n_train)
    if steps is None:
        return {"full_gpu_hours_estimate": None, "budget_gpu_hours_estimate": None}
    seconds = steps * steady_seconds_per_step(per_step)
    hours = round(seconds / 3600, 2)
    return {"full_steps": steps, "real_training_cases": n_train, "full_gpu_hours_estimate": hours,
            "budget_gpu_hours_estimate": round(min(hours, DEFAULT_TIME_BUDGET_S / 3600), 2)}


def run_one(run: SmokeRun, data_root: Path, out_dir: Path, *, limit_s: float, device: str = "cuda",
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """One smoke run in its own process (killed after ``limit_s``); what it did, measured and implies."""
    public = prepare(run, data_root)
    folder = out_dir / f"{run.baseline}.{run.task_id}"
    folder.mkdir(parents=True, exist_ok=True)
    record_file = folder / "record.json"
    record_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", "rexmle_baselines", "run", run.baseline, "--task", run.task_id,
               "--public-dir", str(public), "--config", "smoke", "--device", device,
               "--out", str(folder / "submission"), "--work-dir", str(folder / "work"), "--record", str(record_file)]
    if device == "cpu":
        command.append("--allow-cpu")
    log(f"smoke: {run.baseline} on {run.task_id} ({run.why}), limit {limit_s:.0f} s")
    started = time.monotonic()
    with (folder / "output.log").open("w") as output:
        try:
            exit_code: int | None = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT,
                                                   timeout=limit_s, check=False).returncode
        except subprocess.TimeoutExpired:
            exit_code = None
    seconds = round(time.monotonic() - started, 1)
    record = json.loads(record_file.read_text()) if record_file.is_file() else {}
    measured = record.get("measurements", {})
    result = {**asdict(run), "exit_code": exit_code, "timed_out": exit_code is None, "seconds": seconds,
              "valid": bool(record.get("valid")), "problems": record.get("problems", []),
              "peak_gpu_memory_gb": measured.get("peak_gpu_memory_gb"),
              "seconds_per_step": measured.get("seconds_per_step"), "epochs_run": measured.get("epochs_run"),
              **extrapolate(record, run)}
    log(f"  -> {'valid' if result['valid'] else 'NOT valid'}, {seconds} s, peak GPU memory "
        f"{result['peak_gpu_memory_gb']} GB, est. full {result['full_gpu_hours_estimate']} GPU-h")
    return result


def markdown(results: Sequence[dict[str, Any]], device_name: str) -> str:
    lines = [f"Smoke runs on {device_name} (measured), and training-time estimates extrapolated from them "
             "(estimates, not measurements).", "",
             "| baseline | task | valid | seconds | peak GPU GB | s/step | est. full h | est. budget h |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        per_step = r["seconds_per_step"] or {}
        step = f"{steady_seconds_per_step(per_step):.3f}" if per_step else "-"
        lines.append(f"| {r['baseline']} | {r['task_id']} | {'yes' if r['valid'] else 'NO'}"
                     f"{' (time limit)' if r['timed_out'] else ''} | {r['seconds']} | "
                     f"{r['peak_gpu_memory_gb'] if r['peak_gpu_memory_gb'] is not None else '-'} | {step} | "
                     f"{r['full_gpu_hours_estimate'] if r['full_gpu_hours_estimate'] is not None else '-'} | "
                     f"{r['budget_gpu_hours_estimate'] if r['budget_gpu_hours_estimate'] is not None else '-'} |")
    return "\n".join(lines) + "\n"


def run_smoke(data_root: Path, out_dir: Path, *, limit_s: float = 300.0, device: str = "cuda",
              only: Sequence[str] = (), log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every smoke run (or those of the ``only`` baselines), then ``smoke_results.json`` / ``.md`` in ``out_dir``."""
    from rexmle_baselines.calibration import hardware

    runs = [r for r in SMOKE_RUNS if not only or r.baseline in only]
    machine = hardware()
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for run in runs:  # the tables are rewritten after each run: a smoke stopped part-way keeps what it measured
        results.append(run_one(run, data_root, out_dir, limit_s=limit_s, device=device, log=log))
        write_results(out_dir, machine, results)
    return results


def write_results(out_dir: Path, machine: dict[str, Any], results: Sequence[dict[str, Any]]) -> None:
    """``smoke_results.json`` and ``smoke_results.md`` in ``out_dir`` for the runs so far."""
    (out_dir / "smoke_results.json").write_text(json.dumps({"hardware": machine, "results": list(results)},
                                                           indent=1) + "\n")
    (out_dir / "smoke_results.md").write_text(markdown(results, machine.get("gpu", machine["cpu"])))
