"""Who agent code runs as, and which GPU device nodes it may open.

**Never host root.** When the harness runs as root (most cloud GPU boxes and containers), a sandboxed process that
kept uid 0 would own every root-owned file it can see, ``/proc/sys`` included (``kernel.core_pattern`` with a pipe
runs a program as root outside every namespace). So commands drop to an unprivileged host identity before they
start. The drop is done by ``setpriv`` (util-linux) inside the sandbox, after the runtime has set up its mounts as
root: every group, capability (bounding and inheritable sets too) is cleared and ``no_new_privs`` set, so nothing
the code executes can gain privileges back. A harness that is not root needs none of this: its user is already
unprivileged (bubblewrap's user namespace maps the code to that same user).

**One identity per run.** Runs that shared one uid would share everything the kernel keeps per user: the user
keyrings (a storage channel between concurrent and later runs), per-user quotas (inotify instances, keys, ...: one
run could use them up so that another fails), and the right to signal each other's processes, connect to each
other's relay socket and write each other's workspace. So every run leases a uid (gid the same number) of its own
from a range no user, group or subordinate-id range of this machine uses (:data:`DEFAULT_ID_RANGE`, or
``$REXMLE_SANDBOX_UIDS=START:COUNT``; checked against ``/etc/passwd``, ``/etc/group``, ``/etc/subuid``,
``/etc/subgid`` and the name service at every lease). A lease is an exclusive ``flock`` on ``<ID>.lock`` in a
root-only folder (:data:`LEASE_DIR`, node-local), held for the run's life: concurrent ``rexmle run`` processes and
SLURM jobs on one node never get the same id, and a crashed harness's lease dies with its process. What a previous
holder may have left under that id is scrubbed when it is leased and again when it is released: its processes are
killed and its user, user-session and persistent keyrings cleared (by a child that becomes that id and calls
``keyctl``). Each command also starts in a fresh anonymous session keyring (:func:`join_fresh_session_keyring`),
so no command inherits the harness's or another command's session keyring.

``$REXMLE_SANDBOX_USER`` (a name or ``UID:GID``) keeps the old behaviour: every run then shares that one identity.
It is for operators who need a fixed, named user (e.g. files on a shared file system that must belong to it).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import grp
import os
import platform
import pwd
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rexmle_grade.errors import SandboxError

SANDBOX_USER = "rexmle-sandbox"
USER_VARIABLE = "REXMLE_SANDBOX_USER"
IDS_VARIABLE = "REXMLE_SANDBOX_UIDS"
# Above systemd's container range (524288-1879048191) and below 2^31 (tools that keep ids in a signed int), in the
# span systemd documents as unused; a machine that uses it anyway is told so at the first lease.
DEFAULT_ID_RANGE = (1_900_000_000, 4096)
LEASE_DIR = Path("/run/rexmle/ids")  # node-local (tmpfs): leases are per machine, like the kernel's uids
SETPRIV_HINT = "install util-linux (apt-get install -y util-linux), which provides setpriv"
RANGE_HINT = (f"set ${IDS_VARIABLE}=START:COUNT to ids no user, group or /etc/subuid|subgid range of this machine "
              "uses (`bash tools/setup.sh` checks the range), or set $REXMLE_SANDBOX_USER to run every run as one "
              "fixed user")
NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")  # the driver's record of each GPU (module globals: tests point them
DEV_DIR = Path("/dev")  # at a fake tree)
NVIDIA_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
# What a login shell would set from the password entry; a leased id has none, and getpass.getuser() reads these.
ACCOUNT_ENV_NAME = "rexmle-sandbox"


@dataclass(frozen=True)
class SandboxUser:
    """The unprivileged host identity sandboxed code runs as. ``shared``: the fixed ``$REXMLE_SANDBOX_USER``,
    which every run uses (not leased, never scrubbed)."""

    name: str
    uid: int
    gid: int
    shared: bool = False

    @property
    def owner(self) -> tuple[int, int]:
        return self.uid, self.gid

    def drop_privileges(self, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed with the drop to this user: no groups, no capability in any set, no_new_privs."""
        return [setpriv_path(), f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--", *argv]


@dataclass(eq=False)
class IdentityLease:
    """One run's hold on its identity: released (and the id scrubbed) by :meth:`release`, or by the kernel when
    the process that holds it ends."""

    user: SandboxUser
    lock_fd: int | None  # None: the shared $REXMLE_SANDBOX_USER, held by nobody
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def abandon(self) -> None:
        """Give the id up without scrubbing it (the next lease scrubs it first); for finalizers."""
        with self._lock:
            fd, self.lock_fd = self.lock_fd, None
        if fd is not None:
            os.close(fd)

    def release(self) -> None:
        """Scrub the id (its processes, its keyrings), then let another run lease it. Idempotent."""
        with self._lock:
            fd, self.lock_fd = self.lock_fd, None
        if fd is None:
            return
        try:
            scrub_identity(self.user)
        finally:
            os.close(fd)


@functools.cache
def setpriv_path() -> str:
    path = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if path is None:
        raise SandboxError("the harness runs as root, and setpriv (to run agent code as an unprivileged user) is "
                           "missing", hint=SETPRIV_HINT)
    return path


def lease_identity() -> IdentityLease | None:
    """The identity a new run's agent code runs as when the harness is root (None when it is not: its own user):
    a uid/gid of its own from the range, or the shared ``$REXMLE_SANDBOX_USER`` when that is set."""
    if os.geteuid() != 0:
        return None
    wanted = os.environ.get(USER_VARIABLE, "")
    if wanted:
        return IdentityLease(user=_resolve_user(wanted), lock_fd=None)
    return _lease_from_range(id_range())


@functools.cache
def _resolve_user(wanted: str) -> SandboxUser:
    uid_text, colon, gid_text = wanted.partition(":")
    if colon and uid_text.isdigit() and gid_text.isdigit():
        user = SandboxUser(name=wanted, uid=int(uid_text), gid=int(gid_text), shared=True)
    else:
        try:
            entry = pwd.getpwnam(wanted)
        except KeyError:
            raise SandboxError(f"${USER_VARIABLE} names the user {wanted!r}, which does not exist",
                               hint=f"create it (useradd --system --no-create-home {SANDBOX_USER}) or give "
                                    f"UID:GID, or unset ${USER_VARIABLE} to give every run an id of its own"
                               ) from None
        user = SandboxUser(name=wanted, uid=entry.pw_uid, gid=entry.pw_gid, shared=True)
    if user.uid == 0 or user.gid == 0:
        raise SandboxError(f"the sandbox user {user.name!r} is root (uid {user.uid}, gid {user.gid}); agent code "
                           "must never run as root", hint=f"set ${USER_VARIABLE} to an unprivileged user")
    return user


def id_range() -> tuple[int, int]:
    """(first id, count) runs lease from: ``$REXMLE_SANDBOX_UIDS`` (``START:COUNT``) or the default."""
    text = os.environ.get(IDS_VARIABLE, "").strip()
    if not text:
        return DEFAULT_ID_RANGE
    start, colon, count = text.partition(":")
    if not (colon and start.isdigit() and count.isdigit()):
        raise SandboxError(f"${IDS_VARIABLE} is {text!r}; expected START:COUNT (e.g. "
                           f"{DEFAULT_ID_RANGE[0]}:{DEFAULT_ID_RANGE[1]})", hint=RANGE_HINT)
    first, number = int(start), int(count)
    if first < 1000 or number < 1 or first + number - 1 > 2**31 - 1:
        raise SandboxError(f"${IDS_VARIABLE}={text} gives ids {first}..{first + number - 1}; they must lie in "
                           f"1000..{2**31 - 1} (system ids below, ids tools misread above), at least one",
                           hint=RANGE_HINT)
    return first, number


def range_conflicts(first: int, count: int, *, etc: Path = Path("/etc")) -> list[str]:
    """Entries of this machine's account files that use an id of the range (each as ``file: line``)."""
    last = first + count - 1
    found: list[str] = []
    for name in ("passwd", "group"):
        for line in _lines(etc / name):
            fields = line.split(":")
            if len(fields) > 2 and fields[2].isdigit() and first <= int(fields[2]) <= last:
                found.append(f"{etc / name}: {line}")
    for name in ("subuid", "subgid"):
        for line in _lines(etc / name):
            fields = line.split(":")
            if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
                sub_first, sub_count = int(fields[1]), int(fields[2])
                if sub_first <= last and first <= sub_first + sub_count - 1:
                    found.append(f"{etc / name}: {line}")
    return found


def _lines(path: Path) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def named_elsewhere(uid: int) -> str | None:
    """What the name service (LDAP, sssd, ... as well as the files) calls this id, if anything."""
    with contextlib.suppress(KeyError):
        return f"the user {pwd.getpwuid(uid).pw_name!r}"
    with contextlib.suppress(KeyError):
        return f"the group {grp.getgrgid(uid).gr_name!r}"
    return None


def lease_dir() -> Path:
    """The root-only folder of the lease files (made on first use; refused if anyone else could change it)."""
    LEASE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(LEASE_DIR)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise SandboxError(f"{LEASE_DIR}, the folder of sandbox id leases, must be a folder only root may change; "
                           f"it is mode {stat.filemode(info.st_mode)} owned by uid {info.st_uid}",
                           hint=f"remove it (rm -r {LEASE_DIR}) and start the run again; the harness remakes it")
    return LEASE_DIR


def _lease_from_range(id_span: tuple[int, int]) -> IdentityLease:
    first, count = id_span
    conflicts = range_conflicts(first, count)
    if conflicts:
        raise SandboxError(f"the sandbox id range {first}:{count} overlaps ids this machine already uses: "
                           + "; ".join(conflicts[:5]) + (" ..." if len(conflicts) > 5 else ""), hint=RANGE_HINT)
    folder = lease_dir()
    for uid in range(first, first + count):
        fd = os.open(folder / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            other = named_elsewhere(uid)
            if other is not None:
                raise SandboxError(f"the sandbox id {uid} (range {first}:{count}) is {other} on this machine",
                                   hint=RANGE_HINT)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())  # for an operator: which process holds it
            user = SandboxUser(name=f"rexmle-{uid}", uid=uid, gid=uid)
            scrub_identity(user)  # a previous holder that crashed left its processes and keys
        except BaseException:
            os.close(fd)
            raise
        return IdentityLease(user=user, lock_fd=fd)
    raise SandboxError(f"all {count} sandbox ids of the range {first}:{count} are leased by runs in progress on "
                       "this machine", hint=f"wait for some to end, or widen the range (${IDS_VARIABLE})")


# ---------------------------------------------------------------------------------------------------------------
# scrubbing an id: processes and keyrings

# keyctl(2) operations and special keyring ids (linux/keyctl.h)
KEYCTL_GET_KEYRING_ID = 0
KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_CLEAR = 7
KEYCTL_GET_PERSISTENT = 22
KEY_SPEC_SESSION_KEYRING = -3
KEY_SPEC_USER_KEYRING = -4
KEY_SPEC_USER_SESSION_KEYRING = -5
_KEYCTL_SYSCALL = {"x86_64": 250, "aarch64": 219, "ppc64le": 311, "s390x": 280}.get(platform.machine())
# keyctl denied or absent (a seccomp filter, a kernel without keys): then no run can use keyrings either
_NO_KEYS = (errno.ENOSYS, errno.EPERM, errno.EACCES, errno.EOPNOTSUPP)


def _libc_syscall() -> ctypes._CFuncPtr | None:
    if _KEYCTL_SYSCALL is None:
        return None
    call = ctypes.CDLL(None, use_errno=True).syscall
    call.restype = ctypes.c_long
    return call


_SYSCALL = _libc_syscall()


def keyctl(operation: int, *args: int) -> int:
    """One keyctl(2) call; OSError with the kernel's errno on failure. Safe between fork and exec (no Python
    objects are made beyond the integers)."""
    if _SYSCALL is None:
        raise OSError(errno.ENOSYS, f"keyctl: unknown system call number on {platform.machine()}")
    result = _SYSCALL(ctypes.c_long(_KEYCTL_SYSCALL), ctypes.c_long(operation),
                      *(ctypes.c_long(a) for a in args))
    if result == -1:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def join_fresh_session_keyring() -> None:
    """Make this process (and what it starts) subscribe to a new anonymous session keyring, so that it possesses
    neither the harness's session keyring nor another command's. Where keyctl is not allowed at all, nothing can
    use a keyring, and nothing is done."""
    try:
        keyctl(KEYCTL_JOIN_SESSION_KEYRING, 0)
    except OSError as exc:
        if exc.errno not in _NO_KEYS:
            raise


def _clear_own_keyrings() -> None:
    """Run as the id being scrubbed (in a child, after it became that id): empty its user, user-session and
    persistent keyrings (keys unlinked from every keyring are garbage-collected by the kernel)."""
    # a session keyring of this id's own: the persistent keyring's owner rights do not include clearing it, its
    # possessor's do, and it is possessed through a keyring linked to the caller's session (the harness's session
    # keyring, inherited, is not the id's)
    join_fresh_session_keyring()
    try:
        persistent = keyctl(KEYCTL_GET_PERSISTENT, -1, KEY_SPEC_SESSION_KEYRING)
    except OSError as exc:
        if exc.errno not in (*_NO_KEYS, errno.ENOKEY):
            raise
    else:
        keyctl(KEYCTL_CLEAR, persistent)
    for keyring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
        try:
            keyctl(KEYCTL_CLEAR, keyring)
        except OSError as exc:
            if exc.errno not in _NO_KEYS:
                raise
    _wait_for_collection()


# the keyrings the kernel keeps for a uid (cleared above, never removed) and the scrubbing child's own session
_OWN_KEYRINGS = (b"_uid.", b"_uid_ses.", b"_persistent.", b"_ses:")
COLLECTION_WAIT_S = 2.0


def _wait_for_collection() -> None:
    """Unlinked keys are freed by the kernel's key collector a moment later; until then /proc/keys still lists
    their descriptions to their uid. Wait (bounded) until no key of this uid is left but its own keyrings."""
    uid = str(os.getuid()).encode()
    deadline = time.monotonic() + COLLECTION_WAIT_S
    while time.monotonic() < deadline:
        fd = os.open("/proc/keys", os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        finally:
            os.close(fd)
        left = [fields for fields in (line.split(None, 8) for line in b"".join(chunks).splitlines())
                if len(fields) == 9 and fields[5] == uid and not fields[8].startswith(_OWN_KEYRINGS)]
        if not left:
            return
        time.sleep(0.01)


def scrub_identity(user: SandboxUser) -> None:
    """Kill every process running as ``user`` and clear its keyrings: what the next holder of a leased id must not
    inherit. Never for a shared user (another run may be using it)."""
    if user.shared:
        return
    kill_processes_of(user.uid)
    try:
        subprocess.run(["/bin/true"], user=user.uid, group=user.gid, extra_groups=[], env={}, cwd="/",
                       preexec_fn=_clear_own_keyrings, check=True, timeout=30,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxError(f"could not clear the keyrings of the sandbox id {user.uid}: {exc}",
                           hint="check that keyctl works here (the harness must run as root)") from exc


def kill_processes_of(uid: int, *, rounds: int = 5) -> int:
    """SIGKILL every process whose real, effective or saved uid is ``uid`` (a few rounds: one may fork while the
    list is read). Returns how many were killed."""
    killed = 0
    for _ in range(rounds):
        found = [pid for pid in _pids() if uid in _uids_of(pid)]
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != os.getpid()]


def _uids_of(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    return {int(v) for v in line.split()[1:4]}
    except OSError:
        pass
    return set()


# ---------------------------------------------------------------------------------------------------------------
# GPUs


@dataclass(frozen=True)
class GpuDevice:
    """One NVIDIA GPU as the driver lists it."""

    pci: str  # the folder name under /proc/driver/nvidia/gpus (e.g. 0000:3b:00.0)
    minor: int  # /dev/nvidia<minor>
    uuid: str

    @property
    def node(self) -> str:
        return f"nvidia{self.minor}"


def driver_gpus(proc_dir: Path | None = None) -> list[GpuDevice]:
    """Every GPU the NVIDIA driver lists (none without the driver)."""
    proc_dir = NVIDIA_PROC if proc_dir is None else proc_dir
    found: list[GpuDevice] = []
    if not proc_dir.is_dir():
        return found
    for folder in sorted(proc_dir.iterdir()):
        fields: dict[str, str] = {}
        try:
            text = (folder / "information").read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, colon, value = line.partition(":")
            if colon:
                fields[key.strip().lower()] = value.strip()
        minor = fields.get("device minor", "")
        if minor.isdigit():
            found.append(GpuDevice(pci=folder.name, minor=int(minor), uuid=fields.get("gpu uuid", "")))
    return found


def _smi_bus_ids() -> dict[str, str]:
    """nvidia-smi index -> PCI bus id in the driver's /proc spelling (lower case, 4-digit domain)."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    ids = {}
    for line in out.splitlines():
        index, _, bus = (part.strip() for part in line.partition(","))
        if index and bus:
            domain, _, rest = bus.lower().partition(":")
            ids[index] = f"{domain[-4:]}:{rest}"
    return ids


def resolve_gpus(wanted: Sequence[str], *, proc_dir: Path | None = None,
                 bus_ids: dict[str, str] | None = None) -> list[GpuDevice]:
    """The driver's records of the run's GPUs (by UUID, or by index through nvidia-smi's bus ids; a lone index
    without nvidia-smi is taken as the minor number). A GPU the driver does not list is an error: binding every
    node instead would give the run the machine's other GPUs."""
    devices = driver_gpus(proc_dir)
    by_uuid = {d.uuid: d for d in devices if d.uuid}
    by_pci = {d.pci.lower(): d for d in devices}
    by_minor = {str(d.minor): d for d in devices}
    bus = _smi_bus_ids() if bus_ids is None else bus_ids
    chosen = []
    for gpu in wanted:
        device = by_uuid.get(gpu) or by_pci.get(bus.get(gpu, "").lower()) or (None if bus else by_minor.get(gpu))
        if device is None:
            raise SandboxError(f"GPU {gpu!r} was assigned to the run, but the NVIDIA driver lists no such GPU "
                               f"({len(devices)} listed under {NVIDIA_PROC if proc_dir is None else proc_dir})",
                               hint="assign GPUs by the indices `nvidia-smi -L` shows, or by their UUIDs")
        chosen.append(device)
    return chosen


def gpu_binds(wanted: Sequence[str], *, bus_ids: dict[str, str] | None = None
              ) -> tuple[list[tuple[str, str]], list[str], list[GpuDevice]]:
    """(host node, node inside) pairs to bind for the run's GPUs and the driver's control nodes, the /proc
    folders of the machine's other GPUs (to cover inside), and the run's GPUs."""
    dev_dir, proc_dir = DEV_DIR, NVIDIA_PROC
    chosen = resolve_gpus(wanted, proc_dir=proc_dir, bus_ids=bus_ids)
    binds = [(str(dev_dir / d.node), f"/dev/{d.node}") for d in chosen]
    binds += [(str(dev_dir / name), f"/dev/{name}") for name in NVIDIA_CONTROL_NODES if (dev_dir / name).exists()]
    caps = dev_dir / "nvidia-caps"
    if caps.is_dir():
        binds.append((str(caps), "/dev/nvidia-caps"))
    # the driver's /proc records of the other GPUs are covered inside (the sandbox's /proc shows the host driver's)
    others = [f"/proc/driver/nvidia/gpus/{d.pci}" for d in driver_gpus(proc_dir) if d not in chosen
              if proc_dir == Path("/proc/driver/nvidia/gpus")]
    missing = [host for host, _ in binds if not Path(host).exists()]
    if missing:
        raise SandboxError(f"the device node(s) {missing} of the run's GPUs do not exist",
                           hint="load the NVIDIA driver (nvidia-modprobe) or run where the GPUs are")
    return binds, others, chosen
