"""Sandboxes for agent-written code: one interface (:class:`Sandbox`), four runtimes.

``bwrap`` (the default where it works), ``apptainer`` and ``docker`` isolate; ``none`` does not and must be asked
for explicitly. :func:`get_sandbox` picks one by name and says how to get a missing runtime.
"""

from __future__ import annotations

import logging

from rexmle_agents.sandbox.apptainer import ApptainerSandbox
from rexmle_agents.sandbox.base import (
    DATA_DIRNAME,
    STOPPED_CANCELLED,
    STOPPED_FILE_SIZE,
    STOPPED_MEMORY,
    STOPPED_PROCESSES,
    STOPPED_TIMEOUT,
    SUBMISSION_DIRNAME,
    WORKING_DIRNAME,
    WORKSPACE,
    ExecResult,
    ExtraBind,
    Sandbox,
    SandboxLimits,
    SandboxSpec,
)
from rexmle_agents.sandbox.bwrap import BwrapSandbox
from rexmle_agents.sandbox.docker import DockerSandbox
from rexmle_agents.sandbox.none import NoSandbox
from rexmle_grade.errors import SandboxError, UnknownNameError

log = logging.getLogger(__name__)

SANDBOX_KINDS = ("bwrap", "apptainer", "docker", "none")
AUTO = "auto"
_CLASSES: dict[str, type[Sandbox]] = {"bwrap": BwrapSandbox, "apptainer": ApptainerSandbox,
                                      "docker": DockerSandbox, "none": NoSandbox}
_CHOICES_HINT = ("install bubblewrap (apt-get install -y bubblewrap), or choose --sandbox apptainer|docker, or run "
                 "without isolation with --sandbox none --allow-unsandboxed")

__all__ = [
    "AUTO", "DATA_DIRNAME", "SANDBOX_KINDS", "STOPPED_CANCELLED", "STOPPED_FILE_SIZE", "STOPPED_MEMORY",
    "STOPPED_PROCESSES", "STOPPED_TIMEOUT", "SUBMISSION_DIRNAME", "WORKING_DIRNAME", "WORKSPACE", "ApptainerSandbox",
    "BwrapSandbox", "DockerSandbox", "ExecResult", "ExtraBind", "NoSandbox", "Sandbox", "SandboxLimits", "SandboxSpec",
    "default_sandbox_kind", "get_sandbox",
]


def default_sandbox_kind() -> str:
    """"bwrap" when bubblewrap works here; else a SandboxError saying how to install it or what to choose."""
    reason = BwrapSandbox.unavailable_reason()
    if reason is None:
        return "bwrap"
    raise SandboxError(f"no sandbox is available by default: {reason}", hint=_CHOICES_HINT)


def get_sandbox(kind: str, spec: SandboxSpec, *, allow_unsandboxed: bool = False) -> Sandbox:
    """The sandbox of kind ``kind`` ("auto": the default) for ``spec``, after checking its runtime works here."""
    if kind == AUTO:
        kind = default_sandbox_kind()
    cls = _CLASSES.get(kind)
    if cls is None:
        raise UnknownNameError("sandbox kind", kind, [*SANDBOX_KINDS, AUTO])
    if cls is NoSandbox:
        if not allow_unsandboxed:
            raise SandboxError("--sandbox none runs agent code on the host without isolation: it could read the "
                               "test labels, the leaderboards and your files",
                               hint="add --allow-unsandboxed if you accept this, or " + _CHOICES_HINT)
        log.warning("!!! SANDBOX DISABLED: agent code runs on the host WITHOUT isolation (--sandbox none "
                    "--allow-unsandboxed); it can read private task data and anything this user can. Results of "
                    "this run are not trustworthy benchmark results. !!!")
    reason = cls.unavailable_reason()
    if reason is not None:
        raise SandboxError(f"the {kind} sandbox is not usable here: {reason}", hint=_CHOICES_HINT)
    return cls(spec)
