#!/usr/bin/env python3
"""A one-node SLURM cluster on this machine, to try (and test) ``rexmle run --executor slurm`` without a cluster.

    python tools/slurm_local.py start [--dir DIR] [--cpus N] [--memory-mb M] [--no-gpus]
    export SLURM_CONF=DIR/slurm.conf          # printed by start: the SLURM commands and rexmle find the cluster
    rexmle run --executor slurm --agent sample --tasks ldct-iqa --seeds 2
    python tools/slurm_local.py stop [--dir DIR]

It needs Debian's (or Ubuntu's) packages ``slurmctld slurmd slurm-client munge`` (``tools/setup.sh --dev``
installs them when run as root). Everything lives in one folder (default ``/tmp/rexmle-slurm-$USER``): a munge key
and socket of its own (a system munged is left alone), ``slurm.conf`` (this machine's CPUs and memory, one
partition, process tracking without cgroups so it runs in a container, ``select/cons_tres``, a ``gpu`` gres only
where ``nvidia-smi`` lists GPUs), state, spool, logs and pid files, on free ports. Run as root, munged runs as the
``munge`` user and jobs run as whoever submits them; run as another user, every daemon runs as that user (and
can only run that user's jobs). No accounting storage is configured: ``sacct`` says so, and rexmle falls back on
``squeue``/``scontrol``.

Standard library only: the test suite loads this file (``packages/rexmle-agents/tests/slurm/conftest.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client", "squeue": "slurm-client",
            "scontrol": "slurm-client", "sinfo": "slurm-client", "munged": "munge", "mungekey": "munge"}
# --accounting: SLURM's accounting daemon and a database of its own, so that sacct works
ACCOUNTING_PACKAGES = {"slurmdbd": "slurmdbd", "sacct": "slurm-client", "sacctmgr": "slurm-client",
                       "mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server"}
SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")
PARTITION = "rexmle"
START_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 15


class ClusterError(RuntimeError):
    """The cluster could not be started (the message says which step failed and quotes its log)."""


def which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def missing_packages(*, accounting: bool = False) -> list[str]:
    """The Debian packages whose programs are not installed (empty: the cluster can be tried)."""
    programs = {**PACKAGES, **(ACCOUNTING_PACKAGES if accounting else {})}
    return sorted({package for program, package in programs.items() if which(program) is None})


def default_dir() -> Path:
    return Path(f"/tmp/rexmle-slurm-{getpass.getuser()}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def machine_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024**2


def gpu_count() -> int:
    """GPUs ``nvidia-smi`` lists (0 without it)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


@dataclass
class ClusterConfig:
    """What ``slurm.conf`` says; the defaults describe this machine."""

    cpus: int = field(default_factory=machine_cpus)
    # a reserve for the system and the daemons: SLURM refuses a node that has less than it says
    memory_mb: int = field(default_factory=lambda: max(512, int(machine_memory_mb() * 0.9)))
    gpus: int = field(default_factory=gpu_count)
    max_time: str = "INFINITE"  # the partition's MaxTime (a job asking for more never starts)
    kill_wait_s: int = 5  # between a job's SIGTERM and its SIGKILL
    min_job_age_s: int = 600  # how long scontrol still shows a finished job
    accounting: bool = False  # slurmdbd and a MariaDB of the cluster's own: sacct works (else it says it cannot)


