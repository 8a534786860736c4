"""`collect fix` end to end: real engines, a real patched ncnn model, checked against the numpy fp64 forward."""
from __future__ import annotations

import json

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import LayerdiffError
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.collector.engines.ncnn.options import HIGH_PRECISION_MASK, Feature
from layerdiff.collector.fix.trial import TrialRunner
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import resolve_model
from layerdiff.collector.engines.ncnn.patch import layer_names, patched_param_text
from layerdiff.samples.catalog import reference
from tests.conftest import MODELS, SAMPLES, sample_input
from tests.test_collect_cli import collect


def _rel_l2(run: np.ndarray, ref: np.ndarray) -> float:
    run, ref = run.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    return float(np.linalg.norm(run - ref) / np.linalg.norm(ref))


def test_overflow_on_vulkan_low_is_fixed_by_a_few_masked_layers(tmp_path):
    out = tmp_path / "fix"
    done = collect("fix", "--device", "local", "--model", MODELS / "overflow.param", "--backend", "vulkan",
                   "--precision", "low", "--input", SAMPLES / "inputs" / "overflow.npy", "-o", out)
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "fix.json").read_text())
    assert doc["status"] == "fixed" and doc["mode"] == "feature-mask"
    chosen = [item["layer"] for item in doc["layers"]]
    assert "block2/amplify" in chosen and doc["layers"][0]["kind"] == "inf_origin"
    assert all(item["reason"] for item in doc["layers"])
    assert 0 < len(chosen) <= doc["layers_total"] / 3
    assert doc["errors"]["overflow"]["before"] > 0.1 and doc["errors"]["overflow"]["after"] < 1e-2
    assert doc["search"]["runs"] >= 3 and doc["speed"]["slowdown"] > 0
    assert doc["masks"]["block2/amplify"] == {"key": 31, "value": int(HIGH_PRECISION_MASK["vulkan"]),
                                              "bits": "fp16_arithmetic|fp16_storage|bf16_storage|vulkan"}

    original = (MODELS / "overflow.param").read_text().splitlines()
    patched = (out / "overflow.fixed.param").read_text().splitlines()
    changed = [(a, b) for a, b in zip(original, patched) if a != b]
    assert len(original) == len(patched) and len(changed) == len(chosen)
    assert all(b == f"{a} 31={int(HIGH_PRECISION_MASK['vulkan'])}" for a, b in changed)
    assert (out / "overflow.fixed.bin").read_bytes() == (MODELS / "overflow.bin").read_bytes()

    # the patched model, collected again like any model, against the independent fp64 numpy forward
    again = collect("--device", "local", "--model", out / "overflow.fixed.param", "--backend", "vulkan",
                    "--precision", "low", "--input", SAMPLES / "inputs" / "overflow.npy", "-o", tmp_path / "again")
    assert again.returncode == 0, again.stderr
    with DumpFile(tmp_path / "again" / "ncnn_vulkan_low_overflow.h5") as dump:
        prob = dump.tensor_by_key("prob:0")
    assert np.isfinite(prob).all()
    assert _rel_l2(prob, reference("overflow")["prob:0"]) < 1e-2
    page = (out / "report" / "index.html").read_text()
    assert "<h2>Fix</h2>" in page and "block2/amplify" in page and "overflow.fixed.param" in page


def test_a_tolerance_no_set_can_meet_reports_the_best_set_and_exits_1(tmp_path):
    """vulkan/high runs fp32 on the GPU, a masked layer fp32 on the CPU: they differ by ~1e-7, never 1e-12."""
    out = tmp_path / "fix"
    done = collect("fix", "--model", MODELS / "overflow.param", "--backend", "vulkan", "--precision", "low",
                   "--input", SAMPLES / "inputs" / "overflow.npy", "--tolerance", "1e-12", "-o", out)
    assert done.returncode == 1, done.stderr
    doc = json.loads((out / "fix.json").read_text())
    assert doc["status"] == "unfixable" and doc["layers"]
    assert any(step["phase"] == "bisect" and len(step["layers"]) == doc["layers_maskable"]
               for step in doc["search"]["steps"])
    assert "unfixable" in done.stderr and "Traceback" not in done.stderr


