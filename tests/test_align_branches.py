"""Engine against engine, every name different: structure pairs the layers, values must not be
overruled by edges where they plainly name the partner.

Two parallel branches fed by one tensor, run in opposite orders by two engines:

PP-PicoDet's CSP blocks feed one Concat to two 1x1 convs of the same shape. MNN runs the second
branch first and decomposes HardSwish into Add, Clip, Mul, Div; ncnn runs the first branch first
and fuses it into one `hswish`. Every name differs, so structure pairs the layers: the monotone
pass meets the first conv of each run, both fed by the matched Concat (every graph edge agrees),
while their values differ (rel L2 ~1.4) and each conv's true partner, within fp32 rounding, sits
past the next match. The test holds the alignment against the values written into the dumps.

One op decomposed two ways: Paddle's HardSigmoid `clip(0.2 x + 0.5, 0, 1)` is `0.2 x`, `+ 0.5`,
ReLU6 in MNN and `1.2 x`, HardSigmoid(1/6, 0.5) after pnnx in ncnn: `0.2 x` and `1.2 x` sit in the
same place, every edge agrees, and they are different tensors (rel L2 5) whose consumers agree.
A FAIL there blamed an op that computes nothing wrong.

The model output written twice: MNN writes an `Output` copy of the final Softmax, ncnn's Softmax is
its last layer; the copy (the reference's model output) must be the one compared.
"""
from __future__ import annotations

import numpy as np

from layerdiff.analyzer.align.byname import NameRules, align_layers
from layerdiff.analyzer.align.naming import naming_of
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.measure.compare import value_error
from tests.analyze_dumps import write_dump

C, HALF = (1, 16, 6, 6), (1, 8, 6, 6)


class _Run:
    def __init__(self, dump: DumpFile) -> None:
        self.dump, self.layers = dump, dump.layers


def _hswish_chain(prefix: str, x: np.ndarray, source: str) -> tuple[list, dict]:
    """MNN's decomposed HardSwish after conv `source`: Add(+3), Clip(0, 6), Mul(x), Div(6)."""
    add, clip = x + 3, np.clip(x + 3, 0, 6)
    values = {f"{prefix}_add": add, f"{prefix}_clip": clip, f"{prefix}_mul": x * clip, f"{prefix}_hs": x * clip / 6}
    layers = [(f"{prefix}_add", "BinaryOp", [source], HALF), (f"{prefix}_clip", "ReLU6", [f"{prefix}_add"], HALF),
              (f"{prefix}_mul", "BinaryOp", [source, f"{prefix}_clip"], HALF),
              (f"{prefix}_hs", "BinaryOp", [f"{prefix}_mul"], HALF)]
    return layers, values


def _runs(tmp_path):
    rng = np.random.default_rng(7)
    t = {k: rng.normal(0, 1, s).astype(np.float32) for k, s in
         (("stem", C), ("left", HALF), ("right", HALF), ("deep", HALF), ("head", C))}
    left_hs, right_hs = (x * np.clip(x + 3, 0, 6) / 6 for x in (t["left"], t["right"]))
    mnn_layers = [("stem", "Convolution", ["data"], C), ("cat_raster", "Raster", ["stem"], C),
                  ("bn_right", "Convolution", ["cat_raster"], HALF)]
    mnn_values = {"stem": t["stem"], "cat_raster": t["stem"], "bn_right": t["right"], "bn_deep": t["deep"]}
    for prefix, x, source in (("r", t["right"], "bn_right"),):
        layers, values = _hswish_chain(prefix, x, source)
        mnn_layers += layers
        mnn_values.update(values)
    mnn_layers += [("bn_deep", "Convolution", ["r_hs"], HALF), ("bn_left", "Convolution", ["cat_raster"], HALF)]
    mnn_values["bn_left"] = t["left"]
    layers, values = _hswish_chain("l", t["left"], "bn_left")
    mnn_layers += layers + [("cat5_raster", "Raster", ["bn_deep", "l_hs"], C), ("head", "Convolution", ["cat5_raster"], C)]
    mnn_values.update(values, cat5_raster=np.concatenate([t["deep"], left_hs], 1), head=t["head"])
    ncnn_layers = [("conv_1", "Convolution", ["data"], C), ("cat_4", "Concat", ["conv_1"], C),
                   ("conv_134", "Convolution", ["cat_4"], HALF), ("hswish_48", "HardSwish", ["conv_134"], HALF),
                   ("conv_135", "Convolution", ["cat_4"], HALF), ("hswish_49", "HardSwish", ["conv_135"], HALF),
                   ("conv_136", "Convolution", ["hswish_49"], HALF), ("cat_5", "Concat", ["conv_136", "hswish_48"], C),
                   ("conv_138", "Convolution", ["cat_5"], C)]
    ncnn_values = {"conv_1": t["stem"], "cat_4": t["stem"], "conv_134": t["left"], "hswish_48": left_hs,
                   "conv_135": t["right"], "hswish_49": right_hs, "conv_136": t["deep"],
                   "cat_5": mnn_values["cat5_raster"], "conv_138": t["head"]}
    return (write_dump(tmp_path / "mnn.h5", mnn_values, layers=mnn_layers, engine="mnn"),
            write_dump(tmp_path / "ncnn.h5", ncnn_values, layers=ncnn_layers))


