"""`analyze`: compare dumps into a report (`analyze FILES_OR_DIRS... -o REPORT`) or inspect one dump.

The main job needs no sub-command word, as the README promises: `analyze runs/ -o report/`. A
command group with a default command does that while keeping real sub-commands (`analyze inspect`,
and the ones other modules contribute through `LAZY_COMMANDS`). Every user-fixable problem ends as
one line on stderr and a non-zero exit code, never a traceback:
  0  report written, every input usable;
  1  nothing could be analyzed (bad arguments, fewer than two usable dumps, ...);
  2  report written, but some inputs or layers could not be used (each listed on stderr).
"""
from __future__ import annotations

if __name__ == "__main__":  # `python -m layerdiff.analyzer.cli.app`: the command's own process, as the console script
    from layerdiff.console import fewer_collections

    fewer_collections()

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from layerdiff.errors import EXIT_INTERRUPTED, LayerdiffError, os_error_line
from layerdiff.analyzer.report.numbers import format_number
from layerdiff.safetext import terminal_cell, terminal_lines, terminal_text

from layerdiff.analyzer.cli.defaultgroup import DEFAULT_COMMAND, DefaultCommandGroup

MAX_CONSOLE_FINDINGS = 25


class AnalyzeGroup(DefaultCommandGroup):
    """`analyze`'s commands: the sub-commands other modules contribute are imported when asked for."""

    lazy_commands = {"import": "layerdiff.analyzer.cli.offline:register",
                     "merge": "layerdiff.analyzer.cli.offline:register",
                     "export": "layerdiff.analyzer.cli.offline:register",
                     "cache": "layerdiff.analyzer.cli.cache:register"}


app = typer.Typer(cls=AnalyzeGroup, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Compare layerdiff dumps layer by layer (analyze FILES_OR_DIRS... -o REPORTDIR), "
                       "or inspect one dump.")


