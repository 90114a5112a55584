"""What the machine offers a run: CPUs, memory, GPUs (read once; GPUs through nvidia-smi when present)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess


@functools.cache
def gpu_ids() -> tuple[str, ...]:
    """Indices of the visible NVIDIA GPUs (respecting CUDA_VISIBLE_DEVICES), () when there are none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return tuple(v.strip() for v in visible.split(",") if v.strip() and v.strip() != "-1")
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in out.splitlines() if line.strip())


def memory_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    except (ValueError, OSError):
        return 0.0


def usable_cpus() -> int:
    """The cores this process may run on (a SLURM job's or a container's share, through its CPU affinity)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def describe(gpus: tuple[str, ...], cpus: int | None, memory_limit_gb: float | None) -> dict[str, object]:
    return {
        "cpus": cpus or usable_cpus(),
        "memory_gb": round(memory_limit_gb or memory_gb(), 1),
        "gpus": len(gpus),
        "gpu_ids": list(gpus),
    }


@functools.cache
def gpu_names(ids: tuple[str, ...]) -> tuple[str, ...]:
    """The model names of the GPUs with these indices (nvidia-smi), () when unknown."""
    if not ids or shutil.which("nvidia-smi") is None:
        return ()
    try:
        out = subprocess.run(["nvidia-smi", f"--id={','.join(ids)}", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in out.splitlines() if line.strip())


@functools.cache
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def measured(gpus: tuple[str, ...], cpus: int | None, memory_limit_gb: float | None) -> dict[str, object]:
    """What a run has, as recorded in its ``status.json`` (results compare runs on this, never on what a user says)."""
    return {**describe(gpus, cpus, memory_limit_gb), "cpu_model": cpu_model(), "gpu_names": list(gpu_names(gpus))}
