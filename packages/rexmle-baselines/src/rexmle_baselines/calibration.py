"""Calibration: run baselines on prepared tasks, grade them with the task's grader, and store what was measured.

One JSON file per task (``<folder>/<task_id>.json``) holds a list of :class:`CalibrationResult`. A record is
keyed by everything that was chosen or could differ between runs (:func:`record_key`: baseline, config, every
parameter, seed, device, time budget, task version, package versions, hardware, real or synthetic data): a new run
replaces only a record with the same key, so seeds, parameter settings and machines accumulate side by side.
Nothing is estimated: every number in a file was measured by the run it records, on the hardware it names, on
real or synthetic data as it says.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rexmle_baselines.api import run_baseline
from rexmle_baselines.base import cuda_available, preferred_baselines

PACKAGE_CALIBRATION_DIR = Path(__file__).parent / "calibration_data"


class CalibrationResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    task_version: str
    baseline: str
    config: str
    params: dict[str, Any]
    seed: int
    device: str
    versions: dict[str, str]
    hardware: dict[str, str]
    seconds: float
    valid: bool
    metrics: dict[str, float | None]
    percentile: float | None
    synthetic: bool
    recorded_at: str
    time_budget_s: float | None = None
    gpu_hours: float = 0.0  # wall-clock hours on the GPU (0 on a CPU)
    # seconds per optimiser step, epochs run, peak GPU memory, weights used (name -> sha256): as the run measured
    measurements: dict[str, Any] = Field(default_factory=dict)


# the fields that are measured outcomes of a run; every other field is part of a record's key
MEASURED_FIELDS = frozenset({"seconds", "valid", "metrics", "percentile", "recorded_at", "gpu_hours",
                             "measurements"})


def record_key(result: CalibrationResult) -> str:
    """Everything about a record that is not a measured outcome, as canonical JSON."""
    return json.dumps(result.model_dump(mode="json", exclude=set(MEASURED_FIELDS)), sort_keys=True)


def hardware() -> dict[str, str]:
    """CPU model and core count, and the GPU's name when one is usable."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    found = {"cpu": cpu, "cpu_cores": str(os.cpu_count() or 0), "platform": platform.platform()}
    if cuda_available():
        import torch

        found["gpu"] = torch.cuda.get_device_name(0)
    return found


def calibration_file(folder: Path, task_id: str) -> Path:
    return folder / f"{task_id}.json"


def load_results(folder: Path, task_id: str) -> list[CalibrationResult]:
    path = calibration_file(folder, task_id)
    if not path.is_file():
        return []
    return [CalibrationResult.model_validate(item) for item in json.loads(path.read_text())]


def store_result(folder: Path, result: CalibrationResult) -> Path:
    """Add ``result`` to its task's file, replacing only a record with the same :func:`record_key`."""
    key = record_key(result)
    kept = [r for r in load_results(folder, result.task_id) if record_key(r) != key]
    path = calibration_file(folder, result.task_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    items = sorted([*kept, result], key=lambda r: (r.baseline, r.config, r.seed, r.recorded_at))
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps([r.model_dump(mode="json") for r in items], indent=1) + "\n")
    os.replace(partial, path)
    return path


def calibrate(task_ids: Sequence[str], *, into: Path, data_root: Path | None = None,
              baselines: Sequence[str] | None = None, config: str = "quick", device: str = "auto",
              seeds: Sequence[int] = (0,), work_root: Path | None = None, log: Callable[[str], None] | None = None,
              allow_cpu: bool = False, time_budget_s: float | None = None, weights_dir: Path | None = None,
              overrides: Mapping[str, Any] | None = None) -> list[CalibrationResult]:
    """Run every (or each named) baseline covering each task once per seed, grade and rank it, and store the
    results (the paper's protocol: 3 seeds of ``budget`` and of ``full`` on one GPU)."""
    from datetime import datetime, timezone

    from rexmle_grade.evaluate import evaluate_submission
    from rexmle_grade.targets import resolve_target

    say = log or (lambda line: None)
    results = []
    for task_id in task_ids:
        target = resolve_target(task_id, data_root)
        names = list(baselines) if baselines else preferred_baselines(task_id, config)
        for name in names:
            for seed in seeds:
                work_dir = None if work_root is None else work_root / task_id / name / f"seed{seed}"
                run = run_baseline(name, task_id, data_root=data_root, work_dir=work_dir, config=config,
                                   device=device, seed=seed, log=say, allow_cpu=allow_cpu,
                                   time_budget_s=time_budget_s, weights_dir=weights_dir, overrides=overrides)
                entry = evaluate_submission(target, run.submission_dir)
                result = CalibrationResult(
                    task_id=task_id, task_version=target.task_version, baseline=name, config=config,
                    params=run.params, seed=seed, device=run.device, versions=run.versions, hardware=hardware(),
                    seconds=run.seconds, valid=entry.valid_submission, metrics=dict(entry.metrics),
                    percentile=entry.percentile, synthetic=target.synthetic,
                    recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    time_budget_s=run.time_budget_s, gpu_hours=run.gpu_hours,
                    measurements=json.loads(json.dumps(run.measurements, default=str)))
                path = store_result(into, result)
                say(f"{task_id} / {name} ({config}, seed {seed}): {run.seconds:.0f} s, percentile "
                    f"{entry.percentile} -> {path}")
                results.append(result)
    return results
