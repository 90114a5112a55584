"""The ``rexmle`` command.

Each installed rexmle package contributes verbs through the ``rexmle.commands`` entry-point group: an entry point
whose object is a :class:`typer.Typer` becomes a command group (``rexmle grade ...``); a plain function becomes a
single command (``rexmle prepare ...``). Installing a package therefore adds its verbs.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from rexmle_grade.errors import RexmleError
from rexmle_grade.settings import DATA_DIR_ENV, rexmle_versions
from rexmle_grade.text import printable

ENTRY_POINT_GROUP = "rexmle.commands"
_STATE: dict[str, Any] = {"verbose": False}
err_console = Console(stderr=True)


def make_app(**kwargs: Any) -> typer.Typer:
    """A Typer app with rexmle's defaults (typer names close matches for an unknown sub-command)."""
    kwargs.setdefault("no_args_is_help", True)
    kwargs.setdefault("pretty_exceptions_enable", False)
    return typer.Typer(**kwargs)


app = make_app(help="rexmle: benchmark ML-engineering agents on real medical-imaging challenges.")


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show tracebacks and debug logs.")] = False,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help=f"Data folder (default: ${DATA_DIR_ENV} or a user cache folder)."),
    ] = None,
) -> None:
    _STATE["verbose"] = verbose
    if data_dir is not None:
        os.environ[DATA_DIR_ENV] = str(data_dir.expanduser().resolve())
    from rich.logging import RichHandler

    handler = RichHandler(console=err_console, show_path=verbose, rich_tracebacks=verbose, markup=False)
    handler.addFilter(_printable_record)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(message)s", handlers=[handler],
                        force=True)


def _printable_record(record: logging.LogRecord) -> bool:
    """Log messages may quote agent output: printed with control characters escaped."""
    record.msg = printable(record.getMessage())
    record.args = ()
    return True


@app.command("version")
def version_command() -> None:
    """Print the versions of every installed rexmle package."""
    for name, ver in rexmle_versions().items():
        typer.echo(f"{name} {ver}")


def load_plugins() -> None:
    """Add every installed package's verbs (once). Done on first use, not at import, so that a plugin module may
    itself import this module."""
    if _STATE.get("plugins_loaded"):
        return
    _STATE["plugins_loaded"] = True
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin must not take the whole CLI down
            err_console.print(Text.assemble(("warning:", "yellow"), f" could not load rexmle command {ep.name!r} "
                                                                    f"({ep.value}): {exc}"))
            continue
        if isinstance(obj, typer.Typer):
            app.add_typer(obj, name=ep.name)
        elif callable(obj):
            app.command(ep.name)(obj)



ROOT_OPTIONS_WITH_VALUE = ("--data-dir",)


def hoist_root_options(argv: list[str]) -> list[str]:
    """Move the root options that users also type after the sub-command (``rexmle prepare isles22 --data-dir D``)
    to the front, where click expects them. Nothing after a ``--`` is touched."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest += argv[i:]
            break
        name = arg.split("=", 1)[0]
        if name in ROOT_OPTIONS_WITH_VALUE:
            takes_next = "=" not in arg and i + 1 < len(argv)
            front += argv[i:i + 2] if takes_next else [arg]
            i += 2 if takes_next else 1
            continue
        rest.append(arg)
        i += 1
    return front + rest


def main(argv: list[str] | None = None) -> int:
    """Run the ``rexmle`` command and return its exit code (usage errors exit 2, rexmle errors their own code)."""
    load_plugins()
    argv = hoist_root_options(sys.argv[1:] if argv is None else list(argv))
    try:
        app(args=argv, prog_name="rexmle", standalone_mode=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except RexmleError as exc:
        if _STATE["verbose"]:
            err_console.print(traceback.format_exc(), markup=False, highlight=False)
        # messages quote user and submission text (ids, paths), which must print as written, never as markup
        err_console.print(Text.assemble(("error:", "bold red"), " ", printable(exc.message)), highlight=False)
        if exc.hint:
            err_console.print(Text.assemble("  ", ("hint:", "cyan"), " ", printable(exc.hint)), highlight=False)
        return exc.exit_code
    return 0


def run() -> None:  # pragma: no cover - console-script shim
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
