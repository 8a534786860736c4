"""The plain run beside every observed run: the model run as an app runs it, on the same input and configuration.

Each engine's record (the raw footer's `plain_run`) is checked against the engine's own API run outside
layerdiff, and the plain outputs the dump stores against that run bit for bit. ONNX Runtime with its graph
optimisations on is the real case where observing changes the computation: a node output fetched as a graph
output is kept out of every fusion, so the observed run's outputs differ from the plain run's at the bit level.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.formats.rawdump import convert_raw_dump, read_raw_dump
from tests.corpus import INPUT_MAKERS, MODELS, wheel_file
from tests.ggml_support import ggml_binary, run_ggml  # noqa: F401 (ggml_binary: the fixture)

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
OCR_CLS = next(m for m in MODELS if m.stem == "ocr_cls")


def harness(engine: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"layerdiff.collector.engines.{engine}.engine", *args],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})


def ocr_cls_files(tmp: Path) -> tuple[Path, Path, np.ndarray]:
    model = tmp / "ocr_cls.onnx"
    model.write_bytes(wheel_file(OCR_CLS).read_bytes())
    x = INPUT_MAKERS[OCR_CLS.make_inputs]()["x"]
    np.save(tmp / "x.npy", x)
    return model, tmp / "x.npy", x


def footer_record(out: Path) -> dict:
    dump = read_raw_dump(out)
    assert dump.complete, dump.problems
    return dump.footer["plain_run"]


def plain_dump(out: Path) -> dict[str, np.ndarray]:
    plain = read_raw_dump(out / "plain")
    return {t.name: plain.read(t) for t in plain.tensors}


def observed_outputs(out: Path, names) -> dict[str, np.ndarray]:
    dump = read_raw_dump(out)
    return {t.name: dump.read(t) for t in dump.tensors if t.name in names}


def ort_outputs(model: Path, x: np.ndarray, level: str, every_node: bool = False) -> dict[str, np.ndarray]:
    """ONNX Runtime's own run: the model's outputs, optionally with every node output fetched too."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    proto = onnx.load(str(model))
    outputs = [o.name for o in proto.graph.output]
    if every_node:
        names = [o for n in proto.graph.node if n.op_type != "Constant" for o in n.output if o]
        proto.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names if n not in outputs)
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(outputs, session.run(outputs, {"x": x})))


def assert_identical_to_plain(out: Path) -> dict:
    """The record says identical for every output and both plain runs, and the stored plain outputs are the
    dumped outputs byte for byte; the HDF5 carries them under the outputs' layer keys."""
    record = footer_record(out)
    assert record["runs"] == 2 and record["identical"] is True and record["outputs"]
    assert record["observing"]  # what observing does in this engine, in the engine's words
    for entry in record["outputs"]:
        assert entry["vs_observed"] == {"compared": True, "identical": True, "max_abs": 0.0, "rel_l2": 0.0}, entry
        assert entry["vs_second_plain_run"]["identical"] is True
    plain = plain_dump(out)
    observed = observed_outputs(out, set(plain))
    assert set(plain) == {e["name"] for e in record["outputs"]} == set(observed)
    for name, array in plain.items():
        assert array.tobytes() == observed[name].tobytes(), name
    h5 = convert_raw_dump(out, out.parent / f"{out.name}.h5")
    with DumpFile(h5) as dump:
        assert set(dump.plain_outputs()) == {e["key"] for e in record["outputs"]}
        assert set(dump.plain_outputs()) <= set(dump.layers["key"])
    return record


