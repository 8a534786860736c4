"""Many inputs as one unit: one configuration judged over a data set of inputs.

A sweep over 200 inputs gives 200 runs per configuration, each judged alone; the user's question is
about the set: "fails on 7 of 200 inputs, first on x.png, worst on y.png, always from layer L". This
module reads the judged run summary (summary.py), the judged layer rows and the zero-collapse
findings, and builds per configuration with at least two inputs:
- `configs`: counts over inputs (pass / warn / fail), the first failing input, the worst input, the
  inputs whose values collapse to zero, and the layer failing on the most inputs;
- `inputs`: the per-input table behind those counts;
- `layers`: per layer, on how many inputs it fails or warns.
and one `dataset` finding per configuration that says it in a sentence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from layerdiff.analyzer.findings.finding import MAX_NAMED, Finding, FindingKind, Severity, named
from layerdiff.analyzer.findings.verdict import STATUS_ORDER
from layerdiff.analyzer.measure.comparison import Comparison

CONFIG_COLUMNS = ["configuration", "inputs", "n_pass", "n_warn", "n_fail", "n_other", "n_with_failing_layer",
                  "first_failing_input", "first_warning_input", "worst_input", "worst_output_rel_l2", "n_zero_collapse",
                  "zero_collapse_inputs", "zero_collapse_first_layer", "most_failing_layer", "most_failing_inputs"]
INPUT_COLUMNS = ["configuration", "input", "run", "verdict", "n_fail", "n_warn", "first_divergence", "first_fail",
                 "worst_layer", "worst_rel_l2", "output_rel_l2", "output_zero_collapse", "zero_collapse_start"]
LAYER_COLUMNS = ["configuration", "position", "layer", "op_type", "inputs", "n_fail", "n_warn", "failing_inputs"]


@dataclass
class Dataset:
    """The data-set view of an analysis; empty frames when no configuration ran on two inputs or more."""

    configs: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CONFIG_COLUMNS))
    inputs: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=INPUT_COLUMNS))
    layers: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=LAYER_COLUMNS))

    @property
    def empty(self) -> bool:
        return self.configs.empty


def dataset_view(comparison: Comparison, summary: pd.DataFrame, findings: list[Finding]) -> Dataset:
    """Per configuration run on several inputs: its counts, per-input rows and per-layer frequencies."""
    compared = _reference_pairs(comparison)
    by_config: dict[tuple, list[int]] = {}
    for index in compared:
        by_config.setdefault(comparison.plan.pairs[index].other.config, []).append(index)
    by_config = {c: _first_repeat_per_input(comparison, idx) for c, idx in by_config.items()}
    by_config = {c: idx for c, idx in by_config.items() if len(idx) >= 2}
    if not by_config:
        return Dataset()
    labels = _config_labels(comparison, by_config)
    zero_starts = {f.run: f.layer for f in findings if f.kind == FindingKind.ZERO_COLLAPSE_ORIGIN}
    summary_by_run = {r["run"]: r for r in summary.to_dict("records")}
    inputs, layers, configs = [], [], []
    for config, indices in by_config.items():
        rows = [_input_row(comparison, i, labels[config], summary_by_run, zero_starts) for i in indices]
        frame = pd.DataFrame(rows, columns=INPUT_COLUMNS)
        per_layer = _layer_frequency(comparison, indices, labels[config], frame)
        inputs.append(frame)
        layers.append(per_layer)
        configs.append(_config_row(labels[config], frame, per_layer))
    return Dataset(pd.DataFrame(configs, columns=CONFIG_COLUMNS), pd.concat(inputs, ignore_index=True),
                   pd.concat(layers, ignore_index=True))


def dataset_findings(view: Dataset) -> list[Finding]:
    """One sentence per configuration: "vulkan/low over 3 inputs: ... zero collapse on 2 of 3 inputs"."""
    out = []
    for config in view.configs.to_dict("records"):
        inputs = view.inputs[view.inputs["configuration"] == config["configuration"]]
        layers = view.layers[view.layers["configuration"] == config["configuration"]]
        out.append(_finding(config, inputs, layers))
    return out


def _reference_pairs(comparison: Comparison) -> list[int]:
    return [i for i, p in enumerate(comparison.plan.pairs) if p.kind == "reference" and p.base.config != p.other.config]


def _first_repeat_per_input(comparison: Comparison, indices: list[int]) -> list[int]:
    """One pair per input: its first repeat stands for it (the per-op repeat section covers the others),
    so a configuration repeated 3 times on 10 inputs counts 10 inputs, not 30. In input-name order, the
    order `collect --input DIR` feeds a folder's files in, so "first failing input" means what it says."""
    chosen: dict[str, int] = {}
    for index in indices:
        run = comparison.plan.pairs[index].other
        held = chosen.get(run.input_key)
        if held is None or run.repeat < comparison.plan.pairs[held].other.repeat:
            chosen[run.input_key] = index
    return sorted(chosen.values(), key=lambda i: (comparison.plan.pairs[i].other.input_name, i))


