"""`analyze import`, `analyze merge`, `analyze export`: the offline commands for dumps from elsewhere.

The analyzer's main CLI calls `register` to add them when one of them is asked for; each command prints a problem the user
can fix as one line on stderr and exits non-zero, never a traceback.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from layerdiff.clioptions import choices

from layerdiff.errors import LayerdiffError, UsageError
from layerdiff.safetext import terminal_lines
from layerdiff.analyzer.importers import helptext
from layerdiff.analyzer.report.export import KEY_BY, METRICS, export_model_explorer, export_polygraphy

EXPORT_FORMATS = ("model-explorer", "polygraphy")


def import_command(
    src: Path = typer.Argument(..., help=helptext.SOURCE),
    output: Path = typer.Option(..., "-o", "--output", help="HDF5 file to write"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="key=value attribute the format lacks (repeatable), e.g. backend_requested=opencl"),
    fmt: Optional[str] = typer.Option(None, "--format", help="Skip detection and read as this format"),
    order_file: Optional[Path] = typer.Option(None, "--order-file", help="Layer order: one name per line"),
    shapes_file: Optional[Path] = typer.Option(None, "--shapes-file", help=helptext.SHAPES_FILE),
    runner: Optional[str] = typer.Option(None, "--runner", help=helptext.RUNNER),
    iteration: int = typer.Option(0, "--iteration", help=helptext.ITERATION),
    include_inputs: bool = typer.Option(False, "--include-inputs", help=helptext.INCLUDE_INPUTS),
    topo_file: Optional[Path] = typer.Option(None, "--topo-file", help=helptext.TOPO_FILE),
) -> None:
    """Convert a foreign dump to a layerdiff HDF5, attaching provenance with --set."""
    from layerdiff.analyzer.importers import import_one, parse_set_options  # the command's own imports, not --help's

    options = {"format": fmt, "order_file": order_file, "shapes_file": shapes_file, "runner": runner,
               "iteration": iteration, "include_inputs": include_inputs, "topo_file": topo_file}
    result = import_one(src, parse_set_options(set_), output, **{k: v for k, v in options.items() if v is not None})
    for problem in result.problems:
        typer.echo(terminal_lines(f"warning: {problem}"), err=True)
    typer.echo(terminal_lines(f"{src} ({result.format}) -> {result.path}"))


def merge_command(
    paths: List[Path] = typer.Argument(..., help="Runs to gather (HDF5 or any importable dump, directories, zips)"),
    output: Path = typer.Option(..., "-o", "--output", help="Directory to gather the runs in (index.csv is written there)"),
    allow_model_mismatch: bool = typer.Option(False, "--allow-model-mismatch", help="Gather runs of different models anyway"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="key=value attribute applied to imported foreign dumps"),
) -> None:
    """Gather runs from several people into one directory with an index of device, backend, precision, input, model."""
    from layerdiff.analyzer.importers import parse_set_options
    from layerdiff.analyzer.runs.merge import merge

    result = merge(paths, output, allow_model_mismatch=allow_model_mismatch, attrs=parse_set_options(set_))
    for line in result.errors:
        typer.echo(terminal_lines(f"warning: {line}"), err=True)
    typer.echo(terminal_lines(f"{len(result.added)} run(s) added, {len(result.skipped_duplicates)} duplicate(s) skipped; "
                              f"index: {result.index}"))


def export_command(
    run: Path = typer.Argument(..., help="The run (HDF5 dump) to export"),
    output: Path = typer.Option(..., "-o", "--output", help="JSON file to write"),
    to: str = typer.Option("model-explorer", "--to", help=f"Target: {', '.join(EXPORT_FORMATS)}",
                          callback=choices(EXPORT_FORMATS, "export target")),
    reference: Optional[Path] = typer.Option(None, "--reference", help="Model Explorer: the reference run"),
    metric: str = typer.Option("rel_l2", "--metric", help=f"Model Explorer: per-layer metric ({', '.join(METRICS)})",
                              callback=choices(METRICS, "metric")),
    key_by: str = typer.Option("reference", "--key-by", help=f"Model Explorer node keys ({', '.join(KEY_BY)})",
                              callback=choices(KEY_BY, "key")),
    runner_name: Optional[str] = typer.Option(None, "--runner-name", help="Polygraphy: runner name to record"),
    name_map: Optional[Path] = typer.Option(None, "--name-map", help="Model Explorer: CSV or JSON file mapping old -> new layer names (as analyze)"),
    rename: List[str] = typer.Option([], "--rename", help="Model Explorer: REGEX=REPL applied to layer names (repeatable, as analyze)"),
    no_builtin_rules: bool = typer.Option(False, "--no-builtin-rules", help="Model Explorer: no built-in name rules (as analyze)"),
) -> None:
    """Export a run for Google Model Explorer (per-layer error vs a reference, as the report measures
    it) or Polygraphy."""
    problems: list[str] = []
    if to == "model-explorer":
        from layerdiff.analyzer.align.byname import NameRules, load_name_map, parse_rename

        if reference is None:
            raise UsageError("--to model-explorer needs --reference REF.h5 (the run to measure against)")
        rules = NameRules(name_map=load_name_map(name_map) if name_map else {},
                          regex=[parse_rename(r) for r in rename], builtin=not no_builtin_rules)
        path = export_model_explorer(run, reference, output, metric=metric, key_by=key_by, rules=rules, problems=problems)
    elif to == "polygraphy":
        path = export_polygraphy(run, output, runner_name=runner_name)
    else:
        raise UsageError(f"--to {to}: choose from {', '.join(EXPORT_FORMATS)}")
    typer.echo(terminal_lines(f"wrote {path}"))
    for problem in problems:  # as `analyze` does: the file is written, the layers left out are named, exit 2
        typer.echo(terminal_lines(f"analyze: {problem}"), err=True)
    if problems:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    """Add the `import`, `merge` and `export` subcommands to the analyzer's Typer app.

    A LayerdiffError raised by these commands becomes one line in `layerdiff.analyzer.cli.app.main`, like every
    other command's.
    """
    app.command("import")(import_command)
    app.command("merge")(merge_command)
    app.command("export")(export_command)
