"""Apptainer (formerly Singularity), what HPC clusters offer: no daemon, so the command stays our descendant and
the harness's cgroup and rlimits apply to it as to bwrap.

``apptainer exec --containall --no-home --cleanenv --net --network none``: own PID/IPC/mount namespaces, no host
home or /tmp, no host variables, no network (apptainer always sets no_new_privs). As root, ``--no-privs --security
uid:U,gid:G`` runs the code as the run's own leased unprivileged uid/gid without capabilities (it inherits the
fresh session keyring the harness starts every command in). The workspace is bound read-write
at /workspace and the public data read-only over /workspace/data; ``--nv`` passes the NVIDIA driver and devices
through when the run has GPUs. The image (``spec.image``: a ``.sif`` file or a ``docker://`` reference) must hold
Python and the rexmle packages.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rexmle_agents.sandbox._container import container_env, require_image
from rexmle_agents.sandbox.base import DATA_DIRNAME, WORKSPACE, Sandbox, SandboxSpec

INSTALL_HINT = "install Apptainer (https://apptainer.org/docs/admin/main/installation.html) or load its module"


@functools.cache
def _apptainer_problem() -> str | None:
    if shutil.which("apptainer") is None:
        return f"apptainer is not installed; {INSTALL_HINT}"
    return None


class ApptainerSandbox(Sandbox):
    kind = "apptainer"

    def __init__(self, spec: SandboxSpec, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self.image = require_image(spec, self.kind, "rexmle.sif or docker://ghcr.io/ORG/rexmle:TAG")
        self.env = {**container_env(spec), **self.account_env()}

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return _apptainer_problem()

    def command(self, argv: Sequence[str]) -> list[str]:
        spec = self.spec
        args = [shutil.which("apptainer") or "apptainer", "exec", "--containall", "--no-home", "--cleanenv",
                "--writable-tmpfs"]
        user = self.user
        if user is not None:
            # as root, apptainer would run the code as root: no privileges, and the run's unprivileged identity
            args += ["--no-privs", "--security", f"uid:{user.uid},gid:{user.gid}"]
        if not spec.network:
            args += ["--net", "--network", "none"]
        if spec.limits.gpus:
            args.append("--nv")
        args += ["--bind", f"{spec.workspace.resolve()}:{WORKSPACE}:rw",
                 "--bind", f"{spec.data.resolve()}:{WORKSPACE}/{DATA_DIRNAME}:ro",
                 "--pwd", f"{WORKSPACE}/{spec.workdir}"]
        for bind in spec.binds:
            args += ["--bind", f"{Path(bind.host).resolve()}:{bind.inside}:{'rw' if bind.writable else 'ro'}"]
        for key, value in self.env.items():
            args += ["--env", f"{key}={value}"]
        return [*args, self.image, *argv]