def test_on_the_cpu_kept_layers_bring_their_producers_and_bf16_drift_needs_the_whole_model(tmp_path):
    """x86 cpu/low is bf16 storage: a layer kept fp32 must read fp32 (ncnn casts 16-bit inputs only for
    layers that keep 16-bit storage), so its producers are kept too; at 1e-3 only the whole model does."""
    out = tmp_path / "fix"
    done = collect("fix", "--model", MODELS / "overflow.param", "--backend", "cpu", "--precision", "low",
                   "--input", SAMPLES / "inputs" / "overflow.npy", "--tolerance", "1e-3", "-o", out)
    assert done.returncode == 1, done.stderr
    doc = json.loads((out / "fix.json").read_text())
    assert doc["status"] == "unfixable" and len(doc["layers"]) == doc["layers_maskable"] == 14
    assert {item["kind"] for item in doc["layers"]} >= {"feeds_kept_layer"}
    assert doc["masks"]["splitncnn_0"]["value"] == int(HIGH_PRECISION_MASK["cpu"])
    assert doc["errors"]["overflow"]["after"] <= 1e-3 < doc["errors"]["overflow"]["before"]
    steps = [step["layers"] for step in doc["search"]["steps"] if step["layers"]]
    order = layer_names(MODELS / "overflow.param")[1:]
    assert all(layers == order[:len(layers)] for layers in steps)  # every trial is closed upstream


def test_mnn_what_if_replaces_outputs_inside_the_low_precision_run(local_runs, tmp_path):
    """Feeding input A's run with input B's reference `block2/amplify` (the only path to the output)
    makes A's output B's: the injected tensor really drives everything after it."""
    model = resolve_model(MODELS / "overflow.mnn")
    ref_b = local_runs("overflow.mnn", "cpu", "high")
    other = np.random.default_rng(3).random(sample_input("overflow").shape, dtype=np.float32)
    runner = TrialRunner(LocalDevice(), model, "cpu", "low", [InputSet("a", {"data": other}, "random")],
                         {"a": ref_b}, tmp_path / "work")
    assert runner.run(()).worst > 1e-2
    replaced = runner.run(("block2/amplify",))
    assert replaced.worst < 1e-5 and runner.runs == 2
    with DumpFile(replaced.paths["a"]) as dump:
        assert dump.attrs["fix_mode"] == "what-if"


def test_mnn_fix_on_a_backend_without_fp16_has_nothing_to_fix_and_says_what_mnn_offers(tmp_path):
    out = tmp_path / "fix"
    done = collect("fix", "--model", MODELS / "overflow.mnn", "--backend", "cpu", "--precision", "low",
                   "--input", SAMPLES / "inputs" / "overflow.npy", "-o", out)
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "fix.json").read_text())
    assert doc["status"] == "nothing_to_fix" and doc["layers"] == [] and doc["mode"] == "what-if"
    assert any("createMultiPathSession" in line for line in doc["engine_options"])


def test_an_engine_without_a_per_layer_switch_is_refused_in_one_line_before_any_run(tmp_path):
    """The fix mechanism is the engine folder's declaration: an ONNX Runtime model names none."""
    out = tmp_path / "fix"
    done = collect("fix", "--model", MODELS / "overflow.onnx", "--backend", "cpu", "--precision", "low",
                   "--input", SAMPLES / "inputs" / "overflow.npy", "-o", out)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    (line,) = [l for l in done.stderr.splitlines() if "collect fix" in l]
    assert "onnxruntime" in line and "mnn" in line and "ncnn" in line
    assert not list(out.rglob("*.h5")), "no run may start for an engine that cannot be fixed"


def test_param_patch_keeps_every_other_byte_and_merges_an_existing_mask(tmp_path):
    text = (MODELS / "overflow.param").read_text()
    text = text.replace("block2/tanh\n", "block2/tanh 31=128\n")
    out = patched_param_text(text, {"block2/tanh": int(Feature.VULKAN), "head/fc": 7}, MODELS / "overflow.param")
    assert "block2/tanh 31=144\n" in out and "head/fc 0=10 1=1 2=320 31=7\n" in out
    assert len(out) - len(text) == len(" 31=7")  # 128 -> 144 keeps its length
    with pytest.raises(LayerdiffError, match="no layer named nope"):
        patched_param_text(text, {"nope": 1}, MODELS / "overflow.param")
    assert len(layer_names(MODELS / "overflow.param")) == 15