def _input_row(comparison: Comparison, index: int, config: str, summary_by_run: dict, zero_starts: dict) -> dict:
    run = comparison.plan.pairs[index].other
    judged = summary_by_run.get(run.label, {})
    rows = comparison.pair_rows(index)
    outputs = rows[rows["is_output"].astype(bool)]
    collapse = pd.to_numeric(outputs["zero_collapse"], errors="coerce").fillna(0.0)
    return {"configuration": config, "input": run.input_name, "run": run.label,
            "verdict": str(judged.get("verdict", "")), "n_fail": int((rows["status"] == "fail").sum()),
            "n_warn": int((rows["status"] == "warn").sum()),
            "first_divergence": _text(judged.get("first_divergence")), "first_fail": _text(judged.get("first_fail")),
            "worst_layer": _text(judged.get("worst_layer")), "worst_rel_l2": _number(judged.get("worst_rel_l2")),
            "output_rel_l2": _number(judged.get("output_rel_l2")),
            "output_zero_collapse": float(collapse.max()) if len(collapse) else math.nan,
            "zero_collapse_start": zero_starts.get(run.label, "")}


def _layer_frequency(comparison: Comparison, indices: list[int], config: str, inputs: pd.DataFrame) -> pd.DataFrame:
    """Per layer: on how many inputs it fails or warns (only layers that do on at least one)."""
    table = comparison.table
    rows = table[table["pair"].isin(indices) & table["status"].isin(["fail", "warn"])]
    if rows.empty:
        return pd.DataFrame(columns=LAYER_COLUMNS)
    label_of = dict(zip(inputs["run"], inputs["input"]))
    rank = {run: i for i, run in enumerate(inputs["run"])}  # the inputs' own (name) order
    out = []
    for key, group in rows.groupby("key", sort=False):
        failing = group[group["status"] == "fail"]
        out.append({"configuration": config, "position": int(group["position"].min()), "layer": str(key),
                    "op_type": str(group["op_type"].iloc[0]), "inputs": len(inputs),
                    "n_fail": int(len(failing)), "n_warn": int((group["status"] == "warn").sum()),
                    "failing_inputs": ", ".join(label_of.get(r, r) for r in sorted(failing["run"], key=rank.get))})
    return pd.DataFrame(out, columns=LAYER_COLUMNS).sort_values("position", kind="stable").reset_index(drop=True)


def _config_row(config: str, inputs: pd.DataFrame, layers: pd.DataFrame) -> dict:
    verdicts = inputs["verdict"]
    collapsing = inputs[inputs["zero_collapse_start"] != ""]
    worst = _worst_input(inputs)
    most = layers.sort_values(["n_fail", "position"], ascending=[False, True], kind="stable") if len(layers) else layers
    most = most[most["n_fail"] > 0] if len(most) else most
    return {"configuration": config, "inputs": int(len(inputs)),
            "n_pass": int((verdicts == "pass").sum()), "n_warn": int((verdicts == "warn").sum()),
            "n_fail": int((verdicts == "fail").sum()),
            "n_other": int((~verdicts.isin(["pass", "warn", "fail"])).sum()),
            "n_with_failing_layer": int((inputs["n_fail"] > 0).sum()),
            "first_failing_input": _first(inputs, "fail"), "first_warning_input": _first(inputs, "warn"),
            "worst_input": "" if worst is None else worst["input"],
            "worst_output_rel_l2": math.nan if worst is None else worst["output_rel_l2"],
            "n_zero_collapse": int(len(collapsing)), "zero_collapse_inputs": ", ".join(sorted(collapsing["input"])),
            "zero_collapse_first_layer": _earliest(collapsing, layers),
            "most_failing_layer": str(most.iloc[0]["layer"]) if len(most) else "",
            "most_failing_inputs": int(most.iloc[0]["n_fail"]) if len(most) else 0}


def _first(inputs: pd.DataFrame, verdict: str) -> str:
    hits = inputs[inputs["verdict"] == verdict]
    return str(hits.iloc[0]["input"]) if len(hits) else ""


def _worst_input(inputs: pd.DataFrame):
    """The worst verdict, then the most collapsed output, then the largest output error."""
    if inputs.empty:
        return None
    ranked = inputs.assign(
        _v=inputs["verdict"].map(lambda v: STATUS_ORDER.get(v, -1)),
        _z=inputs["output_zero_collapse"].fillna(0.0), _o=inputs["output_rel_l2"].fillna(-1.0),
        _w=inputs["worst_rel_l2"].fillna(-1.0))
    ranked = ranked.sort_values(["_v", "_z", "_o", "_w"], ascending=False, kind="stable")
    return ranked.iloc[0] if ranked.iloc[0]["_v"] > 0 else None


