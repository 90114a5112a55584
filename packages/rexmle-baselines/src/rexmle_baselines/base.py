"""The baseline interface every pipeline implements, its registry, and the helpers they share.

A baseline reads only a task's ``public/`` folder and writes a submission into ``out_dir``; everything else it
writes (models, caches, nnU-Net folders) goes under ``work_dir``. Heavy libraries (torch, nnunetv2, monai...) are
imported inside :meth:`Baseline.run`, so importing this package and listing baselines works without them.
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from rexmle_grade.errors import ConfigurationError, RexmleError, UnknownNameError, UserInputError

# quick: CPU minutes (tests, the main job); budget: fits the agents' time budget on one GPU (time-aware); full: the
# published recipe with unlimited time; smoke: full's networks, patches and batches with epochs/iterations/folds cut,
# a whole-code-path check on one GPU in minutes
CONFIGS = ("quick", "budget", "full", "smoke")
# sized for a GPU: refused on a CPU unless explicitly allowed (allow_cpu)
GPU_CONFIGS = ("budget", "full", "smoke")
# what `budget` fits into when no time budget is given: the paper's 12 h per run
DEFAULT_TIME_BUDGET_S = 12 * 3600.0


@dataclass(frozen=True)
class BaselineContext:
    """Everything one baseline run may use."""

    task_id: str
    grader_id: str
    public_dir: Path          # the task's public/ folder (read only): all a baseline may read
    out_dir: Path             # submission.csv + prediction files (emptied by the runner unless resuming)
    work_dir: Path            # scratch: models, caches, nnU-Net folders
    config: str               # one of CONFIGS
    params: Mapping[str, Any]  # the config's parameters after overrides
    device: str               # "cpu" | "cuda"
    seed: int
    log: Callable[[str], None]  # progress lines (the runner prints/journals them)
    lateralised: bool = False  # the task's labels tell left from right: never mirror without swapping them
    deadline: float | None = None  # time.monotonic() by which the submission must be written (None: no limit)
    resume: bool = False      # continue the work already under work_dir (a run killed by a time limit)
    weights_dir: Path | None = None  # the local weights cache (`rexmle baselines fetch-weights`)
    # what the run measured for the record (seconds per step, epochs run, peak GPU memory, weights used...)
    measurements: dict[str, Any] = field(default_factory=dict)

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()


class Baseline(ABC):
    """One expert pipeline. Subclasses set the class variables and implement :meth:`run`."""

    name: ClassVar[str]
    extra: ClassVar[str]                  # the pip extra that installs what ``requires`` names
    requires: ClassVar[tuple[str, ...]]   # modules that must import, e.g. ("torch", "nnunetv2")
    description: ClassVar[str]
    configs: ClassVar[dict[str, dict[str, Any]]]  # one per name in CONFIGS
    # whether a run killed part-way continues with --resume from its work folder (else it starts again)
    resumable: ClassVar[bool] = False
    # whether it trains a model (the heuristic does not: its configs are one, without epochs or GPU switches)
    trains: ClassVar[bool] = True

    def supports(self, task_id: str, grader_id: str) -> bool:
        """Whether this baseline can produce a submission for the task (by default: none)."""
        return False

    @abstractmethod
    def run(self, ctx: BaselineContext) -> None:
        """Train on the public training data and write a submission that validates into ``ctx.out_dir``."""

    def estimated_steps(self, params: Mapping[str, Any], n_train: int) -> int | None:
        """Optimiser steps a run of ``params`` takes on ``n_train`` training cases (None: not known), for
        extrapolating a measured time per step (``rexmle_baselines.smoke``)."""
        return None

    def installed(self) -> bool:
        """Whether every module in ``requires`` can be imported (checked without importing it)."""
        return all(importlib.util.find_spec(module) is not None for module in self.requires)

    def missing_modules(self) -> list[str]:
        return [module for module in self.requires if importlib.util.find_spec(module) is None]


B = TypeVar("B", bound=type[Baseline])
_REGISTRY: dict[str, type[Baseline]] = {}
# modules holding baselines: imported on first registry access so each registers itself; none imports torch at import
_BASELINE_MODULES = ("nnunet", "monai_seg", "detector", "timm_models", "enhance", "heuristic")


def register_baseline(cls: B) -> B:
    """Class decorator: make a baseline known by its ``name``."""
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise ConfigurationError(f"two baselines are named {cls.name!r}: {existing.__qualname__} and "
                                 f"{cls.__qualname__}", hint="give one of them another name")
    for config in CONFIGS:
        if config not in cls.configs:
            raise ConfigurationError(f"baseline {cls.name!r} has no {config!r} configuration",
                                     hint=f"add configs[{config!r}] to {cls.__qualname__}")
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtin() -> None:
    for module in _BASELINE_MODULES:
        if importlib.util.find_spec(f"rexmle_baselines.{module}") is not None:
            importlib.import_module(f"rexmle_baselines.{module}")


def baseline_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_baseline(name: str) -> Baseline:
    """A fresh instance of the baseline named ``name``; unknown names raise :class:`UnknownNameError`."""
    _load_builtin()
    if name not in _REGISTRY:
        raise UnknownNameError("baseline", name, _REGISTRY)
    return _REGISTRY[name]()


def baselines_for(task_id: str) -> list[str]:
    """Names of the baselines that support ``task_id``."""
    from rexmle_tasks.registry import get_task

    grader_id = get_task(task_id).meta.grader
    return [name for name in baseline_names() if get_baseline(name).supports(task_id, grader_id)]


# Which baseline stands for a task when none is named (the `baseline` agent, calibration's default order): the
# strongest first. With a GPU config (budget, full, smoke) nnU-Net is the reference for every segmentation-type task,
# TopCoW task 3 included (its edge lists come from the predicted segmentation, as the strong teams derived them,
# rather than from MIPs); the L1 UNet is preferred to the diffusion model on USenhance's full-reference metrics.
PREFERENCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("topcow-", ("nnunet", "monai-seg", "timm-cls")),
    ("topbrain-", ("nnunet", "monai-seg")),
    ("panther-", ("nnunet", "monai-seg")),
    ("puma-", ("nnunet", "monai-seg")),
    ("isles22", ("nnunet", "monai-seg")),
    ("seg_a", ("nnunet", "monai-seg")),
    ("neurips-cellseg", ("nnunet", "monai-seg")),
    ("ravir", ("nnunet", "monai-seg")),
    ("dentex", ("detector",)),
    ("ldct-iqa", ("timm-regress",)),
    ("usenhance", ("unet-enhance", "diffusion-enhance")),
)
# The quick configurations rank differently (measured on the synthetic mirrors, README of rexmle-baselines): quick
# nnU-Net (2 x 8 iterations) is a CPU smoke test that does not beat the sample on the 3-D tasks, while quick
# monai-seg (40 epochs) does on every non-vessel task; on TopCoW task 3 only timm-cls beats it.
QUICK_PREFERENCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("topcow-track1-task3", ("timm-cls", "monai-seg", "nnunet")),
    ("topcow-track2-task3", ("timm-cls", "monai-seg", "nnunet")),
    *((prefix, ("monai-seg", "nnunet")) for prefix in ("topcow-", "topbrain-", "panther-", "puma-", "isles22",
                                                        "seg_a", "neurips-cellseg", "ravir")),
)


def preferred_baselines(task_id: str, config: str = "full") -> list[str]:
    """The baselines covering ``task_id``, strongest first for ``config``: the explicit preference, then any other
    that covers it (alphabetically)."""
    covering = baselines_for(task_id)
    table = (*QUICK_PREFERENCES, *PREFERENCES) if config == "quick" else PREFERENCES
    ranked = next((names for prefix, names in table if task_id.startswith(prefix)), ())
    return [n for n in ranked if n in covering] + sorted(n for n in covering if n not in ranked)


def preferred_baseline(task_id: str, config: str = "full", *, installed_only: bool = True) -> str:
    """The strongest baseline for ``task_id`` in ``config`` (among the installed ones unless ``installed_only`` is
    false)."""
    names = preferred_baselines(task_id, config)
    if not names:
        raise UserInputError(f"no baseline covers task {task_id!r}", hint="see `rexmle baselines list`")
    usable = [n for n in names if not installed_only or get_baseline(n).installed()]
    if not usable:
        first = get_baseline(names[0])
        raise ConfigurationError(f"no baseline for task {task_id!r} is installed (they are {', '.join(names)})",
                                 hint=f"pip install 'rexmle-baselines[{first.extra}]' -c constraints.txt")
    return usable[0]


def lateralised_labels(task_id: str) -> bool:
    """Whether the task declares left/right labels (task.yaml ``lateralised_labels``)."""
    from rexmle_tasks.registry import get_task

    return bool(get_task(task_id).meta.lateralised_labels)


def seed_everything(seed: int, *, deterministic: bool = True, with_torch: bool = True) -> None:
    """Seed random, numpy and (when importable) torch. ``deterministic`` asks cuDNN for deterministic kernels
    (repeatable, but 1.5-3x slower in 3-D training) instead of its autotuned fastest ones."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    os.environ["PYTHONHASHSEED"] = str(seed)
    if not with_torch or importlib.util.find_spec("torch") is None:
        return
    import torch

    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic


