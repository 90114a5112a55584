"""ReX-MLE graders: metrics, per-challenge graders, validation, ranking and reports."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rexmle-grade")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

from rexmle_grade.errors import (
    GraderError,
    InvalidSubmissionError,
    RexmleError,
)

__all__ = ["GraderError", "InvalidSubmissionError", "RexmleError", "__version__", "score_arrays", "score_files"]


def __getattr__(name: str) -> object:
    # the evaluation-library entry points, imported on first use so that `import rexmle_grade` stays light
    if name in ("score_files", "score_arrays"):
        from rexmle_grade import files

        return getattr(files, name)
    raise AttributeError(f"module 'rexmle_grade' has no attribute {name!r}")