def test_onnxruntime_records_its_observed_run_identical_to_a_plain_run(tmp_path):
    model, feed, x = ocr_cls_files(tmp_path)
    proc = harness("ort", "--model", str(model), "--input", f"x={feed}", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_identical_to_plain(tmp_path / "out")
    ours = ort_outputs(model, x, "ORT_DISABLE_ALL")
    assert {k: v.tobytes() for k, v in plain_dump(tmp_path / "out").items()} == {k: v.tobytes() for k, v in ours.items()}


@pytest.mark.parametrize("engine, files", [
    ("mnn", ("convnet.mnn",)),
    ("ncnn", ("convnet.param", "convnet.bin")),
])
def test_mnn_and_ncnn_record_their_observed_run_identical_to_a_plain_run(tmp_path, engine, files):
    models = [a for f in files for a in ("--model", str(SAMPLES / "models" / f))]
    proc = harness(engine, *models, "--input", f"data={SAMPLES / 'inputs' / 'convnet.npy'}", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = assert_identical_to_plain(tmp_path / "out")
    assert [e["name"] for e in record["outputs"]] == ["prob"]


@pytest.mark.parametrize("backend, precision", [("cpu", "high"), ("cpu", "normal"), ("gpu", "high")])
def test_litert_records_its_observed_run_identical_to_a_plain_run(tmp_path, backend, precision):
    from layerdiff.collector.engines.litert.gpu import availability
    from tests.litert_models import image_input, tflite_model

    if backend == "gpu" and not availability()["ok"]:
        pytest.skip(availability()["reason"])
    model = tflite_model("face_detection_short_range")
    np.save(tmp_path / "x.npy", image_input((1, 128, 128, 3)))
    proc = harness("litert", "--model", str(model), "--input", f"input={tmp_path / 'x.npy'}", "--backend", backend,
                   "--precision", precision, "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = assert_identical_to_plain(tmp_path / "out")
    assert sorted(e["name"] for e in record["outputs"]) == ["classificators", "regressors"]


def test_paddle_records_its_observed_run_identical_to_a_plain_run(tmp_path):
    pytest.importorskip("paddle", reason="the paddle engine needs paddlepaddle: pip install 'layerdiff[paddle]'")
    from tests.corpus import PADDLE_MODELS, copy_paddle_model

    model = copy_paddle_model(PADDLE_MODELS["ocr_cls"], tmp_path / "models")
    np.save(tmp_path / "x.npy", INPUT_MAKERS[OCR_CLS.make_inputs]()["x"])
    proc = harness("paddle", "--model", str(model), "--model", str(model.with_suffix(".pdiparams")),
                   "--input", f"x={tmp_path / 'x.npy'}", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_identical_to_plain(tmp_path / "out")


def paddle_lite_python_outputs(nb: Path, feed: Path) -> dict[str, np.ndarray]:
    """Paddle-Lite's own Python API (PyPI paddlelite, in the Python 3.10 venv opt comes from): the .nb run once
    as an app runs it, its outputs by name."""
    from tests.paddle_lite_env import opt_binary

    script = ("import sys, numpy as np\n"
              "from paddlelite.lite import MobileConfig, create_paddle_predictor\n"
              "config = MobileConfig(); config.set_model_from_file(sys.argv[1])\n"  # one thread: the default
              "p = create_paddle_predictor(config)\n"
              "p.get_input(0).from_numpy(np.load(sys.argv[2])); p.run()\n"
              "np.savez(sys.argv[3], **{n: p.get_output(i).numpy() for i, n in enumerate(p.get_output_names())})\n")
    out = nb.parent / "paddlelite_outputs.npz"
    python = str(opt_binary().parent / "python")
    if subprocess.run([python, "-c", "import numpy"], capture_output=True).returncode != 0:
        pytest.skip("numpy is missing beside paddlelite (Python 3.10 venv): run device_scripts/setup_host.sh --test")
    proc = subprocess.run([python, "-c", script, str(nb), str(feed), str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(np.load(out))


def test_the_cpp_harness_records_its_paddle_lite_run_identical_to_a_plain_run(tmp_path):
    """Paddle-Lite (the C++ harness, host build): after Run() every variable read with GetTensor, against a Run()
    whose outputs only are read with GetOutput; the plain outputs are Paddle-Lite's own Python API's, bit for bit."""
    from tests.corpus import PADDLE_MODELS, copy_paddle_model
    from tests.paddle_lite_env import need_paddle_lite_root, optimise

    need_paddle_lite_root()
    program = copy_paddle_model(PADDLE_MODELS["ocr_cls"], tmp_path / "models")
    nb = optimise(program, "x86", tmp_path / "models" / "cls_x86")
    np.save(tmp_path / "x.npy", INPUT_MAKERS[OCR_CLS.make_inputs]()["x"])
    proc = harness("paddle_lite", "--engine", "paddle-lite", "--model", str(nb), "--input", f"x={tmp_path / 'x.npy'}",
                   "--threads", "1", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = assert_identical_to_plain(tmp_path / "out")
    assert [e["key"] for e in record["outputs"]] == ["softmax_0.tmp_0:0"]
    assert "GetTensor" in record["observing"]
    ours = paddle_lite_python_outputs(nb, tmp_path / "x.npy")
    assert {k: v.tobytes() for k, v in plain_dump(tmp_path / "out").items()} == {k: v.tobytes() for k, v in ours.items()}


@pytest.mark.parametrize("backend", ["cpu", "vulkan"])
def test_the_cpp_harness_records_its_ncnn_run_identical_to_a_plain_run(tmp_path, backend):
    """The phone harness (host build): a fresh extractor extracting only the outputs, as an app runs the net."""
    from tests.test_harness_support import host_harness

    out = tmp_path / "out"
    proc = subprocess.run([str(host_harness()), "--engine", "ncnn", "--model", str(SAMPLES / "models" / "convnet.param"),
                           "--model", str(SAMPLES / "models" / "convnet.bin"), "--input",
                           f"data={SAMPLES / 'inputs' / 'convnet.npy'}", "--backend", backend, "--precision", "low",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = assert_identical_to_plain(out)
    assert [e["key"] for e in record["outputs"]] == ["prob:0"]
    assert "light mode" in record["observing"]


@pytest.mark.parametrize("model, feed", [("tinyllama", "prompt"), ("conv2d", "conv_small")])
def test_the_ggml_harness_records_its_observed_run_identical_to_a_plain_run(tmp_path, ggml_binary, model, feed):
    """llama.cpp's graph with the eval callback asking for every node, against the same graph computed whole
    (the callback asks for none): on the CPU the logits, and the convolution's output, agree bit for bit."""
    from layerdiff.samples.ggml_models import write_all

    samples = write_all(tmp_path / "samples")
    spec = f"prompt={samples['prompt']}" if feed == "prompt" else f"x={samples[feed]}"
    proc = run_ggml(ggml_binary, tmp_path / "out", samples[model], spec)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = assert_identical_to_plain(tmp_path / "out")
    assert [e["name"] for e in record["outputs"]] == ["result_output" if model == "tinyllama" else "conv.out"]
    assert "eval callback" in record["observing"]


def collect(out: Path, model: Path, feed: Path, level: str) -> Path:
    env = {**os.environ, "LAYERDIFF_ORT_OPTIMIZATION": level}
    proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--no-report",
                           "--model", str(model), "--input", f"x={feed}", "-o", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [h5] = out.glob("*.h5")
    return h5


def test_observing_onnxruntime_with_optimisations_changes_its_outputs_and_the_report_judges_the_plain_run(tmp_path):
    """ORT_ENABLE_BASIC fuses Conv+BatchNorm and friends; with every node output fetched those nodes stay unfused.
    The engine's record, the stored plain outputs and the analysis all follow ONNX Runtime's own two runs."""
    from layerdiff.analyzer.analysis import analyze_paths

    model, feed, x = ocr_cls_files(tmp_path)
    ours_plain = ort_outputs(model, x, "ORT_ENABLE_BASIC")
    ours_observed = ort_outputs(model, x, "ORT_ENABLE_BASIC", every_node=True)
    golden = ort_outputs(model, x, "ORT_DISABLE_ALL")
    (name,) = ours_plain
    assert ours_plain[name].tobytes() != ours_observed[name].tobytes()  # the fact the test stands on

    ref = collect(tmp_path / "ref", model, feed, "disable")
    run = collect(tmp_path / "basic", model, feed, "basic")
    with DumpFile(run) as dump:
        record = dump.provenance["raw_footer"]["plain_run"]
        assert dump.plain_outputs()[f"{name}:0"].tobytes() == ours_plain[name].tobytes()
        assert dump.provenance["raw_header"]["options"]["graph_optimization_level"] == "ORT_ENABLE_BASIC"
    (entry,) = record["outputs"]
    assert record["identical"] is False and entry["vs_observed"]["identical"] is False
    assert entry["vs_observed"]["max_abs"] == pytest.approx(float(np.abs(ours_observed[name].astype(np.float64)
                                                                          - ours_plain[name]).max()), rel=1e-6)
    assert entry["vs_second_plain_run"]["identical"] is True

    analysis = analyze_paths([run], ref=ref)
    try:
        (finding,) = [f for f in analysis.findings if f.kind == "observation_changed"]
        assert finding.layer == f"{name}:0" and "Observing changed the result" in finding.sentence
        assert "graph optimisations" in finding.sentence and "two plain runs agree bit for bit" in finding.sentence
        table = analysis.comparison.table
        row = table[(table["key"] == f"{name}:0") & (table["run"] == finding.run)].iloc[0]
        expected = np.linalg.norm(ours_plain[name].astype(np.float64) - golden[name]) / np.linalg.norm(golden[name])
        assert row["rel_l2"] == pytest.approx(expected, rel=1e-6, abs=1e-12)
        assert "judged on the plain run's output" in row["reasons"]
    finally:
        analysis.close()
