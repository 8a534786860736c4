"""Figures for the report, each readable at a glance, drawn with matplotlib's object API on Agg.

Every function takes tidy data and returns PNG bytes; nothing touches pyplot's global state, so
figures can be drawn in any order (and in a server) without leaking into each other. Plots stay
readable with many runs: past `MANY_RUNS` lines, runs of one configuration are drawn thin and their
median bold, and tick labels give way to indices when there are too many layers to name.
Plots scale with the model: past `MAX_POINTS` layers a line keeps the worst value of each of
`MAX_POINTS` buckets (so the worst layers are always drawn) and the heatmap keeps the worst value
per column bucket, so every figure is a fixed number of drawing objects whatever the layer count.
"""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullLocator  # noqa: E402

from layerdiff.analyzer.report.buckets import MAX_POINTS, PLOT_MAX, plottable, worst_columns, worst_per_bucket  # noqa: E402,F401

STATUS_COLOURS = {"pass": "#2e7d32", "warn": "#ef6c00", "fail": "#c62828"}
FLOOR = 1e-12  # where an exactly-zero error sits on a log axis
MANY_RUNS = 10
MAX_NAMED_LAYERS = 40
FP16_MAX, FP16_MIN_NORMAL = 65504.0, 6.1e-5
DPI = 96  # 11-inch figures are 1056 px wide: the page's width; pixels cost rasterising and PNG encoding


def _png(fig: Figure) -> bytes:
    """PNG bytes; log axes get plain `1e-04` labels (matplotlib's default mathtext labels were half of
    the drawing time) and PNG compression is light (the page embeds them; size matters less than time)."""
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                axis.set_major_formatter(FuncFormatter(_log_label))
                axis.set_minor_locator(NullLocator())  # unlabelled minor ticks were a third of a figure's drawing
    buf = io.BytesIO()  # "tight": layer names, run labels and legends outside the axes are never cut
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", pad_inches=0.15, pil_kwargs={"compress_level": 1})
    return buf.getvalue()


def _log_label(value: float, _pos) -> str:
    return f"{value:.0e}" if value > 0 else "0"


def _layer_ticks(ax, keys: list[str]) -> None:
    if len(keys) <= MAX_NAMED_LAYERS:
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels(keys, rotation=75, ha="right", fontsize=7)
    else:
        ax.set_xlabel("layer (execution order)")


def error_by_layer(rows: pd.DataFrame, first: dict[str, str], metric: str = "rel_l2",
                   isolated: pd.DataFrame | None = None, colours: dict[str, str] | None = None) -> bytes:
    """Error vs depth, one line per run, the first divergence circled; NaN/Inf layers marked at the top.

    `isolated` (columns run, key, isolated_<metric>) adds a triangle per isolated layer at the error
    the layer makes alone, in its run's colour, so "broken here" and "inherited" read off the line.
    """
    return _png(error_by_layer_figure(rows, first, metric, isolated, colours))


def error_by_layer_figure(rows: pd.DataFrame, first: dict[str, str], metric: str = "rel_l2",
                          isolated: pd.DataFrame | None = None, colours: dict[str, str] | None = None) -> Figure:
    """Error vs depth, one line per run, the first divergence circled; NaN/Inf layers marked at the top.

    `isolated` (columns run, key, isolated_<metric>) adds a triangle per isolated layer at the error
    the layer makes alone, in its run's colour, so "broken here" and "inherited" read off the line.
    """
    fig = Figure(figsize=(11, 4.8))
    ax = fig.subplots()
    keys = list(rows.groupby("key")["position"].min().sort_values().index)
    x_of = pd.Series(np.arange(len(keys)), index=keys)
    runs = list(dict.fromkeys(rows["run"]))
    many = len(runs) > MANY_RUNS
    top = max(_top_value(rows[metric]), _top_value(_isolated_values(isolated, metric)))
    given, colours = colours or {}, {}
    for run, r in rows.groupby("run", sort=False):
        x = x_of.reindex(r["key"]).to_numpy()
        raw = r[metric].to_numpy(dtype=float)
        y = np.where(np.isfinite(raw), np.clip(raw, FLOOR, None), top)
        bad = ~np.isfinite(raw) | (r["n_nonfinite_mismatch"].fillna(0).to_numpy() > 0)
        line, = ax.plot(*worst_per_bucket(x, y), lw=0.8 if many else 1.5, alpha=0.35 if many else 0.9,
                        label=None if many else run, color=given.get(run))
        colours[run] = line.get_color()
        if bad.any():
            ax.scatter(x[bad], np.full(int(bad.sum()), top), marker="x", color=line.get_color(), zorder=3)
        if run in first and first[run] in x_of.index:
            hit = np.flatnonzero(r["key"].to_numpy() == first[run])
            if hit.size:
                ax.scatter([x_of[first[run]]], [y[hit[0]]], s=90, facecolors="none", edgecolors="#c62828",
                           linewidths=2, zorder=4)
    if many:
        _median_lines(ax, rows, x_of, metric, colours)
    shown = _isolated_markers(ax, isolated, metric, x_of, colours, top)
    ax.set_yscale("log")
    ax.set_ylabel(f"{metric} vs reference (log)")
    ax.set_title("Error by layer (circle: first divergence, x: NaN/Inf not in reference"
                 + (", triangle: layer run alone on the reference's inputs)" if shown else ")"))
    _layer_ticks(ax, keys)
    ax.grid(True, which="major", alpha=0.3)
    _legend_outside(ax)
    return fig


