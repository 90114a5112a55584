"""No isolation: commands run on the host, in the workspace folder, with the scrubbed environment and the limits.

Nothing is mounted, so ``workspace/data`` must be a symbolic link to the task's public data (the harness makes it).

For machines where no sandbox runtime can be had, and only when asked for explicitly (``--sandbox none
--allow-unsandboxed``): agent code then sees the whole machine, private task data and leaderboards included. The
environment is still rebuilt from nothing (no API key reaches the code) and the timeout and limits still hold.
A harness running as root still runs the code as the run's own leased identity (:mod:`.identity`): it shares no
uid with another run, so it can neither connect to a sandboxed neighbour's relay socket (``0600``, the
neighbour's) nor enter its workspace (``0700``, the neighbour's).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rexmle_agents.sandbox import _process, environment
from rexmle_agents.sandbox.base import Sandbox, SandboxSpec


class NoSandbox(Sandbox):
    kind = "none"
    isolating = False
    signals_as_exit_codes = False

    def __init__(self, spec: SandboxSpec, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        workspace = str(spec.workspace.resolve())
        self.env = {**environment.sandbox_env(spec, workspace=workspace, venv_bin=environment.venv_bin(),
                                              host_system=True), **self.account_env()}

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    @property
    def workspace_path(self) -> str:
        return str(self.spec.workspace.resolve())

    def command(self, argv: Sequence[str]) -> list[str]:
        # as root, even unsandboxed code runs as the run's unprivileged identity (the workspace, the data and the
        # Python environment must then be reachable by it)
        user = self.user
        return list(argv) if user is None else user.drop_privileges(argv)

    def _launch(self, argv: Sequence[str]) -> _process.Launch:
        os.makedirs(self.env["TMPDIR"], exist_ok=True)
        return _process.Launch(argv=tuple(self.command(argv)), env=self.env,
                               cwd=Path(self.workspace_path) / self.spec.workdir)