def test_parallel_branches_in_opposite_orders_meet_their_own_twins(tmp_path):
    mnn_path, ncnn_path = _runs(tmp_path)
    for base_path, other_path in ((mnn_path, ncnn_path), (ncnn_path, mnn_path)):
        with DumpFile(base_path) as base, DumpFile(other_path) as other:
            error = value_error(_Run(base), _Run(other))
            matched = align_layers(base.layers, other.layers, NameRules(), error, fp32=True,
                                   naming=naming_of(base.attrs, other.attrs)).matched
            rows_b = {int(o): i for i, o in enumerate(base.layers["order"])}
            rows_o = {int(o): j for j, o in enumerate(other.layers["order"])}
            errors = {(k, o): error(rows_b[b], rows_o[oo]) for k, o, b, oo in
                      zip(matched["key"], matched["other_key"], matched["base_order"], matched["other_order"])}
            assert max(errors.values()) < 1e-5, errors  # no pair of different tensors
            pairs = dict(zip(matched["key"], matched["other_key"]))
            expected = {"bn_left:0": "conv_134:0", "bn_right:0": "conv_135:0", "l_hs:0": "hswish_48:0",
                        "r_hs:0": "hswish_49:0"}
            if base_path == ncnn_path:
                expected = {v: k for k, v in expected.items()}
            assert {k: pairs.get(k) for k in expected} == expected, pairs


def _matched(base_path, other_path) -> tuple[dict[str, str], dict]:
    """{base key: other key} and {(base key, other key): rel L2} of the structural alignment (fp32)."""
    with DumpFile(base_path) as base, DumpFile(other_path) as other:
        error = value_error(_Run(base), _Run(other))
        matched = align_layers(base.layers, other.layers, NameRules(), error, fp32=True,
                               naming=naming_of(base.attrs, other.attrs)).matched
        rows_b = {int(o): i for i, o in enumerate(base.layers["order"])}
        rows_o = {int(o): j for j, o in enumerate(other.layers["order"])}
        errors = {(k, o): error(rows_b[b], rows_o[oo]) for k, o, b, oo in
                  zip(matched["key"], matched["other_key"], matched["base_order"], matched["other_order"])}
        return dict(zip(matched["key"], matched["other_key"])), errors


def _se_runs(tmp_path):
    """A squeeze-excite gate (HardSigmoid decomposed two ways) and a Softmax head, as MNN and ncnn dump them."""
    rng = np.random.default_rng(3)
    x, feat = rng.normal(0, 2, (1, 8, 1, 1)).astype(np.float32), rng.normal(0, 1, HALF).astype(np.float32)
    gate = np.clip(np.float32(0.2) * x + np.float32(0.5), 0, 1)
    logits = rng.normal(0, 1, (1, 4)).astype(np.float32)
    prob = np.exp(logits) / np.exp(logits).sum()
    g, s1 = (1, 8, 1, 1), (1, 4)
    mnn = write_dump(tmp_path / "mnn_se.h5", {
        "feat": feat, "fc": x, "BinaryOp29": np.float32(0.2) * x, "BinaryOp31": np.float32(0.2) * x + np.float32(0.5),
        "hardsigmoid_0": gate, "tmp_0": feat * gate, "head": logits, "Softmax331": prob, "scale_0.tmp_1": prob},
        layers=[("feat", "Convolution", ["data"], HALF), ("fc", "Convolution", ["feat"], g),
                ("BinaryOp29", "BinaryOp", ["fc"], g), ("BinaryOp31", "BinaryOp", ["BinaryOp29"], g),
                ("hardsigmoid_0", "ReLU6", ["BinaryOp31"], g), ("tmp_0", "BinaryOp", ["feat", "hardsigmoid_0"], HALF),
                ("head", "InnerProduct", ["tmp_0"], s1), ("Softmax331", "Softmax", ["head"], s1),
                ("scale_0.tmp_1", "Output", ["Softmax331"], s1)], engine="mnn")
    ncnn = write_dump(tmp_path / "ncnn_se.h5", {
        "conv_1": feat, "linear_79": x, "mul_0": np.float32(1.2) * x, "hsigmoid_10": gate, "mul_1": feat * gate,
        "linear_96": logits, "softmax_53": prob},
        layers=[("conv_1", "Convolution", ["data"], HALF), ("linear_79", "InnerProduct", ["conv_1"], g),
                ("mul_0", "BinaryOp", ["linear_79"], g), ("hsigmoid_10", "HardSigmoid", ["mul_0"], g),
                ("mul_1", "BinaryOp", ["conv_1", "hsigmoid_10"], HALF), ("linear_96", "InnerProduct", ["mul_1"], s1),
                ("softmax_53", "Softmax", ["linear_96"], s1)])
    return mnn, ncnn


def test_inner_tensors_of_an_op_decomposed_two_ways_are_not_paired(tmp_path):
    mnn, ncnn = _se_runs(tmp_path)
    for base, other in ((mnn, ncnn), (ncnn, mnn)):
        pairs, errors = _matched(base, other)
        assert max(errors.values()) < 1e-5, errors  # 0.2 x is not 1.2 x
        gate = ("hardsigmoid_0:0", "hsigmoid_10:0") if base == mnn else ("hsigmoid_10:0", "hardsigmoid_0:0")
        assert pairs.get(gate[0]) == gate[1], pairs  # the gate itself still meets its partner


def test_model_output_copy_is_the_one_compared(tmp_path):
    mnn, ncnn = _se_runs(tmp_path)
    pairs, _errors = _matched(mnn, ncnn)
    assert pairs.get("scale_0.tmp_1:0") == "softmax_53:0", pairs