@dataclass
class LocalCluster:
    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """This process's environment pointed at the cluster (SLURM commands read ``SLURM_CONF``)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=check)

    def node_state(self) -> str:
        try:
            out = self.run("sinfo", "-h", "-N", "-o", "%T", timeout=10, check=False)
        except subprocess.TimeoutExpired:
            return "no answer"
        return out.stdout.strip() or out.stderr.strip()

    def log_tail(self, name: str) -> str:
        path = self.root / "log" / name
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return f"({path} does not exist)"
        return "\n".join(f"    {line}" for line in lines[-LOG_TAIL_LINES:]) or f"({path} is empty)"


def write_conf(root: Path, config: ClusterConfig, *, user: str, dbd_port: int | None = None) -> Path:
    node = socket.gethostname().split(".")[0]
    mem_per_cpu = max(256, config.memory_mb // max(1, config.cpus))
    lines = [
        "# written by tools/slurm_local.py: a one-node cluster for trying rexmle's SLURM executor",
        "ClusterName=rexmle-local",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge' / 'munge.socket'}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'run' / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # no cgroups (a container rarely delegates them): processes are tracked by their parent ids
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        # AccountingStoragePass: the munge socket of the connection to slurmdbd (which ignores AuthInfo)
        *(["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=localhost",
            f"AccountingStoragePort={dbd_port}", f"AccountingStoragePass={root / 'munge' / 'munge.socket'}"]
          if dbd_port else ["AccountingStorageType=accounting_storage/none"]),
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={mem_per_cpu}",
        # quick to schedule and to kill: this cluster serves tests and trials, not throughput of long jobs
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,default_queue_depth=1000,bf_interval=1",
        f"KillWait={config.kill_wait_s}",
        f"MinJobAge={config.min_job_age_s}",
        "MessageTimeout=20",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        "Waittime=0",
        "ReturnToService=2",
        "MpiDefault=none",
        "MaxArraySize=10001",
        "MaxJobCount=50000",
        "SlurmdParameters=config_overrides",
    ]
    node_line = (f"NodeName={node} NodeHostname={node} NodeAddr=127.0.0.1 CPUs={config.cpus} "
                 f"RealMemory={config.memory_mb} State=UNKNOWN")
    if config.gpus:
        lines.append("GresTypes=gpu")
        node_line += f" Gres=gpu:{config.gpus}"
        devices = f"/dev/nvidia[0-{config.gpus - 1}]" if config.gpus > 1 else "/dev/nvidia0"
        (root / "gres.conf").write_text(f"NodeName={node} Name=gpu File={devices}\n")
    lines += [node_line,
              f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime={config.max_time} State=UP"]
    # slurmd loads a cgroup plugin even when nothing uses cgroups (proctrack/linuxproc, task/none). On a cgroup-v2
    # host it would pick cgroup/v2, whose start-up needs systemd's dbus and writable controllers, which a container
    # lacks ("slurmd initialization failed"); cgroup/v1 loads anywhere and, unused, does nothing
    (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _munge_user() -> pwd.struct_passwd | None:
    """As root, munged runs as the ``munge`` user (it refuses root); otherwise as whoever starts it."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("munge")
    except KeyError:
        raise ClusterError("munged refuses to run as root and there is no `munge` user",
                           ) from None


def _run_checked(argv: list[str], what: str, cluster: LocalCluster, log: str | None = None) -> None:
    try:
        result = subprocess.run(argv, env=cluster.env, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"{what} could not be started: {exc}") from None
    if result.returncode != 0:
        tail = f"\n  {log}:\n{cluster.log_tail(log)}" if log else ""
        raise ClusterError(f"{what} failed (exit {result.returncode}): {(result.stderr or result.stdout).strip()}"
                           f"{tail}")


def start(root: Path | None = None, config: ClusterConfig | None = None) -> LocalCluster:
    """Start munged, slurmctld and slurmd in ``root`` and wait until the node is idle; on failure everything that
    was started is stopped again and :class:`ClusterError` says why."""
    config = config or ClusterConfig()
    missing = missing_packages(accounting=config.accounting)
    if missing:
        raise ClusterError(f"SLURM is not installed (missing Debian packages: {' '.join(missing)})")
    root = (root or default_dir()).resolve()
    cluster = LocalCluster(root)
    if (root / "run" / "slurmctld.pid").is_file():
        stop(root)
    for sub in ("state", "spool", "run", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # the munge user traverses it to its own folder
    user = getpass.getuser()
    dbd_port = free_port() if config.accounting else None
    write_conf(root, config, user=user, dbd_port=dbd_port)
    try:
        _start_munge(cluster)
        if dbd_port is not None:
            _start_accounting(cluster, user=user, dbd_port=dbd_port)
        _run_checked([which("slurmctld") or "slurmctld", "-f", str(cluster.conf), "-i"], "slurmctld", cluster,
                     "slurmctld.log")
        _run_checked([which("slurmd") or "slurmd", "-f", str(cluster.conf)], "slurmd", cluster, "slurmd.log")
        wait_idle(cluster)
    except BaseException:
        stop(root)
        raise
    return cluster


def _start_munge(cluster: LocalCluster) -> None:
    folder = cluster.root / "munge"
    folder.mkdir(exist_ok=True)
    key = folder / "munge.key"
    owner = _munge_user()
    if not key.is_file():
        _run_checked([which("mungekey") or "mungekey", "-c", "-k", str(key)], "mungekey", cluster)
    if owner is not None:
        for path in (folder, key):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    folder.chmod(0o755)  # every user's SLURM commands reach the socket; the key stays the munge user's alone
    key.chmod(0o600)
    argv = [which("munged") or "munged", "--force", f"--key-file={key}", f"--socket={folder / 'munge.socket'}",
            f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
            f"--seed-file={folder / 'munged.seed'}"]
    if owner is not None:
        argv = ["setpriv", f"--reuid={owner.pw_uid}", f"--regid={owner.pw_gid}", "--clear-groups", *argv]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"munged could not be started: {exc}") from None
    if result.returncode != 0:
        raise ClusterError(f"munged failed (exit {result.returncode}): {result.stderr.strip()}")


