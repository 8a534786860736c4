"""The report directory: index.html (self-contained, images inline), tables, plots and results.json.

index.html reads top-down the way a user asks: is it broken (verdict), where and why (findings),
which runs (matrix), how it evolves (plots), every number (tables, folded). Long lists are
summarized first and folded in <details>, so a sweep of 20 inputs x 2 configurations stays one
readable page. The page has no external resources: it opens offline, from an e-mail attachment.
"""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from layerdiff.analyzer.analysis import Analysis
from layerdiff.analyzer.findings.divergence import Finding
from layerdiff.analyzer.report.fixsection import fix_html
from layerdiff.analyzer.report.datasetsection import dataset_document, dataset_html
from layerdiff.analyzer.report.fleetsection import fleet_document, fleet_html
from layerdiff.analyzer.report.figures import chart_parts, draw_pngs
from layerdiff.analyzer.report.estimates import mark_estimated, runs_view, sketch_lines
from layerdiff.analyzer.report.interactive import layer_table_parts
from layerdiff.analyzer.report.outdir import atomic_write_bytes, atomic_write_chunks, finish_out_dir
from layerdiff.analyzer.report.results import build_results, dump_chunks, dumps
from layerdiff.analyzer.report.tables import (LAYER_VIEW, isolation_table, layer_view, reference_rows, sweep_matrix, to_html,
                                              unmatched_table, write_tables)
from layerdiff.analyzer.findings.verdict import worst
from layerdiff.analyzer.measure.rows import records
from layerdiff.safetext import html_text

