"""Plots that scale: a fixed number of drawing objects at any layer count, worst layers kept,
heatmap colours that put the largest error on the most alarming colour, no zig-zag in the
value-range plot when a run executes layers in another order, and large layers sampled from disk."""
from __future__ import annotations

import numpy as np
import pandas as pd

from layerdiff.analyzer.formats.dumpfile import DumpFile, DumpWriter
from layerdiff.analyzer.report.plots import MAX_POINTS, error_by_layer_figure, heatmap_figure, value_range_figure, worst_per_bucket


def test_worst_per_bucket_keeps_every_spike_and_bounds_points():
    x = np.arange(50_000)
    y = np.full(x.size, 1e-6)
    spikes = [3, 17_777, 49_999]
    y[spikes] = [1.0, 5.0, 2.0]
    xs, ys = worst_per_bucket(x[::-1].copy(), y[::-1].copy())
    assert len(xs) <= MAX_POINTS and np.all(np.diff(xs) > 0)
    assert set(spikes) <= set(xs.tolist())


def _rows(layers: int, runs: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    parts = []
    for r in range(runs):
        rel = rng.uniform(1e-6, 1e-3, layers)
        rel[layers // 2] = 0.5
        parts.append(pd.DataFrame({"run": f"run{r}", "key": [f"l{i}:0" for i in range(layers)],
                                   "position": np.arange(layers), "rel_l2": rel, "n_nonfinite_mismatch": 0}))
    return pd.concat(parts, ignore_index=True)


def _artists(fig) -> int:
    return sum(len(ax.lines) + len(ax.collections) + len(ax.patches) + len(ax.images) for ax in fig.axes)


def test_error_plot_is_constant_size_at_10k_layers():
    small, big = error_by_layer_figure(_rows(50), {}), error_by_layer_figure(_rows(10_000), {})
    assert _artists(big) == _artists(small)
    line = big.axes[0].lines[0]
    assert len(line.get_xdata()) <= MAX_POINTS and max(line.get_ydata()) == 0.5


def test_heatmap_largest_error_is_darkest_and_equal_is_light():
    matrix = pd.DataFrame([[0.0, 1e-4, 0.3]], index=["run"], columns=["a", "b", "c"])
    image = heatmap_figure(matrix).axes[0].images[0]
    rgba = image.to_rgba(image.get_array())[0]
    brightness = rgba[:, :3].sum(axis=1)
    assert brightness[0] > brightness[1] > brightness[2]  # equal: lightest; largest: darkest
    assert rgba[2, 0] > rgba[2, 1] and rgba[2, 0] > rgba[2, 2]  # and red


def test_heatmap_buckets_columns_keeping_the_worst():
    values = np.full((2, 20_000), 1e-6)
    values[1, 12_345] = 2.0
    matrix = pd.DataFrame(values, index=["a", "b"], columns=[f"l{i}" for i in range(values.shape[1])])
    data = heatmap_figure(matrix).axes[0].images[0].get_array()
    assert data.shape[1] <= MAX_POINTS and float(np.nanmax(data[1])) == 2.0


def test_value_range_follows_reference_order_without_zigzag():
    keys = [f"l{i}:0" for i in range(30)]
    layer = lambda order: pd.DataFrame({"key": order, "min": -np.arange(1, 31.0), "max": np.arange(1, 31.0),
                                        "n_fp16_underflow": 0, "numel": 10})
    fig = value_range_figure({"ref": layer(keys), "run": layer(keys[::-1])})
    run_line = fig.axes[0].lines[1]
    assert np.all(np.diff(run_line.get_xdata()) > 0)


def test_large_layer_sample_reads_same_positions(tmp_path):
    rng = np.random.default_rng(1)
    big = rng.standard_normal((1, 8, 300, 300)).astype(np.float32)
    with DumpWriter(tmp_path / "c.h5", {}, compression="gzip") as chunked, DumpWriter(tmp_path / "p.h5", {}) as plain:
        for w in (chunked, plain):
            w.add_tensor({"order": 0, "op": "conv"}, big)
    with DumpFile(tmp_path / "c.h5") as a, DumpFile(tmp_path / "p.h5") as b:
        sa, sb = a.sample(0, 5000), b.sample(0, 5000)
    assert sa.dtype == np.float64 and 4000 <= sa.size <= 5000
    np.testing.assert_array_equal(sa, sb)
    assert set(np.round(sa, 5)) <= set(np.round(big.reshape(-1).astype(np.float64), 5))


def test_page_charts_stay_bounded_and_keep_the_worst_layer():
    """The page's charts (drawn by the browser) at 10,000 layers x 8 runs: the heatmap keeps at most
    MAX_POINTS columns with the spike in them, the lines keep every point (WebGL draws them), and a
    run keeps its configuration's colour in both."""
    from layerdiff.analyzer.report import charts

    rows = _rows(10_000, runs=8)
    matrix = rows.pivot_table(index="run", columns="key", values="rel_l2", sort=False)
    matrix = matrix[[f"l{i}:0" for i in range(10_000)]]
    traces, layout = charts.heatmap_traces(matrix, {f"l{i}:0": i for i in range(10_000)})
    z = np.array(traces[0]["z"], dtype=float)
    assert z.shape == (8, MAX_POINTS) and np.isclose(np.nanmax(z), np.log10(0.5))
    assert traces[0]["y"] == [f"run{r}" for r in range(8)] and traces[0]["x"][0] == 1  # 1-based like "#N"
    summary = pd.DataFrame({"run": [f"run{r}" for r in range(8)], "role": ["compared"] * 8,
                            "config": ["a"] * 4 + ["b"] * 4})
    colours = charts.run_colours(summary)
    lines, _ = charts.error_traces(rows, colours, {"run0": "l5000:0"}, configs=charts.run_configs(summary))
    drawn = [t for t in lines if t["mode"] == "lines"]
    assert len(drawn) == 8 and {t["line"]["color"] for t in drawn[:4]} != {t["line"]["color"] for t in drawn[4:]}
    assert all(t["type"] == "scattergl" and len(t["x"]) == 10_000 for t in drawn)
    circle = next(t for t in lines if t["name"] == "first divergence")
    assert circle["x"] == [5001] and circle["y"] == [0.5]
