"""One control group per command: memory, process-count and CPU limits that root cannot ignore.

``RLIMIT_NPROC`` does not bind root and ``RLIMIT_AS`` counts address space rather than memory (CUDA reserves
terabytes of it), so where the machine lets us write control groups every command gets its own: created under the
harness's own cgroup (so the machine's limits on the harness still apply above it), the command moved in before it
execs (:attr:`RunCgroup.procs_files`, written by the child itself), killed member by member and removed afterwards.

Both layouts are handled: v2 (one ``cgroup2`` tree with ``memory`` and ``pids`` delegated to our cgroup) and v1
(one tree per controller under ``/sys/fs/cgroup/<controller>``). Detection runs once per process.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
_V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
_CPU_PERIOD_US = 100_000
_counter = itertools.count()


@dataclass(frozen=True)
class CgroupSupport:
    """Where this process may create per-command cgroups: the parent folder of each usable controller."""

    version: int  # 1 or 2
    parents: dict[str, Path]  # controller -> folder in which run cgroups are created (v2: one folder for all)

    def has(self, controller: str) -> bool:
        return controller in self.parents

    def describe(self) -> str:
        return f"cgroup-v{self.version} ({', '.join(sorted(self.parents))})"


def _own_paths() -> dict[str, str]:
    """{controller or "" for v2: this process's cgroup path} from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def _probe_writable(parent: Path) -> bool:
    probe = parent / f"rexmle-probe-{os.getpid()}-{next(_counter)}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        probe.rmdir()
    except OSError as exc:
        log.warning("could not remove the probe cgroup %s: %s", probe, exc)
    return True


def _detect_v2(own: dict[str, str]) -> CgroupSupport | None:
    for mount in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        if (mount / "cgroup.controllers").is_file() and "" in own:
            parent = mount / own[""].lstrip("/")
            break
    else:
        return None
    try:
        available = set((parent / "cgroup.controllers").read_text().split())
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
    except OSError:
        return None
    if not {"memory", "pids"} <= available:
        return None
    wanted = {"memory", "pids", "cpu"} & available
    missing = wanted - enabled
    if missing:
        # Enabling a controller for our children fails (EBUSY) when our own cgroup holds processes and is not the
        # root: the "no internal processes" rule. Then v2 is not delegated to us and we fall back.
        try:
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(missing)))
        except OSError:
            wanted -= missing
    if not {"memory", "pids"} <= wanted or not _probe_writable(parent):
        return None
    return CgroupSupport(version=2, parents={c: parent for c in sorted(wanted)})


def _detect_v1(own: dict[str, str]) -> CgroupSupport | None:
    parents: dict[str, Path] = {}
    for controller in _V1_CONTROLLERS:
        mount = CGROUP_ROOT / controller
        if controller not in own or not (mount / "cgroup.procs").is_file():
            continue
        parent = mount / own[controller].lstrip("/")
        if _probe_writable(parent):
            parents[controller] = parent
    if not parents:
        return None
    return CgroupSupport(version=1, parents=parents)


@functools.cache
def detect_cgroups() -> CgroupSupport | None:
    """The cgroup layout usable for per-command limits here, or None (then rlimits are the fallback)."""
    try:
        own = _own_paths()
    except OSError:
        return None
    support = _detect_v2(own) or _detect_v1(own)
    log.debug("cgroup support: %s", support.describe() if support else "none writable")
    if support is not None:
        _sweep_stale(support)
    return support


