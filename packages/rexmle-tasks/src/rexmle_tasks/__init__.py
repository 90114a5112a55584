"""ReX-MLE tasks: the 20 challenge definitions, data preparation, synthetic mirrors of every download, and downloads."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rexmle-tasks")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"
