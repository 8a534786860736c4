"""`analyze cache` (where the layerdiff cache is, how big) and `analyze cache clean` (empty it)."""
from __future__ import annotations

import typer

from layerdiff.analyzer.importers import convcache
from layerdiff.analyzer.formats.limits import human_bytes

cache_app = typer.Typer(add_completion=False, rich_markup_mode=None,
                        help="The layerdiff cache (conversions, stored measurements, finished reports): `analyze cache` reports its size, "
                        "`analyze cache clean` empties it.")


@cache_app.callback(invoke_without_command=True)
def cache_command(ctx: typer.Context) -> None:
    """Where the layerdiff cache is, what it holds, and its limit (LAYERDIFF_CACHE_MAX_BYTES)."""
    if ctx.invoked_subcommand is None:
        print(convcache.describe())


@cache_app.command("clean")
def clean_command() -> None:
    """Remove every cached conversion, extracted archive, stored measurement and finished report."""
    count, size = convcache.clean()
    print(f"{convcache.cache_dir(create=False)}: removed {count} entries ({human_bytes(size)})")


def register(app: typer.Typer) -> None:
    """Add the `cache` command group to the analyzer's Typer app."""
    app.add_typer(cache_app, name="cache")