def prepare_run(ctx: BaselineContext) -> None:
    """What every in-process baseline does first: caches under the work folder, the device checked, seeds set
    (with the config's ``deterministic`` switch)."""
    isolate_caches(ctx.work_dir)
    resolve_device(ctx.device)
    seed_everything(ctx.seed, deterministic=bool(ctx.params.get("deterministic", True)))


class TrainingDivergedError(RexmleError):
    """Training produced a NaN or infinite loss."""

    exit_code = 1

    def __init__(self, *, epoch: int, loss: float, last_finite: float | None) -> None:
        self.epoch = epoch
        self.loss = loss
        self.last_finite = last_finite
        last = "no finite loss before it" if last_finite is None else f"the last finite loss was {last_finite:.6g}"
        super().__init__(f"training diverged: the loss became {loss} at epoch {epoch}; {last}",
                         hint="lower the learning rate (--set lr=...), check the input normalisation, or change "
                              "the seed (--seed)")


def check_loss(loss: float, *, epoch: int, last_finite: float | None) -> float:
    """Return ``loss`` if finite, else raise :class:`TrainingDivergedError` naming the epoch and last finite loss."""
    value = float(loss)
    if not math.isfinite(value):
        raise TrainingDivergedError(epoch=epoch, loss=value, last_finite=last_finite)
    return value


