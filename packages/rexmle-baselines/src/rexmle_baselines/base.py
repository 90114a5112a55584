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
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from rexmle_grade.errors import ConfigurationError, RexmleError, UnknownNameError

CONFIGS = ("quick", "full")


@dataclass(frozen=True)
class BaselineContext:
    """Everything one baseline run may use."""

    task_id: str
    grader_id: str
    public_dir: Path          # the task's public/ folder (read only): all a baseline may read
    out_dir: Path             # submission.csv + prediction files (created empty by the runner)
    work_dir: Path            # scratch: models, caches, nnU-Net folders
    config: str               # "quick" | "full"
    params: Mapping[str, Any]  # the config's parameters after overrides
    device: str               # "cpu" | "cuda"
    seed: int
    log: Callable[[str], None]  # progress lines (the runner prints/journals them)


class Baseline(ABC):
    """One expert pipeline. Subclasses set the class variables and implement :meth:`run`."""

    name: ClassVar[str]
    extra: ClassVar[str]                  # the pip extra that installs what ``requires`` names
    requires: ClassVar[tuple[str, ...]]   # modules that must import, e.g. ("torch", "nnunetv2")
    description: ClassVar[str]
    configs: ClassVar[dict[str, dict[str, Any]]]  # at least "quick" (CPU, minutes) and "full" (published recipe)

    def supports(self, task_id: str, grader_id: str) -> bool:
        """Whether this baseline can produce a submission for the task (by default: none)."""
        return False

    @abstractmethod
    def run(self, ctx: BaselineContext) -> None:
        """Train on the public training data and write a submission that validates into ``ctx.out_dir``."""

    def installed(self) -> bool:
        """Whether every module in ``requires`` can be imported (checked without importing it)."""
        return all(importlib.util.find_spec(module) is not None for module in self.requires)

    def missing_modules(self) -> list[str]:
        return [module for module in self.requires if importlib.util.find_spec(module) is None]


B = TypeVar("B", bound=type[Baseline])
_REGISTRY: dict[str, type[Baseline]] = {}
# modules holding baselines: imported on first registry access so each registers itself; none imports torch at import
_BASELINE_MODULES = ("nnunet", "monai_seg", "detector", "timm_models", "enhance")


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


def seed_everything(seed: int) -> None:
    """Seed random, numpy and (when importable) torch, and ask torch for deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    os.environ["PYTHONHASHSEED"] = str(seed)
    if importlib.util.find_spec("torch") is None:
        return
    import torch

    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


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


def adamw_cosine(model: Any, params: Mapping[str, Any], steps: int) -> tuple[Any, Any]:
    """AdamW at ``lr`` / ``weight_decay`` from ``params`` and a cosine schedule annealed over ``steps`` steps."""
    import torch

    optimiser = torch.optim.AdamW(model.parameters(), lr=float(params["lr"]),
                                  weight_decay=float(params["weight_decay"]))
    return optimiser, torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=max(1, steps))


def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def resolve_device(device: str) -> str:
    """``"cpu"`` or ``"cuda"``; asking for cuda without a usable GPU raises :class:`ConfigurationError`."""
    if device not in ("cpu", "cuda"):
        raise ConfigurationError(f"device must be 'cpu' or 'cuda', got {device!r}", hint="use --device cpu or cuda")
    if device == "cuda" and not cuda_available():
        raise ConfigurationError("--device cuda was asked for but no CUDA GPU is usable here "
                                 "(torch.cuda.is_available() is False or torch is not installed)",
                                 hint="run with --device cpu, or on a machine with an NVIDIA GPU and CUDA torch")
    return device


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
