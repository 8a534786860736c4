"""`collect repro` on ggml: seed 004's IM2COL (and its MUL_MAT) as a bundle whose repro.cpp, built by the bundle's
own CMakeLists against the ggml source tree the harness is built from, in a fresh directory, rebuilds the one op
with ggml's public API: the f16 IM2COL overflows exactly where numpy says f16 cannot hold the values, and the
reference configuration computes the full graph's reference tensor bit for bit. `--check` runs that program."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from tests.ggml_support import ggml_binary, ggml_samples, gguf_weights  # noqa: F401
from tests.test_collect_cli import collect
from tests.test_ggml import _conv_reference

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="the bundle's repro.cpp is built with CMake")


@pytest.fixture(scope="module")
def conv_runs(ggml_binary, ggml_samples, tmp_path_factory):
    """Fully dumped cpu/high (reference) and cpu/low (failing) runs of the convolution graph on the large input."""
    out = tmp_path_factory.mktemp("ggml-repro") / "runs"
    done = collect("--model", ggml_samples["conv2d"], "--backend", "cpu", "--precision", "high", "--precision", "low",
                   "--input", f"x={ggml_samples['conv_large']}", "-o", out, "--no-report")
    assert done.returncode == 0, done.stderr
    return out / "ggml_cpu_low_conv2d_large.h5", out / "ggml_cpu_high_conv2d_large.h5"


def _bundle(samples, runs, layer, out):
    run, ref = runs
    return collect("repro", "--model", samples["conv2d"], "--run", run, "--ref", ref, "--layer", layer, "-o", out)


def _build_and_run(bundle, tmp_path) -> dict:
    """The maintainer's steps in a fresh directory: cmake -DGGML_DIR=..., build, run from inside the folder."""
    from layerdiff.collector.engines.ggml.build import source_dir

    fresh = tmp_path / "fresh"
    shutil.copytree(bundle, fresh)
    for step in (["cmake", "-S", str(fresh), "-B", str(fresh / "build"), f"-DGGML_DIR={source_dir() / 'ggml'}",
                  "-DCMAKE_BUILD_TYPE=Release"],
                 ["cmake", "--build", str(fresh / "build"), "--target", "repro", "-j", "2"]):
        done = subprocess.run(step, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    text = subprocess.run([str(fresh / "build" / "repro")], capture_output=True, text=True, cwd=fresh, timeout=300)
    assert text.returncode == 0, text.stderr
    done = subprocess.run([str(fresh / "build" / "repro"), "--json"], capture_output=True, text=True, cwd=fresh,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return {"fresh": fresh, "text": text.stdout, "json": json.loads(done.stdout)}


@pytest.fixture(scope="module")
def im2col_bundle(ggml_samples, conv_runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("ggml-bundle") / "im2col"
    done = _bundle(ggml_samples, conv_runs, "conv.im2col", out)
    assert done.returncode == 0, done.stderr
    return out, done, _build_and_run(out, tmp_path_factory.mktemp("ggml-build"))


def test_the_im2col_bundle_holds_the_node_its_tensors_and_the_recorded_error(ggml_samples, conv_runs, im2col_bundle):
    bundle, done, _ = im2col_bundle
    assert (bundle.parent / "im2col.zip").is_file()
    assert "repro: conv.im2col ->" in done.stderr and "Traceback" not in done.stderr
    graph = json.loads((bundle / "model" / "graph.json").read_text())
    assert graph["op"] == "IM2COL" and graph["params"] == {"s0": 1, "s1": 1, "p0": 1, "p1": 1, "d0": 1, "d1": 1,
                                                           "is_2D": True}
    assert graph["output"]["types"] == {"run": "f16", "reference": "f32"}
    assert [(s["name"], s["origin"], s["ne"]) for s in graph["sources"]] == [("conv.weight", "weight", [3, 3, 8, 16]),
                                                                             ("x", "input", [32, 32, 8, 1])]
    x = np.load(ggml_samples["conv_large"])
    np.testing.assert_array_equal(np.load(bundle / "tensors" / "input1_x.npy"), x)
    np.testing.assert_array_equal(np.load(bundle / "tensors" / "input0_conv.weight.npy"),
                                  gguf_weights(ggml_samples["conv2d"])["conv.weight"])
    raw = np.fromfile(bundle / "tensors" / "input1_x.bin", dtype="<f4").reshape(x.shape)
    np.testing.assert_array_equal(raw, x)
    run, ref = conv_runs
    with DumpFile(ref) as dump:
        np.testing.assert_array_equal(np.load(bundle / "tensors" / "reference_output0_conv.im2col.npy"),
                                      dump.tensor_by_key("conv.im2col:0"))
    _, overflow = _conv_reference(x, gguf_weights(ggml_samples["conv2d"])["conv.weight"])
    spec = json.loads((bundle / "repro.json").read_text())
    recorded = spec["outputs"][0]["recorded_error"]
    assert recorded["pos_inf"] + recorded["neg_inf"] == overflow > 1000 and recorded["rel_l2"] is None
    assert spec["configs"]["run"]["precision"] == "low" and spec["configs"]["reference"]["precision"] == "high"
    readme = (bundle / "README.md").read_text()
    assert "-DGGML_DIR=" in readme and "conv.im2col" in readme and "ggml 0.25.3" in readme
    assert not any(p.suffix in (".c", ".h") for p in bundle.rglob("*"))  # no ggml source shipped


def test_the_runner_built_fresh_reproduces_the_overflow_and_the_reference_bit_for_bit(ggml_samples, im2col_bundle):
    _, _, built = im2col_bundle
    x = np.load(ggml_samples["conv_large"])
    _, overflow = _conv_reference(x, gguf_weights(ggml_samples["conv2d"])["conv.weight"])
    run = built["json"]["configs"]["run"]
    error = run["outputs"]["conv.im2col"]
    assert run["ran"] and error["reproduces"] and error["pos_inf"] + error["neg_inf"] == overflow
    assert error["rel_l2"] is None and not error["bit_identical"]
    reference = built["json"]["configs"]["reference"]["outputs"]["conv.im2col"]
    assert reference["bit_identical"] and reference["rel_l2"] == 0 and reference["nan"] == 0
    assert "=> REPRODUCES" in built["text"] and "bit-identical to reference: yes" in built["text"]
    # the run's output is the failing run's own tensor again, value for value
    fresh = built["fresh"]
    assert "node conv.im2col  ggml 0.25.3" in built["text"].splitlines()[0]
    assert (fresh / "build" / "repro").is_file()


def test_check_runs_the_bundles_program_and_says_it_still_reproduces(im2col_bundle):
    _, _, built = im2col_bundle
    done = collect("repro", "--check", built["fresh"])  # its build/ is reused: CMake only checks it is up to date
    assert done.returncode == 0, done.stderr
    assert "repro: still reproduces" in done.stderr
    assert "repro: reference configuration reproduces the reference tensor bit for bit" in done.stderr


def test_the_mul_mat_bundle_reads_the_columns_and_kernel_in_each_configurations_types(ggml_samples, conv_runs,
                                                                                       tmp_path):
    done = _bundle(ggml_samples, conv_runs, "conv.mul_mat", tmp_path / "mm")
    assert done.returncode == 0, done.stderr
    graph = json.loads((tmp_path / "mm" / "model" / "graph.json").read_text())
    assert graph["op"] == "MUL_MAT" and graph["output"]["types"] == {"run": "f32", "reference": "f32"}
    assert [(s["name"], s["origin"], s["types"]) for s in graph["sources"]] == [
        ("conv.reshape", "node", {"reference": "f32", "run": "f16"}),
        ("conv.reshape#1", "node", {"reference": "f32", "run": "f16"})]
    assert "ggml_mul_mat(ctx, s[0], s[1])" in (tmp_path / "mm" / "repro.cpp").read_text()


def test_unsupported_nodes_and_ranges_are_one_line(ggml_samples, conv_runs, tmp_path):
    for layer, words in (("conv.out", "is a CONT node: a ggml bundle rebuilds IM2COL and MUL_MAT nodes"),
                         ("conv.im2col..conv.mul_mat", "a ggml bundle holds one op"),
                         ("conv.nothing", "no node 'conv.nothing'")):
        done = _bundle(ggml_samples, conv_runs, layer, tmp_path / "b")
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], lines
        assert not (tmp_path / "b").exists()


def test_a_language_model_mul_mat_reads_its_weight_from_the_gguf(ggml_binary, ggml_samples, tmp_path):
    """tinyllama's Qcur-0: the activations from the reference dump, the f16 weight from the GGUF, value for value."""
    runs = tmp_path / "runs"
    done = collect("--model", ggml_samples["tinyllama"], "--backend", "cpu", "--precision", "high", "--precision", "low",
                   "--input", f"prompt={ggml_samples['prompt']}", "-o", runs, "--no-report")
    assert done.returncode == 0, done.stderr
    run, ref = runs / "ggml_cpu_low_tinyllama_prompt.h5", runs / "ggml_cpu_high_tinyllama_prompt.h5"
    done = collect("repro", "--model", ggml_samples["tinyllama"], "--run", run, "--ref", ref, "--layer", "Qcur-0",
                   "-o", tmp_path / "q")
    assert done.returncode == 0, done.stderr
    graph = json.loads((tmp_path / "q" / "model" / "graph.json").read_text())
    assert graph["op"] == "MUL_MAT"
    assert [(s["name"], s["origin"], s["types"]) for s in graph["sources"]] == [
        ("blk.0.attn_q.weight", "weight", {"reference": "f16", "run": "f16"}),
        ("attn_norm-0", "node", {"reference": "f32", "run": "f32"})]
    np.testing.assert_array_equal(np.load(tmp_path / "q" / "tensors" / "input0_blk.0.attn_q.weight.npy"),
                                  gguf_weights(ggml_samples["tinyllama"])["blk.0.attn_q.weight"])
    with DumpFile(ref) as dump:
        np.testing.assert_array_equal(np.load(tmp_path / "q" / "tensors" / "input1_attn_norm-0.npy"),
                                      dump.tensor_by_key("attn_norm-0:0"))
    done = collect("repro", "--model", ggml_samples["tinyllama"], "--run", run, "--ref", ref, "--layer", "kq_soft_max-0",
                   "-o", tmp_path / "s")
    assert done.returncode != 0 and "is a SOFT_MAX node" in done.stderr and "Traceback" not in done.stderr


def test_a_program_bundle_naming_an_engine_without_programs_is_refused_in_one_line(tmp_path):
    """--check finds the program's builder through the engine repro.json names: an engine that writes no program
    bundles (or an unknown one) is one line naming the bundle, before anything is built."""
    from layerdiff.collector.repro.check import check_bundle
    from layerdiff.errors import InputError

    bundle = tmp_path / "b"
    (bundle / "model").mkdir(parents=True)
    (bundle / "model" / "graph.json").write_text("{}")
    (bundle / "CMakeLists.txt").write_text("project(x)\n")
    for engine in ("ncnn", "no-such-engine"):
        (bundle / "repro.json").write_text(json.dumps({"engine": engine}))
        with pytest.raises(InputError) as err:
            check_bundle(bundle)
        assert str(bundle) in str(err.value) and engine in str(err.value) and "\n" not in str(err.value)