def _sweep_stale(support: CgroupSupport) -> None:
    """Remove the empty cgroups that harness processes killed outright (SIGKILL, reboot of a container) left."""
    for parent in set(support.parents.values()):
        for folder in parent.glob("rexmle-*-*"):
            owner = folder.name.split("-")[1]
            if not owner.isdigit() or Path(f"/proc/{owner}").exists():
                continue
            try:
                folder.rmdir()
            except OSError as exc:  # still has members: leave it to whoever owns them
                log.debug("stale cgroup %s kept: %s", folder, exc)


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _read_keyed(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return 0
    return 0


class RunCgroup:
    """The cgroup(s) of one command. Create with :meth:`create`; :meth:`remove` when the command is over."""

    def __init__(self, support: CgroupSupport, dirs: dict[str, Path]) -> None:
        self.support = support
        self.dirs = dirs

    @classmethod
    def create(cls, support: CgroupSupport, *, memory_bytes: int | None, max_processes: int | None,
               cpus: int | None) -> RunCgroup:
        name = f"rexmle-{os.getpid()}-{next(_counter)}-{time.monotonic_ns() % 10**9}"
        dirs: dict[str, Path] = {}
        try:
            if support.version == 2:
                folder = next(iter(support.parents.values())) / name
                folder.mkdir()
                dirs = dict.fromkeys(support.parents, folder)
                if memory_bytes is not None:
                    (folder / "memory.max").write_text(str(memory_bytes))
                    if (folder / "memory.swap.max").exists():
                        (folder / "memory.swap.max").write_text("0")
                if max_processes is not None:
                    (folder / "pids.max").write_text(str(max_processes))
                if cpus is not None and "cpu" in dirs:
                    (folder / "cpu.max").write_text(f"{cpus * _CPU_PERIOD_US} {_CPU_PERIOD_US}")
            else:
                unused = {"memory": memory_bytes is None, "cpu": cpus is None}
                for controller, parent in support.parents.items():
                    if unused.get(controller):
                        continue  # each hierarchy joined costs a cgroup move at start
                    (parent / name).mkdir()
                    dirs[controller] = parent / name
                if memory_bytes is not None and "memory" in dirs:
                    (dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    memsw = dirs["memory"] / "memory.memsw.limit_in_bytes"
                    if memsw.exists():  # without it, swap would extend the limit
                        memsw.write_text(str(memory_bytes))
                if max_processes is not None and "pids" in dirs:
                    (dirs["pids"] / "pids.max").write_text(str(max_processes))
                if cpus is not None and "cpu" in dirs:
                    (dirs["cpu"] / "cpu.cfs_period_us").write_text(str(_CPU_PERIOD_US))
                    (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(cpus * _CPU_PERIOD_US))
        except OSError:
            cls(support, dirs).remove()
            raise
        return cls(support, dirs)

    @property
    def procs_files(self) -> tuple[bytes, ...]:
        """The cgroup.procs files the child writes its own pid into before exec (one per hierarchy)."""
        return tuple(dict.fromkeys(os.fsencode(d / "cgroup.procs") for d in self.dirs.values()))

    def members(self) -> set[int]:
        pids: set[int] = set()
        for folder in set(self.dirs.values()):
            try:
                pids.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
            except OSError:
                continue
        return pids

    def kill(self, *, spare: int | None = None, deadline_s: float = 5.0) -> None:
        """SIGKILL every member but ``spare`` (the exited, unreaped main process) until none is left (a fork bomb
        keeps forking while we kill: repeat)."""
        kill_file = next(iter(self.dirs.values())) / "cgroup.kill" if self.support.version == 2 else None
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if kill_file is not None and kill_file.exists():
                try:
                    kill_file.write_text("1")
                except OSError as exc:
                    log.debug("cgroup.kill failed: %s", exc)
            pids = self.members() - {spare}
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
            time.sleep(0.005)
        log.warning("processes %s of cgroup %s survived SIGKILL for %.0f s", sorted(self.members()),
                    self.dirs, deadline_s)

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer ended in this cgroup (v1 falls back to failcnt)."""
        folder = self.dirs.get("memory")
        if folder is None:
            return 0
        if self.support.version == 2:
            return _read_keyed(folder / "memory.events", "oom_kill")
        try:
            control = (folder / "memory.oom_control").read_text()
        except OSError:
            control = ""
        if "oom_kill " in control:
            return _read_keyed(folder / "memory.oom_control", "oom_kill")
        return _read_int(folder / "memory.failcnt")  # kernels before 4.13 have no oom_kill counter

    def cpu_seconds(self) -> float | None:
        """CPU time of every process that ran in this cgroup (None without CPU accounting)."""
        if self.support.version == 2:
            folder = next(iter(self.dirs.values()))
            return _read_keyed(folder / "cpu.stat", "usage_usec") / 1e6
        folder = self.dirs.get("cpuacct")
        return None if folder is None else _read_int(folder / "cpuacct.usage") / 1e9

    def process_limit_hits(self) -> int:
        """How many forks failed because the process limit was reached."""
        folder = self.dirs.get("pids")
        return 0 if folder is None else _read_keyed(folder / "pids.events", "max")

    def remove(self) -> None:
        for folder in set(self.dirs.values()):
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        log.warning("could not remove cgroup %s: %s", folder, exc)
                        break
                    time.sleep(0.01)  # the last member is still being torn down
            else:
                log.warning("cgroup %s is still busy; left behind", folder)
