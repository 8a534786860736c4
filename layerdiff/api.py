"""The notebook API's analysis half: `layerdiff.analyze(...)` (re-exported by `layerdiff`).

`analyze` runs the very analysis `analyze` (the command) runs and hands it back as DataFrames:
`.runs` (one row per run: its provenance and verdict), `.layers` (one row per aligned layer and run,
every metric), `.findings` (one row per finding), `.inputs` / `.datasets` (many inputs as one unit),
`.repeat_ops` (which op varies across repeats), `.fleet` (verdicts per GPU driver); `.write_report(dir)` writes the report the command
would. `layerdiff.collect` is collector/sweep/collect.py's `collect`, the collect command's library half.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    import pandas as pd

    from layerdiff.analyzer.analysis import Analysis

__all__ = ["Results", "analyze", "check_task", "report_directory"]
PROVENANCE_FIRST = ["run", "file", "source", "engine", "engine_version", "backend_requested", "backend_actual",
                    "precision_requested", "precision_effective", "device_serial", "device_model", "model_name",
                    "model_sha256", "input_label", "input_sha256", "complete"]


class Results:
    """One analysis as DataFrames; close it (or use `with`) to release the dump files it reads."""

    def __init__(self, analysis: Analysis) -> None:
        self.analysis = analysis

    def __enter__(self) -> Results:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.analysis.close()

    @functools.cached_property
    def runs(self) -> pd.DataFrame:
        """One row per run: label, file, every scalar provenance attribute, and the report's verdict."""
        import pandas as pd

        rows = [{"run": run.label, "file": str(run.path), "source": str(run.source or ""),
                 **{key: _scalar(value) for key, value in run.attrs.items() if _scalar(value) is not None}}
                for run in self.analysis.runs]
        frame = pd.DataFrame(rows)
        summary = self.analysis.summary
        if "verdict" in summary.columns:
            frame = frame.merge(summary[["run", "verdict"]], on="run", how="left")
        first = [c for c in PROVENANCE_FIRST + ["verdict"] if c in frame.columns]
        return frame[first + [c for c in frame.columns if c not in first]]

    @property
    def summary(self) -> pd.DataFrame:
        """The report's run table (runs.csv): verdict, counts, first divergence, output errors."""
        return self.analysis.summary

    @property
    def layers(self) -> pd.DataFrame:
        """One row per aligned layer and compared run, with every metric and status (summary.csv)."""
        return self.analysis.comparison.table

    @functools.cached_property
    def findings(self) -> pd.DataFrame:
        """One row per finding, most important first: kind, run, layer, op_type, sentence, severity, numbers."""
        import pandas as pd

        rows = [{**f.as_dict(), "kind": str(f.kind), "severity": str(f.severity)} for f in self.analysis.findings]
        return pd.DataFrame(rows, columns=["kind", "run", "layer", "op_type", "sentence", "severity", "numbers"])

    @property
    def inputs(self) -> pd.DataFrame:
        """One row per configuration and input of a data set (a configuration run on two inputs or more):
        verdict, failing layers, first divergence, output error, where zeros start. Empty without one."""
        return self.analysis.dataset.inputs

    @property
    def datasets(self) -> pd.DataFrame:
        """One row per configuration run on several inputs: counts over inputs (pass / warn / fail), first
        failing and worst input, inputs collapsing to zero, the layer failing on the most inputs."""
        return self.analysis.dataset.configs

    @property
    def dataset_layers(self) -> pd.DataFrame:
        """Per configuration and layer: on how many of the inputs it fails or warns, and on which."""
        return self.analysis.dataset.layers

    @property
    def repeat_ops(self) -> pd.DataFrame:
        """Per repeated configuration and input (`collect --repeat N`) and per op, in execution order: in
        how many repeats its output differs from the first repeat's, and by how much (rel L2, max abs)."""
        return self.analysis.repeat_ops

    @property
    def fleet(self) -> pd.DataFrame:
        """One row per GPU x driver x engine version x backend/precision (findings/fleet.py): runs and their
        pass / warn / fail counts. Empty unless the runs span two or more GPU/driver identities."""
        return self.analysis.fleet

    @property
    def problems(self) -> list[str]:
        """The one-line problems `analyze` prints (unusable inputs or layers); empty when all was usable."""
        return list(self.analysis.problems)

    def write_report(self, out_dir: Path | str, *, force: bool = False, png: bool = False) -> Path:
        """Write the report `analyze -o out_dir` writes (index.html, results.json, CSVs); returns the page."""
        from layerdiff.analyzer.report.outdir import prepare_out_dir
        from layerdiff.analyzer.report.page import write_report

        out = prepare_out_dir(out_dir, force=force)
        return write_report(self.analysis, out, png=png)["index.html"]


