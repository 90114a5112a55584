"""``rexmle export harbor``: rexmle's tasks in another framework's task format; and the commands that bring that
framework's results back (``rexmle import harbor``) and write a run in its trajectory format
(``rexmle runs export --format atif``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rexmle_grade.cli import make_app
from rexmle_grade.errors import UserInputError

console = Console()
app = make_app(help="Export rexmle's tasks in another framework's task format (Harbor).")


@app.callback()
def _export() -> None:
    """Export rexmle's tasks in another framework's task format."""


@app.command("harbor")
def export_harbor_command(
    out: Annotated[Path, typer.Argument(help="The dataset folder to write (one task folder per task).")],
    tasks: Annotated[str, typer.Option(help="lite | all | T1,T2 | 2d | 3d | a task type.")] = "lite",
    time_limit: Annotated[str, typer.Option(help="The agent's timeout: 90m, 12h, 1d.")] = "12h",
    cpus: Annotated[int, typer.Option(min=1, help="CPU cores of the agent's container.")] = 8,
    memory_gb: Annotated[float, typer.Option(min=1, help="Memory of the agent's container.")] = 32.0,
    gpus: Annotated[int, typer.Option(min=0, help="GPUs of the agent's container.")] = 1,
    storage_gb: Annotated[float | None, typer.Option(help="Disk of the container (default: the public data "
                                                          "twice over plus 20 GB).")] = None,
    data: Annotated[str, typer.Option(help="auto | copy | mount: the public data copied into the image, or "
                                           "mounted from $REXMLE_DATA_DIR (auto: copy up to --copy-limit-gb).")]
    = "auto",
    copy_limit_gb: Annotated[float, typer.Option(help="auto: the largest public data copied into the image.")] = 2.0,
    base_image: Annotated[str, typer.Option(help="The image the task's Dockerfile starts FROM (pin a digest: "
                                                 "python:3.11-slim@sha256:...).")] = "python:3.11-slim",
    install: Annotated[bool, typer.Option(help="pip-install rexmle-grade's requirements into the image; "
                                               "--no-install when --base-image already holds them (a prebuilt "
                                               "image, or a build without a package index).")] = True,
    allow_host: Annotated[list[str] | None, typer.Option(help="A host the agent may reach (its model API); "
                                                              "repeatable. Default: no network at all.")] = None,
) -> None:
    """Write one Harbor task per prepared rexmle task (task.toml, instruction.md, environment/, tests/, solution/);
    run them with `harbor run -p OUT -a AGENT -m MODEL`."""
    from rexmle_agents.cli import select_tasks
    from rexmle_agents.harness.spec import parse_duration
    from rexmle_agents.integrations.harbor import ExportOptions, data_variable_hint, export_tasks

    if data not in ("auto", "copy", "mount"):
        raise UserInputError(f"--data {data!r} is not a data mode", hint="use auto, copy or mount")
    options = ExportOptions(time_limit_s=parse_duration(time_limit), cpus=cpus, memory_gb=memory_gb, gpus=gpus,
                            storage_gb=storage_gb, data=data, copy_limit_gb=copy_limit_gb,  # type: ignore[arg-type]
                            base_image=base_image, allowed_hosts=tuple(allow_host or ()), pip_install=install)
    exported = export_tasks(select_tasks(tasks), out, options=options)
    for task in exported:
        console.print(f"{task.task_id}: {task.folder} (public data {task.data}, "
                      f"{task.public_bytes / 1024**2:.1f} MB; labels {task.private_bytes / 1024**2:.1f} MB)")
    if any(t.data == "mounted" for t in exported):
        console.print(f"mounted tasks read their public data from the host: {data_variable_hint()}")
    console.print(f"run them: harbor run -p {out} -a AGENT -m MODEL")


def import_harbor_command(
    job_dir: Annotated[Path, typer.Argument(help="A Harbor job folder (jobs/<job name>), or one trial folder.")],
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="The group folder the runs go into "
                                                             "(runs/<group>).")] = Path("runs/harbor"),
    force: Annotated[bool, typer.Option("--force", help="Replace run folders imported before.")] = False,
) -> None:
    """Bring Harbor trials of exported rexmle tasks back as run folders (marked origin: harbor) that `rexmle
    report`, `rexmle view` and `rexmle runs` read."""
    from rexmle_agents.integrations.harbor import import_job

    results = import_job(job_dir, runs_dir, force=force)
    for result in results:
        if result.run_dir is None:
            console.print(f"[yellow]{result.trial}: not imported: {result.problem}[/]")
            continue
        console.print(f"{result.action:9} {result.run_dir}")
        for warning in result.warnings:
            console.print(f"  [yellow]{warning}[/]")
    if not any(r.run_dir for r in results):
        raise UserInputError(f"no trial of {job_dir} could be imported", hint="see the reasons above")
    console.print(f"`rexmle report {runs_dir}` shows them")


def runs_export_command(
    run: Annotated[Path, typer.Argument(help="A run folder, or a run id (or its start) under --runs-dir.")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="atif: Harbor's Agent Trajectory Interchange "
                                                            "Format.")] = "atif",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write it here (default: print it).")] = None,
    runs_dir: Annotated[Path, typer.Option(help="Where run folders are (to find a run id).")] = Path("runs"),
) -> None:
    """Write a run's trajectory in another format (atif: steps, tool calls, observations, tokens and cost)."""
    from rexmle_agents.integrations.atif import run_to_atif
    from rexmle_agents.results.cli import find_run
    from rexmle_agents.results.loader import load_run

    if fmt != "atif":
        raise UserInputError(f"--format {fmt!r} is not an export format", hint="use --format atif")
    document = json.dumps(run_to_atif(load_run(find_run(run, runs_dir))), indent=1, ensure_ascii=False,
                          allow_nan=False)
    if out is None:
        typer.echo(document)
    else:
        out.write_text(document + "\n", encoding="utf-8")
        console.print(f"wrote {out}")
