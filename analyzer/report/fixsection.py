"""The report's "Fix" section: what `collect fix` wrote in `fix.json` beside the runs being analyzed.

`collect fix -o OUT` puts its runs under OUT/reference, OUT/before and OUT/after and its answer in
OUT/fix.json; a report made from OUT shows that answer next to the runs it came from. Only the file
is read (no collector code): keys are listed in analyzer/REPORT_SCHEMA.md.
"""
from __future__ import annotations

import json
from pathlib import Path

from layerdiff.safetext import html_text

FIX_JSON = "fix.json"


def fix_documents(run_paths: list[Path]) -> list[tuple[Path, dict]]:
    """Every readable fix.json in a run's directory or the one above it (each once)."""
    found: dict[Path, dict] = {}
    for path in run_paths:
        for folder in (path.parent, path.parent.parent):
            candidate = folder / FIX_JSON
            if candidate in found or not candidate.is_file():
                continue
            try:
                doc = json.loads(candidate.read_text())
            except (OSError, ValueError, RecursionError):  # a fix.json from elsewhere: damaged or nested past parsing
                continue
            if isinstance(doc, dict) and "layers" in doc and "errors" in doc:
                found[candidate] = doc
    return list(found.items())


def fix_html(run_paths: list[Path]) -> list[str]:
    """The section's HTML parts (nothing when no fix.json is found)."""
    parts: list[str] = []
    for path, doc in fix_documents(run_paths):
        parts += ["<h2>Fix</h2>", f"<p>{_e(_headline(doc))} (<code>{_e(path)}</code>)</p>", _layers(doc), _errors(doc)]
        search = doc.get("search", {})
        parts.append(f"<p>Search: {_e(search.get('runs'))} runs ({_e(search.get('trials'))} trials) in "
                     f"{_e(search.get('seconds'))} s.{_e(_speed(doc))}</p>")
        # fix.json files before `engine_options` named the key after their engine
        advice = doc.get("engine_options") or doc.get(f"{doc.get('engine')}_options")
        if isinstance(advice, list) and advice:
            parts.append("<ul>" + "".join(f"<li>{_e(line)}</li>" for line in advice) + "</ul>")
    return parts


def _headline(doc: dict) -> str:
    n, total = len(doc.get("layers", [])), doc.get("layers_total", "?")
    what = {"fixed": f"{n} of {total} layers kept at high precision bring every output within tolerance",
            "unfixable": f"no set smaller than the whole model meets the tolerance; best set found: {n} layers",
            "nothing_to_fix": "the outputs are already within tolerance; nothing to fix",
            "unverified": f"{n} layers met the tolerance in the search but the patched model, re-run, did not"}.get(doc.get("status"), "")
    model = doc.get("patched_model", {}).get("param")
    how = f"; patched model {model}" if model else " (what-if: the layers' high-precision outputs injected)"
    tol = doc.get("tolerance", {}).get("max")
    return (f"{doc.get('engine')} {doc.get('backend')}/{doc.get('precision')} vs {doc.get('reference')}, "
            f"tolerance rel L2 {tol}: {what}{how if n else ''}")


def _layers(doc: dict) -> str:
    masks = doc.get("masks", {})
    rows = "".join(f"<tr><td>{_e(item.get('layer'))}</td><td>{_e(masks.get(item.get('layer'), {}).get('value', ''))}"
                   f"</td><td>{_e(item.get('kind', ''))}</td><td style='text-align:left'>{_e(item.get('reason', ''))}</td></tr>"
                   for item in doc.get("layers", []))
    return ("<table class='data'><tr><th>layer</th><th>31=</th><th>why</th><th>finding</th></tr>" + rows + "</table>"
            if rows else "")


def _errors(doc: dict) -> str:
    rows = "".join(f"<tr><td>{_e(label)}</td><td>{_e(_g(err.get('before')))}</td><td>{_e(_g(err.get('after')))}</td></tr>"
                   for label, err in doc.get("errors", {}).items())
    return "<table class='data'><tr><th>input</th><th>output rel L2 before</th><th>after</th></tr>" + rows + "</table>"


def _speed(doc: dict) -> str:
    speed = doc.get("speed")
    if not speed:
        return ""
    return (f" Patched model {_g(speed.get('patched_ms'))} ms vs {_g(speed.get('original_ms'))} ms per inference "
            f"({_g(speed.get('slowdown'))}x the original's time).")


def _g(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _e(value) -> str:
    return html_text(value)