def _legend_outside(ax) -> None:
    """The legend right of the axes, never over a marker, a line or the layer names below."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)


def _isolated_values(isolated: pd.DataFrame | None, metric: str) -> pd.Series:
    column = f"isolated_{metric}"
    if isolated is None or isolated.empty or column not in isolated:
        return pd.Series(dtype=float)
    return isolated[column].astype(float)


def _isolated_markers(ax, isolated: pd.DataFrame | None, metric: str, x_of: pd.Series,
                      colours: dict[str, str], top: float) -> bool:
    """Triangles at each isolated layer's own error (at the top when it is NaN/Inf); True if any drawn."""
    values = _isolated_values(isolated, metric)
    if values.empty:
        return False
    frame = isolated.assign(_value=values.to_numpy())
    frame = frame[frame["key"].isin(x_of.index) & frame["run"].isin(list(colours)) & frame["_value"].notna()]
    drawn = False
    for run, part in frame.groupby("run", sort=False):
        value = part["_value"].to_numpy(float)
        y = np.where(np.isfinite(value), np.maximum(value, FLOOR), top)
        ax.scatter(x_of.reindex(part["key"]).to_numpy(), y, marker="^", s=110, color=colours[run],
                   edgecolors="black", linewidths=0.8, zorder=5, label=None if drawn else "isolated (reference's inputs)")
        drawn = True
    return drawn


def _top_value(values: pd.Series) -> float:
    finite = values[np.isfinite(values.astype(float))]
    return float(max(finite.max() * 10, 1.0)) if len(finite) else 1.0


def _median_lines(ax, rows: pd.DataFrame, x_of: pd.Series, metric: str, colours: dict[str, str]) -> None:
    """With many runs: one bold median line per configuration (runs are labelled `config input`),
    in the colour its runs are drawn in."""
    config = rows["run"].str.rsplit(" ", n=1).str[0] if "config" not in rows else rows["config"]
    for name, part in rows.assign(_config=config).groupby("_config"):
        med = part.groupby("key")[metric].median()
        x, y = worst_per_bucket(x_of.reindex(med.index).to_numpy(), np.clip(med.to_numpy(float), FLOOR, None))
        ax.plot(x, y, lw=2.2, label=f"{name} (median)", color=colours.get(str(part["run"].iloc[0])))


def heatmap(matrix: pd.DataFrame, title: str = "rel L2 error, runs x layers") -> bytes:
    """Runs x layers of a metric on a log colour scale; grey where a layer was not compared.

    Equal layers are white and the largest errors the darkest red, so the eye goes to what is
    broken; past `MAX_POINTS` layers each column shows the worst of its bucket of layers.
    """
    return _png(heatmap_figure(matrix, title))


def heatmap_figure(matrix: pd.DataFrame, title: str = "rel L2 error, runs x layers") -> Figure:
    """Runs x layers of a metric on a log colour scale; grey where a layer was not compared.

    Equal layers are white and the largest errors the darkest red, so the eye goes to what is
    broken; past `MAX_POINTS` layers each column shows the worst of its bucket of layers.
    """
    values = matrix.to_numpy(dtype=float)
    values = np.where(np.isfinite(values), np.clip(values, FLOOR, None),
                      np.where(np.isnan(values), np.nan, np.inf))
    keys = list(matrix.columns)
    if values.shape[1] > MAX_POINTS:
        values, keys = worst_columns(values), []
    finite = values[np.isfinite(values)]
    top = float(finite.max()) * 10 if finite.size else 1.0
    values = np.where(np.isposinf(values), max(top, FLOOR * 10), values)
    height = min(2 + 0.28 * len(matrix.index), 14)
    fig = Figure(figsize=(11, height))
    ax = fig.subplots()
    ax.set_facecolor("#cccccc")
    shown = values[np.isfinite(values)]
    norm = LogNorm(vmin=max(shown.min(), FLOOR), vmax=max(shown.max(), shown.min() * 10, FLOOR * 10)) if shown.size else None
    image = ax.imshow(values, aspect="auto", cmap="Reds", norm=norm, interpolation="nearest")
    ax.set_yticks(range(len(matrix.index)))
    ax.set_yticklabels(matrix.index, fontsize=7 if len(matrix.index) > 20 else 9)
    if keys:
        _layer_ticks(ax, keys)
    else:
        ax.set_xlabel(f"layer buckets (execution order, worst of {matrix.shape[1] / values.shape[1]:.0f} layers each)")
    ax.set_title(title + " (white: equal, dark red: largest; grey: not compared)")
    fig.colorbar(image, ax=ax, fraction=0.03)
    return fig


