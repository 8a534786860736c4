"""`collect bisect` on ggml: seed 004's convolution graph (ggml_conv_2d = IM2COL + MUL_MAT) at cpu/low and
cpu/normal against cpu/high, every trial a plain run of layerdiff-ggml with `--keep REGEX` and only conv.out
dumped; the culprit checked against the analysis of fully dumped runs and the outputs against numpy. Also on
the emulated arm64 phone (the static aarch64 build under qemu) through a stand-in and the real adb server."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.engines.harness_cli import split_key
from tests.ggml_support import dump_arrays, ggml_binary, ggml_samples, gguf_weights, run_ggml, vulkan_binary  # noqa: F401
from tests.test_collect_cli import collect
from tests.test_ggml import _conv_reference


def _output(path) -> np.ndarray:
    """The one tensor of a bisect dump: conv.out and nothing else."""
    with DumpFile(path) as dump:
        assert list(dump.layers["key"]) == ["conv.out:0"], path
        return dump.tensor_by_key("conv.out:0").astype(np.float64)


def _rel_l2(run: np.ndarray, ref: np.ndarray) -> float:
    if not np.isfinite(run).all():
        return math.inf
    return float(np.linalg.norm(run.ravel() - ref.ravel()) / np.linalg.norm(ref.ravel()))


def _analysis_culprit(samples, tmp_path, precision: str) -> str:
    """The node the analysis of fully dumped cpu/high and cpu/<precision> runs names first."""
    runs = tmp_path / "dumps"
    done = collect("--model", samples["conv2d"], "--backend", "cpu", "--precision", "high", "--precision", precision,
                   "--input", f"x={samples['conv_large']}", "-o", runs, "--no-report")
    assert done.returncode == 0, done.stderr
    ref = runs / "ggml_cpu_high_conv2d_large.h5"
    analysis = analyze_paths([ref, runs / f"ggml_cpu_{precision}_conv2d_large.h5"], ref=ref)
    try:
        named = {f.kind: split_key(f.layer)[0] for f in analysis.findings
                 if f.kind in ("inf_origin", "nan_origin", "failure_source") and f.layer}
    finally:
        analysis.close()
    assert named, "the dumped analysis names no origin nor failure source"
    return named.get("inf_origin") or named.get("nan_origin") or named["failure_source"]


@pytest.mark.parametrize("precision", ["low", "normal"])
def test_seed_004_names_the_im2col_the_dumped_analysis_names_from_outputs_alone(ggml_binary, ggml_samples, tmp_path,
                                                                                precision):
    out = tmp_path / "bisect"
    done = collect("bisect", "--model", ggml_samples["conv2d"], "--backend", "cpu", "--precision", precision,
                   "--input", f"x={ggml_samples['conv_large']}", "-o", out)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    doc = json.loads((out / "bisect.json").read_text())
    assert doc["status"] == "found" and doc["mechanism"] == "node-keep"
    culprits = [c["layer"] for c in doc["culprits"]]
    assert culprits[0] == _analysis_culprit(ggml_samples, tmp_path, precision) == "conv.im2col"
    # the f32 columns kept, a MUL_MAT reading them in f16 overflows again: it is the second culprit
    assert culprits == ["conv.im2col", "conv.mul_mat"]
    assert f"conv.im2col: moving it to cpu/{precision} breaks the outputs" in done.stderr
    assert doc["kept_argument"] == ["--keep", r"^(?:conv\.im2col|conv\.mul_mat)$"]

    # only conv.out was observed, in the reference and in every trial; each trial ran the nodes it says it kept
    dumps = sorted(out.rglob("*.h5"))
    assert len(dumps) == doc["runs"] + doc["reference_runs"]
    for path in dumps:
        _output(path)
    movable = doc["layers_movable"]
    assert movable == 2 and doc["runs"] <= 2 + len(culprits) * (math.ceil(math.log2(movable)) + 1)
    assert f"{doc['runs']} plain run(s) ({doc['runs']} trials) for 2 layers" in done.stderr
    for index, trial in enumerate(doc["trials"], start=1):
        [path] = (out / "trials" / f"trial{index}").glob("*.h5")
        with DumpFile(path) as dump:
            keep = dump.provenance["raw_header"]["options"]["keep"]
        assert keep["kept"] == trial["kept"] and keep["movable"] == ["conv.im2col", "conv.mul_mat"]

    # numpy: the failing run and each half kept overflow; both kept is numpy's convolution
    x = np.load(ggml_samples["conv_large"])
    w = gguf_weights(ggml_samples["conv2d"])["conv.weight"]
    reference, overflow = _conv_reference(x, w)
    assert overflow > 0  # the columns hold values f16 cannot: both the IM2COL and the MUL_MAT's f16 read overflow
    by_kept = {tuple(t["kept"]): index for index, t in enumerate(doc["trials"], start=1)}
    outputs = {kept: _output(next((out / "trials" / f"trial{i}").glob("*.h5"))) for kept, i in by_kept.items()}
    assert _rel_l2(outputs[()], reference) == math.inf
    assert _rel_l2(outputs[("conv.im2col",)], reference) == math.inf
    assert _rel_l2(outputs[("conv.im2col", "conv.mul_mat")], reference) < 1e-4
    assert _rel_l2(_output(next((out / "reference").glob("*.h5"))), reference) < 1e-4


def test_small_input_nothing_fails_in_one_line(ggml_binary, ggml_samples, tmp_path):
    done = collect("bisect", "--model", ggml_samples["conv2d"], "--backend", "cpu", "--precision", "low",
                   "--input", f"x={ggml_samples['conv_small']}", "-o", tmp_path / "b")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bisect: nothing fails: cpu/low outputs are within 0.01 of cpu/high")


def test_a_language_model_is_refused_in_one_line_before_anything_runs(ggml_samples, tmp_path):
    done = collect("bisect", "--model", ggml_samples["tinyllama"], "--backend", "cpu", "--precision", "low",
                   "--input", f"prompt={ggml_samples['prompt']}", "-o", tmp_path / "b")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no per-node choice of backend or type" in lines[0]
    assert not (tmp_path / "b").exists()


def test_the_harness_keep_option(ggml_binary, ggml_samples, tmp_path):
    """--keep builds the named nodes in the high precision's types and records what it kept; bad use is one line."""
    large = f"x={ggml_samples['conv_large']}"
    proc = run_ggml(ggml_binary, tmp_path / "kept", ggml_samples["conv2d"], large, "cpu", "low",
                    "--keep", "im2col|mul_mat")
    assert proc.returncode == 0, proc.stderr
    header, arrays, records = dump_arrays(tmp_path / "kept")
    assert header["options"]["keep"]["kept"] == ["conv.im2col", "conv.mul_mat"]
    assert records["conv.im2col"].layout == "ggml/f32@CPU" and np.isfinite(arrays["conv.out"]).all()
    proc = run_ggml(ggml_binary, tmp_path / "none", ggml_samples["conv2d"], large, "cpu", "low", "--keep", "(?!)")
    assert proc.returncode == 0, proc.stderr
    header, arrays, records = dump_arrays(tmp_path / "none")
    assert header["options"]["keep"]["kept"] == [] and records["conv.im2col"].layout == "ggml/f16@CPU"
    assert not np.isfinite(arrays["conv.out"]).all()
    for args, words in ((("--keep", "("), "not a valid regular expression"),
                        (("--keep",), "--keep needs a node-name REGEX")):
        proc = run_ggml(ggml_binary, tmp_path / "bad", ggml_samples["conv2d"], large, "cpu", "low", *args)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr
    proc = run_ggml(ggml_binary, tmp_path / "llama", ggml_samples["tinyllama"], f"prompt={ggml_samples['prompt']}",
                    "cpu", "low", "--keep", "Qcur")
    assert proc.returncode == 2 and "convolution graph only" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-g++")),
                    reason="needs qemu-user and g++-aarch64-linux-gnu (apt) for the aarch64 build")
