"""ReX-MLE expert baselines (nnU-Net v2, MONAI, timm, diffusers) that take a prepared task and write a valid submission."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rexmle-baselines")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"
