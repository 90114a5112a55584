"""``rexmle models``: the model providers, the keys they need, and the price table."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rexmle_agents.models.accounting import load_prices
from rexmle_agents.models.registry import PROVIDERS
from rexmle_grade.cli import make_app

app = make_app(help="Model backends: providers, known models and their prices.")


def _usd(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


@app.command("list")
def list_command() -> None:
    """List the model providers (with the key each needs) and the models with a known price."""
    providers = Table(title="model providers")
    for column in ("provider", "key variable", "key set", "APIs"):
        providers.add_column(column, no_wrap=True)
    for p in PROVIDERS.values():
        key_set = "yes" if os.environ.get(p.key_env) else ("no" if p.key_required else "optional")
        providers.add_row(p.name, p.key_env, key_set, ", ".join(p.apis))
    table = load_prices()
    models = Table(title=f"models with prices (USD per million tokens, as of {table.as_of})")
    for column in ("model", "input", "output"):
        models.add_column(column, no_wrap=True)
    for name, price in table.models.items():
        models.add_row(name, _usd(price.input), _usd(price.output))
    console = Console()
    console.print(providers)
    for p in PROVIDERS.values():
        typer.echo(f"{p.name}: {p.description}, e.g. {p.example}")
    console.print(models)
    typer.echo("Other models of these providers work too; their calls are counted in tokens but not priced.")


@app.command("prices")
def prices_command(
    table_path: Annotated[
        Path | None, typer.Option("--table", help="Show (and check) this price table instead of the shipped one.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON.")] = False,
) -> None:
    """Show the price table: USD per million input, cached-input, cache-write and output tokens."""
    table = load_prices(table_path)
    if as_json:
        typer.echo(table.model_dump_json(indent=2))
        return
    view = Table(title=f"model prices, USD per million tokens, as of {table.as_of}")
    for column in ("model", "input", "cached input", "cache write", "output"):
        view.add_column(column, no_wrap=True)
    for name, price in table.models.items():
        view.add_row(name, _usd(price.input), _usd(price.cached_input), _usd(price.cache_write), _usd(price.output))
        if (tier := price.long_context) is not None:
            view.add_row(f"  prompt > {tier.above_input_tokens:,} tokens", _usd(tier.input), _usd(tier.cached_input),
                         _usd(tier.cache_write), _usd(tier.output))
    Console().print(view)
    typer.echo("sources: " + ", ".join(table.sources))
