"""Starting, limiting, watching and killing one host command: the part every sandbox runtime shares.

The command starts in a new session (its own process group), in its own cgroup where the machine allows one
(:mod:`._cgroups`), else under rlimits. Its stdout/stderr are pipes the waiting loop reads (no pump threads) into
bounded log files: the first :data:`LOG_HEAD_BYTES` of each stream, then a line saying how much was left out, then
its last :data:`LOG_TAIL_BYTES` (agent output is data of unbounded size; the host's disk is not). The harness
waits on a pidfd, so a finished command is noticed at once while timeouts, cancellation and a process-limit storm
are checked every :data:`POLL_S`. Killing means SIGKILL to the
process group, to every member of the cgroup and to every descendant still found in /proc; the PID namespace of
an isolating runtime then takes whatever is left with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rexmle_agents.sandbox._cgroups import CgroupSupport, RunCgroup, detect_cgroups
from rexmle_agents.sandbox.identity import join_fresh_session_keyring
from rexmle_grade.errors import SandboxError

log = logging.getLogger(__name__)

POLL_S = 0.1
TAIL_BYTES = 8192
LOG_HEAD_BYTES = 4 * 1024 * 1024
LOG_TAIL_BYTES = 1024 * 1024
_READ_BYTES = 256 * 1024
_DRAIN_S = 2.0  # after the command is over, how long its pipes are read before they are abandoned
# A process tree whose forks keep failing at the process limit for this long is a fork storm, not a program that
# noticed the limit and coped: it is killed then rather than at the timeout.
PROCESS_STORM_S = 2.0
STORM_GAP_S = 0.5  # fork failures further apart than this are not one storm

RUNTIME_PROCESSES = (b"bwrap", b"setpriv")  # a sandbox runtime's own processes above the command it runs
KILL_TIMEOUT = "timeout"
KILL_CANCEL = "cancel"
KILL_PROCESSES = "processes"


@dataclass(frozen=True)
class LimitPlan:
    """How one sandbox enforces its limits: which in cgroups, which as rlimits."""

    cgroups: CgroupSupport | None
    memory_bytes: int | None
    max_processes: int | None
    cpus: int | None
    rlimits: tuple[tuple[int, int], ...]  # (resource, value) set in the child before exec
    mechanism: str

    @property
    def memory_by_rlimit(self) -> bool:
        return any(r == resource.RLIMIT_AS for r, _ in self.rlimits)

    @property
    def processes_by_rlimit(self) -> bool:
        return any(r == resource.RLIMIT_NPROC for r, _ in self.rlimits)


def plan_limits(*, memory_bytes: int | None, max_processes: int | None, max_file_bytes: int | None,
                cpus: int | None, gpus: bool, use_cgroups: bool = True) -> LimitPlan:
    """Cgroups for memory, processes and CPU where writable; rlimits for the rest; RLIMIT_FSIZE always."""
    support = detect_cgroups() if use_cgroups else None
    rlimits: list[tuple[int, int]] = []
    parts: list[str] = []
    by_cgroup = [name for name, wanted, ctrl in (("memory", memory_bytes, "memory"),
                                                 ("processes", max_processes, "pids"),
                                                 ("cpus", cpus, "cpu"))
                 if wanted is not None and support is not None and support.has(ctrl)]
    if by_cgroup and support is not None:
        parts.append(f"{support.describe()}: {', '.join(by_cgroup)}")
    if memory_bytes is not None and "memory" not in by_cgroup:
        if gpus:
            # RLIMIT_AS counts address space; CUDA maps far more than it uses, so it would break every GPU job.
            log.warning("no writable memory cgroup and GPUs in use: the memory limit is NOT enforced")
            parts.append("memory: not enforced (GPU jobs cannot run under RLIMIT_AS)")
        else:
            rlimits.append((resource.RLIMIT_AS, memory_bytes))
    if max_processes is not None and "processes" not in by_cgroup:
        rlimits.append((resource.RLIMIT_NPROC, max_processes))
        if os.geteuid() == 0:
            log.warning("no writable pids cgroup and running as root: RLIMIT_NPROC does not bind root, so the "
                        "process limit is NOT enforced")
    if max_file_bytes is not None:
        rlimits.append((resource.RLIMIT_FSIZE, max_file_bytes))
    names = {resource.RLIMIT_AS: "as", resource.RLIMIT_NPROC: "nproc", resource.RLIMIT_FSIZE: "fsize"}
    if rlimits:
        parts.append("rlimit: " + ", ".join(names[r] for r, _ in rlimits))
    # A cgroup is used even without limits in it: it finds every process of the command (to kill) and counts their
    # CPU time.
    return LimitPlan(cgroups=support, memory_bytes=memory_bytes if "memory" in by_cgroup
                     else None, max_processes=max_processes if "processes" in by_cgroup else None,
                     cpus=cpus if "cpus" in by_cgroup else None, rlimits=tuple(rlimits),
                     mechanism="; ".join(parts) or "no limits set")


@dataclass(frozen=True)
class Launch:
    """The host side of one command: what to exec, with which environment, where; and an extra stop action for
    runtimes whose processes are not our descendants (a Docker container belongs to the engine)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path | None = None
    on_kill: Callable[[], None] | None = None