def _earliest(collapsing: pd.DataFrame, layers: pd.DataFrame) -> str:
    """The zero-collapse start earliest in execution order among the collapsing inputs."""
    if collapsing.empty:
        return ""
    position = dict(zip(layers["layer"], layers["position"]))
    starts = sorted(set(collapsing["zero_collapse_start"]), key=lambda k: (position.get(k, math.inf), k))
    return starts[0]


def _finding(config: dict, inputs: pd.DataFrame, layers: pd.DataFrame) -> Finding:
    n = config["inputs"]
    if config["n_pass"] == n:
        counts = f"all {n} inputs pass"
    else:
        counts = f"run verdicts {config['n_fail']} fail, {config['n_warn']} warn, {config['n_pass']} pass"
        counts += f", {config['n_other']} not judged" if config["n_other"] else ""
    parts = [f"{config['configuration']} over {n} inputs: {counts}"]
    if config["n_with_failing_layer"]:
        parts.append(f"layers fail on {config['n_with_failing_layer']} of {n} inputs")
    if config["first_failing_input"]:
        parts.append(f"first failing input {config['first_failing_input']}")
    elif config["first_warning_input"]:
        parts.append(f"no input fails, first warning on {config['first_warning_input']}")
    if config["worst_input"]:
        parts.append(f"worst {config['worst_input']} (output rel L2 {_g(config['worst_output_rel_l2'])})")
    if config["n_zero_collapse"]:
        names = sorted(inputs.loc[inputs["zero_collapse_start"] != "", "input"])
        parts.append(f"zero collapse on {config['n_zero_collapse']} of {n} inputs ({named(names)}), first at layer "
                     f"{config['zero_collapse_first_layer']}")
    frequent = layers[layers["n_fail"] > 0].sort_values(["n_fail", "position"], ascending=[False, True], kind="stable")
    if len(frequent):
        parts.append("layers failing on most inputs: " + ", ".join(
            f"{r['layer']} ({r['n_fail']} of {n})" for r in frequent.head(MAX_NAMED).to_dict("records")))
    severity = Severity.FAIL if config["n_fail"] else (Severity.WARN if config["n_warn"] or config["n_zero_collapse"]
                                                       else Severity.INFO)
    numbers = {k: config[k] for k in ("inputs", "n_pass", "n_warn", "n_fail", "n_other", "n_with_failing_layer",
                                      "first_failing_input", "first_warning_input", "worst_input", "n_zero_collapse",
                                      "zero_collapse_first_layer", "most_failing_layer", "most_failing_inputs")}
    numbers["worst_output_rel_l2"] = _number(config["worst_output_rel_l2"])
    numbers["zero_collapse_inputs"] = sorted(inputs.loc[inputs["zero_collapse_start"] != "", "input"].tolist())
    numbers["verdict_by_input"] = dict(zip(inputs["input"], inputs["verdict"]))
    numbers["fail_count_by_layer"] = {r["layer"]: int(r["n_fail"]) for r in layers.to_dict("records") if r["n_fail"]}
    return Finding(FindingKind.DATASET, config["configuration"], config["zero_collapse_first_layer"]
                   or config["most_failing_layer"], "", "Data set: " + "; ".join(parts) + ".",
                   severity=severity, numbers=numbers)


def _config_labels(comparison: Comparison, by_config: dict[tuple, list[int]]) -> dict[tuple, str]:
    """'vulkan/low' when that names each configuration alone, else the full configuration label (always
    for an engine release asked for by version: its cpu/high is not the reference's cpu/high)."""
    pairs = {config: comparison.plan.pairs[indices[0]] for config, indices in by_config.items()}
    runs = {config: pair.other for config, pair in pairs.items()}
    short = {config: f"{run.backend}/{run.precision}" for config, run in runs.items()}
    releases = any(str(p.base.attrs.get("engine_version", "")) != str(p.other.attrs.get("engine_version", ""))
                   and p.base.attrs.get("engine") == p.other.attrs.get("engine") for p in pairs.values())
    if releases:  # `mnn 3.6.1 cpu/high`: the release is what sets the configuration apart from its reference
        return {config: " ".join(str(part) for part in (run.attrs.get("engine", ""), run.attrs.get("engine_version", ""),
                                                         short[config]) if part) for config, run in runs.items()}
    if len(set(short.values())) == len(short):
        return short
    return {config: run.config_label or run.label for config, run in runs.items()}


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _g(value) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{float(value):.3g}"
