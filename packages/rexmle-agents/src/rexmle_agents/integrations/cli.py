"""``rexmle import``: results of other evaluation frameworks as rexmle run folders (``rexmle import inspect``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rexmle_agents.integrations.export_cli import import_harbor_command
from rexmle_grade.cli import make_app

app = make_app(help="Import results of other evaluation frameworks (Inspect logs...) as rexmle run folders.")


@app.command("inspect")
def inspect_command(
    logs: Annotated[list[Path], typer.Argument(help="Inspect log files (.eval or .json) or folders of them.")],
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="The group folder the runs go into "
                                                             "(runs/<group>).")] = Path("runs/inspect"),
    force: Annotated[bool, typer.Option("--force", help="Replace run folders imported before.")] = False,
) -> None:
    """Turn the samples of Inspect logs of rexmle tasks into run folders that `rexmle report`, `rexmle view` and
    `rexmle analyse` read (one run per sample and epoch, marked as coming from Inspect)."""
    from rich.console import Console

    from rexmle_agents.integrations.inspect import require_inspect

    require_inspect()
    from rexmle_agents.integrations.inspect.importer import import_logs

    imported = import_logs(logs, runs_dir, force=force)
    console = Console()
    for run in imported:
        console.print(f"{run.action:9} {run.run_dir}  ({run.state}, percentile {run.percentile})")
    console.print(f"{len(imported)} run(s) in {runs_dir}; `rexmle report {runs_dir}` shows them")


app.command("harbor")(import_harbor_command)  # `rexmle import harbor JOB_DIR`