def end_epoch(ctx: BaselineContext, epoch: int, epochs: int, mean_loss: float, last_finite: float | None, *,
              what: str = "") -> float:
    """:func:`check_loss` for an epoch's mean loss, logged at the first, the last and every fifth of the epochs;
    returns it as the new last finite loss."""
    loss = check_loss(mean_loss, epoch=epoch, last_finite=last_finite)
    if epoch == 1 or epoch == epochs or epoch % max(1, epochs // 5) == 0:
        ctx.log(f"{what}epoch {epoch}/{epochs}: loss {loss:.5g}")
    return loss


class CosineSchedule:
    """Cosine annealing of every parameter group's learning rate from its initial value to 0 over ``total`` steps,
    where ``total`` may change while training (a time-aware run learns how many epochs fit only after the first)."""

    def __init__(self, optimiser: Any, total: int) -> None:
        self.optimiser = optimiser
        self.initial = [float(group["lr"]) for group in optimiser.param_groups]
        self.total = max(1, int(total))
        self.done = 0

    def resize(self, total: int) -> None:
        self.total = max(1, int(total), self.done)

    def step(self) -> None:
        self.done += 1
        factor = 0.5 * (1.0 + math.cos(math.pi * min(self.done, self.total) / self.total))
        for group, initial in zip(self.optimiser.param_groups, self.initial, strict=True):
            group["lr"] = initial * factor


def adamw_cosine(model: Any, params: Mapping[str, Any], steps: int) -> tuple[Any, CosineSchedule]:
    """AdamW at ``lr`` / ``weight_decay`` from ``params`` and a cosine schedule annealed over ``steps`` steps."""
    import torch

    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=float(params["lr"]),
                                  weight_decay=float(params["weight_decay"]))
    return optimiser, CosineSchedule(optimiser, steps)


