"""ReX-MLE agents: model backends (OpenAI, Anthropic, OpenAI-compatible), the run harness and agent scaffolds."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rexmle-agents")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"
