"""What the two image-based runtimes (Apptainer, Docker) share: the image is required, the environment is the
scrubbed one with the image's own PATH, and the workspace/data mounts follow the same contract as bwrap."""

from __future__ import annotations

from rexmle_agents.sandbox import environment
from rexmle_agents.sandbox.base import WORKSPACE, SandboxSpec
from rexmle_grade.errors import SandboxError


def require_image(spec: SandboxSpec, kind: str, example: str) -> str:
    if not spec.image:
        raise SandboxError(f"the {kind} sandbox needs an image, and the spec names none",
                           hint=f"set the run's sandbox image (e.g. {example}) holding Python and the rexmle "
                                "packages, or use --sandbox bwrap")
    return spec.image


def container_env(spec: SandboxSpec) -> dict[str, str]:
    """The scrubbed environment; /tmp is the container's own."""
    return environment.sandbox_env(spec, workspace=WORKSPACE, tmpdir="/tmp")