@app.command(DEFAULT_COMMAND)
def compare_command(
    inputs: List[Path] = typer.Argument(..., metavar="FILES_OR_DIRS", help="HDF5 dumps, directories of them, or other formats to import"),
    out: Path = typer.Option(..., "-o", "--out", help="report directory (created)"),
    ref: Optional[Path] = typer.Option(None, "--ref", help="reference dump or golden in any format, e.g. an ONNX Runtime .npz "
                                       "(default: cpu + high, else the first); need not be among the inputs"),
    ref_input: Optional[str] = typer.Option(None, "--ref-input", help="input label (or sha256 prefix) the --ref golden "
                                            "was made from, when it records no input hash"),
    json_out: bool = typer.Option(False, "--json", help="print the results as JSON on stdout (schema: REPORT_SCHEMA.md)"),
    atol: float = typer.Option(1e-3, "--atol", help="allclose: element fails when |diff| > atol and rel > rtol"),
    rtol: float = typer.Option(1e-2, "--rtol", help="allclose relative tolerance (|diff| / |ref|)"),
    warn_rel_l2: float = typer.Option(1e-2, "--warn-rel-l2", help="layer warns above this relative L2 error"),
    fail_rel_l2: float = typer.Option(1e-1, "--fail-rel-l2", help="layer fails above this relative L2 error"),
    min_pass_fraction: float = typer.Option(0.99, "--min-pass-fraction", help="layer warns below this allclose pass share"),
    name_map: Optional[Path] = typer.Option(None, "--name-map", help="CSV or JSON file mapping old -> new layer names"),
    rename: List[str] = typer.Option([], "--rename", help="REGEX=REPL applied to layer names of every run (repeatable)"),
    no_builtin_rules: bool = typer.Option(False, "--no-builtin-rules", help="do not apply the built-in name rules (converters' renames, engine-inserted copies and helper ops)"),
    force: bool = typer.Option(False, "--force", help="write into a non-empty directory that is not a report"),
    png: bool = typer.Option(False, "--png", help="also draw static PNG figures (print, e-mail); the page's own "
                             "charts show the same data"),
    set_: List[str] = typer.Option([], "--set", help="[INPUT:]key=value provenance for foreign dumps (e.g. run.npz:backend_requested=opencl)"),
    task: Optional[str] = typer.Option(None, "--task", help="what the outputs are, judged as a user reads them: classification, "
                                       "yolov5, yolox, yolov8, picodet, ssd, text-det, segmentation, landmarks, embedding, "
                                       "language-model, regression (NAME[:OUTPUT][,key=value,...], e.g. picodet:conf=0.5, "
                                       "yolox:output; docs/tasks.md; default: what collect --task recorded)"),
) -> None:
    """Align the runs by layer, measure every layer against the reference, write the report."""
    from layerdiff.analyzer.findings.thresholds import Thresholds

    thresholds = Thresholds(atol=atol, rtol=rtol, warn_rel_l2=warn_rel_l2, fail_rel_l2=fail_rel_l2,
                            min_pass_fraction=min_pass_fraction)
    set_attrs = per_input_attrs(set_)
    key = None  # a name map or renames make no stored-report key (layerdiff.analyzer.report.stored.report_key)
    if name_map is None and not rename:  # the same analysis asked again: its stored report, nothing imported
        from layerdiff.analyzer.report import stored

        key = stored.key_for(inputs, png=png, ref=ref, ref_input=ref_input, set_attrs=set_attrs, task=task,
                             thresholds=thresholds, builtin_rules=not no_builtin_rules)
        entry = stored.find(key)
        if entry is not None:
            page = stored.replay(entry, out, force=force)
            if json_out:
                sys.stdout.write(entry.results_json.read_text(encoding="utf-8") + "\n")
            else:
                print_view(entry.view)
                print(terminal_text(f"Report: {page}"), flush=True)
            _report_problems(entry.view["problems"])
            return
    from layerdiff.analyzer.align.byname import NameRules, load_name_map, parse_rename
    from layerdiff.analyzer.report.job import report_paths
    from layerdiff.analyzer.report.page import console_json
    from layerdiff.progress import Steps

    rules = NameRules(name_map=load_name_map(name_map) if name_map else {},
                      regex=[parse_rename(r) for r in rename], builtin=not no_builtin_rules)
    analysis = report_paths(inputs, out, force=force, png=png, ref=ref, rules=rules, thresholds=thresholds,
                            set_attrs=set_attrs, ref_input=ref_input, steps=Steps("analyze"), task=task,
                            on_analyzed=None if json_out else print_summary, stored_key=key)  # the verdict before the page is written
    try:
        if json_out:
            print(console_json(analysis))
        else:
            print(terminal_text(f"Report: {out / 'index.html'}"), flush=True)
    finally:
        analysis.close()
    _report_problems(analysis.problems)


def _report_problems(problems: list[str]) -> None:
    """Each input or layer that could not be used, one line on stderr; then exit 2 (report written)."""
    if not problems:
        return
    err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)
    for problem in problems:
        err.print(terminal_cell(f"analyze: {problem}"))
    raise typer.Exit(2)


def per_input_attrs(items: list[str]) -> dict[str, dict]:
    """`--set run.npz:backend_requested=opencl --set precision_requested=low` → {input or "": attrs}."""
    if not items:
        return {}  # the foreign formats' module stays unimported
    from layerdiff.analyzer.importers.common import parse_set_options

    grouped: dict[str, list[str]] = {}
    for item in items:
        key, _, _value = item.partition("=")
        target, sep, _name = key.rpartition(":")
        grouped.setdefault(target if sep else "", []).append(item[len(target) + 1:] if sep else item)
    return {target: parse_set_options(values) for target, values in grouped.items()}


def print_summary(analysis, page: Path | None = None) -> None:
    """The console view: one row per compared run, then the findings as sentences (and the report
    page, when it is written; a finished sweep prints this too)."""
    from layerdiff.analyzer.report.stored import console_view

    print_view(console_view(analysis), page)


