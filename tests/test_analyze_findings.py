"""Each finding kind, on real HDF5 dumps with one known defect injected at a known layer."""
from __future__ import annotations

import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from tests.analyze_dumps import DOWNSTREAM, perturbed, reference_arrays, write_dump

FP16_LIKE = 1e-4  # relative noise of a healthy low-precision run: every layer passes


def kinds(analysis, kind, run=None):
    return [f for f in analysis.findings if f.kind == kind and (run is None or f.run == run)]


def broken_from(ref, op, rel=0.5, seed=3):
    """fp16-like noise everywhere plus a large error born at `op` and carried downstream."""
    run = perturbed(ref, FP16_LIKE)
    for layer in DOWNSTREAM[op]:
        run[layer] = perturbed(run, rel, seed=seed, ops=[layer])[layer]
    return run


@pytest.fixture
def ref_dump(tmp_path):
    return write_dump(tmp_path / "ref.h5", reference_arrays())


def test_failure_source_and_first_divergence(tmp_path, ref_dump):
    write_dump(tmp_path / "vk.h5", broken_from(reference_arrays(), "block/conv 2"), backend="vulkan", precision="low")
    analysis = analyze_paths([tmp_path])
    try:
        (source,) = kinds(analysis, "failure_source")
        assert source.layer == "block/conv 2:0" and source.op_type == "Convolution" and source.run == "vulkan/low"
        assert "block/conv 2:0" in source.sentence and "vulkan/low" in source.sentence
        assert "this op breaks at this setting" in source.sentence and source.numbers["not_compared_between"] == []
        (first,) = kinds(analysis, "first_divergence")
        assert first.layer == "block/conv 2:0" and first.numbers["position"] == 2
        row = analysis.summary.set_index("run").loc["vulkan/low"]
        assert row["verdict"] == "fail" and row["n_fail"] == 5 and row["n_pass"] == 2
        assert analysis.comparison.plan.reference.label == "cpu/high"
        assert analysis.problems == []
    finally:
        analysis.close()


def test_failure_source_names_the_layers_between_that_were_not_compared(tmp_path, ref_dump):
    """The run has no `pool` (fused away, converted into other ops): its error is born there and `fc`
    is the first compared layer that fails. Blaming `fc` alone would be a guess: the sentence names
    the stretch (vad_lstm's ncnn model vs ONNX on an H200: a Reshape was said to break)."""
    run = broken_from(reference_arrays(), "pool")
    del run["pool"]
    write_dump(tmp_path / "vk.h5", run, backend="vulkan", precision="low")
    analysis = analyze_paths([tmp_path])
    try:
        (source,) = kinds(analysis, "failure_source")
        assert source.layer == "fc:0" and source.numbers["not_compared_between"] == ["pool:0"]
        assert "pool:0 (Pooling)" in source.sentence and "not necessarily here" in source.sentence
        assert "this op breaks" not in source.sentence
    finally:
        analysis.close()


@pytest.mark.parametrize("observed, second, varying, said", [
    (0.0, 0.0, 0, None),
    (0.0, 1.7, 0, "two plain runs of the same input differ"),
    (0.0, 0.0, 2, "two runs of the observed graph on the same input differ at 2 of 7"),
])
def test_observation_check_says_when_a_plain_run_disagrees(tmp_path, ref_dump, observed, second, varying, said):
    """The GPU engine's own check (options.plain_run in the header of older LiteRT GPU dumps: the model run as
    an app runs it, twice, against the observed run's outputs) says when two plain runs, or two calibration
    runs, disagree beyond the warn threshold."""
    def diff(rel):
        return {"compared": True, "rel_l2": rel, "max_abs": rel * 10}

    check = {"runs": 2, "outputs": [{"name": "prob", "vs_observed": diff(observed), "vs_second_plain_run": diff(second)}]}
    calibration = {"runs_compared": 2, "tensors_compared": 7, "tensors_differing": varying,
                   "first_differing": [{"key": "pool:0", "op_type": "Pooling", "n_differing": 3, "max_abs": 0.5}][:varying]}
    write_dump(tmp_path / "gpu.h5", perturbed(reference_arrays(), FP16_LIKE), backend="gpu", precision="high",
               extra_attrs={"provenance": {"raw_header": {"options": {"plain_run": check, "run_to_run": calibration}}}})
    analysis = analyze_paths([tmp_path])
    try:
        found = [f for f in kinds(analysis, "nondeterminism") if f.sentence.startswith("Observation check")]
        if said is None:
            assert found == []
        else:
            (finding,) = found
            assert said in finding.sentence and finding.run == "gpu/high"
            assert finding.layer == ("pool:0" if varying else "prob")
    finally:
        analysis.close()


