"""Tables: the tidy per-layer x per-run frame, the per-run summary, and the sweep matrices.

Every table and plot is cut from one tidy DataFrame (one row per layer x run), so the CSV, the
Markdown, the HTML page and `--json` can never disagree. Markdown is written here (no `tabulate`
dependency); HTML comes from pandas.
"""
from __future__ import annotations

import csv
import io
import os
import re
from typing import Iterator

import numpy as np
import pandas as pd

from layerdiff.analyzer.measure.comparison import Comparison
from layerdiff.analyzer.findings.divergence import Finding
from layerdiff.analyzer.report.estimates import mark_estimated
from layerdiff.analyzer.report.numbers import format_number  # noqa: F401  (re-exported: callers import it from here)
from layerdiff.analyzer.report.outdir import atomic_write_chunks, atomic_write_text
from layerdiff.analyzer.findings.summary import SUMMARY_COLUMNS, run_summary  # noqa: F401 (the report's run table)
from layerdiff.safetext import html_text, html_texts, markdown_text, markdown_texts

CHUNK_ROWS = 2000  # rows formatted at a time when writing big tables
LAYER_VIEW = ["run", "position", "key", "op_type", "status", "rel_l2", "sqnr_db", "cosine", "max_abs", "mean_abs",
              "median_abs", "p99_abs", "max_rel", "mean_rel", "pass_fraction", "n_nonfinite_mismatch",
              "zero_collapse", "n_saturated", "growth", "top1", "top5", "shape", "run_shape", "permutation", "reasons"]
# With isolated dumps among the inputs, each cumulative number sits next to its isolated twin.
ISOLATED_PAIRS = {"status": "isolated_status", "rel_l2": "isolated_rel_l2", "max_abs": "isolated_max_abs"}
ISOLATION_VIEW = ["run", "position", "key", "op_type", "status", "isolated_status", "rel_l2", "isolated_rel_l2",
                  "max_abs", "isolated_max_abs", "sqnr_db", "isolated_sqnr_db", "isolation", "isolated_file"]


def layer_view(table: pd.DataFrame) -> list[str]:
    """LAYER_VIEW, with `isolated_<metric>` right after `<metric>` when the table has isolated layers and
    `block` after `position` when its graph is named block by block."""
    columns = []
    for column in LAYER_VIEW:
        columns.append(column)
        if column == "position" and "block" in table.columns:  # llama.cpp's layer N (findings/blocks.py)
            columns.append("block")
        if ISOLATED_PAIRS.get(column) in table.columns:
            columns.append(ISOLATED_PAIRS[column])
    return columns


def isolation_table(comparison: Comparison) -> pd.DataFrame:
    """Only the isolated layers, cumulative and isolated columns side by side (empty without isolation)."""
    table = reference_rows(comparison)
    if "isolated_status" not in table.columns:
        return pd.DataFrame(columns=ISOLATION_VIEW)
    rows = table[table["isolated_status"].notna() & (table["isolated_status"] != "")]
    return rows[ISOLATION_VIEW].sort_values(["run", "position"]).reset_index(drop=True)


def reference_rows(comparison: Comparison) -> pd.DataFrame:
    """Rows of run-vs-reference comparisons (repeat-vs-repeat rows feed only nondeterminism).

    The table itself when it has no repeat rows (the usual case): a filtered copy of a 50,000-layer
    table is tens of MB, and the report asks for these rows several times."""
    table = comparison.table
    if len(table) == 0 or "comparison" not in table.columns:
        return table
    wanted = table["comparison"] == "reference"
    return table if bool(wanted.all()) else table[wanted]


def layer_matrix(comparison: Comparison, value: str = "rel_l2") -> pd.DataFrame:
    """Runs x layers (columns in execution order) of one metric: the heatmap and the wide table."""
    rows = reference_rows(comparison)
    if rows.empty:
        return pd.DataFrame()
    wide = rows.pivot_table(index="run", columns="key", values=value, aggfunc="first", sort=False)
    order = rows.groupby("key")["position"].min().sort_values().index
    return wide.reindex(columns=[k for k in order if k in wide.columns])


def sweep_matrix(summary: pd.DataFrame) -> pd.DataFrame:
    """Rows: configuration x input; columns: the summary metrics people scan a sweep for."""
    compared = summary[summary["role"] == "compared"]
    columns = ["config", "input", "repeat", "verdict", "n_fail", "n_warn", "first_divergence",
               "output_rel_l2", "output_sqnr_db", "top1", "top5"]
    return compared[columns].sort_values(["config", "input", "repeat"]).reset_index(drop=True)


