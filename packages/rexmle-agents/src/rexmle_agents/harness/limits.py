"""The limits a run's sandbox actually enforces, settled once per run and recorded in its journal.

A spec may leave the memory and disk limits to the harness (``None``: the safe default of this machine), and the
run id must not depend on the machine, so the values are worked out when a run first starts and journaled
(with ``run_started``); every later attempt, and ``rexmle sandbox exec``, reads them back rather than recomputing
them on another machine or with another number of workers.

* memory: the machine's memory (or the harness's own cgroup limit, or its SLURM job's memory, if lower), less a
  reserve for the harness and the system (10%, at least 1 GiB), shared by the runs that go on at once; at least
  1 GiB;
* workspace disk: :data:`DEFAULT_DISK_GB`, or half the free space of the workspace's file system shared by the
  runs at once if that is less; and at most ``max_files`` entries and :data:`~rexmle_agents.safe_workspace.MAX_DEPTH`
  folder levels;
* largest file: the spec's ``max_file_gb``;
* run folder: what the harness itself writes for the run besides the workspace (journal, model cassette, command
  logs, snapshots, the final submission) may hold at most the spec's ``run_folder_gb``, else
  :data:`DEFAULT_RUN_FOLDER_GB`: every answered model request is a cassette line, so agent code could otherwise grow
  the host's disk through its prompts. :class:`RunFolderWatch` measures it for the watchdog.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rexmle_agents.harness.spec import RunSpec

GIB = 1024**3
DEFAULT_DISK_GB = 100.0
DEFAULT_RUN_FOLDER_GB = 5.0
MEMORY_RESERVE_FRACTION = 0.10
MIN_RESERVE_BYTES = 1 * GIB
MIN_RUN_MEMORY_BYTES = 1 * GIB


@dataclass(frozen=True)
class EffectiveLimits:
    memory_bytes: int | None
    max_file_bytes: int | None
    disk_bytes: int
    max_files: int
    max_processes: int
    cpus: int | None
    how: dict[str, str]  # limit -> where its value came from ("spec", or the auto rule with its inputs)
    # journals written before this limit existed read back with the default
    run_folder_bytes: int = int(DEFAULT_RUN_FOLDER_GB * GIB)

    def to_event(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> EffectiveLimits:
        return cls(**{name: event[name] for name in cls.__dataclass_fields__ if name in event})

    def describe(self) -> str:
        memory = "none" if self.memory_bytes is None else f"{self.memory_bytes / GIB:.1f} GiB"
        return (f"memory {memory}, workspace disk {self.disk_bytes / GIB:.1f} GiB and {self.max_files} files, "
                f"largest file {'none' if self.max_file_bytes is None else f'{self.max_file_bytes / GIB:g} GiB'}, "
                f"run folder {self.run_folder_bytes / GIB:.1f} GiB")


def machine_memory_bytes() -> int:
    """Physical memory, or what this process is granted when that is lower: the memory limit of its cgroup (a
    container's limit, a SLURM job's under task/cgroup) or its SLURM job's memory (also where SLURM enforces it
    without cgroups)."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        physical = 0
    limits = [physical] if physical else []
    for limit in [*_own_cgroup_memory_limits(), slurm_job_memory_bytes()]:
        if 0 < limit < (physical or limit + 1):
            limits.append(limit)
    return min(limits) if limits else 0


def slurm_job_memory_bytes() -> int:
    """The memory of the SLURM job this process runs in (``SLURM_MEM_PER_NODE``, or ``SLURM_MEM_PER_CPU`` times
    ``SLURM_CPUS_ON_NODE``; both in MB); 0 outside a job."""
    per_node = os.environ.get("SLURM_MEM_PER_NODE", "")
    if per_node.isdigit():
        return int(per_node) * 1024**2
    per_cpu, cpus = os.environ.get("SLURM_MEM_PER_CPU", ""), os.environ.get("SLURM_CPUS_ON_NODE", "")
    if per_cpu.isdigit() and cpus.isdigit():
        return int(per_cpu) * int(cpus) * 1024**2
    return 0