@pytest.mark.parametrize("observed, severity", [(0.0, None), (1e-7, "warn"), (0.4, "fail")])
def test_a_plain_run_that_disagrees_is_an_observation_changed_finding(tmp_path, ref_dump, observed, severity):
    """The footer's plain_run (every engine: the model run as an app runs it, against the observed run's outputs):
    any output not identical is `observation_changed`, failing past --warn-rel-l2, naming what the engine does
    differently when observed (the record's `observing`, the engine's own words)."""
    diff = {"compared": True, "identical": observed == 0.0, "rel_l2": observed, "max_abs": observed * 10}
    same = {"compared": True, "identical": True, "rel_l2": 0.0, "max_abs": 0.0}
    check = {"runs": 2, "observing": "fusion is off while observed", "identical": observed == 0.0,
             "outputs": [{"name": "prob", "key": "prob:0", "vs_observed": diff, "vs_second_plain_run": same}]}
    write_dump(tmp_path / "run.h5", perturbed(reference_arrays(), FP16_LIKE), backend="cpu", precision="low",
               extra_attrs={"provenance": {"raw_footer": {"plain_run": check}}})
    analysis = analyze_paths([tmp_path])
    try:
        found = kinds(analysis, "observation_changed")
        if severity is None:
            assert found == []
        else:
            (finding,) = found
            assert finding.severity == severity and finding.layer == "prob:0" and finding.run == "cpu/low"
            assert "Observing changed the result" in finding.sentence and "fusion is off while observed" in finding.sentence
            assert "two plain runs agree bit for bit" in finding.sentence
    finally:
        analysis.close()


def test_a_model_output_of_another_shape_fails_the_run(tmp_path, ref_dump):
    """ncnn's Vulkan run of Silero VAD (pnnx) gave its output as [1, 1] where the CPU run gives [1, 128]:
    that output was left out of the verdict, which read WARN from the other outputs' small errors."""
    run = perturbed(reference_arrays(), FP16_LIKE)
    run["prob"] = run["prob"][:, :8].copy()
    write_dump(tmp_path / "vk.h5", run, backend="vulkan", precision="high")
    analysis = analyze_paths([tmp_path])
    try:
        row = analysis.summary.set_index("run").loc["vulkan/high"]
        assert row["verdict"] == "fail"
        assert "model output prob:0 has shape [1, 8] in the run and [1, 16]" in row["verdict_reason"]
    finally:
        analysis.close()


def test_nan_origin_names_the_layer_with_clean_inputs(tmp_path, ref_dump):
    run = perturbed(reference_arrays(), FP16_LIKE)
    run["pool"][0, 3, 1, 1] = np.nan
    run["fc"][:] = np.nan
    run["prob"][:] = np.nan
    write_dump(tmp_path / "cl.h5", run, backend="opencl", precision="low")
    analysis = analyze_paths([tmp_path])
    try:
        (origin,) = kinds(analysis, "nan_origin")
        assert origin.layer == "pool:0" and origin.op_type == "Pooling" and origin.numbers["count"] == 1
        assert not kinds(analysis, "inf_origin")
        (source,) = kinds(analysis, "failure_source")
        assert source.layer == "pool:0"
        rows = analysis.comparison.table.set_index("key")
        assert rows.loc["prob:0", "n_nan_new"] == 16 and rows.loc["prob:0", "top1"] == 0.0
    finally:
        analysis.close()


def test_inf_origin(tmp_path, ref_dump):
    run = perturbed(reference_arrays(), FP16_LIKE)
    run["add:1"][0, 0, 0, :2] = np.inf
    write_dump(tmp_path / "vk.h5", run, backend="vulkan", precision="low")
    analysis = analyze_paths([tmp_path])
    try:
        (origin,) = kinds(analysis, "inf_origin")
        assert origin.layer == "add:1:0" and origin.numbers["count"] == 2
    finally:
        analysis.close()