@dataclass(eq=False)  # identity, not value: kept in a set of commands in flight
class Running:
    """One command in flight; :meth:`stop` may be called from any thread (the watchdog's kill_all) until the
    command is reaped, never after (its pid could belong to another process by then)."""

    proc: subprocess.Popen[bytes]
    cgroup: RunCgroup | None
    on_kill: Callable[[], None] | None
    killed_for: str | None = None
    reaped: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def stop(self, reason: str) -> None:
        with self.lock:
            if self.reaped:
                return
            if self.killed_for is None:
                self.killed_for = reason
            kill_tree(self.proc.pid, self.cgroup, descendants=True)
            if self.on_kill is not None:
                self.on_kill()

    def interrupt(self, signum: int) -> bool:
        """Send ``signum`` to the command itself (the first process of its tree that is not the runtime's own,
        e.g. below bubblewrap's monitor and init), not to its whole tree: a gentle stop it may handle (finish
        writing, run its clean-up). False when the command is gone or could not be found."""
        with self.lock:
            if self.reaped:
                return False
            target = self.proc.pid
            for pid in [self.proc.pid, *_descendants(self.proc.pid)]:
                try:
                    with open(f"/proc/{pid}/comm", "rb") as fh:
                        name = fh.read().strip()
                except OSError:
                    continue
                if name not in RUNTIME_PROCESSES:
                    target = pid
                    break
            try:
                os.kill(target, signum)
            except ProcessLookupError:
                return False
            return True

    def reap(self) -> tuple[int, resource.struct_rusage]:
        """Kill what the main process left behind (it is still unreaped, so its ids are still ours), then reap."""
        with self.lock:
            kill_tree(self.proc.pid, self.cgroup, descendants=False, spare_main=True)
            _, status, usage = os.wait4(self.proc.pid, 0)
            self.reaped = True
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        return self.proc.returncode, usage


@dataclass(frozen=True)
class Outcome:
    """What the host saw of one command, before classification."""

    returncode: int  # as subprocess reports it: negative for a signal
    killed_for: str | None
    wall_s: float
    cpu_s: float
    oom_kills: int
    process_limit_hits: int


