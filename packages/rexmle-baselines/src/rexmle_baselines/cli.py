"""``rexmle baselines``: the expert baselines and whether their optional dependencies are installed."""

from __future__ import annotations

import importlib.util

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rexmle_grade.cli import make_app

app = make_app(help="Expert baselines (nnU-Net v2, MONAI, timm, diffusers).")

# family -> (python module that must import, pip extra that installs it, what it is for)
BASELINE_FAMILIES: dict[str, tuple[str, str, str]] = {
    "nnunet": ("nnunetv2", "nnunet", "3D/2D segmentation (TopCoW, TopBrain, PANTHER, ISLES, SEG.A., PUMA tissue)"),
    "monai": ("monai", "monai", "MONAI UNet/SegResNet segmentation"),
    "timm": ("timm", "timm", "classification and regression (LDCT-IQA)"),
    "diffusers": ("diffusers", "diffusers", "image-to-image enhancement (USenhance)"),
}


@app.command("list")
def list_command() -> None:
    """List baseline families and whether their optional dependencies are installed."""
    table = Table(title="rexmle baselines")
    for col in ("family", "installed", "install with", "for"):
        table.add_column(col)
    for name, (module, extra, purpose) in BASELINE_FAMILIES.items():
        installed = importlib.util.find_spec(module) is not None
        table.add_row(name, "yes" if installed else "no", escape(f"pip install 'rexmle-baselines[{extra}]'"), purpose)
    Console().print(table)
    typer.echo("Baseline pipelines are planned (issue 8); this lists their dependency status.")
