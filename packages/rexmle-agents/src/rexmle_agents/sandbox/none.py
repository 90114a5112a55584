"""No isolation: commands run on the host, in the workspace folder, with the scrubbed environment and the limits.

Nothing is mounted, so ``workspace/data`` must be a symbolic link to the task's public data (the harness makes it).

For machines where no sandbox runtime can be had, and only when asked for explicitly (``--sandbox none
--allow-unsandboxed``): agent code then sees the whole machine, private task data and leaderboards included. The
environment is still rebuilt from nothing (no API key reaches the code) and the timeout and limits still hold.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from rexmle_agents.sandbox import _process, environment
from rexmle_agents.sandbox.base import Sandbox, SandboxSpec


class NoSandbox(Sandbox):
    kind = "none"
    isolating = False
    signals_as_exit_codes = False

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(spec)
        workspace = str(spec.workspace.resolve())
        self.env = environment.sandbox_env(spec, workspace=workspace, venv_bin=environment.venv_bin(),
                                           host_system=True)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    @property
    def workspace_path(self) -> str:
        return str(self.spec.workspace.resolve())

    def command(self, argv: Sequence[str]) -> list[str]:
        # as root, even unsandboxed code runs as the unprivileged sandbox user (the workspace, the data and the
        # Python environment must then be readable by that user)
        return list(argv) if self.user is None else self.user.drop_privileges(argv)

    def _launch(self, argv: Sequence[str]) -> _process.Launch:
        os.makedirs(self.env["TMPDIR"], exist_ok=True)
        return _process.Launch(argv=tuple(self.command(argv)), env=self.env,
                               cwd=Path(self.workspace_path) / self.spec.workdir)