def test_fp16_saturation_where_reference_is_larger(tmp_path):
    ref = reference_arrays()
    ref["conv1"][0, 0, 0, :3] = [1.0e5, -2.0e5, 7.0e4]
    write_dump(tmp_path / "ref.h5", ref)
    run = perturbed(ref, FP16_LIKE)
    run["conv1"][0, 0, 0, :3] = [65504.0, -65504.0, 65504.0]
    write_dump(tmp_path / "vk.h5", run, backend="vulkan", precision="low")
    analysis = analyze_paths([tmp_path])
    try:
        (sat,) = kinds(analysis, "saturation")
        assert sat.layer == "conv1:0" and sat.numbers["n_saturated"] == 3
        assert sat.numbers["reference_peak"] == pytest.approx(2.0e5)
        risk = kinds(analysis, "fp16_risk", run="cpu/high")
        assert risk and risk[0].layer == "conv1:0" and risk[0].numbers["n_overflow"] == 3
    finally:
        analysis.close()


def test_zero_collapse_origin_and_underflow_risk(tmp_path):
    ref = reference_arrays()
    ref["relu1"] = (ref["relu1"] * np.float32(1e-5)).astype(np.float32)  # values in fp16's underflow range
    write_dump(tmp_path / "ref.h5", ref)
    run = perturbed(ref, FP16_LIKE)
    for op in ("relu1", "block/conv 2"):
        run[op][:] = 0.0
    write_dump(tmp_path / "cpu_low.h5", run, backend="cpu", precision="low")
    analysis = analyze_paths([tmp_path])
    try:
        (origin,) = kinds(analysis, "zero_collapse_origin")
        assert origin.layer == "relu1:0" and origin.numbers["zero_collapse"] == 1.0
        under = [f for f in kinds(analysis, "fp16_risk") if "underflow" in f.sentence]
        assert under and under[0].layer == "relu1:0"
    finally:
        analysis.close()


def test_error_growth_names_the_amplifier(tmp_path, ref_dump):
    ref = reference_arrays()
    run = perturbed(ref, FP16_LIKE)
    run["conv1"] = perturbed(ref, 0.15, seed=4, ops=["conv1"])["conv1"]  # the failure source
    run["relu1"] = perturbed(ref, 0.15, seed=5, ops=["relu1"])["relu1"]  # inherits it
    for op in DOWNSTREAM["block/conv 2"]:
        run[op] = perturbed(ref, 3.0, seed=6, ops=[op])[op]  # block/conv 2 multiplies it ~20x
    write_dump(tmp_path / "vk.h5", run, backend="vulkan", precision="low")
    analysis = analyze_paths([tmp_path])
    try:
        table = analysis.comparison.table.set_index("key")
        assert table.loc["block/conv 2:0", "growth"] == pytest.approx(
            table.loc["block/conv 2:0", "rel_l2"] / table.loc["relu1:0", "rel_l2"])
        assert [f.layer for f in kinds(analysis, "failure_source")] == ["conv1:0"]
        (growth,) = kinds(analysis, "error_growth")
        assert growth.layer == "block/conv 2:0" and growth.numbers["factor"] > 10
        assert f"{growth.numbers['factor']:.0f}x" in growth.sentence
    finally:
        analysis.close()


def test_nondeterminism_between_repeats(tmp_path, ref_dump):
    ref = reference_arrays()
    a = perturbed(ref, FP16_LIKE)
    b = {k: v.copy() for k, v in a.items()}
    b["fc"][0, 3] += np.float32(0.25)
    b["prob"][0, 5] += np.float32(0.01)
    write_dump(tmp_path / "vk_r0.h5", a, backend="vulkan", precision="low", repeat=0)
    write_dump(tmp_path / "vk_r1.h5", b, backend="vulkan", precision="low", repeat=1)
    analysis = analyze_paths([tmp_path])
    try:
        (nd,) = kinds(analysis, "nondeterminism")
        assert nd.layer == "fc:0" and nd.numbers["layers_differing"] == 2
        assert nd.numbers["max_abs"] == pytest.approx(0.25, rel=1e-3)
    finally:
        analysis.close()


