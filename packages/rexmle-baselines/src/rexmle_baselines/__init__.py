"""ReX-MLE expert baselines (nnU-Net v2, MONAI, timm, diffusers): a prepared task in, a valid submission out."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rexmle-baselines")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"