def _descendants(root: int) -> list[int]:
    """Every process whose ancestry leads to ``root``, from /proc (children of a session leader that left it)."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        parents[int(entry.name)] = int(fields[1])
    found: list[int] = []
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        kids = [pid for pid, ppid in parents.items() if ppid == parent]
        found.extend(kids)
        frontier.extend(kids)
    return found


def kill_tree(pid: int, cgroup: RunCgroup | None, *, descendants: bool, spare_main: bool = False) -> None:
    """SIGKILL the command's process group, its cgroup and (``descendants``: while its tree is intact) every
    descendant. ``pid`` must not be reaped yet (then neither it nor its process group id can have been reused)."""
    for victim in _descendants(pid) if descendants else ():
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if not spare_main:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if cgroup is not None:
        cgroup.kill(spare=pid if spare_main else None)


def _child_setup(procs_files: tuple[bytes, ...], rlimits: tuple[tuple[int, int], ...]) -> Callable[[], None]:
    """Runs in the forked child before exec: join the cgroup first (so every later fork is counted), set the
    rlimits and subscribe to a new session keyring (what the command starts inherits it: no command possesses the
    harness's session keyring or another's). Only plain system calls: the harness may have other threads."""

    def setup() -> None:
        pid = str(os.getpid()).encode()
        for path in procs_files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        for res, value in rlimits:
            resource.setrlimit(res, (value, value))
        join_fresh_session_keyring()

    return setup


def tail(path: Path, size: int = TAIL_BYTES) -> str:
    """The last ``size`` bytes of a log file, decoded leniently (agent output is not always UTF-8)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


class LogSink:
    """One output stream kept in a bounded file: the head as it comes, the tail held back and written on close."""

    def __init__(self, path: Path, *, head_bytes: int = LOG_HEAD_BYTES, tail_bytes: int = LOG_TAIL_BYTES) -> None:
        # unbuffered: the head is on disk as it comes, so progress can be read while the command runs
        self.file = open(path, "wb", buffering=0)  # noqa: SIM115 (closed in close())
        self.head_left = head_bytes
        self.tail_bytes = tail_bytes
        self.held = bytearray()
        self.dropped = 0  # bytes neither in the head nor in the held tail

    def write(self, data: bytes) -> None:
        if self.head_left > 0:
            taken = min(len(data), self.head_left)
            self._write_all(data[:taken])
            self.head_left -= taken
            data = data[taken:]
        if data:
            self.held += data
            excess = len(self.held) - self.tail_bytes
            if excess > 0:
                del self.held[:excess]
                self.dropped += excess

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self.file.write(view):]

    def close(self) -> None:
        if self.held:
            if self.dropped:
                self._write_all(f"\n[rexmle: {self.dropped} bytes of output left out here]\n".encode())
            self._write_all(bytes(self.held))
        self.file.close()


def run_host(launch: Launch, plan: LimitPlan, *, stdout_path: Path, stderr_path: Path, timeout_s: float | None,
             cancel: threading.Event | None, register: Callable[[Running | None], None]) -> Outcome:
    """Run one host command to its end (or kill it), keeping its output in the two files. ``register`` is told of
    the command once it runs and with None once it is over, so that kill_all can reach it meanwhile."""
    cgroup = None
    if plan.cgroups is not None:
        try:
            cgroup = RunCgroup.create(plan.cgroups, memory_bytes=plan.memory_bytes,
                                      max_processes=plan.max_processes, cpus=plan.cpus)
        except OSError as exc:
            raise SandboxError(f"could not create the command's cgroup: {exc}",
                               hint="check that /sys/fs/cgroup is writable, or run where rlimits suffice") from exc
    start = time.monotonic()
    try:
        sinks = (LogSink(stdout_path), LogSink(stderr_path))
        pipes: list[int] = []
        try:
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            pipes = [out_r, err_r]
            try:
                proc = subprocess.Popen(
                    launch.argv, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, env=dict(launch.env),
                    cwd=launch.cwd, start_new_session=True,
                    preexec_fn=_child_setup(cgroup.procs_files if cgroup else (), plan.rlimits))
            except (OSError, subprocess.SubprocessError) as exc:
                raise SandboxError(f"could not start {launch.argv[0]!r}: {exc}",
                                   hint="check that the sandbox runtime is installed (see `rexmle sandbox`)") from exc
            finally:
                os.close(out_w)
                os.close(err_w)
            running = Running(proc=proc, cgroup=cgroup, on_kill=launch.on_kill)
            register(running)
            streams = dict(zip(pipes, sinks, strict=True))
            try:
                _wait(running, start=start, timeout_s=timeout_s, cancel=cancel, streams=streams)
            except BaseException:
                running.stop(KILL_CANCEL)  # the harness itself is interrupted: never leave the command running
                raise
            finally:
                register(None)
                returncode, usage = running.reap()
                _drain(streams)
        finally:
            for fd in pipes:
                os.close(fd)
            for sink in sinks:
                sink.close()
        # rusage misses what bwrap's monitor never reaps; the cgroup's CPU accounting counts every process.
        cgroup_cpu = cgroup.cpu_seconds() if cgroup else None
        return Outcome(returncode=returncode, killed_for=running.killed_for, wall_s=time.monotonic() - start,
                       cpu_s=usage.ru_utime + usage.ru_stime if cgroup_cpu is None else cgroup_cpu,
                       oom_kills=cgroup.oom_kills() if cgroup else 0,
                       process_limit_hits=cgroup.process_limit_hits() if cgroup else 0)
    finally:
        if cgroup is not None:
            cgroup.kill()
            cgroup.remove()


