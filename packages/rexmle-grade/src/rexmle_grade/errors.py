"""The one exception hierarchy of rexmle.

Every error a user can cause derives from :class:`RexmleError`. The CLI prints such errors as one clear message
(what was expected, what arrived, what to do) without a traceback and exits with :attr:`RexmleError.exit_code`;
``--verbose`` adds the traceback. Anything that is *not* a ``RexmleError`` is a bug in rexmle.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


class RexmleError(Exception):
    """Base class of every user-facing rexmle error."""

    exit_code: int = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  hint: {hint}")


class UserInputError(RexmleError):
    """A command-line argument or API argument is wrong."""


class UnknownNameError(UserInputError):
    """A name (task id, grader id, agent, sub-command...) is not known; the message names the close matches."""

    def __init__(self, kind: str, name: str, choices: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.choices = sorted(set(choices))
        close = difflib.get_close_matches(name, self.choices, n=3, cutoff=0.5)
        if close:
            hint = "did you mean " + ", ".join(repr(c) for c in close) + "?"
        elif self.choices:
            hint = f"known {kind}s: " + ", ".join(self.choices)
        else:
            hint = f"no {kind} is installed"
        super().__init__(f"unknown {kind} {name!r}", hint=hint)


class InvalidSubmissionError(RexmleError):
    """A submission breaks the task's submission format. ``problems`` lists every problem found."""

    def __init__(self, problems: Sequence[str] | str, *, hint: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        head = "invalid submission" if len(self.problems) != 1 else "invalid submission: " + self.problems[0]
        body = "" if len(self.problems) == 1 else "".join(f"\n  - {p}" for p in self.problems)
        super().__init__(head + body, hint=hint)


class GraderError(RexmleError):
    """An exception inside rexmle's grading code (a bug), reported apart from an invalid submission."""

    exit_code = 1


class TaskDataMissingError(RexmleError):
    """A task's prepared or raw data is not where it should be."""


class DownloadError(RexmleError):
    """A download failed for good (after retries), or needs a manual step."""


class ChecksumMismatchError(DownloadError):
    """A downloaded file does not have the published checksum."""


class ManualDownloadRequired(DownloadError):
    """The data cannot be fetched automatically; the message says which file to place where."""


class BudgetExceededError(RexmleError):
    """A time, step, token or money budget is spent."""


class SandboxError(RexmleError):
    """The sandbox could not be set up or was violated."""


class ModelAPIError(RexmleError):
    """A model API call failed permanently (client error, retries exhausted, malformed response)."""


class ConfigurationError(RexmleError):
    """A setting (environment variable, config file, missing optional dependency) is missing or wrong."""


def require_module(module: str, *, extra: str, package: str) -> object:
    """Import an optional heavy dependency, or raise a ConfigurationError naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ConfigurationError(
            f"{module!r} is needed here but is not installed ({exc})",
            hint=f"pip install '{package}[{extra}]' -c constraints.txt",
        ) from exc