def test_seed_004_bisect_on_an_arm64_phone(standins, ggml_samples, tmp_path):
    """The static aarch64 build under qemu on an arm64-v8a stand-in, through the real adb: the same culprits."""
    from layerdiff.collector.fix.bisect import bisect, bisect_document
    from layerdiff.collector.inputs.inputset import InputSet
    from layerdiff.collector.inputs.modelfiles import resolve_model
    from layerdiff.collector.transport.adb import AdbDevice

    phone = AdbDevice(standins.start(abi="arm64-v8a").serial)
    model = resolve_model(ggml_samples["conv2d"])
    inputs = [InputSet("conv2d_large", {"x": np.load(ggml_samples["conv_large"])}, str(ggml_samples["conv_large"]))]
    result = bisect(phone, model, "cpu", "low", inputs, tmp_path / "bisect")
    doc = bisect_document(result, device=phone.serial, model=model.name, backend="cpu", precision="low",
                          ref_config=("cpu", "high"))
    assert doc["status"] == "found" and [c["layer"] for c in doc["culprits"]] == ["conv.im2col", "conv.mul_mat"]
    assert doc["runs"] == 4
    for path in sorted((tmp_path / "bisect").rglob("*.h5")):
        with DumpFile(path) as dump:
            assert dump.attrs["abi"] == "arm64-v8a" and dump.attrs["device_serial"] == phone.serial
        _output(path)


@pytest.mark.slow
def test_on_vulkan_a_kept_node_is_pinned_to_the_cpu_backend(vulkan_binary, ggml_samples, tmp_path):
    """lavapipe: --keep moves the IM2COL to the CPU backend (its buffer says so), the rest stays on Vulkan."""
    large = f"x={ggml_samples['conv_large']}"
    proc = run_ggml(vulkan_binary, tmp_path / "kept", ggml_samples["conv2d"], large, "vulkan", "low",
                    "--keep", r"^conv\.im2col$")
    assert proc.returncode == 0, proc.stderr[-2000:]
    header, arrays, records = dump_arrays(tmp_path / "kept")
    keep = header["options"]["keep"]
    assert keep["kept"] == ["conv.im2col"] and keep["how"].startswith("pinned to the CPU backend")
    assert "conv.im2col" in keep["movable"] and "conv.mul_mat" in keep["movable"] and "conv.reshape" not in keep["movable"]
    assert records["conv.im2col"].layout.endswith("@CPU") and records["conv.mul_mat"].layout.endswith("@Vulkan0")


@pytest.mark.slow
def test_seed_004_bisect_on_vulkan(vulkan_binary, ggml_samples, tmp_path):
    out = tmp_path / "bisect"
    done = collect("bisect", "--model", ggml_samples["conv2d"], "--backend", "vulkan", "--precision", "low",
                   "--input", f"x={ggml_samples['conv_large']}", "-o", out)
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "bisect.json").read_text())
    assert doc["status"] == "found" and doc["culprits"][0]["layer"] == "conv.im2col"
    for path in sorted(out.rglob("*.h5")):
        _output(path)