def _start_accounting(cluster: LocalCluster, *, user: str, dbd_port: int) -> None:
    """A MariaDB of the cluster's own (its folder, a free port on the loopback, no grant tables: nothing but this
    cluster can reach it) and slurmdbd on it; the cluster registered, so sacct answers."""
    root = cluster.root
    db = root / "db"
    if not (db / "mysql").is_dir():
        _run_checked([which("mariadb-install-db") or "mariadb-install-db", f"--datadir={db}", f"--user={user}",
                      "--auth-root-authentication-method=normal", "--skip-test-db"], "mariadb-install-db", cluster)
    db_port = free_port()
    subprocess.Popen([which("mariadbd") or "mariadbd", "--no-defaults", f"--datadir={db}", f"--user={user}",
                      f"--port={db_port}", "--bind-address=127.0.0.1", f"--socket={root / 'run' / 'mariadb.sock'}",
                      f"--pid-file={root / 'run' / 'mariadb.pid'}", f"--log-error={root / 'log' / 'mariadb.log'}",
                      "--skip-grant-tables"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    dbd_conf = root / "slurmdbd.conf"  # slurmdbd reads it beside the slurm.conf that SLURM_CONF names
    dbd_conf.write_text("\n".join([
        "AuthType=auth/munge", f"AuthInfo=socket={root / 'munge' / 'munge.socket'}", "DbdHost=localhost",
        f"DbdPort={dbd_port}", f"SlurmUser={user}", "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
        f"StoragePort={db_port}", "StorageUser=root", "StorageLoc=slurm_acct_db",
        f"PidFile={root / 'run' / 'slurmdbd.pid'}", f"LogFile={root / 'log' / 'slurmdbd.log'}"]) + "\n")
    dbd_conf.chmod(0o600)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (root / "run" / "mariadb.pid").is_file():
        if time.monotonic() > deadline:
            raise ClusterError(f"MariaDB did not start\n  mariadb.log:\n{cluster.log_tail('mariadb.log')}")
        time.sleep(0.2)
    _run_checked([which("slurmdbd") or "slurmdbd"], "slurmdbd", cluster, "slurmdbd.log")
    while True:
        added = cluster.run("sacctmgr", "-i", "add", "cluster", "rexmle-local", timeout=15, check=False)
        if added.returncode == 0 or "already exists" in added.stdout + added.stderr:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"slurmdbd did not answer: {added.stderr.strip()}\n  slurmdbd.log:\n"
                               f"{cluster.log_tail('slurmdbd.log')}")
        time.sleep(0.3)


def wait_idle(cluster: LocalCluster, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        state = cluster.node_state()
        if state in ("idle", "mixed", "allocated"):
            return
        time.sleep(0.25)
    raise ClusterError(f"the node did not become idle within {timeout_s:g} s (sinfo says: {state or 'nothing'})\n"
                       f"  slurmctld.log:\n{cluster.log_tail('slurmctld.log')}\n"
                       f"  slurmd.log:\n{cluster.log_tail('slurmd.log')}")


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _terminate(pids: list[int], timeout_s: float = 10.0) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _step_daemons(spool: Path) -> list[int]:
    """The slurmstepd processes of this cluster's jobs: those holding a socket or file under its spool folder."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if not (proc / "comm").read_text().startswith("slurmstepd"):
                continue
            targets = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:
            continue
        if any(str(spool) in target for target in targets):
            found.append(int(proc.name))
    return found


def stop(root: Path | None = None, *, remove: bool = False) -> None:
    """Cancel the cluster's jobs, stop its daemons (by their pid files) and their job step daemons; ``remove``
    deletes the folder too. Safe to call on a half-started or already stopped cluster."""
    root = (root or default_dir()).resolve()
    cluster = LocalCluster(root)
    ctld = _pid(root / "run" / "slurmctld.pid")
    if ctld is not None and _alive(ctld) and cluster.conf.is_file():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            jobs = cluster.run("squeue", "-h", "-o", "%A", timeout=10, check=False).stdout.split()
            if jobs:
                cluster.run("scancel", *sorted(set(jobs)), timeout=10, check=False)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and cluster.run("squeue", "-h", "-o", "%A", timeout=10,
                                                                  check=False).stdout.strip():
                    time.sleep(0.2)
    daemons = [p for p in (_pid(root / "run" / "slurmd.pid"), ctld) if p is not None and _alive(p)]
    _terminate(daemons)
    _terminate(_step_daemons(root / "spool"))
    accounting = [p for p in (_pid(root / "run" / "slurmdbd.pid"), _pid(root / "run" / "mariadb.pid"))
                  if p is not None and _alive(p)]
    _terminate(accounting)
    munged = _pid(root / "munge" / "munged.pid")
    if munged is not None and _alive(munged):
        _terminate([munged])
    for pid_file in (root / "run" / "slurmd.pid", root / "run" / "slurmctld.pid", root / "run" / "slurmdbd.pid",
                     root / "run" / "mariadb.pid", root / "munge" / "munged.pid"):
        pid_file.unlink(missing_ok=True)
    if remove:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("start", "stop", "status"))
    parser.add_argument("--dir", type=Path, default=None, help=f"the cluster's folder (default {default_dir()})")
    parser.add_argument("--cpus", type=int, default=None, help="CPUs of the node (default: this machine's)")
    parser.add_argument("--memory-mb", type=int, default=None, help="memory of the node (default: 90%% of this "
                                                                    "machine's)")
    parser.add_argument("--no-gpus", action="store_true", help="leave the GPUs out even where nvidia-smi lists some")
    parser.add_argument("--accounting", action="store_true", help="also slurmdbd and a MariaDB of its own, so sacct "
                                                                  "works (packages slurmdbd, mariadb-server)")
    parser.add_argument("--remove", action="store_true", help="with stop: delete the folder (logs included)")
    args = parser.parse_args(argv)
    root = (args.dir or default_dir()).resolve()
    if args.command == "stop":
        stop(root, remove=args.remove)
        print(f"stopped the cluster in {root}")
        return 0
    if args.command == "status":
        cluster = LocalCluster(root)
        if not cluster.conf.is_file():
            print(f"no cluster in {root}")
            return 1
        print(f"node: {cluster.node_state()}")
        print(cluster.run("squeue", check=False).stdout, end="")
        return 0
    config = ClusterConfig()
    if args.cpus:
        config.cpus = args.cpus
    if args.memory_mb:
        config.memory_mb = args.memory_mb
    if args.no_gpus:
        config.gpus = 0
    config.accounting = args.accounting
    try:
        cluster = start(root, config)
    except ClusterError as exc:
        print(f"slurm_local: {exc}", file=sys.stderr)
        missing = missing_packages(accounting=config.accounting)
        if missing:
            print(f"  install them: sudo apt-get install -y {' '.join(missing)}", file=sys.stderr)
        return 1
    gres = f", {config.gpus} GPU(s)" if config.gpus else ""
    gres += ", accounting (sacct)" if config.accounting else ""
    print(f"one-node SLURM running in {root} ({config.cpus} CPUs, {config.memory_mb} MB{gres}, partition "
          f"{PARTITION})\n\n  export SLURM_CONF={cluster.conf}\n  sinfo; rexmle run --executor slurm ...\n\n"
          f"stop it with: python {sys.argv[0]} stop{'' if args.dir is None else f' --dir {root}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