def value_range(ranges: dict[str, pd.DataFrame], colours: dict[str, str] | None = None) -> bytes:
    """Each layer's largest |value| per run against fp16's limits, plus the reference's underflow share.

    Every run is drawn in the reference's layer order (sorted by its x), so a run that executes
    layers in another order does not zig-zag.
    """
    return _png(value_range_figure(ranges, colours))


def value_range_figure(ranges: dict[str, pd.DataFrame], colours: dict[str, str] | None = None) -> Figure:
    """Each layer's largest |value| per run against fp16's limits, plus the reference's underflow share.

    Every run is drawn in the reference's layer order (sorted by its x), so a run that executes
    layers in another order does not zig-zag.
    """
    ref = next(iter(ranges.values()))
    share = (ref["n_fp16_underflow"] / ref["numel"].clip(lower=1)).to_numpy(float)
    underflow = bool(share.size) and float(np.nanmax(share)) > 0  # no empty panel when no value is that small
    fig = Figure(figsize=(11, 6 if underflow else 4.6))
    if underflow:
        ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    else:
        ax, ax2 = fig.subplots(), None
    reference_keys = list(ref["key"])
    x_of = pd.Series(np.arange(len(reference_keys)), index=reference_keys)
    x_of = x_of[~x_of.index.duplicated()]
    for k, (label, layers) in enumerate(ranges.items()):
        peak = np.maximum(layers["min"].abs(), layers["max"].abs()).to_numpy(float)
        x = x_of.reindex(layers["key"]).to_numpy()
        keep = ~np.isnan(x)
        xs, ys = worst_per_bucket(x[keep].astype(np.int64), np.clip(peak[keep], FLOOR, None))
        ax.plot(xs, ys, marker="." if len(xs) <= 200 else None, lw=max(3.5 - 0.7 * k, 1.0), label=label,
                ls=("-", "--", ":", "-.")[k % 4], color=(colours or {}).get(label))  # coinciding lines stay visible
    ax.axhline(FP16_MAX, color="#c62828", ls="--", lw=1, label="fp16 max 65504")
    ax.axhline(FP16_MIN_NORMAL, color="#1565c0", ls=":", lw=1, label="fp16 smallest normal 6.1e-5")
    ax.set_yscale("log")
    ax.set_ylabel("max |value| (log)")
    ax.set_title("Value range by layer against fp16 limits")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    if ax2 is None:
        _layer_ticks(ax, reference_keys)
        return fig
    xs, ys = worst_per_bucket(np.arange(len(share)), share)
    ax2.fill_between(xs, ys, step="mid", color="#1565c0", alpha=0.8, lw=0)
    ax2.set_ylabel("share in\n(0, 6.1e-5)")
    ax2.set_ylim(0, max(0.05, float(share.max()) * 1.1 if share.size else 0.05))
    _layer_ticks(ax2, reference_keys)
    return fig


def failure_layer(ref: np.ndarray, run: np.ndarray, title: str) -> bytes:
    """Histogram of run - ref and a ref-vs-run scatter for one layer.

    `ref` and `run` are flat samples taken at the same positions (`DumpFile.sample`), never whole
    large layers."""
    a, b = np.asarray(ref, dtype=np.float64).reshape(-1), np.asarray(run, dtype=np.float64).reshape(-1)
    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = b - a
    finite = diff[plottable(diff)]
    ax1.hist(finite if finite.size else [0.0], bins=80, color="#6a1b9a", log=True, histtype="stepfilled")
    ax1.set_xlabel("run - reference")
    ax1.set_ylabel("elements (log)")
    ax1.set_title(f"difference histogram ({diff.size - finite.size} non-finite or beyond ±{PLOT_MAX:g})")
    both = plottable(a) & plottable(b)
    ax2.plot(a[both], b[both], ".", ms=1.5, alpha=0.5, color="#00838f", zorder=3)  # one Line2D, not 20k markers
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

