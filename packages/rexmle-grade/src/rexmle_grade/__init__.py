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

__all__ = ["GraderError", "InvalidSubmissionError", "RexmleError", "__version__"]