def unmatched_table(comparison: Comparison) -> pd.DataFrame:
    """Layers present on one side only, per pair, with the reason when it is a known engine habit."""
    parts = []
    for pair, alignment in zip(comparison.plan.pairs, comparison.alignments):
        for side, frame, owner in (("reference only", alignment.only_base, pair.base),
                                   ("run only", alignment.only_other, pair.other)):
            if len(frame):
                parts.append(frame.assign(run=pair.other.label, side=side, file=owner.path.name))
    if not parts:
        return pd.DataFrame(columns=["run", "side", "key", "op_type", "why", "file"])
    return pd.concat(parts, ignore_index=True)[["run", "side", "key", "op_type", "why", "file"]]


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table; pipes in cells are escaped."""
    return "".join(markdown_chunks(frame))


def markdown_chunks(frame: pd.DataFrame, rows: int = CHUNK_ROWS) -> Iterator[str]:
    """`to_markdown` in pieces of `rows` rows: a 50,000-layer table formatted whole was ~50 MB of strings."""
    if frame.empty:
        yield "_(none)_\n"
        return
    yield "| " + " | ".join(_title(c) for c in frame.columns) + " |\n"
    yield "|" + "|".join("---" for _ in frame.columns) + "|\n"
    for start in range(0, len(frame), rows):
        part = frame.iloc[start:start + rows]
        cells = [_formatted_column(part[c], markdown=True) for c in part.columns]
        yield "".join("| " + " | ".join(row) + " |\n" for row in zip(*cells))


def csv_chunks(frame: pd.DataFrame, rows: int = CHUNK_ROWS) -> Iterator[bytes]:
    """`frame.to_csv(index=False)` in pieces of `rows` rows (the same text, never whole in memory)."""
    if len(frame) == 0:
        yield frame.to_csv(index=False).encode("utf-8")
    plain = _plain_csv_columns(frame)
    for start in range(0, len(frame), rows):
        part = frame.iloc[start:start + rows]
        text = _plain_csv(part, start == 0) if plain else part.to_csv(index=False, header=start == 0)
        yield text.encode("utf-8")


def _plain_csv_columns(frame: pd.DataFrame) -> bool:
    """Whether every column is of a kind `_plain_csv` writes as pandas does (float64, integers, booleans,
    texts), under names that are all texts."""
    return frame.columns.is_unique and all(isinstance(c, str) for c in frame.columns) and all(
        dtype == np.float64 or (isinstance(dtype, np.dtype) and dtype.kind in "iub") or isinstance(dtype, pd.StringDtype)
        for dtype in frame.dtypes)


def _plain_csv(frame: pd.DataFrame, header: bool) -> str:
    """`frame.to_csv(index=False, header=header)`, byte for byte, a column at a time: pandas spells each
    float through numpy's `astype(str)` one cell at a time (most of writing summary.csv); `repr` of a
    Python float is the same shortest text. Cells are quoted as the `csv` module's minimal quoting
    quotes them, then each row is one `join` (the `csv` writer's per-cell checks were a third of the file)."""
    if frame.shape[1] == 1:  # a row of one empty cell is written `""` by the csv module: its own writer
        return _csv_module_text(frame, header)
    rows = [",".join(row) for row in zip(*(_csv_cells(frame[column]) for column in frame.columns))]
    if header:
        rows.insert(0, ",".join(_csv_quoted(str(column)) for column in frame.columns))
    return "".join(row + os.linesep for row in rows)


def _csv_module_text(frame: pd.DataFrame, header: bool) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator=os.linesep, quoting=csv.QUOTE_MINIMAL, quotechar='"', doublequote=True)
    if header:
        writer.writerow(list(frame.columns))
    writer.writerows([cell] for cell in _csv_cells(frame[frame.columns[0]], quote=False))
    return buffer.getvalue()


# what the csv module's minimal quoting quotes a cell for: the delimiter, the quote, a character of the line end
_CSV_SPECIAL = re.compile("[" + re.escape(',"' + os.linesep) + "]")


def _csv_quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if _CSV_SPECIAL.search(text) else text


