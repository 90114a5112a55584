"""Who agent code runs as, and which GPU device nodes it may open.

**Never host root.** When the harness runs as root (most cloud GPU boxes and containers), a sandboxed process that
kept uid 0 would own every root-owned file it can see, ``/proc/sys`` included (``kernel.core_pattern`` with a pipe
runs a program as root outside every namespace). So commands drop to an unprivileged host user before they start:
``rexmle-sandbox`` (made by ``tools/setup.sh``), else ``nobody``, or ``$REXMLE_SANDBOX_USER`` (a name or
``UID:GID``). The drop is done by ``setpriv`` (util-linux) inside the sandbox, after the runtime has set up its
mounts as root: every group, capability (bounding and inheritable sets too) is cleared and ``no_new_privs`` set,
so nothing the code executes can gain privileges back. A harness that is not root needs none of this: its user is
already unprivileged (bubblewrap's user namespace maps the code to that same user).

**GPUs of its own.** Only the device nodes of the run's GPUs (``/dev/nvidia<minor>``) and the driver's shared
control nodes are bound into the sandbox; the others do not exist inside, so unsetting ``CUDA_VISIBLE_DEVICES``
reaches nothing more. A GPU is named by its index (as ``nvidia-smi`` numbers them) or its UUID; the driver's
``/proc/driver/nvidia/gpus/<pci>/information`` gives its minor number and UUID.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rexmle_grade.errors import SandboxError

SANDBOX_USER = "rexmle-sandbox"
FALLBACK_USER = "nobody"
USER_VARIABLE = "REXMLE_SANDBOX_USER"
SETPRIV_HINT = "install util-linux (apt-get install -y util-linux), which provides setpriv"
NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")  # the driver's record of each GPU (module globals: tests point them
DEV_DIR = Path("/dev")  # at a fake tree)
NVIDIA_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


@dataclass(frozen=True)
class SandboxUser:
    """The unprivileged host user sandboxed code runs as."""

    name: str
    uid: int
    gid: int

    @property
    def owner(self) -> tuple[int, int]:
        return self.uid, self.gid

    def drop_privileges(self, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed with the drop to this user: no groups, no capability in any set, no_new_privs."""
        return [setpriv_path(), f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--", *argv]


@functools.cache
def setpriv_path() -> str:
    path = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if path is None:
        raise SandboxError("the harness runs as root, and setpriv (to run agent code as an unprivileged user) is "
                           "missing", hint=SETPRIV_HINT)
    return path


def sandbox_user() -> SandboxUser | None:
    """The user agent code runs as when the harness is root; None when the harness is not root (its own user)."""
    if os.geteuid() != 0:
        return None
    return _resolve_user(os.environ.get(USER_VARIABLE, ""))


@functools.cache
def _resolve_user(wanted: str) -> SandboxUser:
    if wanted:
        uid_text, colon, gid_text = wanted.partition(":")
        if colon and uid_text.isdigit() and gid_text.isdigit():
            user = SandboxUser(name=wanted, uid=int(uid_text), gid=int(gid_text))
        else:
            try:
                entry = pwd.getpwnam(wanted)
            except KeyError:
                raise SandboxError(f"${USER_VARIABLE} names the user {wanted!r}, which does not exist",
                                   hint="create it (useradd --system --no-create-home rexmle-sandbox) or give "
                                        "UID:GID") from None
            user = SandboxUser(name=wanted, uid=entry.pw_uid, gid=entry.pw_gid)
    else:
        for name in (SANDBOX_USER, FALLBACK_USER):
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                continue
            user = SandboxUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid)
            break
        else:
            raise SandboxError(f"the harness runs as root and neither the user {SANDBOX_USER!r} nor {FALLBACK_USER!r} "
                               "exists to run agent code as",
                               hint="run tools/setup.sh (it creates rexmle-sandbox), or set "
                                    f"${USER_VARIABLE}=UID:GID")
    if user.uid == 0 or user.gid == 0:
        raise SandboxError(f"the sandbox user {user.name!r} is root (uid {user.uid}, gid {user.gid}); agent code "
                           "must never run as root", hint=f"set ${USER_VARIABLE} to an unprivileged user")
    return user


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
