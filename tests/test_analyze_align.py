"""Alignment edge cases: odd names, unmatched layers, shapes, name maps, rules, reference choice."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from layerdiff.analyzer.align.byname import NameRules, align_layers, load_name_map, parse_rename, shape_status
from layerdiff.analyzer.align.naming import naming_of
from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile, DumpWriter
from layerdiff.errors import LayerdiffError
from layerdiff.analyzer.runs.reference import plan_comparisons
from layerdiff.analyzer.runs.sources import open_runs
from tests.analyze_dumps import LAYERS, perturbed, reference_arrays, write_dump


def layers_of(path):
    with DumpFile(path) as dump:
        return dump.layers


def renamed(layers, mapping):
    return [(mapping.get(op, op), t, [mapping.get(i, i) for i in ins], s) for op, t, ins, s in layers]


def test_names_with_slash_colon_space_match_and_extras_are_listed(tmp_path):
    ref = reference_arrays()
    a = write_dump(tmp_path / "a.h5", ref)
    extra = LAYERS[:2] + [("relu1_raster_0", "Raster", ["relu1"], (1, 8, 6, 6))] + LAYERS[2:]
    arrays = {**ref, "relu1_raster_0": ref["relu1"]}
    del arrays["pool"]
    b = write_dump(tmp_path / "b.h5", arrays, layers=extra)
    result = align_layers(layers_of(a), layers_of(b), NameRules(), naming=naming_of({"engine": "mnn"}))
    assert list(result.matched["key"]) == ["conv1:0", "relu1:0", "block/conv 2:0", "add:1:0", "fc:0", "prob:0"]
    assert list(result.only_base["key"]) == ["pool:0"]
    assert list(result.only_other["key"]) == ["relu1_raster_0:0"]
    assert "raster" in result.only_other["why"].iloc[0]


def test_disjoint_and_empty_tables_do_not_raise():
    empty = pd.DataFrame({c: [] for c in ("key", "op", "op_type", "output_index", "order", "shape")})
    result = align_layers(empty, empty, NameRules())
    assert result.matched.empty and result.only_base.empty


def test_shape_status_and_squeeze():
    assert shape_status((1, 16), (1, 16)) == "same"
    assert shape_status((1, 16, 1, 1), (16,)) == "squeezed"
    assert shape_status((1, 8, 3, 3), (1, 8, 9)) == "mismatch"


def test_shape_mismatch_is_reported_per_layer_and_squeeze_is_compared(tmp_path):
    ref = reference_arrays()
    write_dump(tmp_path / "ref.h5", ref)
    run = perturbed(ref, 1e-4)
    run["fc"] = run["fc"].reshape(16)  # squeezable: compared
    run["pool"] = run["pool"].reshape(1, 8, 9)  # same size, different shape: not compared
    write_dump(tmp_path / "vk.h5", run, backend="vulkan", precision="low")
    analysis = analyze_paths([tmp_path])
    try:
        table = analysis.comparison.table.set_index("key")
        assert table.loc["pool:0", "status"] == "shape_mismatch"
        assert "[1, 8, 9]" in table.loc["pool:0", "reasons"]
        assert table.loc["fc:0", "shape_status"] == "squeezed" and table.loc["fc:0", "status"] == "pass"
    finally:
        analysis.close()


def test_name_map_csv_json_and_regex(tmp_path):
    (tmp_path / "map.csv").write_text("old,new\n# comment\nnet/conv_a,conv1\n")
    (tmp_path / "map.json").write_text(json.dumps({"net/conv_a": "conv1"}))
    (tmp_path / "pairs.json").write_text(json.dumps([["net/conv_a", "conv1"]]))
    for name in ("map.csv", "map.json", "pairs.json"):
        assert load_name_map(tmp_path / name) == {"net/conv_a": "conv1"}
    (tmp_path / "bad.csv").write_text("a,b,c\n")
    with pytest.raises(LayerdiffError, match="two columns"):
        load_name_map(tmp_path / "bad.csv")
    with pytest.raises(LayerdiffError, match="REGEX=REPLACEMENT"):
        parse_rename("no-equals-sign")

    ref = reference_arrays()
    a = write_dump(tmp_path / "a.h5", ref)
    other = renamed(LAYERS, {"conv1": "net/conv_a", "relu1": "net/relu1", "fc": "net/fc"})
    b = write_dump(tmp_path / "b.h5", {op: ref[orig] for (op, *_), (orig, *_) in zip(other, LAYERS)}, layers=other)
    rules = NameRules(name_map={"net/conv_a": "conv1"}, regex=[parse_rename("^net/=")])
    result = align_layers(layers_of(a), layers_of(b), rules)
    assert result.only_base.empty and result.only_other.empty
    assert dict(zip(result.matched["key"], result.matched["other_key"]))["conv1:0"] == "net/conv_a:0"


def test_builtin_rules_only_for_leftovers(tmp_path):
    ref = reference_arrays()
    a = write_dump(tmp_path / "a.h5", ref)
    other = renamed(LAYERS, {"fc": "fc__matmul_converted", "conv1": "/conv1"})
    b = write_dump(tmp_path / "b.h5", {op: ref[orig] for (op, *_), (orig, *_) in zip(other, LAYERS)}, layers=other)
    result = align_layers(layers_of(a), layers_of(b), NameRules(), naming=naming_of({"engine": "mnn"}))
    how = dict(zip(result.matched["key"], result.matched["match"]))
    assert how["fc:0"] == "builtin-rule" and how["conv1:0"] == "builtin-rule" and how["prob:0"] == "exact"
    assert align_layers(layers_of(a), layers_of(b), NameRules(builtin=False)).only_base["key"].tolist() == [
        "conv1:0", "fc:0"]


def test_multi_output_ops_keep_their_index(tmp_path):
    rng = np.random.default_rng(0)
    path_a, path_b = tmp_path / "a.h5", tmp_path / "b.h5"
    for path in (path_a, path_b):
        with DumpWriter(path, {}) as w:
            for i in range(2):
                w.add_tensor({"order": i, "op": "split", "op_type": "Slice", "output_index": i, "name": f"s{i}",
                              "inputs": ["data"]}, rng.normal(size=(2, 3)).astype(np.float32))
    result = align_layers(layers_of(path_a), layers_of(path_b), NameRules())
    assert list(result.matched["key"]) == ["split:0", "split:1"]


def test_reference_choice(tmp_path):
    ref = reference_arrays()
    write_dump(tmp_path / "1_vk.h5", ref, backend="vulkan", precision="low")
    write_dump(tmp_path / "2_cpu.h5", ref, backend="cpu", precision="high")
    sources = open_runs([tmp_path])
    try:
        plan = plan_comparisons(sources.runs)
        assert plan.reference.path.name == "2_cpu.h5" and "cpu" in plan.reason
        plan = plan_comparisons(sources.runs, tmp_path / "1_vk.h5")
        assert plan.reference.path.name == "1_vk.h5" and "--ref" in plan.reason
        with pytest.raises(LayerdiffError, match="not among the dumps"):
            plan_comparisons(sources.runs, tmp_path / "missing.h5")
    finally:
        sources.close()
    write_dump(tmp_path / "2_cpu.h5", ref, backend="opencl", precision="normal")
    sources = open_runs([tmp_path])
    try:
        plan = plan_comparisons(sources.runs)
        assert plan.reference.path.name == "1_vk.h5" and "first run" in plan.reason
    finally:
        sources.close()


def test_onnx_runtime_names_align_with_mnn_dump_names_without_a_map():
    """ORT names tensors `/blk/conv/Conv_output_0`; MNN's dump files say `_blk_conv_Conv_output_0_0`,
    and a second ONNX output `/tk/TopK_output_1` is output 1 of MNN op `_tk_TopK_output_0`."""
    ort = pd.DataFrame({"op": ["/blk/conv/Conv_output_0", "/tk/TopK_output_0", "/tk/TopK_output_1"],
                        "output_index": [0, 0, 0], "order": [0, 1, 2], "op_type": ["", "", ""],
                        "shape": ["[4]", "[2]", "[2]"]})
    ort["key"] = [f"{op}:0" for op in ort["op"]]
    mnn = pd.DataFrame({"op": ["_blk_conv_Conv_output_0", "_tk_TopK_output_0", "_tk_TopK_output_0",
                               "_blk_conv_Conv_output_0_raster_0"],
                        "output_index": [0, 0, 1, 0], "order": [0, 1, 2, 3], "op_type": ["Convolution", "TopKV2", "TopKV2", "Raster"],
                        "shape": ["[4]", "[2]", "[2]", "[4]"]})
    mnn["key"] = [f"{op}:{i}" for op, i in zip(mnn["op"], mnn["output_index"])]
    alignment = align_layers(ort, mnn, NameRules(), naming=naming_of({"engine": "onnxruntime"}, {"engine": "mnn"}))
    pairs = dict(zip(alignment.matched["key"], alignment.matched["other_key"]))
    assert pairs == {"/blk/conv/Conv_output_0:0": "_blk_conv_Conv_output_0:0",
                     "/tk/TopK_output_0:0": "_tk_TopK_output_0:0", "/tk/TopK_output_1:0": "_tk_TopK_output_0:1"}
    assert list(alignment.only_other["key"]) == ["_blk_conv_Conv_output_0_raster_0:0"]