def _csv_cells(series: pd.Series, quote: bool = True) -> list[str]:
    """A column's cells as the CSV text pandas writes: floats by `repr` (NaN empty), integers and booleans
    as `str` gives them, texts quoted where needed (`quote`; a missing text empty)."""
    values = series.tolist()
    if series.dtype == np.float64:
        return ["" if v != v else repr(v) for v in values]
    if isinstance(series.dtype, pd.StringDtype):
        if series.hasnans:
            values = ["" if v is None or v is pd.NA or (isinstance(v, float) and v != v) else v for v in values]
        if not quote or not _CSV_SPECIAL.search("".join(values)):  # one search: most columns need no quotes
            return values
        return [_csv_quoted(v) for v in values]
    return [str(v) for v in values]


def _formatted_column(series: pd.Series, markdown: bool = False) -> list[str]:
    """`format_number` of every cell, a column at a time (`tolist` gives Python scalars in one call,
    so a 10,000-layer table is not formatted through per-cell pandas/numpy access)."""
    values = series.tolist()
    if series.name == "position":  # shown 1-based, as the findings' "#N in execution order"
        values = [v + 1 if isinstance(v, (int, float)) and v == v else v for v in values]
    kind = series.dtype.kind if isinstance(series.dtype, np.dtype) else "O"  # nullable dtypes hold pd.NA
    if kind == "f":  # `format_number`'s rule for a float, without its per-cell type tests
        out = ["" if v != v else f"{v:.4g}" for v in values]
    elif kind in "iub":
        out = [str(v) for v in values]
    elif isinstance(series.dtype, pd.StringDtype) and not series.hasnans:  # texts: `format_number` keeps them
        out = values
    else:
        out = [format_number(v) for v in values]
    if markdown and series.dtype.kind not in "iufb":  # names are data: nothing in them is Markdown
        out = markdown_texts(out)
    return out


def _title(column) -> str:
    """A column's heading on screen: `position` reads `#` (1-based, like the findings); the CSV and
    results.json keep the 0-based `position`."""
    return "#" if column == "position" else str(column)


def to_html(frame: pd.DataFrame, css_class: str = "data") -> str:
    """An HTML table with the same number formatting as Markdown; status cells get a class for colour."""
    if frame.empty:
        return "<p><em>(none)</em></p>"
    head = "".join(f"<th>{html_text(_title(c))}</th>" for c in frame.columns)
    columns = []
    for column in frame.columns:
        texts = html_texts(_formatted_column(frame[column]))
        if column in ("status", "verdict", "isolated_status"):
            columns.append([f'<td class="s-{t}">{t}</td>' for t in texts])
        else:
            columns.append([f"<td>{t}</td>" for t in texts])
    lines = ["<tr>" + "".join(row) + "</tr>" for row in zip(*columns)]
    return f'<table class="{css_class}"><thead><tr>{head}</tr></thead><tbody>{"".join(lines)}</tbody></table>'


def write_tables(out_dir, summary: pd.DataFrame, comparison: Comparison, findings: list[Finding]) -> None:
    """summary.csv (every layer x run, all metrics) and summary.md (summary, findings, layers)."""
    atomic_write_chunks(out_dir / "summary.csv", csv_chunks(comparison.table))
    atomic_write_text(out_dir / "runs.csv", summary.to_csv(index=False))
    atomic_write_chunks(out_dir / "summary.md", (part.encode("utf-8") for part in _markdown_parts(summary, comparison, findings)))


def _markdown_parts(summary: pd.DataFrame, comparison: Comparison, findings: list[Finding]) -> Iterator[str]:
    yield from ["# layerdiff report\n", f"Reference: **{markdown_text(comparison.plan.reference.label)}** "
                f"({markdown_text(comparison.plan.reason)})\n", "## Runs\n",
                to_markdown(summary[["run", "role", "verdict", "n_fail", "n_warn", "first_divergence",
                                     "first_divergence_op", "output_rel_l2", "top1", "top5"]]),
                "\n## Findings\n", *(f"- {markdown_text(f.sentence)}\n" for f in findings)]
    isolated = isolation_table(comparison)
    if len(isolated):
        yield from ["\n## Isolation (cumulative vs isolated: the layer fed the reference's own inputs)\n",
                    to_markdown(isolated)]
    rows = reference_rows(comparison)
    view = layer_view(rows)
    yield "\n## Layers\n"
    yield from markdown_chunks(mark_estimated(rows, view)[view])  # a summary's figures read as estimates