SHOWN_PER_KIND = 3
MAX_REASONS = 5  # runs whose verdict reason is listed under the banner
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{margin-bottom:4px} .verdict{font-size:1.4em;padding:10px 16px;border-radius:6px;color:#fff;margin:12px 0}
.v-pass{background:#2e7d32}.v-warn{background:#ef6c00}.v-fail{background:#c62828}.v-none{background:#616161}
ul.findings li{margin:4px 0} .sev-fail{color:#b71c1c}.sev-warn{color:#e65100}.sev-info{color:#37474f}
table.data{border-collapse:collapse;font-size:12px;margin:6px 0} table.data td,table.data th{border:1px solid #ddd;padding:2px 6px;text-align:right}
table.data th{background:#f3f3f3;position:sticky;top:0} table.data td:first-child{text-align:left}
td.s-pass{background:#e8f5e9}td.s-warn{background:#fff3e0}td.s-fail{background:#ffebee}
details{margin:6px 0} summary{cursor:pointer;font-weight:600} img{max-width:100%;border:1px solid #eee;margin:6px 0}
figure{margin:10px 0} figcaption{font-size:13px;color:#444}
.problems{background:#fff8e1;border-left:4px solid #ffb300;padding:6px 12px} code{background:#f5f5f5;padding:0 3px}
td.estimate{font-style:italic;color:#5d4037} ul.pulled{font-size:13px;color:#37474f}
"""


def write_report(analysis: Analysis, out_dir: Path, png: bool = False) -> dict[str, Path]:
    """Write every report file into `out_dir` (already prepared); returns name -> path.

    The page's charts are drawn by the browser; `png` also draws static PNGs (print, e-mail) and
    embeds them under the charts (matplotlib: ~1-2 s CPU, so only on request)."""
    comparison = analysis.comparison
    write_tables(out_dir, analysis.summary, comparison, analysis.findings)
    images = draw_pngs(analysis) if png else {}
    for name, data in images.items():
        atomic_write_bytes(out_dir / f"{name}.png", data)
    atomic_write_chunks(out_dir / "results.json", dump_chunks(results_document(analysis)))
    atomic_write_chunks(out_dir / "index.html", (part if isinstance(part, bytes) else part.encode("utf-8")
                                                 for part in html_parts(analysis, images)))
    names = ["index.html", "summary.csv", "runs.csv", "summary.md", "results.json", *(f"{n}.png" for n in images)]
    finish_out_dir(out_dir)
    return {name: out_dir / name for name in names}


def render_html(analysis: Analysis, images: dict[str, bytes]) -> str:
    """The whole page as one string."""
    return b"".join(part if isinstance(part, bytes) else part.encode("utf-8")
                    for part in html_parts(analysis, images)).decode("utf-8")  # a byte piece may end mid-character


def html_parts(analysis: Analysis, images: dict[str, bytes]) -> Iterator[str | bytes]:
    """The page in pieces, each section built only when the previous one is written (a 50,000-layer
    page is tens of MB: joined and encoded whole it was counted two more times at the peak). Pieces
    that are UTF-8 already (plotly.js, the rows' JSON) come as bytes: decoding and encoding them again
    was most of the page's cost at 200 layers."""
    for i, piece in enumerate(_sections(analysis, images)):
        if i:
            yield "\n"
        if isinstance(piece, str):
            yield piece
        else:  # a section that comes in pieces itself
            yield from piece


def _sections(analysis: Analysis, images: dict[str, bytes]) -> Iterator[str | Iterator[str | bytes]]:
    plan = analysis.comparison.plan
    verdict = _overall(analysis.summary)
    yield f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>layerdiff report</title><style>{CSS}</style></head><body>"
    yield "<h1>layerdiff report</h1>"
    yield (f"<div class='verdict v-{verdict if verdict in ('pass', 'warn', 'fail') else 'none'}'>Verdict: {verdict.upper()}"
           f" &mdash; {_counts_line(analysis.summary)}</div>")
    yield _reasons_html(analysis.summary, verdict)
    yield (f"<p>Reference: <b>{_e(plan.reference.label)}</b> (<code>{_e(plan.reference.path.name)}</code>; {_e(plan.reason)})."
           f" Runs on other inputs are compared with the reference configuration's run on the same input.</p>")
    if analysis.problems:
        yield ("<div class='problems'><b>Problems</b><ul>" +
               "".join(f"<li>{_e(p)}</li>" for p in analysis.problems) + "</ul></div>")
    yield from ["<h2>Findings</h2>", _findings_html(analysis.findings)]
    yield from ["<h2>Runs</h2>", _runs_html(analysis.summary)]
    yield from dataset_html(analysis)
    yield from fleet_html(analysis)
    yield from _isolation_html(analysis)
    yield from fix_html([run.path for run in analysis.runs])
    yield "<h2>Charts</h2>"
    yield chart_parts(analysis)
    if images:
        yield "<h3>Static figures (--png)</h3>"
        yield from (_img(name, data) for name, data in images.items())
    yield "<h2>Details</h2>"
    yield _layers_parts(analysis)
    yield _unmatched_html(analysis)
    yield _provenance_html(analysis)
    yield "</body></html>"


def _overall(summary: pd.DataFrame) -> str:
    verdicts = summary.loc[summary["role"] == "compared", "verdict"]
    measured = [v for v in verdicts if v in ("pass", "warn", "fail")]
    return worst(measured) if measured else "nothing compared"


def _reasons_html(summary: pd.DataFrame, verdict: str) -> str:
    """Why the banner says what it says, right under it: the reason of each run with that verdict."""
    rows = summary[(summary["role"] == "compared") & (summary["verdict"] == verdict)]
    reasons = [(r["run"], r["verdict_reason"]) for r in records(rows, ["run", "verdict_reason"]) if r["verdict_reason"]]
    if verdict not in ("warn", "fail") or not reasons:
        return ""
    items = "".join(f"<li><b>{_e(run)}</b>: {_e(why)}</li>" for run, why in reasons[:MAX_REASONS])
    more = f"<li>... and {len(reasons) - MAX_REASONS} more (Runs table)</li>" if len(reasons) > MAX_REASONS else ""
    return f"<ul class='verdict-why'>{items}{more}</ul>"


def _counts_line(summary: pd.DataFrame) -> str:
    verdicts = summary.loc[summary["role"] == "compared", "verdict"].value_counts()
    parts = [f"{int(verdicts.get(v, 0))} {v}" for v in ("fail", "warn", "pass") if verdicts.get(v, 0)]
    return f"{int((summary['role'] == 'compared').sum())} run(s) compared: " + (", ".join(parts) or "none measured")


def _findings_html(findings: list[Finding]) -> str:
    """Per kind: the first few sentences, the rest folded."""
    if not findings:
        return "<p>No findings: every compared layer passes.</p>"
    by_kind: dict[str, list[Finding]] = {}
    for f in findings:
        by_kind.setdefault(f.kind, []).append(f)
    out = []
    for kind, items in by_kind.items():
        shown = "".join(f"<li class='sev-{f.severity}'>{_e(f.sentence)}</li>" for f in items[:SHOWN_PER_KIND])
        out.append(f"<h3>{_e(kind.replace('_', ' '))} ({len(items)})</h3><ul class='findings'>{shown}</ul>")
        if len(items) > SHOWN_PER_KIND:
            rest = "".join(f"<li class='sev-{f.severity}'>{_e(f.sentence)}</li>" for f in items[SHOWN_PER_KIND:])
            out.append(f"<details><summary>{len(items) - SHOWN_PER_KIND} more</summary><ul class='findings'>{rest}</ul></details>")
    return "\n".join(out)


def _runs_html(summary: pd.DataFrame) -> str:
    """The sweep matrix (configuration x input), the bytes sketch-first runs pulled, then every run's summary
    folded (estimated figures marked: layerdiff.analyzer.report.estimates)."""
    matrix = sweep_matrix(summary)
    full = to_html(runs_view(summary).drop(columns=["file"]))
    pulled = "".join(f"<li>{_e(line)}</li>" for line in sketch_lines(summary))
    pulled = f"<ul class='pulled'>{pulled}</ul>" if pulled else ""
    return (to_html(matrix) + pulled
            + f"<details><summary>All runs, all summary columns ({len(summary)})</summary>{full}</details>")


def _isolation_html(analysis: Analysis) -> list[str]:
    """Isolated layers, cumulative next to isolated error (not folded: they answer the report's question)."""
    table = isolation_table(analysis.comparison)
    if table.empty:
        return []
    files = sorted(set(table["isolated_file"]))
    return ["<h2>Isolation</h2>",
            f"<p>Each layer below was also run alone on its run's backend and precision, fed the reference's own "
            f"input tensors ({_e(', '.join(files))}). <code>kernel</code>: off even alone; <code>upstream</code>: "
            "fine alone, so its error in the full run comes from earlier layers.</p>", to_html(table)]


def _undefined_cosine(table):
    """Cosine spelled `nan` (not blank, which reads "not measured") where the run has NaN/Inf that the
    reference has not: the similarity of such a pair is undefined, and the finite remainder's cosine
    (0.99999996 on a layer 84% Inf) would have read as a perfect match."""
    if "cosine" not in table or "n_nonfinite_mismatch" not in table:
        return table
    undefined = table["cosine"].isna() & (table["n_nonfinite_mismatch"].fillna(0) > 0)
    if not bool(undefined.any()):
        return table
    table = table.copy()
    table["cosine"] = table["cosine"].astype(object).where(~undefined, "nan")
    return table


def _layers_parts(analysis: Analysis) -> Iterator[str | bytes]:
    """Every layer of every run in one interactive table (layerdiff.analyzer.report.interactive), then repeats."""
    table = reference_rows(analysis.comparison)
    columns = layer_view(table)
    if "estimated" in table.columns and table["estimated"].eq(True).any():  # a sketch-first run's rows say so
        columns.insert(columns.index("status") + 1, "estimated")
    shown = mark_estimated(_undefined_cosine(table), columns)
    rows = _by_run_and_position(shown[list(dict.fromkeys([*columns, "run", "position"]))])
    bad = int(rows["status"].isin(["fail", "warn"]).sum())
    yield (f"<h3>Layers ({len(rows)} rows, {bad} warn/fail)</h3>"
           "<p>Search, filter by run, op type or status in the panes, click a header to sort.</p>\n")
    yield from layer_table_parts(rows, columns)
    table = analysis.comparison.table
    is_repeat = table["comparison"] == "repeat"
    if bool(is_repeat.any()):  # a filtered copy of every column only when there are repeats
        repeats = table[is_repeat]
        yield (f"\n<details><summary>Repeat-vs-repeat comparisons ({len(repeats)} rows)</summary>"
               f"{to_html(repeats[LAYER_VIEW])}</details>")


def _by_run_and_position(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows.sort_values(["run", "position"], kind="stable")`, without the copy when already in that
    order (one run's rows usually are: a sorted copy of a 50,000-layer table was ~15 MB)."""
    order = np.lexsort((rows["position"].to_numpy(), pd.factorize(rows["run"], sort=True)[0]))
    return rows if bool((order == np.arange(len(order))).all()) else rows.iloc[order]


def _unmatched_html(analysis: Analysis) -> str:
    table = unmatched_table(analysis.comparison)
    return f"<details><summary>Unmatched layers ({len(table)})</summary>{to_html(table)}</details>"


def _provenance_html(analysis: Analysis) -> str:
    rows = [{"run": r.label, "file": r.path.name, **{k: r.attrs.get(k, "") for k in
             ("device_model", "device_serial", "engine", "engine_version", "backend_requested", "backend_actual",
              "precision_requested", "precision_effective", "input_label", "repeat", "complete", "infer_ms")}}
            for r in analysis.runs + analysis.sources.isolated]
    return f"<details><summary>Provenance ({len(rows)} dumps)</summary>{to_html(pd.DataFrame(rows))}</details>"


def _img(name: str, data: bytes) -> str:
    encoded = base64.b64encode(data).decode("ascii")
    return f"<figure><img alt='{_e(name)}' src='data:image/png;base64,{encoded}'><figcaption>{_e(name.replace('_', ' '))}</figcaption></figure>"


def _e(text) -> str:
    return html_text(text)


def console_json(analysis: Analysis) -> str:
    """What `--json` prints: the same document as results.json."""
    return dumps(results_document(analysis))


def results_document(analysis: Analysis) -> dict:
    document = build_results(analysis.comparison, analysis.runs, analysis.findings, analysis.summary,
                             analysis.thresholds, analysis.problems, analysis.isolation.matched)
    return {**document, **dataset_document(analysis), **fleet_document(analysis)}

