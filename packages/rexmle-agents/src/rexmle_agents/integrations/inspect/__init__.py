"""rexmle in Inspect (inspect_ai): tasks ``rexmle/<task id>`` (and ``rexmle/lite``, ``rexmle/all``), the sandbox
``rexmle`` (rexmle's own bubblewrap workspace), the scorer ``rexmle/rexmle_scorer`` (the task's grader, outside the
sandbox) and the importer of Inspect logs into rexmle run folders.

Inspect finds them through the ``inspect_ai`` entry-point group (:mod:`._registry`); nothing here imports
inspect_ai at package import time, so rexmle-agents installs and imports without the ``inspect`` extra.
"""

from __future__ import annotations

INSTALL_HINT = "pip install 'rexmle-agents[inspect]' (inspect_ai)"


def require_inspect() -> None:
    """inspect_ai is importable; else a UserInputError saying how to install it."""
    from rexmle_grade.errors import UserInputError

    try:
        import inspect_ai  # noqa: F401
    except ImportError as exc:
        raise UserInputError(f"this needs Inspect (inspect_ai), which is not installed ({exc})",
                             hint=INSTALL_HINT) from None
