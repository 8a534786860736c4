"""Where two releases of one engine part: `collect --engine mnn==3.5.0` beside the installed MNN.

Two releases run on one device, backend and precision are two configurations compared like any two
(one is the reference of the other). What a user asks of them is one sentence: at which layer the
newer release first computes something else than the older ("regressed between 3.5.0 and 3.6.1 at
layer X"), or that they agree. Judged from the pair's layer statuses; no tensor is read here.
"""
from __future__ import annotations

import re

import pandas as pd

from layerdiff.analyzer.findings.finding import Finding, FindingKind, Severity
from layerdiff.analyzer.findings.wording import layer_name
from layerdiff.analyzer.runs.sources import bare_release

COMPARED = ("pass", "warn", "fail")
SAME_SETTING = ("device_serial", "backend_requested", "precision_requested", "model_sha256")


def release_key(version: str) -> tuple:
    """`3.10.0` after `3.9.1`: release numbers compared part by part as numbers where they are numbers."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.+-]", version))


def releases_of(pair) -> tuple[str, str, str] | None:
    """(engine, base release, other release) when the pair is one engine at two releases on one device,
    backend, precision and model, else None."""
    base, other = pair.base.attrs, pair.other.attrs
    engine = str(base.get("engine", "") or "")
    if not engine or engine != str(other.get("engine", "") or ""):
        return None
    if any(str(base.get(f, "")) != str(other.get(f, "")) for f in SAME_SETTING):
        return None  # another backend or precision too: what parts them is not the release alone
    a, b = str(base.get("engine_version", "") or ""), str(other.get("engine_version", "") or "")
    if not a or not b or a == b:
        return None
    return engine, bare_release(engine, a), bare_release(engine, b)


def release_parting(pair, rows: pd.DataFrame) -> list[Finding]:
    """One finding for a reference pair of two releases of one engine: the first layer in execution
    order where they part (warn or fail), or that every compared layer agrees within tolerance."""
    found = releases_of(pair)
    if found is None:
        return []
    engine, base_release, other_release = found
    older, newer = sorted((base_release, other_release), key=release_key)
    compared = rows[rows["status"].isin(COMPARED)].sort_values("position")
    if compared.empty:
        return []
    numbers = {"engine": engine, "older": older, "newer": newer, "reference_release": base_release,
               "layers_compared": int(len(compared))}
    parting = compared[compared["status"].isin(("warn", "fail"))]
    between = f"{pair.other.label} against {pair.base.label}"
    if parting.empty:
        worst = float(compared["rel_l2"].max())
        numbers["worst_rel_l2"] = worst
        return [Finding(FindingKind.RELEASE_PARTING, pair.other.label, "", "",
                        f"{engine} {older} and {newer} agree: all {len(compared)} compared layers are within tolerance "
                        f"(worst rel L2 {worst:.3g}; {between}).", severity=Severity.INFO, numbers=numbers)]
    first = parting.iloc[0]
    n_fail = int((compared["status"] == "fail").sum())
    numbers.update(position=int(first["position"]), rel_l2=float(first["rel_l2"]), max_abs=float(first["max_abs"]),
                   layers_parting=int(len(parting)), layers_failing=n_fail)
    text = (f"{engine} regressed between {older} and {newer} at layer {layer_name(first['key'], first.get('op'))} "
            f"({first['op_type']}), #{int(first['position']) + 1} in execution order: the first layer where the two "
            f"releases part ({first['status']}s with rel L2 {first['rel_l2']:.3g}, max abs {first['max_abs']:.3g}); "
            f"{len(parting)} of {len(compared)} compared layers part, {n_fail} fail ({between}).")
    return [Finding(FindingKind.RELEASE_PARTING, pair.other.label, str(first["key"]), str(first["op_type"]), text,
                    severity=str(first["status"]), numbers=numbers)]