class EpochPlan:
    """How many epochs a training phase runs, given the run's deadline.

    Without a deadline: the configured ``epochs``. With one, after each epoch the phase's share of the time left
    (less ``reserve_s`` kept for predicting) is divided by the mean epoch time so far: a time-aware config
    (``time_aware``, the ``budget`` configs) stretches or shrinks its schedule to that many epochs (never more than
    ``epochs``); any other config only stops early when the next epoch would not fit, and says so. ``phases``: how
    many training phases (e.g. detectors, folds) still share the time, this one included."""

    def __init__(self, ctx: BaselineContext, epochs: int, *, phases: int = 1, what: str = "") -> None:
        self.ctx = ctx
        self.epochs = max(1, int(epochs))
        self.total = self.epochs
        self.time_aware = bool(ctx.params.get("time_aware", False))
        self.started = time.monotonic()
        self.phases = max(1, phases)
        self.what = what
        self.done = 0
        left = ctx.seconds_left()
        self.reserve_s = 0.0 if left is None else min(float(ctx.params.get("reserve_s", 0.0)), 0.3 * max(0.0, left))

    def after_epoch(self) -> int:
        """Record one finished epoch; returns the phase's (possibly new) total number of epochs."""
        self.done += 1
        left = self.ctx.seconds_left()
        if left is None:
            self._record()
            return self.total
        per_epoch = (time.monotonic() - self.started) / self.done
        usable = (left - self.reserve_s) / self.phases
        affordable = self.done + max(0, int(usable // max(per_epoch, 1e-9)))
        if self.time_aware:
            total = max(self.done, min(self.epochs, affordable))
            if total != self.total and self.done == 1:
                self.ctx.log(f"{self.what}time budget: {total} epochs of {per_epoch:.1f} s fit (at most {self.epochs})")
            self.total = total
        elif affordable < self.total:
            self.total = max(self.done, affordable)
            self.ctx.log(f"{self.what}the deadline stops training after epoch {self.total} of {self.epochs}")
        self._record()
        return self.total

    def _record(self) -> None:
        self.ctx.measurements.setdefault("epochs_run", {})[self.what.strip(" ,") or "model"] = self.total


class StepClock:
    """Times a training phase's optimiser steps, the first apart: it also pays for lazy CUDA initialisation, cuDNN
    autotuning and the first allocations (2.5 s of a ResNet-50 smoke's 10 steps on an H200), so the seconds per
    step that estimates extrapolate to a long run are those after it. The time between steps (data loading,
    validation, epoch ends) is counted."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.steps = 0
        self.first_step_s: float | None = None

    def tick(self) -> None:
        """One optimiser step done."""
        self.steps += 1
        if self.steps == 1:
            self.first_step_s = time.monotonic() - self.started

    def seconds_per_step(self) -> float | None:
        """Steady seconds per step so far (a single step's own time when it is the only one; None before one)."""
        if self.first_step_s is None:
            return None
        elapsed = time.monotonic() - self.started
        if self.steps == 1:
            return elapsed
        return (elapsed - self.first_step_s) / (self.steps - 1)


def record_speed(ctx: BaselineContext, *, clock: StepClock | None = None, what: str = "model") -> None:
    """Seconds per optimiser step of a training phase (steady, after the first step) and the first step's seconds,
    and the peak GPU memory so far, into the run's record."""
    per_step = clock.seconds_per_step() if clock is not None else None
    if clock is not None and clock.first_step_s is not None and per_step is not None:
        ctx.measurements.setdefault("seconds_per_step", {})[what] = round(per_step, 5)
        ctx.measurements.setdefault("first_step_seconds", {})[what] = round(clock.first_step_s, 3)
    if ctx.device == "cuda":
        import torch

        peak = torch.cuda.max_memory_allocated() / 2**30
        ctx.measurements["peak_gpu_memory_gb"] = round(max(peak, ctx.measurements.get("peak_gpu_memory_gb", 0.0)), 3)


def autocast(ctx: BaselineContext) -> Any:
    """Mixed precision (bfloat16 autocast) on a GPU when the config's ``amp`` is on; a no-op otherwise."""
    import contextlib

    if ctx.device != "cuda" or not ctx.params.get("amp", False):
        return contextlib.nullcontext()
    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16)


def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str) -> str:
    """``"cpu"`` or ``"cuda"`` (``"auto"``: cuda when a GPU is usable, else cpu); asking for cuda without a usable
    GPU raises :class:`ConfigurationError`."""
    if device not in DEVICES:
        raise ConfigurationError(f"device must be one of {', '.join(DEVICES)}, got {device!r}",
                                 hint="use --device auto (the default), cpu or cuda")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise ConfigurationError("--device cuda was asked for but no CUDA GPU is usable here "
                                 "(torch.cuda.is_available() is False or torch is not installed)",
                                 hint="run with --device cpu, or on a machine with an NVIDIA GPU and CUDA torch")
    return device


def check_device_for_config(config: str, device: str, *, allow_cpu: bool) -> None:
    """A GPU-sized config (budget, full, smoke) on a CPU takes days: refused unless ``allow_cpu``."""
    if config in GPU_CONFIGS and device == "cpu" and not allow_cpu:
        raise ConfigurationError(f"the {config!r} configuration is sized for a GPU and would take days on a CPU",
                                 hint="run it with --device cuda on a GPU machine, use --config quick here, or pass "
                                      "--allow-cpu if you really mean it")


def publish_submission(staging: Path, out_dir: Path) -> None:
    """Move a finished submission from ``staging`` into ``out_dir`` so that ``out_dir`` always holds a complete
    one: each prediction file is replaced atomically, ``submission.csv`` last (a run killed half-way leaves
    whole files of the previous or of the new submission, every one named by the table)."""
    from rexmle_grade.schema import SUBMISSION_CSV

    files = sorted(p for p in staging.rglob("*") if p.is_file() and p.name != SUBMISSION_CSV)
    for path in [*files, staging / SUBMISSION_CSV]:
        target = out_dir / path.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        shutil.copyfile(path, partial)
        os.replace(partial, target)
    shutil.rmtree(staging)


def isolate_caches(work_dir: Path) -> None:
    """Point every cache and model folder a library may write to under ``work_dir`` and forbid hub downloads
    (a sandbox has a read-only HOME and no network)."""
    cache = work_dir / "cache"
    folders = {
        "TORCH_HOME": cache / "torch",
        "HF_HOME": cache / "huggingface",
        "MPLCONFIGDIR": cache / "matplotlib",
        "XDG_CACHE_HOME": cache / "xdg",
        "nnUNet_raw": work_dir / "nnUNet_raw",
        "nnUNet_preprocessed": work_dir / "nnUNet_preprocessed",
        "nnUNet_results": work_dir / "nnUNet_results",
    }
    for variable, folder in folders.items():
        folder.mkdir(parents=True, exist_ok=True)
        os.environ[variable] = str(folder)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