def print_view(view: dict, page: Path | None = None) -> None:
    """Print a console view (`layerdiff.analyzer.report.stored.console_view`): a fresh analysis's or a
    stored report's, the same way."""
    console = Console(highlight=False, emoji=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(highlight=False, emoji=False, soft_wrap=True, width=160)
    console.print(Text.assemble("Reference: ", terminal_cell(view["reference"], "bold"),
                                f" ({terminal_text(view['reason'])})"))
    table = Table(show_lines=False)
    for column in ("run", "verdict", "fail", "warn", "first divergence", "op", "output", "output rel L2", "top-1"):
        table.add_column(column)
    colours = {"pass": "green", "warn": "yellow", "fail": "red"}
    for row in view["rows"]:  # every cell a plain Text: names and labels are data, never markup
        verdict = str(row["verdict"])
        table.add_row(terminal_cell(row["run"]), terminal_cell(verdict, colours.get(verdict, "white")),
                      *map(terminal_cell, (format_number(row["n_fail"]), format_number(row["n_warn"]),
                                           row["first_divergence"], row["first_divergence_op"], row["output"],
                                           format_number(row["output_rel_l2"]), format_number(row["top1"]))))
    console.print(table)
    for row in view["rows"]:  # the reason beside each verdict, before any finding
        if row["verdict"] in ("warn", "fail") and row["verdict_reason"]:
            console.print(terminal_cell(f"{row['run']}: {str(row['verdict']).upper()}: {row['verdict_reason']}"))
    sys.stdout.flush()
    findings = view["findings"]
    for sentence in findings[:MAX_CONSOLE_FINDINGS]:
        console.print(terminal_cell(f"- {sentence}"))
    if len(findings) > MAX_CONSOLE_FINDINGS:
        console.print(f"... and {len(findings) - MAX_CONSOLE_FINDINGS} more findings in the report", markup=False)
    if page is not None:
        console.print(terminal_cell(f"Report: {page}"))


@app.command("inspect")
def inspect_command(
    file: Path = typer.Argument(..., metavar="FILE", help="one HDF5 dump"),
    layer: Optional[str] = typer.Option(None, "--layer", help="summarize one layer (key, op name or tensor name)"),
    json_out: bool = typer.Option(False, "--json", help="print as JSON"),
) -> None:
    """Provenance and per-layer statistics from the dump's precomputed table, without reading tensors."""
    from layerdiff.analyzer.report.inspection import inspect_dump

    inspect_dump(file, layer=layer, as_json=json_out)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point (`_main`); a process whose HDF5 library met a failed write ends
    without the library's exit clean-up, which would crash it (see layerdiff.analyzer.formats.diskspace)."""
    from layerdiff.analyzer.formats.diskspace import exit_now_if_hdf5_failed

    code = _main(argv)
    exit_now_if_hdf5_failed(code)
    return code


def _main(argv: list[str] | None) -> int:
    """Console-script entry point.

    Usage mistakes are typer's (standalone mode: "Usage: ... Error: ...", exit 2); a LayerdiffError
    becomes one line on stderr and its exit code; an OS error (unwritable report, ...) names its path.
    """
    import warnings

    # numpy's "overflow encountered" for float64 values near 1e308: the measurement is inf and the report
    # shows it; the warning would be a stray stderr line quoting our source instead of naming the dump.
    warnings.filterwarnings("ignore", message="(overflow|invalid value|divide by zero) encountered",
                            category=RuntimeWarning)
    try:
        app(args=argv, prog_name="analyze", standalone_mode=True)
    except LayerdiffError as err:
        print(terminal_lines(f"analyze: error: {err}"), file=sys.stderr)
        return err.exit_code
    except OSError as err:
        print(terminal_lines(f"analyze: error: {os_error_line(err)}"), file=sys.stderr)
        return 1
    except SystemExit as exit_:
        code = int(exit_.code or 0) if not isinstance(exit_.code, str) else 1
        if code == EXIT_INTERRUPTED:  # typer's own Ctrl-C handling exits 130 saying nothing
            print("analyze: interrupted; no report file is left half-written", file=sys.stderr)
        return code
    return 0


if __name__ == "__main__":
    from layerdiff.console import exit_without_teardown

    exit_without_teardown(main())
