"""`collect repro` for LiteRT and ONNX Runtime on real corpus models with real divergences.

LiteRT: mediapipe's pose detector on the GPU accelerator (WebGPU over SwiftShader) against the CPU
interpreter. The accelerator rejects the sparse weights' DENSIFY, so the graph is split, and the
analysis names a CONV_2D reading densified weights as the failure source (rel L2 3.9). ONNX Runtime:
PP-OCRv4 rec with every graph optimisation on against the golden (optimisations off): the first Conv
already differs (a layout-transformed kernel). Each bundle's runner is run in a venv holding only the
engine's wheel and numpy; the reference configuration must give the full run's tensor bit for bit.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.engines.litert.graph import load_graph
from tests.corpus import INPUT_MAKERS, MODELS as CORPUS, wheel_file
from tests.litert_models import image_input, tflite_model
from tests.repro_support import bare_venv, pin, run_bundle
from tests.test_collect_cli import collect

POSE_CONV = "model_1/model/batch_normalization_2/FusedBatchNormV3;model_1/model/conv2d_1/Conv2D1"


def _tensor(path: Path, name: str) -> np.ndarray:
    with DumpFile(path) as dump:
        rows = dump.layers[dump.layers["name"] == name]
        return np.asarray(dump.tensor(int(rows.iloc[0]["order"])))


def _rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _wrong_share(out: np.ndarray, ref: np.ndarray) -> float:
    """The share of values that are non-finite or off by more than 1% (of the value, or of 1 near zero)."""
    out, ref = out.astype(np.float64), ref.astype(np.float64)
    with np.errstate(invalid="ignore"):
        wrong = ~np.isfinite(out) | (np.abs(out - ref) > 1e-2 * (np.abs(ref) + 1))
    return float(wrong.mean())


@pytest.fixture(scope="module")
def pose(tmp_path_factory) -> dict:
    """pose_detection on cpu/high and gpu/high with the analyzer's report, and the bundle of its failure source."""
    work = tmp_path_factory.mktemp("repro-litert")
    model = tflite_model("pose_detection")
    graph = load_graph(model.read_bytes())
    np.save(work / "x.npy", image_input(tuple(graph.tensor_shapes[graph.inputs[0]])))
    runs = work / "runs"
    done = collect("--device", "local", "--model", model, "--config", "cpu/high,gpu/high",
                   "--input", f"{graph.name(graph.inputs[0])}={work / 'x.npy'}", "-o", runs)
    assert done.returncode == 0, done.stderr[-3000:]
    bundle = work / "bundle"
    done = collect("repro", "--model", model, "--from-report", runs / "report", "-o", bundle)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"model": model, "runs": runs, "bundle": bundle, "work": work,
            "run": next(runs.glob("litert_gpu_high_*.h5")), "ref": next(runs.glob("litert_cpu_high_*.h5"))}


def test_litert_bundle_is_the_conv_with_its_weight_decoding_as_a_tflite(pose):
    spec = json.loads((pose["bundle"] / "repro.json").read_text())
    assert spec["engine"] == "litert" and spec["layers"] == [POSE_CONV]
    cut = load_graph((pose["bundle"] / spec["model"]["tflite"]).read_bytes())
    full = load_graph(pose["model"].read_bytes())
    # the conv and the DENSIFY/DEQUANTIZE chain that decodes its sparse weights: the split the full graph had
    assert [op.op_type for op in cut.ops] == ["DEQUANTIZE", "DENSIFY", "DEQUANTIZE", "CONV_2D"]
    assert [cut.name(t) for t in cut.outputs] == [POSE_CONV]
    conv = next(op for op in full.ops if full.name(op.outputs[0]) == POSE_CONV)
    assert [cut.name(t) for t in cut.inputs] == [full.name(conv.inputs[0])] == [spec["inputs"][0]["blob"]]
    np.testing.assert_array_equal(np.load(pose["bundle"] / spec["inputs"][0]["npy"]), _tensor(pose["ref"], full.name(conv.inputs[0])))
    assert spec["configs"]["run"]["backend"] == "gpu" and spec["configs"]["run"]["options"]["enforce_f32"] is True
    assert spec["configs"]["reference"]["options"]["kernels"] == "builtin"
    assert "ai-edge-litert==" in (pose["bundle"] / "README.md").read_text()
    assert "placement" not in spec["fingerprint"]["run"]["options"]  # per-op records stay in the HDF5
    assert all(len(p.name) < 80 for p in (pose["bundle"] / "tensors").iterdir())