def test_input_dependence_across_inputs(tmp_path):
    for i, name in enumerate(["cat", "dog", "owl"]):
        ref = reference_arrays(seed=10 + i)
        attrs = {"input_label": name, "input_sha256": f"{i:064x}"}
        write_dump(tmp_path / f"cpu_{name}.h5", ref, **attrs)
        run = broken_from(ref, "pool") if name == "dog" else perturbed(ref, FP16_LIKE)
        write_dump(tmp_path / f"vk_{name}.h5", run, backend="vulkan", precision="low", **attrs)
    analysis = analyze_paths([tmp_path])
    try:
        (dep,) = kinds(analysis, "input_dependence")
        assert dep.numbers["failing_inputs"] == ["dog"] and dep.layer == "pool:0"
        plan = analysis.comparison.plan
        assert len(plan.references) == 3 and len(plan.pairs) == 3
        assert all(p.base.attrs["input_label"] == p.other.attrs["input_label"] for p in plan.pairs)
    finally:
        analysis.close()


def test_incomplete_run_and_backend_fallback(tmp_path, ref_dump):
    ref = reference_arrays()
    partial = {k: v for k, v in perturbed(ref, FP16_LIKE).items() if k in ("conv1", "relu1", "block/conv 2")}
    write_dump(tmp_path / "cl.h5", partial, backend="opencl", precision="low", complete=False, exit_status=-11,
               backend_actual="cpu")
    analysis = analyze_paths([tmp_path])
    try:
        (inc,) = kinds(analysis, "incomplete_run")
        assert inc.layer == "block/conv 2:0" and "-11" in inc.sentence
        (fallback,) = kinds(analysis, "backend_fallback")
        assert "opencl" in fallback.sentence and "cpu" in fallback.sentence
        alignment = analysis.comparison.alignments[0]
        assert list(alignment.only_base["key"]) == ["add:1:0", "pool:0", "fc:0", "prob:0"]
    finally:
        analysis.close()


# llama.cpp's node names (two transformer blocks, views decorated as ggml decorates them)
LLAMA_LAYERS = [
    ("embd", "GET_ROWS", [], (1, 4, 8)),
    ("attn_norm-0", "RMS_NORM", ["embd"], (1, 4, 8)),
    ("Qcur-0", "MUL_MAT", ["attn_norm-0"], (1, 4, 8)),
    ("Qcur-0 (view)", "VIEW", ["Qcur-0"], (1, 4, 8)),
    ("cache_k_l0 (view)", "SET_ROWS", ["Qcur-0 (view)"], (1, 4, 8)),
    ("ffn_out-0", "MUL_MAT", ["cache_k_l0 (view)"], (1, 4, 8)),
    ("attn_norm-1", "RMS_NORM", ["ffn_out-0"], (1, 4, 8)),
    ("Qcur-1", "MUL_MAT", ["attn_norm-1"], (1, 4, 8)),
    ("ffn_out-1", "MUL_MAT", ["Qcur-1"], (1, 4, 8)),
    ("result_output", "MUL_MAT", ["ffn_out-1"], (1, 4, 16)),
]


def test_layer_blocks_only_for_graphs_named_block_by_block():
    from layerdiff.analyzer.align.blocks import layer_blocks

    keys = [f"{op}:0" for op, *_ in LLAMA_LAYERS] + ["Qcur-0#1:0", "cache_v_l1 (reshaped) (view)#1:0"]
    blocks = layer_blocks(keys)
    assert blocks == {"attn_norm-0:0": 0, "Qcur-0:0": 0, "Qcur-0 (view):0": 0, "cache_k_l0 (view):0": 0,
                      "ffn_out-0:0": 0, "attn_norm-1:0": 1, "Qcur-1:0": 1, "ffn_out-1:0": 1, "Qcur-0#1:0": 0,
                      "cache_v_l1 (reshaped) (view)#1:0": 1}
    assert layer_blocks(["conv1:0", "relu1:0", "block/conv 2:0", "input-1:0", "fc:0"]) == {}  # one `-N` of five


