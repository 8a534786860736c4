"""Figures for the report, each readable at a glance, drawn with matplotlib's object API on Agg.

Every function takes tidy data and returns PNG bytes; nothing touches pyplot's global state, so
figures can be drawn in any order (and in a server) without leaking into each other. Plots stay
readable with many runs: past `MANY_RUNS` lines, runs of one configuration are drawn thin and their
median bold, and tick labels give way to indices when there are too many layers to name.
"""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

STATUS_COLOURS = {"pass": "#2e7d32", "warn": "#ef6c00", "fail": "#c62828"}
FLOOR = 1e-12  # where an exactly-zero error sits on a log axis
MANY_RUNS = 10
MAX_NAMED_LAYERS = 40
FP16_MAX, FP16_MIN_NORMAL = 65504.0, 6.1e-5


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def _layer_ticks(ax, keys: list[str]) -> None:
    if len(keys) <= MAX_NAMED_LAYERS:
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels(keys, rotation=75, ha="right", fontsize=7)
    else:
        ax.set_xlabel("layer (execution order)")


def error_by_layer(rows: pd.DataFrame, first: dict[str, str], metric: str = "rel_l2",
                   isolated: pd.DataFrame | None = None) -> bytes:
    """Error vs depth, one line per run, the first divergence circled; NaN/Inf layers marked at the top.

    `isolated` (columns run, key, isolated_<metric>) adds a triangle per isolated layer at the error
    the layer makes alone, in its run's colour, so "broken here" and "inherited" read off the line.
    """
    fig = Figure(figsize=(11, 4.8))
    ax = fig.subplots()
    keys = list(rows.groupby("key")["position"].min().sort_values().index)
    x_of = {k: i for i, k in enumerate(keys)}
    runs = list(dict.fromkeys(rows["run"]))
    many = len(runs) > MANY_RUNS
    top = max(_top_value(rows[metric]), _top_value(_isolated_values(isolated, metric)))
    colours = {}
    for run in runs:
        r = rows[rows["run"] == run].sort_values("position")
        x = np.array([x_of[k] for k in r["key"]])
        y = np.clip(r[metric].to_numpy(dtype=float), FLOOR, None)
        bad = ~np.isfinite(y) | (r["n_nonfinite_mismatch"].fillna(0).to_numpy() > 0)
        y = np.where(np.isfinite(y), y, top)
        line, = ax.plot(x, y, lw=0.8 if many else 1.5, alpha=0.35 if many else 0.9, label=None if many else run)
        colours[run] = line.get_color()
        if bad.any():
            ax.scatter(x[bad], np.full(bad.sum(), top), marker="x", color=line.get_color(), zorder=3)
        if run in first and first[run] in x_of:
            xi = x_of[first[run]]
            yi = y[list(r["key"]).index(first[run])]
            ax.scatter([xi], [yi], s=90, facecolors="none", edgecolors="#c62828", linewidths=2, zorder=4)
    if many:
        _median_lines(ax, rows, x_of, metric)
    shown = _isolated_markers(ax, isolated, metric, x_of, colours, top)
    ax.set_yscale("log")
    ax.set_ylabel(f"{metric} vs reference (log)")
    ax.set_title("Error by layer (circle: first divergence, x: NaN/Inf not in reference"
                 + (", triangle: layer run alone on the reference's inputs)" if shown else ")"))
    _layer_ticks(ax, keys)
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left")
    return _png(fig)


def _isolated_values(isolated: pd.DataFrame | None, metric: str) -> pd.Series:
    column = f"isolated_{metric}"
    if isolated is None or isolated.empty or column not in isolated:
        return pd.Series(dtype=float)
    return isolated[column].astype(float)


def _isolated_markers(ax, isolated: pd.DataFrame | None, metric: str, x_of: dict[str, int],
                      colours: dict[str, str], top: float) -> bool:
    """Triangles at each isolated layer's own error (at the top when it is NaN/Inf); True if any drawn."""
    values = _isolated_values(isolated, metric)
    if values.empty:
        return False
    drawn = False
    for (_, row), value in zip(isolated.iterrows(), values):
        if row["key"] not in x_of or row["run"] not in colours or np.isnan(value):
            continue
        y = max(value, FLOOR) if np.isfinite(value) else top
        ax.scatter([x_of[row["key"]]], [y], marker="^", s=110, color=colours[row["run"]], edgecolors="black",
                   linewidths=0.8, zorder=5, label=None if drawn else "isolated (reference's inputs)")
        drawn = True
    return drawn


def _top_value(values: pd.Series) -> float:
    finite = values[np.isfinite(values.astype(float))]
    return float(max(finite.max() * 10, 1.0)) if len(finite) else 1.0


def _median_lines(ax, rows: pd.DataFrame, x_of: dict[str, int], metric: str) -> None:
    """With many runs: one bold median line per configuration (runs are labelled `config input`)."""
    config = rows["run"].str.rsplit(" ", n=1).str[0] if "config" not in rows else rows["config"]
    for name, part in rows.assign(_config=config).groupby("_config"):
        med = part.groupby("key")[metric].median()
        keys = sorted(med.index, key=x_of.get)
        ax.plot([x_of[k] for k in keys], np.clip(med[keys].to_numpy(float), FLOOR, None), lw=2.2, label=f"{name} (median)")


