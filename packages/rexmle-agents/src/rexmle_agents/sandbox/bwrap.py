"""The default sandbox: bubblewrap (``bwrap``), a mount/PID/network namespace per command, no daemon, no image.

Inside, the root is an empty read-only tmpfs holding only: the system folders and a minimal /etc (read-only), the
harness's Python (interpreter, venv, editable rexmle sources; read-only, same paths, leaderboards covered), the
workspace (read-write at /workspace), the task's public data (read-only at /workspace/data, mounted after the
workspace so it shadows whatever the agent put there), a fresh /proc of its own PID namespace, a minimal /dev and
a private /tmp. All namespaces are unshared (no network unless the spec asks), every capability is dropped (so no
mount can be undone from inside), the environment is rebuilt from nothing, and the sandbox dies with the harness.
"""

from __future__ import annotations

import functools
import glob
import shutil
import subprocess
from collections.abc import Sequence

from rexmle_agents.sandbox import environment
from rexmle_agents.sandbox.base import DATA_DIRNAME, WORKSPACE, Sandbox, SandboxSpec

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


class BwrapSandbox(Sandbox):
    kind = "bwrap"

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(spec)
        self.view = environment.host_view(spec)  # refuses a spec that would expose private data
        self.env = environment.sandbox_env(spec, workspace=WORKSPACE, tmpdir="/tmp", venv_bin=environment.venv_bin())
        self._prefix = self._build_prefix()

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return _bwrap_problem()

    def _build_prefix(self) -> list[str]:
        spec = self.spec
        args = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                "--unshare-all"]
        if spec.network:
            args.append("--share-net")
        args += ["--hostname", "sandbox", "--clearenv"]
        for key, value in self.env.items():
            args += ["--setenv", key, value]
        # the private /tmp comes first: a Python environment under /tmp (a fresh clone there) is bound into it
        args += ["--tmpfs", "/tmp"]
        for target, link in self.view.symlinks:
            args += ["--symlink", target, link]
        for path in self.view.ro_paths:
            args += ["--ro-bind", str(path), str(path)]
        args += ["--proc", "/proc", "--dev", "/dev"]
        if spec.limits.gpus:
            # CUDA_VISIBLE_DEVICES picks the run's GPUs; the driver needs its control nodes and sysfs to start.
            for node in sorted(glob.glob("/dev/nvidia*")):
                args += ["--dev-bind", node, node]
            args += ["--ro-bind", "/sys", "/sys"]
        args += ["--bind", str(spec.workspace.resolve()), WORKSPACE,
                 "--ro-bind", str(spec.data.resolve()), f"{WORKSPACE}/{DATA_DIRNAME}"]
        for path in self.view.hidden_files:
            args += ["--ro-bind", "/dev/null", str(path)]
        for path in self.view.hidden_dirs:
            args += ["--tmpfs", str(path), "--remount-ro", str(path)]
        args += ["--remount-ro", "/", "--chdir", f"{WORKSPACE}/{spec.workdir}"]
        return args

    def command(self, argv: Sequence[str]) -> list[str]:
        return [*self._prefix, "--", *argv]