def test_findings_and_layer_table_name_the_llama_block(tmp_path):
    """A divergence born at Qcur-1 is said to be in block 1; the table gets a `block` column after `#`;
    a graph not named that way (the ncnn-named one) gets neither."""
    from layerdiff.analyzer.report.tables import layer_view

    rng = np.random.default_rng(0)
    ref = {op: rng.normal(0, 1, size=shape).astype(np.float32) for op, _, _, shape in LLAMA_LAYERS}
    run = perturbed(ref, FP16_LIKE, ops=list(ref))
    for op in ("Qcur-1", "ffn_out-1", "result_output"):
        run[op] = perturbed(run, 0.5, seed=3, ops=[op])[op]
    write_dump(tmp_path / "cpu.h5", ref, layers=LLAMA_LAYERS, engine="ggml")
    write_dump(tmp_path / "vk.h5", run, layers=LLAMA_LAYERS, engine="ggml", backend="vulkan", precision="low")
    analysis = analyze_paths([tmp_path])
    try:
        (first,) = kinds(analysis, "first_divergence")
        assert first.layer == "Qcur-1:0" and first.numbers["block"] == 1
        assert first.sentence.startswith("First divergence in vulkan/low in block 1: layer Qcur-1:0 (MUL_MAT)")
        (source,) = kinds(analysis, "failure_source")
        assert "Qcur-1:0 (MUL_MAT) in block 1 fails" in source.sentence and source.numbers["block"] == 1
        table = analysis.comparison.table
        blocks = dict(zip(table["key"], table["block"]))
        assert blocks["cache_k_l0 (view):0"] == 0 and blocks["ffn_out-1:0"] == 1 and np.isnan(blocks["embd:0"])
        assert layer_view(table)[:4] == ["run", "position", "block", "key"]
    finally:
        analysis.close()
    other = tmp_path / "ncnn"
    other.mkdir()
    write_dump(other / "ref.h5", reference_arrays())
    write_dump(other / "vk.h5", broken_from(reference_arrays(), "block/conv 2"), backend="vulkan", precision="low")
    analysis = analyze_paths([other])
    try:
        assert "block" not in analysis.comparison.table and "block" not in layer_view(analysis.comparison.table)
        assert " in block" not in " ".join(f.sentence for f in analysis.findings)
    finally:
        analysis.close()


def test_llama_cpp_input_layer_on_the_cpu_is_no_fallback_but_other_cpu_nodes_are(tmp_path):
    """A ggml Vulkan run records vulkan+cpu because llama.cpp always computes its input layer (embd) on the
    CPU: labelled `vulkan`, said as an info, no backend_fallback. With any other node in CPU memory it
    stays a fallback (`vulkan->vulkan+cpu`, backend_fallback warn)."""
    rng = np.random.default_rng(0)
    ref = {op: rng.normal(0, 1, size=shape).astype(np.float32) for op, _, _, shape in LLAMA_LAYERS}
    on_gpu = {op: "ggml/f32@Vulkan0" for op, *_ in LLAMA_LAYERS}
    cases = {"design": {**on_gpu, "embd": "ggml/f32@Vulkan_Host"},
             "fallback": {**on_gpu, "embd": "ggml/f32@Vulkan_Host", "Qcur-1": "ggml/f32@CPU"}}
    expected = {"design": "vulkan/low", "fallback": "vulkan->vulkan+cpu/low"}
    for case, layouts in cases.items():
        folder = tmp_path / case
        folder.mkdir()
        write_dump(folder / "cpu.h5", ref, layers=LLAMA_LAYERS, engine="ggml", layouts={o: "ggml/f32@CPU" for o in ref})
        write_dump(folder / "vk.h5", perturbed(ref, FP16_LIKE, ops=list(ref)), layers=LLAMA_LAYERS, engine="ggml",
                   backend="vulkan", precision="low", backend_actual="vulkan+cpu", layouts=layouts)
        analysis = analyze_paths([folder])
        try:
            assert set(analysis.summary["run"]) == {"cpu/high", expected[case]}
            designed, fallback = kinds(analysis, "cpu_by_design"), kinds(analysis, "backend_fallback")
            if case == "design":
                (info,) = designed
                assert not fallback and info.severity == "info" and info.numbers["cpu_nodes"] == ["embd:0"]
                assert "Not a fallback" in info.sentence and "Vulkan_Host" in info.sentence
                assert "9 of 10 nodes ran in vulkan memory" in info.sentence
            else:
                assert not designed and len(fallback) == 1 and fallback[0].severity == "warn"
        finally:
            analysis.close()