def test_litert_runner_with_only_the_wheel_reproduces_the_gpu_failure_and_the_cpu_tensor_bit_for_bit(pose, tmp_path):
    python = bare_venv(tmp_path / "venv", pin("litert", "ai-edge-litert"), "numpy")
    result = run_bundle(python, pose["bundle"], "--save", str(tmp_path / "out"))
    reference = result["configs"]["reference"]["outputs"][POSE_CONV]
    assert reference["bit_identical"] is True
    spec = json.loads((pose["bundle"] / "repro.json").read_text())
    name = spec["outputs"][0]["npy_name"]
    expected = _tensor(pose["ref"], POSE_CONV)
    assert np.load(tmp_path / "out" / "reference" / name).tobytes() == expected.tobytes()
    run = result["configs"]["run"]
    assert run["ran"] and run["outputs"][POSE_CONV]["reproduces"] is True
    # judged here with numpy: most of the GPU conv's values are wrong, in the full graph and alone (the wrong values
    # themselves differ from run to run: garbage, not a rounding difference)
    assert _wrong_share(_tensor(pose["run"], POSE_CONV), expected) > 0.5
    assert _wrong_share(np.load(tmp_path / "out" / "run" / name), expected) > 0.5

    done = collect("repro", "--check", pose["bundle"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "still reproduces" in done.stderr and "bit for bit" in done.stderr


@pytest.fixture(scope="module")
def rec(tmp_path_factory) -> dict:
    """PP-OCRv4 rec on ONNX Runtime: the golden (optimisations off) and an app's session (all on)."""
    work = tmp_path_factory.mktemp("repro-ort")
    corpus = next(m for m in CORPUS if m.stem == "ocr_rec")
    model = work / "ocr_rec.onnx"
    shutil.copyfile(wheel_file(corpus), model)
    (name, array), = INPUT_MAKERS[corpus.make_inputs]().items()
    np.save(work / "x.npy", array)
    paths = {}
    for label, level in (("ref", "disable"), ("opt", "all")):
        out = work / label
        done = subprocess.run(["collect", "--device", "local", "--model", str(model), "--input", f"{name}={work / 'x.npy'}",
                               "-o", str(out), "--no-report"], capture_output=True, text=True, timeout=900,
                              env={**os.environ, "LAYERDIFF_ORT_OPTIMIZATION": level})
        assert done.returncode == 0, done.stderr[-2000:]
        paths[label] = next(out.glob("*.h5"))
    return {"model": model, "work": work, **paths}


FIRST_CONV = "conv2d_185.tmp_0"


def test_onnx_bundle_is_one_node_with_its_own_weights(rec):
    import onnx

    bundle = rec["work"] / "conv"
    done = collect("repro", "--model", rec["model"], "--run", rec["opt"], "--ref", rec["ref"], "--layer", FIRST_CONV,
                   "-o", bundle)
    assert done.returncode == 0, done.stderr[-2000:]
    spec = json.loads((bundle / "repro.json").read_text())
    assert spec["engine"] == "onnxruntime" and spec["layers"] == [FIRST_CONV]
    assert spec["configs"]["run"]["options"]["graph_optimization_level"] == "ORT_ENABLE_ALL"
    assert spec["configs"]["reference"]["options"]["graph_optimization_level"] == "ORT_DISABLE_ALL"
    cut, full = onnx.load(str(bundle / spec["model"]["onnx"])), onnx.load(str(rec["model"]))
    node = next(n for n in full.graph.node if FIRST_CONV in n.output)
    # the node itself and what gives it its weights (initializers, Constant nodes), copied from the full graph
    assert [n.op_type for n in cut.graph.node if n.op_type != "Constant"] == ["Conv"] and cut.graph.node[-1] == node
    constants = {out: n for n in full.graph.node if n.op_type == "Constant" for out in n.output}
    assert list(cut.graph.node[:-1]) == [constants[n] for n in node.input if n in constants]
    weights = {i.name: i for i in full.graph.initializer}
    assert {i.name: i for i in cut.graph.initializer} == {n: weights[n] for n in node.input if n in weights}
    assert [i.name for i in cut.graph.input] == ["x"]


def test_onnx_runner_with_only_onnxruntime_reproduces_the_optimised_session_and_the_golden_bit_for_bit(rec, tmp_path):
    python = bare_venv(tmp_path / "venv", pin("onnx", "onnxruntime"), "numpy")
    for layer, output in ((FIRST_CONV, FIRST_CONV), (f"{FIRST_CONV}..p2o.Mul.3", "p2o.Mul.3")):
        bundle = tmp_path / output
        done = collect("repro", "--model", rec["model"], "--run", rec["opt"], "--ref", rec["ref"], "--layer", layer,
                       "-o", bundle)
        assert done.returncode == 0, done.stderr[-2000:]
        result = run_bundle(python, bundle, "--save", str(tmp_path / "out" / output))
        assert result["configs"]["reference"]["outputs"][output]["bit_identical"] is True
        assert result["configs"]["run"]["outputs"][output]["reproduces"] is True
        name = json.loads((bundle / "repro.json").read_text())["outputs"][0]["npy_name"]
        golden, optimised = _tensor(rec["ref"], output), _tensor(rec["opt"], output)
        alone = np.load(tmp_path / "out" / output / "run" / name)
        assert 0 < _rel_l2(optimised, golden) < 1e-5 and 0 < _rel_l2(alone, golden) < 1e-5  # rounding, really there
    # one node alone, with optimisations on, computes exactly what it computed inside the optimised graph
    assert np.load(tmp_path / "out" / FIRST_CONV / "run" / f"output0_{FIRST_CONV}.npy").tobytes() == \
        _tensor(rec["opt"], FIRST_CONV).tobytes()
    done = collect("repro", "--check", tmp_path / FIRST_CONV)
    assert done.returncode == 0 and "still reproduces" in done.stderr and "bit for bit" in done.stderr, done.stderr[-2000:]


def test_paddle_and_paddle_lite_models_are_refused_in_one_line(tmp_path, rec):
    for suffix, says in ((".pdmodel", "no Paddle run fails"), (".nb", "no Python package writes")):
        model = tmp_path / f"m{suffix}"
        model.write_bytes(b"\0" * 16)
        if suffix == ".pdmodel":
            (tmp_path / "m.pdiparams").write_bytes(b"")
        done = collect("repro", "--model", model, "--run", rec["opt"], "--ref", rec["ref"], "--layer", FIRST_CONV,
                       "-o", tmp_path / "b")
        assert done.returncode != 0 and says in done.stderr and "Traceback" not in done.stderr, done.stderr[-1500:]


def test_litert_bisect_moves_the_gpu_range_and_names_the_convs_reading_densified_weights(pose, tmp_path):
    """`collect bisect` on LiteRT: pieces of the model cut in execution order, moved ones on the GPU accelerator.
    The model is pose_detection's first five operators (PAD, CONV_2D, DEPTHWISE_CONV_2D, CONV_2D, CONV_2D) cut out
    of the real model; the two last convolutions read sparse (DENSIFY) weights, the first two fp16 ones."""
    from layerdiff.collector.engines.litert.cut import cut

    full = load_graph(pose["model"].read_bytes())
    ops = [op for op in full.computing_ops() if op.outputs][:5]
    names = [full.name(op.outputs[0]) for op in ops]
    island = tmp_path / "pose_head.tflite"
    island.write_bytes(cut(pose["model"], names[0], names[-1], {}).model)
    writer = {t: op for op in full.ops for t in op.outputs}

    def reads_densified(op) -> bool:
        seen, todo = set(), [t for t in op.inputs if t in full.weights]
        while todo:
            producer = writer.get(todo.pop())
            if producer is not None and producer.index not in seen:
                seen.add(producer.index)
                todo.extend(producer.inputs)
        return any(full.ops[k].op_type == "DENSIFY" for k in seen)

    expected = [name for op, name in zip(ops, names) if reads_densified(op)]
    assert expected == names[3:]  # judged from the graph, not by layerdiff's search

    done = collect("bisect", "--device", "local", "--model", island, "--backend", "gpu", "--precision", "high",
                   "--ref-config", "cpu/high", "--input", f"input_1={pose['work'] / 'x.npy'}", "-o", tmp_path / "bisect")
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / "bisect" / "bisect.json").read_text())
    assert doc["mechanism"] == "delegated-range" and doc["status"] == "found"
    assert [c["layer"] for c in doc["culprits"]] == expected
    assert expected[0] == POSE_CONV  # the failure source the analysis of the fully dumped runs names
    assert doc["runs"] <= 2 + 2 * (int(np.ceil(np.log2(len(names)))) + 1) and "only the outputs were observed" in done.stderr
    assert "kept_mask" not in doc

    done = collect("bisect", "--device", "arm64", "--model", island, "--backend", "gpu", "--precision", "high",
                   "--ref-config", "cpu/high", "--input", f"input_1={pose['work'] / 'x.npy'}", "-o", tmp_path / "b2")
    assert done.returncode != 0 and "use --device local" in done.stderr and "Traceback" not in done.stderr