def heatmap(matrix: pd.DataFrame, title: str = "rel L2 error, runs x layers") -> bytes:
    """Runs x layers of a metric on a log colour scale; grey where a layer was not compared."""
    values = matrix.to_numpy(dtype=float)
    values = np.where(np.isfinite(values), np.clip(values, FLOOR, None), np.nan)
    height = min(2 + 0.28 * len(matrix.index), 14)
    fig = Figure(figsize=(11, height))
    ax = fig.subplots()
    ax.set_facecolor("#cccccc")
    finite = values[np.isfinite(values)]
    norm = LogNorm(vmin=max(finite.min(), FLOOR), vmax=max(finite.max(), FLOOR * 10)) if finite.size else None
    image = ax.imshow(values, aspect="auto", cmap="magma_r", norm=norm, interpolation="nearest")
    ax.set_yticks(range(len(matrix.index)))
    ax.set_yticklabels(matrix.index, fontsize=7 if len(matrix.index) > 20 else 9)
    _layer_ticks(ax, list(matrix.columns))
    ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.03)
    return _png(fig)


def value_range(ranges: dict[str, pd.DataFrame]) -> bytes:
    """Each layer's largest |value| per run against fp16's limits, plus the reference's underflow share."""
    fig = Figure(figsize=(11, 6))
    ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    reference_keys = list(next(iter(ranges.values()))["key"])
    x_of = {k: i for i, k in enumerate(reference_keys)}
    for label, layers in ranges.items():
        peak = np.maximum(layers["min"].abs(), layers["max"].abs()).to_numpy(float)
        x = np.array([x_of.get(k, -1) for k in layers["key"]])
        keep = x >= 0
        ax.plot(x[keep], np.clip(peak[keep], FLOOR, None), marker=".", lw=1.2, label=label)
    ax.axhline(FP16_MAX, color="#c62828", ls="--", lw=1, label="fp16 max 65504")
    ax.axhline(FP16_MIN_NORMAL, color="#1565c0", ls=":", lw=1, label="fp16 smallest normal 6.1e-5")
    ax.set_yscale("log")
    ax.set_ylabel("max |value| (log)")
    ax.set_title("Value range by layer against fp16 limits")
    ax.legend(fontsize=8, loc="best")
    ref = next(iter(ranges.values()))
    share = (ref["n_fp16_underflow"] / ref["numel"].clip(lower=1)).to_numpy(float)
    ax2.bar(range(len(share)), share, color="#1565c0")
    ax2.set_ylabel("share in\n(0, 6.1e-5)")
    ax2.set_ylim(0, max(0.05, float(share.max()) * 1.1 if share.size else 0.05))
    _layer_ticks(ax2, reference_keys)
    return _png(fig)


def failure_layer(ref: np.ndarray, run: np.ndarray, title: str, max_points: int = 20000) -> bytes:
    """Histogram of run - ref and a ref-vs-run scatter for one layer (sampled when large)."""
    a, b = ref.reshape(-1).astype(np.float64), run.reshape(-1).astype(np.float64)
    if a.size > max_points:
        pick = np.random.default_rng(0).choice(a.size, max_points, replace=False)
        a, b = a[pick], b[pick]
    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    diff = b - a
    finite = diff[np.isfinite(diff)]
    ax1.hist(finite if finite.size else [0.0], bins=80, color="#6a1b9a", log=True)
    ax1.set_xlabel("run - reference")
    ax1.set_ylabel("elements (log)")
    ax1.set_title(f"difference histogram ({diff.size - finite.size} non-finite)")
    both = np.isfinite(a) & np.isfinite(b)
    ax2.scatter(a[both], b[both], s=2, alpha=0.4, color="#00838f")
    if both.any():
        lo, hi = float(min(a[both].min(), b[both].min())), float(max(a[both].max(), b[both].max()))
        ax2.plot([lo, hi], [lo, hi], color="#c62828", lw=1)
    ax2.set_xlabel("reference value")
    ax2.set_ylabel("run value")
    ax2.set_title("run vs reference")
    fig.suptitle(title)
    return _png(fig)


def per_input_bars(summary: pd.DataFrame, metric: str = "worst_rel_l2") -> bytes:
    """One panel per configuration, one bar per input, coloured by verdict: which inputs break."""
    compared = summary[summary["role"] == "compared"]
    configs = list(dict.fromkeys(compared["config"]))[:6]
    fig = Figure(figsize=(11, 2.2 + 2.6 * len(configs)))
    axes = np.atleast_1d(fig.subplots(len(configs), 1, squeeze=False)[:, 0])
    for ax, config in zip(axes, configs):
        part = compared[compared["config"] == config].sort_values("input")
        values = np.clip(part[metric].to_numpy(float), FLOOR, None)
        values = np.where(np.isfinite(values), values, _top_value(part[metric]))
        colours = [STATUS_COLOURS.get(v, "#777777") for v in part["verdict"]]
        ax.bar(range(len(part)), values, color=colours)
        ax.set_yscale("log")
        ax.set_xticks(range(len(part)))
        ax.set_xticklabels([str(i) or "?" for i in part["input"]], rotation=60, ha="right", fontsize=8)
        ax.set_title(f"{config}: {metric} per input (green pass, orange warn, red fail)", fontsize=10)
    fig.tight_layout()
    return _png(fig)

