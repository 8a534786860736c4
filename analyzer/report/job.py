"""One analysis into one report directory: what `analyze` and a finished sweep both do.

The page (layerdiff.analyzer.report.page) only receives an analysis and writes it; this module checks the
directory, answers from a stored report when the same analysis was asked before
(layerdiff.analyzer.report.stored), runs the analysis otherwise, and writes the page.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from layerdiff.analyzer.analysis import Analysis, analyze_paths
from layerdiff.analyzer.report import stored
from layerdiff.analyzer.report.outdir import finish_out_dir, holds_nothing_written, prepare_out_dir
from layerdiff.analyzer.report.page import write_report
from layerdiff.progress import Steps

# analyze_paths options a stored report is keyed by (steps only shows progress)
STORED_KEY_OPTIONS = ("ref", "ref_input", "set_attrs", "task", "thresholds", "rules")


_KEY_FROM_OPTIONS = object()  # report_paths works out the stored report's key itself


def report_paths(paths, out_dir: Path | str, *, force: bool = False, png: bool = False,
                 on_analyzed: Callable[[Analysis], None] | None = None, stored_key: str | None | object = _KEY_FROM_OPTIONS,
                 **analyze_options) -> Analysis:
    """What `analyze` and a finished sweep both do: check the report directory, analyze, write it.

    The report directory is checked first so a bad `-o` fails before any dump is read. The
    caller owns (and closes) the returned Analysis, e.g. to print a summary or JSON.
    `on_analyzed` sees the analysis before the files are drawn and written (`analyze` and a sweep
    print the verdict there, so the user reads it before anything is drawn); `png` also draws the
    static PNGs. `stored_key`: the stored report's key when the caller already worked it out for the same
    arguments (`analyze` does, to answer from a stored report first: discovering every input and hashing
    the analyzer's sources twice cost a re-judged analysis about 0.01 s).
    """
    existed = Path(out_dir).exists()
    out = prepare_out_dir(out_dir, force=force)
    paths = list(paths)
    key = stored_key
    if key is _KEY_FROM_OPTIONS:
        key = stored.report_key(paths, png=png, **{k: v for k, v in analyze_options.items() if k in STORED_KEY_OPTIONS})
    try:
        analysis = analyze_paths(paths, **analyze_options)
    except BaseException:
        if not existed and holds_nothing_written(out):
            finish_out_dir(out)
            out.rmdir()  # nothing to report: no empty report directory left behind
        raise
    try:
        if on_analyzed is not None:
            on_analyzed(analysis)
        with (analyze_options.get("steps") or Steps.quiet()).step("writing the report"):
            written = write_report(analysis, out, png=png)
        stored.store(key, out, written, stored.console_view(analysis))
    except BaseException:
        analysis.close()
        raise
    return analysis
