"""The default sandbox: bubblewrap (``bwrap``), a mount/PID/network namespace per command, no daemon, no image.

Inside, the root is an empty read-only tmpfs holding only: the system folders and a minimal /etc (read-only), the
harness's Python (interpreter, venv, editable rexmle sources; read-only, same paths, leaderboards covered), the
workspace (read-write at /workspace), the task's public data (read-only at /workspace/data, mounted after the
workspace so it shadows whatever the agent put there), a fresh /proc of its own PID namespace (``/proc/sys``,
``/proc/sysrq-trigger`` read-only, ``/proc/config.gz`` covered), a minimal /dev (plus the run's own GPUs' nodes
only) and a private /tmp. Namespaces are unshared (no network unless the spec asks), no capability is left, the
environment is rebuilt from nothing, and the sandbox dies with the harness.

Who the code runs as (:mod:`.identity`): a harness that is not root runs bwrap unprivileged, in a user namespace
that maps the code to the harness's own user. A harness that is root lets bwrap set up the mounts as root, without
a user namespace (one created by root would map the code to host root again), keeping only the capabilities to
change user; ``setpriv`` then drops to the run's own unprivileged identity before the command starts. The mounts
are made by root, so the host folders above the workspace need not be open to that identity; bwrap binds every
tree ``nosuid`` and ``nodev`` (the workspace included), so a set-id file the code makes grants nothing inside.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rexmle_agents.sandbox import environment
from rexmle_agents.sandbox.base import DATA_DIRNAME, WORKSPACE, Sandbox, SandboxSpec
from rexmle_agents.sandbox.identity import gpu_binds
from rexmle_grade.errors import SandboxError

INSTALL_HINT = "install bubblewrap: apt-get install -y bubblewrap"


@functools.cache
def _bwrap_problem() -> str | None:
    path = shutil.which("bwrap")
    if path is None:
        return f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}"
    probe = [path, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "--die-with-parent",
             "--cap-drop", "ALL", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path} does not run: {exc}"
    if done.returncode != 0:
        return (f"{path} cannot create namespaces here ({done.stderr.decode(errors='replace').strip()}); "
                "unprivileged user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone=1)")
    return None


# Host paths bound into the sandbox when it has GPUs: what the CUDA driver reads, read-only (not /sys/kernel,
# /sys/firmware, /sys/fs or /sys/power).
GPU_SYSFS = ("/sys/devices", "/sys/bus", "/sys/class", "/sys/dev", "/sys/module")
# /proc entries that write to the kernel: read-only inside
READ_ONLY_PROC = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")
# Readable /proc files that tell agent code nothing it needs (the kernel's build configuration).
HIDDEN_PROC_FILES = ("/proc/config.gz",)


def _check_readable_by_others(paths: Sequence[Path]) -> None:
    """The trees bound into the sandbox keep their own modes: one closed to others is unusable by the sandbox user."""
    closed = [str(p) for p in paths if Path(p).is_dir() and (Path(p).stat().st_mode & 0o005) != 0o005]
    if closed:
        raise SandboxError("the sandbox runs agent code as an unprivileged identity of its own, but these folders "
                           f"it needs are closed to other users: {', '.join(closed)}",
                           hint="chmod o+rx them (a Python environment and the task's public data must be readable "
                                "by everyone), or keep them elsewhere")


def _ancestors(paths: Sequence[Path]) -> list[str]:
    """Every folder above the given paths (not /), parents first, once each."""
    found: dict[str, None] = {}
    for path in paths:
        for parent in reversed(Path(path).parents[:-1]):
            found.setdefault(str(parent))
    return list(found)


class BwrapSandbox(Sandbox):
    kind = "bwrap"

    def __init__(self, spec: SandboxSpec, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self.view = environment.host_view(spec)  # refuses a spec that would expose private data
        if self.drops_privileges:
            _check_readable_by_others([*self.view.ro_paths, spec.data, *(Path(b.host) for b in spec.binds)])
        self.gpus = gpu_binds(spec.limits.gpus) if spec.limits.gpus else ([], [], [])
        env = environment.sandbox_env(spec, workspace=WORKSPACE, tmpdir="/tmp", venv_bin=environment.venv_bin(),
                                      host_system=True)
        if self.gpus[2]:  # the run's GPUs by UUID: the numbering of indices differs between tools
            env["CUDA_VISIBLE_DEVICES"] = ",".join(d.uuid or str(d.minor) for d in self.gpus[2])
        self.env = {**env, **self.account_env()}
        self._prefix = self._build_prefix()

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return _bwrap_problem()

    def _build_prefix(self) -> list[str]:
        spec = self.spec
        args = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--new-session"]
        if not self.drops_privileges:
            args += ["--cap-drop", "ALL", "--unshare-all"]
        else:
            # no user namespace (root's would map the code to host root); setpriv needs these two to drop to the
            # sandbox user, and clears the bounding set with the third; bwrap needs the fourth to enter the start
            # folder in the workspace, which only the run's identity may enter; the change of uid clears them all
            # before the command starts
            args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                     "--cap-add", "CAP_SETPCAP", "--cap-add", "CAP_DAC_READ_SEARCH", "--unshare-ipc",
                     "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try", "--unshare-net"]
        if spec.network:
            args.append("--share-net")
        args += ["--hostname", "sandbox", "--clearenv"]
        for key, value in self.env.items():
            args += ["--setenv", key, value]
        # the private /tmp comes first: a Python environment under /tmp (a fresh clone there) is bound into it
        args += ["--perms", "1777", "--tmpfs", "/tmp"]
        for target, link in self.view.symlinks:
            args += ["--symlink", target, link]
        # the folders leading to a bound tree (/root for a pyenv interpreter) are made traversable: bwrap would make
        # them 0700, closed to an unprivileged sandbox user
        for folder in _ancestors([*self.view.ro_paths, *(Path(b.inside) for b in spec.binds)]):
            args += ["--perms", "0755", "--dir", folder]
        for path in self.view.ro_paths:
            args += ["--ro-bind", str(path), str(path)]
        # a private /dev/shm everyone may write (POSIX semaphores and shared memory: multiprocessing, DataLoader)
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm"]
        # bwrap leaves /proc/sys writable inside a user namespace, and as root there is none: covered read-only
        for path in READ_ONLY_PROC:
            if Path(path).exists():
                args += ["--ro-bind", path, path]
        for path in HIDDEN_PROC_FILES:
            if Path(path).exists():
                args += ["--ro-bind", "/dev/null", path]
        binds, other_gpus, _ = self.gpus
        if spec.limits.gpus:
            for host, inside in binds:
                args += ["--dev-bind", host, inside]
            for path in GPU_SYSFS:
                if Path(path).exists():
                    args += ["--ro-bind", path, path]
            for path in other_gpus:  # the driver's records of the machine's other GPUs
                args += ["--tmpfs", path]
        args += ["--bind", str(spec.workspace.resolve()), WORKSPACE,
                 "--ro-bind", str(spec.data.resolve()), f"{WORKSPACE}/{DATA_DIRNAME}"]
        for bind in spec.binds:
            args += ["--bind" if bind.writable else "--ro-bind", str(Path(bind.host).resolve()), bind.inside]
        for path in self.view.hidden_files:
            args += ["--ro-bind", "/dev/null", str(path)]
        for path in self.view.hidden_dirs:
            args += ["--tmpfs", str(path), "--remount-ro", str(path)]
        args += ["--remount-ro", "/", "--chdir", f"{WORKSPACE}/{spec.workdir}"]
        return args

    def command(self, argv: Sequence[str]) -> list[str]:
        user = self.user
        inner = list(argv) if user is None else user.drop_privileges(argv)
        return [*self._prefix, "--", *inner]
