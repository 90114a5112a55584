"""Run a baseline on a task: :func:`run_baseline` (the CLI, the calibration and the harness's ``baseline`` agent
all call it)."""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rexmle_baselines.base import (
    CONFIGS,
    DEFAULT_TIME_BUDGET_S,
    BaselineContext,
    baselines_for,
    check_device_for_config,
    get_baseline,
    isolate_caches,
    lateralised_labels,
    resolve_device,
    seed_everything,
)
from rexmle_grade.errors import ConfigurationError, TaskDataMissingError, UserInputError
from rexmle_grade.grader import TEST_MANIFEST, get_grader
from rexmle_grade.schema import SUBMISSION_CSV
from rexmle_grade.validation import validate_submission

VERSIONED_PACKAGES = ("rexmle-baselines", "rexmle-grade", "rexmle-tasks", "torch", "nnunetv2", "monai", "timm",
                      "diffusers", "torchvision", "SimpleITK", "numpy")


@dataclass(frozen=True)
class BaselineRun:
    """What one baseline run did and whether its submission validates."""

    name: str
    task_id: str
    config: str
    params: dict[str, Any]
    seed: int
    device: str
    submission_dir: Path
    seconds: float
    versions: dict[str, str]
    valid: bool
    problems: list[str] = field(default_factory=list)
    time_budget_s: float | None = None
    # measured by the run: seconds per optimiser step, epochs run, peak GPU memory, weights used (name -> sha256)
    measurements: dict[str, Any] = field(default_factory=dict)

    @property
    def gpu_hours(self) -> float:
        return round(self.seconds / 3600, 4) if self.device == "cuda" else 0.0


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def _coerce(value: str, like: Any) -> Any:
    """A ``--set key=value`` string as the type of the config's default."""
    if isinstance(like, bool):
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise UserInputError(f"expected a boolean, got {value!r}", hint="use true or false")
    if like is None or isinstance(like, str):
        return None if value.lower() in ("none", "null") else value
    if isinstance(like, (tuple, list)):
        parts = [part.strip() for part in value.strip("()[] ").split(",") if part.strip()]
        items = list(like) or [""]
        if len(like) and len(parts) != len(like):
            raise UserInputError(f"expected {len(like)} comma-separated values, got {value!r}",
                                 hint="for example " + ",".join(str(item) for item in like))
        return type(like)(_coerce(part, items[min(i, len(items) - 1)]) for i, part in enumerate(parts))
    try:
        return type(like)(value)
    except ValueError:
        raise UserInputError(f"expected a {type(like).__name__}, got {value!r}") from None