def analyze(paths: Path | str | Iterable[Path | str], *, ref: Path | str | None = None,
            name_map: Path | str | dict[str, str] | None = None, rename: Iterable[str] = (),
            builtin_rules: bool = True, set_attrs: dict[str, dict] | None = None, ref_input: str | None = None,
            task: str | None = None, **thresholds: float) -> Results:
    """Open runs (dump files, foreign dumps, or directories such as a sweep's output) and analyze them
    as `analyze` does: `ref`, `name_map` (a file or a dict), `rename` (REGEX=REPL), `task` and the
    thresholds (`atol`, `rtol`, `warn_rel_l2`, `fail_rel_l2`, `min_pass_fraction`) mean what the
    command's options mean. Raises a `layerdiff.errors.LayerdiffError` subclass when nothing can be compared."""
    from layerdiff.analyzer.align.byname import NameRules, load_name_map, parse_rename
    from layerdiff.analyzer.analysis import analyze_paths
    from layerdiff.analyzer.findings.verdict import Thresholds

    paths = _paths(paths)
    mapping = name_map if isinstance(name_map, dict) else (load_name_map(Path(name_map)) if name_map else {})
    rules = NameRules(name_map={str(old): str(new) for old, new in mapping.items()}, regex=[parse_rename(r) for r in rename], builtin=builtin_rules)
    return Results(analyze_paths(paths, ref=ref, rules=rules, thresholds=Thresholds(**thresholds),
                                 set_attrs=set_attrs, ref_input=ref_input, task=task))


def _paths(paths: Path | str | Iterable[Path | str]) -> list[Path | str]:
    """The paths given, refusing anything that is not a path (a number, None) in one line: it would
    otherwise fail deep inside the importers with a TypeError naming no input."""
    import os

    from layerdiff.errors import UsageError

    listed = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    for path in listed:
        if not isinstance(path, (str, os.PathLike)):
            raise UsageError(f"analyze: {path!r} is not a file or directory path; give str or pathlib.Path values")
    return listed


def _scalar(value):
    """A provenance value as a DataFrame cell: text and numbers as they are, anything else left out."""
    if isinstance(value, (str, int, float, bool)):
        return value
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and getattr(value, "ndim", 1) == 0:
        return item()
    return None


def check_task(value: str | None) -> str | None:
    """A `--task` value as the analysis reads it (None: no task), or a UsageError naming what is wrong.
    `collect --task` records it in every dump; the analysis decodes the outputs by it."""
    from layerdiff.analyzer.outputs.task import parse_task

    task = parse_task(value)
    return task.text if task else None


def report_directory(dumps: Path | str, report_dir: Path | str, *, steps=None, **analyze_options) -> Path:
    """Analyze every dump under `dumps` into `report_dir` as `analyze DUMPS -o REPORT_DIR` does,
    printing its verdict table and findings before the report is drawn; returns the page."""
    from layerdiff.analyzer.cli.app import print_summary
    from layerdiff.analyzer.report.job import report_paths

    report_paths([Path(dumps)], Path(report_dir), on_analyzed=print_summary, steps=steps, **analyze_options).close()
    return Path(report_dir) / "index.html"