def _read_into(fd: int, sink: LogSink) -> bool:
    """Read what is waiting in one pipe into its sink; False at end of file."""
    try:
        data = os.read(fd, _READ_BYTES)
    except BlockingIOError:
        return True
    if not data:
        return False
    sink.write(data)
    return True


def _drain(streams: dict[int, LogSink]) -> None:
    """Read the pipes to their end once the command is over (what a killed process wrote last), within a bound:
    a process that escaped the kill keeps its end open, and is not waited for."""
    poller = select.poll()
    open_fds = set(streams)
    for fd in open_fds:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + _DRAIN_S
    while open_fds and time.monotonic() < deadline:
        for fd, _ in poller.poll(100):
            if fd in open_fds and not _read_into(fd, streams[fd]):
                open_fds.discard(fd)
                poller.unregister(fd)


def _wait(running: Running, *, start: float, timeout_s: float | None, cancel: threading.Event | None,
          streams: dict[int, LogSink]) -> None:
    """Block until the main process exits (it stays unreaped), reading its output meanwhile, stopping it on timeout,
    cancel or fork storm."""
    pid = running.proc.pid
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    open_pipes = set(streams)
    for fd in open_pipes:
        poller.register(fd, select.POLLIN)
    storm_start = last_rise = 0.0
    last_hits = 0
    next_check = time.monotonic() + POLL_S
    try:
        while True:
            now = time.monotonic()
            wait_s = max(0.0, next_check - now)
            if timeout_s is not None:
                wait_s = min(wait_s, max(0.0, start + timeout_s - now))
            exited = False
            for fd, _ in poller.poll(wait_s * 1000):
                if fd == pidfd:
                    exited = True
                elif fd in open_pipes and not _read_into(fd, streams[fd]):
                    open_pipes.discard(fd)
                    poller.unregister(fd)
            if exited:
                return
            now = time.monotonic()
            if now < next_check and (timeout_s is None or now - start < timeout_s):
                continue  # woken by output: the checks below run every POLL_S
            next_check = now + POLL_S
            if running.killed_for is not None:
                continue  # stopped from outside (kill_all): wait for the exit
            if cancel is not None and cancel.is_set():
                running.stop(KILL_CANCEL)
            elif timeout_s is not None and now - start >= timeout_s:
                running.stop(KILL_TIMEOUT)
            elif running.cgroup is not None:
                hits = running.cgroup.process_limit_hits()
                if hits > last_hits:
                    if now - last_rise > STORM_GAP_S:
                        storm_start = now
                    last_rise, last_hits = now, hits
                    if now - storm_start >= PROCESS_STORM_S:
                        running.stop(KILL_PROCESSES)
    finally:
        os.close(pidfd)