def merge_params(defaults: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The config's parameters with ``overrides`` applied; unknown keys are refused, strings are typed like the
    default they replace."""
    params = dict(defaults)
    for key, value in (overrides or {}).items():
        if key not in params:
            raise UserInputError(f"unknown parameter {key!r}", hint="parameters of this config: "
                                 + ", ".join(sorted(params)))
        params[key] = _coerce(value, params[key]) if isinstance(value, str) else value
    return params


def _public_dir(task_id: str, public_dir: Path | None, data_root: Path | None) -> Path:
    if public_dir is None:
        from rexmle_grade.targets import resolve_target

        public_dir = resolve_target(task_id, data_root).public_dir
    if not (public_dir / TEST_MANIFEST).is_file():
        raise TaskDataMissingError(f"{public_dir} holds no {TEST_MANIFEST}: not a prepared task's public folder",
                                   hint=f"run `rexmle prepare {task_id} --synthetic` (or with real data) first")
    return public_dir


def run_baseline(name: str, task_id: str, *, public_dir: Path | None = None, data_root: Path | None = None,
                 out: Path | None = None, work_dir: Path | None = None, config: str = "quick",
                 overrides: Mapping[str, Any] | None = None, device: str = "auto", seed: int = 0,
                 log: Callable[[str], None] | None = None, allow_cpu: bool = False,
                 time_budget_s: float | None = None, resume: bool = False,
                 weights_dir: Path | None = None) -> BaselineRun:
    """Run baseline ``name`` on ``task_id`` and validate its submission (public information only).

    ``public_dir`` given: only that folder is read (how the harness runs it inside a sandbox); otherwise the
    prepared task under ``data_root`` is used. ``out`` (default: a folder in the work folder) is emptied first;
    ``work_dir`` (default: a temporary folder, removed afterwards) holds models and caches. ``device`` ``auto``
    takes the GPU when one is usable; a GPU-sized config (budget, full, smoke) on a CPU needs ``allow_cpu``.
    ``time_budget_s``: the submission must be written within that many seconds (the ``budget`` config sizes its
    training to it, 12 h when not given; other configs stop training early rather than overrun it). ``resume``:
    continue the work already in ``work_dir`` (a run killed by an execution time limit) and keep ``out``'s
    submission until a newer one replaces it. ``weights_dir``: the local weights cache (`fetch-weights`).
    """
    started_at = time.monotonic()
    baseline = get_baseline(name)
    if config not in CONFIGS or config not in baseline.configs:
        raise UserInputError(f"unknown config {config!r} for baseline {name!r}",
                             hint="configs: " + ", ".join(sorted(baseline.configs)))
    from rexmle_tasks.registry import get_task

    grader_id = get_task(task_id).meta.grader
    if not baseline.supports(task_id, grader_id):
        raise UserInputError(f"baseline {name!r} does not cover task {task_id!r}",
                             hint="baselines for this task: " + (", ".join(baselines_for(task_id)) or "none"))
    public_dir = _public_dir(task_id, public_dir, data_root)
    missing = baseline.missing_modules()
    if missing:
        raise ConfigurationError(f"baseline {name!r} needs {', '.join(missing)}, which is not installed",
                                 hint=f"pip install 'rexmle-baselines[{baseline.extra}]' -c constraints.txt")
    # nothing to put on a GPU: the heuristic never asks torch whether there is one
    device = resolve_device(device) if baseline.trains else "cpu"
    check_device_for_config(config, device, allow_cpu=allow_cpu or not baseline.trains)
    params = merge_params(baseline.configs[config], overrides)
    if time_budget_s is None and params.get("time_aware"):
        time_budget_s = DEFAULT_TIME_BUDGET_S
    if time_budget_s is not None and time_budget_s <= 0:
        raise UserInputError(f"the time budget must be positive, got {time_budget_s} s")
    if resume and work_dir is None:
        raise UserInputError("resuming needs the work folder of the earlier attempt", hint="pass --work-dir")
    say = log or (lambda line: None)
    temporary = None
    if work_dir is None:
        temporary = tempfile.TemporaryDirectory(prefix=f"rexmle-{name}-")
        work_dir = Path(temporary.name)
    work_dir = work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    out = (out or work_dir / "submission").resolve()
    if out.exists():
        if not out.is_dir() or (any(out.iterdir()) and not (out / SUBMISSION_CSV).is_file()):
            raise UserInputError(f"--out {out} exists and does not hold a submission; refusing to empty it",
                                 hint="give a new folder, or one holding an earlier submission.csv")
        if not resume:
            shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        isolate_caches(work_dir)
        seed_everything(seed, deterministic=bool(params.get("deterministic", True)), with_torch=baseline.trains)
        deadline = None if time_budget_s is None else started_at + float(time_budget_s)
        ctx = BaselineContext(task_id=task_id, grader_id=grader_id, public_dir=public_dir.resolve(), out_dir=out,
                              work_dir=work_dir, config=config, params=params, device=device, seed=seed, log=say,
                              lateralised=lateralised_labels(task_id), deadline=deadline, resume=resume,
                              weights_dir=weights_dir.resolve() if weights_dir else None)
        say(f"{name} ({config}) on {task_id}: device {device}, seed {seed}, params {params}"
            + ("" if time_budget_s is None else f", time budget {time_budget_s:.0f} s")
            + (", lateralised labels (no mirroring)" if ctx.lateralised else "") + (", resuming" if resume else ""))
        started = time.perf_counter()
        baseline.run(ctx)
        seconds = time.perf_counter() - started
        report = validate_submission(get_grader(grader_id), out, public_dir)
        if temporary is not None and out.is_relative_to(work_dir):  # keep it beyond the temporary work folder
            kept = Path(tempfile.mkdtemp(prefix=f"rexmle-{name}-submission-"))
            shutil.copytree(out, kept, dirs_exist_ok=True)
            out = kept
    finally:
        if temporary is not None:
            temporary.cleanup()
    say(f"submission {'valid' if report.ok else 'INVALID'} in {out} ({seconds:.1f} s)")
    return BaselineRun(name=name, task_id=task_id, config=config, params=params, seed=seed, device=device,
                       submission_dir=out, seconds=round(seconds, 2), versions=package_versions(), valid=report.ok,
                       problems=list(report.problems), time_budget_s=time_budget_s,
                       measurements=dict(ctx.measurements))