def _own_cgroup_memory_limits() -> list[int]:
    found: list[int] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidates = [Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.max"]
        elif "memory" in controllers.split(","):
            candidates = [Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.limit_in_bytes"]
        else:
            continue
        for file in candidates:
            try:
                text = file.read_text().strip()
            except OSError:
                continue
            if text.isdigit():
                found.append(int(text))
    return found


def auto_memory_bytes(concurrent_runs: int, total: int | None = None) -> tuple[int | None, str]:
    total = machine_memory_bytes() if total is None else total
    if total <= 0:
        return None, "auto: the machine's memory is unknown, so no memory limit"
    reserve = max(MIN_RESERVE_BYTES, int(total * MEMORY_RESERVE_FRACTION))
    share = max(MIN_RUN_MEMORY_BYTES, (total - reserve) // max(1, concurrent_runs))
    return share, (f"auto: ({total / GIB:.1f} GiB - {reserve / GIB:.1f} GiB reserve) / {concurrent_runs} run(s) "
                   "at once")


def auto_disk_bytes(workspace: Path, concurrent_runs: int) -> tuple[int, str]:
    free = shutil.disk_usage(workspace).free
    share = int(free * 0.5 / max(1, concurrent_runs))
    default = int(DEFAULT_DISK_GB * GIB)
    if share < default:
        return share, f"auto: half of the {free / GIB:.1f} GiB free / {concurrent_runs} run(s) at once"
    return default, f"auto: the default {DEFAULT_DISK_GB:g} GiB"


def resolve_limits(spec: RunSpec, *, workspace: Path, concurrent_runs: int = 1) -> EffectiveLimits:
    res = spec.resources
    how: dict[str, str] = {}
    if res.memory_gb is None:
        memory, how["memory"] = auto_memory_bytes(concurrent_runs)
    else:
        memory, how["memory"] = int(res.memory_gb * GIB), "spec (--memory-gb)"
    if res.disk_gb is None:
        disk, how["disk"] = auto_disk_bytes(workspace, concurrent_runs)
    else:
        disk, how["disk"] = int(res.disk_gb * GIB), "spec (--disk-gb)"
    if res.run_folder_gb is None:
        folder, how["run_folder"] = int(DEFAULT_RUN_FOLDER_GB * GIB), f"the default {DEFAULT_RUN_FOLDER_GB:g} GiB"
    else:
        folder, how["run_folder"] = int(res.run_folder_gb * GIB), "spec (--run-folder-gb)"
    return EffectiveLimits(memory_bytes=memory,
                           max_file_bytes=None if res.max_file_gb is None else int(res.max_file_gb * GIB),
                           disk_bytes=disk, max_files=res.max_files, max_processes=res.max_processes,
                           cpus=res.cpus, how=how, run_folder_bytes=folder)


def recorded_limits(events: Sequence[Mapping[str, Any]]) -> EffectiveLimits | None:
    """The limits journaled (with ``run_started``) when the run first started; None before that."""
    for event in events:
        if event.get("kind") in ("run_started", "run_resumed") and isinstance(event.get("limits"), Mapping):
            return EffectiveLimits.from_event(event["limits"])
    return None


class RunFolderWatch:
    """The run folder limit, checked by the watchdog: bytes allocated by everything in the run folder but the
    workspace (which :class:`~rexmle_agents.harness.runner.DiskWatch` bounds), links not followed; measured at
    intervals that grow with the cost of a scan. The harness writes these files, not agent code, so a plain walk
    suffices."""

    PREFIX = "run folder limit"
    LIMIT = "run_folder"  # the limit's name in status.json and the journal
    MIN_INTERVAL_S = 2.0
    COST_FACTOR = 20

    def __init__(self, run_dir: Path, limit_bytes: int, *, skip: Sequence[str] = ("workspace",)) -> None:
        self.run_dir = Path(run_dir)
        self.limit_bytes = limit_bytes
        self.skip = tuple(skip)
        self.next_at = 0.0
        self.last: dict[str, Any] = {}

    def measure(self) -> tuple[int, int]:
        """(bytes allocated, entries) of the run folder without the skipped top-level names: the same walk as the
        workspace's disk limit (:meth:`~rexmle_agents.safe_workspace.Workspace.usage`)."""
        from rexmle_agents.safe_workspace import Workspace

        usage = Workspace(self.run_dir).usage(skip=self.skip)
        return usage.bytes, usage.entries

    def check(self, now: float) -> str | None:
        """None while the run folder is within its limit; else why it is not."""
        if now < self.next_at:
            return None
        started = time.monotonic()
        size, entries = self.measure()
        took = time.monotonic() - started
        self.next_at = now + max(self.MIN_INTERVAL_S, self.COST_FACTOR * took)
        self.last = {"bytes": size, "entries": entries, "scan_s": round(took, 4)}
        if size > self.limit_bytes:
            return (f"{self.PREFIX} exceeded: the run folder (journal, model cassette, logs, snapshots; the "
                    f"workspace apart) holds {size / GIB:.3f} GiB, the limit is {self.limit_bytes / GIB:.3f} GiB "
                    "(--run-folder-gb)")
        return None
