"""Op isolation on ggml (`collect isolate` with a GGUF model): seed 004 told with ggml's own IM2COL and MUL_MAT,
judged against numpy's im2col of the input; a llama.cpp MUL_MAT node fed the reference's activations; the
nodes that compute nothing alone (views, KV cache stores) refused in one line. Real harness, real GGUF files."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.ggml_support import f16_weight_matmul_error, ggml_binary, ggml_samples, gguf_weights  # noqa: F401

FP16_MAX = 65504.0


def _cli(binary, *args: str, analyze: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAYERDIFF_GGML_BINARY": str(binary)}  # the cached build the fixture made
    module = "layerdiff.analyzer.cli.app" if analyze else "layerdiff.collector.cli"
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=env)


def _collect(binary, out, model, inp, precisions: str):
    proc = _cli(binary, "--device", "local", "--model", model, "--input", inp, "--backend", "cpu",
                "--precision", precisions, "-o", out, "--no-report")
    assert proc.returncode == 0, proc.stderr[-2000:]


def _isolate(binary, out, model, ref, precision: str, *layers: str) -> subprocess.CompletedProcess:
    return _cli(binary, "isolate", "--model", model, "--backend", "cpu", "--precision", precision, "--ref", ref,
                *[a for layer in layers for a in ("--layer", layer)], "-o", out)


def _findings(binary, folder) -> dict:
    proc = _cli(binary, folder, "-o", folder / "rep", "--json", analyze=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = next(r for r in json.loads(proc.stdout)["runs"] if r["run"] == "cpu/normal")
    return {f["layer"]: f for f in run["findings"] if f["kind"] == "isolation"}


def _numpy_im2col(x: np.ndarray) -> np.ndarray:
    """numpy's im2col of a [1, C, H, W] input for a 3x3 kernel, padding 1, in ggml's layout [H*W, C*9]."""
    xp = np.pad(x[0].astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    channels, size = x.shape[1], x.shape[-1]
    cols = np.stack([xp[:, ky:ky + size, kx:kx + size] for ky in range(3) for kx in range(3)], axis=1)  # C,9,H,W
    return cols.reshape(channels * 9, size * size).T


@pytest.fixture(scope="module")
def seed004(ggml_binary, ggml_samples, tmp_path_factory):
    """Per size: the folder with cpu/high + cpu/normal runs and IM2COL, MUL_MAT and the convolution built on the
    IM2COL (IM2COL .. the output, one sub-graph) isolated at cpu/normal."""
    folders = {}
    for size in ("small", "large"):
        out = tmp_path_factory.mktemp(f"seed004-{size}")
        _collect(ggml_binary, out, ggml_samples["conv2d"], ggml_samples[f"conv_{size}"], "high,normal")
        ref = out / f"ggml_cpu_high_conv2d_{size}.h5"
        proc = _isolate(ggml_binary, out, ggml_samples["conv2d"], ref, "normal", "conv.im2col:0", "conv.mul_mat:0",
                        "conv.im2col:0..conv.out:0")
        assert proc.returncode == 0, proc.stderr[-2000:]
        folders[size] = out
    return folders


def test_large_im2col_alone_overflows_exactly_where_numpy_says_f16_cannot_hold_it(seed004, ggml_samples, ggml_binary):
    from layerdiff.analyzer.formats.dumpfile import DumpFile

    cols = _numpy_im2col(np.load(ggml_samples["conv_large"]))
    with np.errstate(over="ignore"):
        overflow = int(np.isinf(cols.astype(np.float16)).sum())
    assert overflow > 1000
    [iso] = seed004["large"].glob("isolated_ggml_cpu_normal_*.h5")
    with DumpFile(iso) as dump:
        assert dump.attrs["mode"] == "isolate"
        assert list(dump.layers["key"]) == ["conv.im2col:0", "conv.mul_mat:0", "conv.out:0"]
        im2col = dump.tensor_by_key("conv.im2col:0").reshape(cols.shape)
        fed = dump.provenance["raw_header"]["isolation"]["fed"]
        ranges = dump.provenance["raw_header"]["isolation"]["ranges"]
        conv = dump.tensor_by_key("conv.out:0")
    with DumpFile(seed004["large"] / "ggml_cpu_normal_conv2d_large.h5") as normal:
        # the whole convolution alone, fed the reference's input: exactly the full normal run, NaN for NaN
        np.testing.assert_array_equal(conv, normal.tensor_by_key("conv.out:0"))
    assert ranges["conv.out"][0] == "conv.im2col" and "conv.mul_mat" in ranges["conv.out"]
    assert int((~np.isfinite(im2col)).sum()) == overflow
    finite = np.isfinite(im2col)
    np.testing.assert_array_equal(im2col[finite], cols[finite].astype(np.float16).astype(np.float32))
    # IM2COL reads the kernel (only its shape: the GGUF's f32 tensor) and the model input, as the run held it
    assert [(f["src"], f["from"]) for f in fed["conv.im2col"]] == [("conv.weight", "gguf"), ("x", "run")]
    # MUL_MAT reads the reference's (finite, f32) im2col as the f16 the graph gives it at normal
    src0 = fed["conv.mul_mat"][0]
    assert (src0["src"], src0["from"], src0["type"]) == ("conv.reshape", "inject", "f16")
    assert src0["overflow"] == overflow and src0["reference_peak"] == pytest.approx(np.abs(cols).max(), rel=1e-6)

    findings = _findings(ggml_binary, seed004["large"])
    im2col_finding = findings["conv.im2col:0"]
    assert im2col_finding["numbers"]["verdict"] == "kernel" and im2col_finding["severity"] == "fail"
    assert im2col_finding["numbers"]["isolated_n_nonfinite_mismatch"] == overflow
    assert "fp16 overflow" in im2col_finding["sentence"] and "kernel itself" in im2col_finding["sentence"]
    mul_mat = findings["conv.mul_mat:0"]
    assert mul_mat["numbers"]["verdict"] == "input_type" and mul_mat["numbers"]["fed_overflow"] == overflow
    assert "conv.reshape as f16" in mul_mat["sentence"] and "not this op" in mul_mat["sentence"]
    whole = findings["conv.out:0"]
    assert whole["numbers"]["verdict"] == "kernel" and whole["numbers"]["range"].startswith("conv.im2col .. conv.out")
    assert "sub-graph" in whole["sentence"] and "from conv.im2col on" in whole["sentence"]


def test_small_im2col_and_mul_mat_pass_alone(seed004, ggml_samples, ggml_binary):
    from layerdiff.analyzer.formats.dumpfile import DumpFile

    x = np.load(ggml_samples["conv_small"])
    cols = _numpy_im2col(x)
    assert np.abs(cols).max() < FP16_MAX
    w = gguf_weights(ggml_samples["conv2d"])["conv.weight"]
    [iso] = seed004["small"].glob("isolated_ggml_cpu_normal_*.h5")
    with DumpFile(iso) as dump:
        im2col = dump.tensor_by_key("conv.im2col:0").reshape(cols.shape)
        mul_mat = dump.tensor_by_key("conv.mul_mat:0")
        conv = dump.tensor_by_key("conv.out:0")
    np.testing.assert_array_equal(im2col, cols.astype(np.float16).astype(np.float32))
    # numpy: the f16 im2col times the kernel (ggml's CPU rounds the f32 kernel to f16 for the f16 dot product)
    kernel = w.reshape(w.shape[0], -1).astype(np.float16).astype(np.float64)  # [out, in*3*3]
    expected = kernel @ cols.astype(np.float16).astype(np.float64).T  # ggml: [out, H*W]
    assert np.abs(mul_mat.reshape(expected.shape) - expected).max() < 1e-5 * np.abs(expected).max()
    np.testing.assert_array_equal(conv.reshape(expected.shape), mul_mat.reshape(expected.shape))  # [out, H, W]
    findings = _findings(ggml_binary, seed004["small"])
    for key in ("conv.im2col:0", "conv.mul_mat:0", "conv.out:0"):
        assert findings[key]["numbers"]["verdict"] == "clean", findings[key]["sentence"]
        assert findings[key]["numbers"]["isolated_status"] == "pass"


@pytest.fixture(scope="module")
def llama_runs(ggml_binary, ggml_samples, tmp_path_factory):
    out = tmp_path_factory.mktemp("ggml-llama-iso")
    _collect(ggml_binary, out, ggml_samples["tinyllama"], ggml_samples["tokens"], "high,low")
    return out


def test_a_llama_mul_mat_alone_is_fed_the_reference_and_its_weight_from_the_model(llama_runs, ggml_binary, ggml_samples):
    """Qcur-0 (attn_norm-0 x blk.0.attn_q.weight, f16) and ffn_out-0 run alone at cpu/low: numpy from the GGUF's
    weight and the reference's activation reproduces Qcur-0; ffn_out-0, off in the full low run (q8_0 K/V cache
    upstream), is exact alone: the error comes from upstream."""
    from layerdiff.analyzer.formats.dumpfile import DumpFile

    ref = llama_runs / "ggml_cpu_high_tinyllama_tokens.h5"
    proc = _isolate(ggml_binary, llama_runs, ggml_samples["tinyllama"], ref, "low", "Qcur-0:0", "ffn_out-0:0",
                    "ffn_inp-0:0..ffn_swiglu-0:0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    [iso] = llama_runs.glob("isolated_ggml_cpu_low_*.h5")
    w = gguf_weights(ggml_samples["tinyllama"])
    with DumpFile(ref) as reference, DumpFile(iso) as dump:
        fed = dump.provenance["raw_header"]["isolation"]["fed"]
        assert [(f["src"], f["from"], f["type"]) for f in fed["Qcur-0"]] == [
            ("blk.0.attn_q.weight", "gguf", "f16"), ("attn_norm-0", "inject", "f32")]
        # the weight sits in the buffer type the run used (the CPU may repack f16 weights for its own kernel), so
        # the node alone runs the run's kernel: bit for bit the reference's Qcur-0 and ffn_out-0 (same inputs)
        assert fed["Qcur-0"][0]["buffer"] == fed["ffn_out-0"][0]["buffer"]
        for key in ("Qcur-0:0", "ffn_out-0:0"):
            np.testing.assert_array_equal(dump.tensor_by_key(key), reference.tensor_by_key(key))
        # layer 0's residual add, norm, gate/up and SwiGLU as one sub-graph, fed the reference's attention output:
        # the reference's own ffn_swiglu-0 again, bit for bit (the same kernels on the same inputs)
        ranged = dump.provenance["raw_header"]["isolation"]["ranges"]["ffn_swiglu-0"]
        assert ranged[0] == "ffn_inp-0" and {"ffn_norm-0", "ffn_gate-0", "ffn_up-0"} <= set(ranged)
        fed_range = {f["src"]: f["from"] for f in fed["ffn_swiglu-0"]}
        assert fed_range["attn_out-0"] == "inject" and fed_range["blk.0.ffn_gate.weight"] == "gguf"
        np.testing.assert_array_equal(dump.tensor_by_key("ffn_swiglu-0:0"), reference.tensor_by_key("ffn_swiglu-0:0"))
        # numpy: the reference's attn_norm-0 times the GGUF's weight, as one of ggml's two CPU kernels computes it
        norm = reference.tensor_by_key("attn_norm-0:0")
        assert f16_weight_matmul_error(norm, w["blk.0.attn_q.weight"], dump.tensor_by_key("Qcur-0:0")) < 1e-5
    proc = _cli(ggml_binary, llama_runs, "-o", llama_runs / "rep", "--json", analyze=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    low = next(r for r in json.loads(proc.stdout)["runs"] if r["run"] == "cpu/low")
    ffn = next(f for f in low["findings"] if f["kind"] == "isolation" and f["layer"] == "ffn_out-0:0")
    assert ffn["numbers"]["verdict"] == "upstream" and ffn["numbers"]["isolated_max_abs"] == 0


def test_nodes_that_compute_nothing_alone_are_refused_in_one_line(llama_runs, ggml_binary, ggml_samples, tmp_path):
    from layerdiff.analyzer.formats.dumpfile import DumpFile

    ref = llama_runs / "ggml_cpu_high_tinyllama_tokens.h5"
    with DumpFile(ref) as dump:
        types = dict(zip(dump.layers["key"], dump.layers["op_type"]))
    reshape = next(k for k, t in types.items() if t == "RESHAPE")
    store = next(k for k, t in types.items() if t == "SET_ROWS")
    through_cache = "Kcur-0:0..kq-0:0"  # a sub-graph with the K cache store inside: it writes into the cache
    assert {"Kcur-0:0", "kq-0:0"} <= set(types)
    for key, words in ((reshape, "is a view of another tensor"), (store, "writes into another tensor in place"),
                       (through_cache, "writes into another tensor in place")):
        proc = _isolate(ggml_binary, tmp_path / "o", ggml_samples["tinyllama"], ref, "high", key)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 1 and words in last and key.split("..")[0].removesuffix(":0") in last, proc.stderr[-1000:]
        assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "o").glob("*.h5"))


def test_the_harness_takes_inject_and_target_only_together(ggml_binary, ggml_samples, tmp_path):
    base = [str(ggml_binary), "--engine", "ggml", "--model", str(ggml_samples["conv2d"]),
            "--input", f"x={ggml_samples['conv_small']}", "--backend", "cpu", "--precision", "normal"]
    for extra in (["--inject", str(tmp_path)], ["--target", "conv.im2col"], ["--inject", str(tmp_path), "--replace", "x"]):
        proc = subprocess.run(base + ["--out", str(tmp_path / "o"), *extra], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("layerdiff-harness: "), proc.stderr
    missing = tmp_path / "inject"
    missing.mkdir()
    (missing / "manifest.jsonl").write_text('{"record": "header", "format": "layerdiff-raw"}\n')
    (missing / "tensors.bin").write_bytes(b"")
    proc = subprocess.run(base + ["--out", str(tmp_path / "o2"), "--inject", str(missing), "--target", "conv.mul_mat"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "conv.reshape is not in the inject dump" in proc.stderr, proc.stderr


def test_two_targets_ending_at_one_node_and_ranges_elsewhere_are_refused(ggml_binary, ggml_samples, tmp_path):
    from layerdiff.collector.inputs.modelfiles import resolve_model
    from layerdiff.collector.run.isolate import isolate
    from layerdiff.collector.transport.devices import LocalDevice
    from layerdiff.errors import UsageError
    from tests.conftest import MODELS

    proc = subprocess.run([str(ggml_binary), "--engine", "ggml", "--model", str(ggml_samples["conv2d"]),
                           "--input", f"x={ggml_samples['conv_small']}", "--out", str(tmp_path / "o"), "--inject",
                           str(tmp_path), "--target", "conv.out", "--target", "conv.im2col..conv.out"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "both end at node conv.out" in proc.stderr, proc.stderr
    with pytest.raises(UsageError, match="FIRST..LAST .* needs an engine that rebuilds graphs"):  # ncnn: layer by layer
        isolate(LocalDevice(), resolve_model(MODELS / "convnet.param"), "cpu", "low", tmp_path / "none.h5",
                ["stem/conv:0..block1/add:0"], tmp_path)


def test_failing_from_a_report_leaves_out_what_ggml_cannot_run_alone(llama_runs, ggml_binary, ggml_samples, tmp_path):
    """cpu/low of tinyllama first departs at the K cache store (SET_ROWS, in place): `--failing-from` says it
    leaves that out rather than failing on it; with nothing else flagged, one line asks for --layer."""
    proc = _cli(ggml_binary, llama_runs / "ggml_cpu_high_tinyllama_tokens.h5", llama_runs / "ggml_cpu_low_tinyllama_tokens.h5",
                "-o", tmp_path / "rep", analyze=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _cli(ggml_binary, "isolate", "--model", ggml_samples["tinyllama"], "--backend", "cpu", "--precision", "low",
                "--ref", llama_runs / "ggml_cpu_high_tinyllama_tokens.h5", "--failing-from", tmp_path / "rep",
                "-o", tmp_path / "iso")
    assert "leaving out cache_k_l0 (view):0 (SET_ROWS)" in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 1 and "no layer to isolate" in proc.stderr.strip().splitlines()[-1]
