"""Values an engine never wrote are known from facts, and reported as not observable.

LiteRT's GPU accelerator over SwiftShader fuses the PADs of mediapipe's face detector into the next op and
never writes them: the sentinel filled into their buffers before two runs survives both. The report must list
them as not observable, never as failing, as the first divergence or as nondeterminism, while the CPU
interpreter (checked here with numpy) holds real values for them. Every other engine records why the tensors
it dumps were written (its own sentinel check, or the engine's declaration), and the analyzer reads that
record, never the engine's name.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.formats.rawdump import read_raw_dump
from tests.litert_models import image_input, tflite_model

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
FACE = "face_detection_short_range"


def gpu_available() -> None:
    from layerdiff.collector.engines.litert.gpu import availability

    if not availability()["ok"]:
        pytest.skip(availability()["reason"])


def collect(out: Path, model: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--model", str(model),
                           "-o", str(out), *extra], capture_output=True, text=True, timeout=900)


def analyze(out: Path, *files: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli", *map(str, files), "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return json.loads((out / "results.json").read_text())


def engine_run(engine: str, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"layerdiff.collector.engines.{engine}.engine", *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def face_sweep(tmp_path_factory) -> Path:
    """One `collect` of the face detector on LiteRT's CPU interpreter (the reference) and its GPU accelerator."""
    gpu_available()
    out = tmp_path_factory.mktemp("face")
    proc = collect(out, tflite_model(FACE), "--backend", "cpu,gpu", "--precision", "high")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def _h5(out: Path, backend: str) -> Path:
    [path] = sorted(out.glob(f"litert_{backend}_*.h5"))
    return path


def test_tensors_the_gpu_never_wrote_are_not_observable_never_failing_nor_divergent(face_sweep):
    results = json.loads((face_sweep / "report" / "results.json").read_text())
    gpu = next(r for r in results["runs"] if r["role"] != "reference")
    with DumpFile(_h5(face_sweep, "gpu")) as dump:
        header = dump.provenance["raw_header"]
    hidden = header["not_observable"]
    assert len(hidden) == 10 and {e["op_type"] for e in hidden} == {"PAD"}
    assert {(e["state"], e["evidence"]) for e in hidden} == {("never_written", "sentinel")}
    assert header["observability"]["checked_by"] == "sentinel" and header["observability"]["indirect"] is True
    assert gpu["observability"]["not_observable"] == {"never_written": 10}
    keys = {e["key"] for e in hidden}
    # numpy, outside the analyzer: on the CPU those tensors are real values (finite, not all zero), so a
    # sentinel taken for a value would have failed every one of them
    with DumpFile(_h5(face_sweep, "cpu")) as cpu:
        for key in keys:
            values = cpu.tensor_by_key(key)
            assert np.isfinite(values).all() and np.abs(values).max() > 0, key
    unmatched = {u["key"]: u["why"] for u in gpu["unmatched"]["only_in_reference"]}
    assert set(unmatched) == keys
    assert all(why.startswith("not observable on this backend: never written in this run") for why in unmatched.values())
    layers = {layer["key"]: layer for layer in gpu["layers"]}
    assert not keys & {k for k, layer in layers.items() if layer["status"] in ("pass", "warn", "fail")}
    assert gpu["verdict"] == "pass" and gpu["first_divergence"] is None
    named = {f["layer"] for f in results["findings"] if f["kind"] in ("first_divergence", "nondeterminism", "failure_source")}
    assert not named & keys


def test_the_analyzer_reads_the_record_not_the_engine_name(face_sweep, tmp_path):
    """The same dumps with the engine renamed everywhere the files name it: the same layers are not observable."""
    files = []
    for backend in ("cpu", "gpu"):
        copy = tmp_path / _h5(face_sweep, backend).name
        shutil.copy(_h5(face_sweep, backend), copy)
        with h5py.File(copy, "r+") as f:
            f.attrs["engine"] = "acme"
            provenance = json.loads(f.attrs["provenance"])
            provenance["raw_header"]["engine"] = "acme"
            provenance["raw_header"]["harness"] = "acme-harness 1.0"
            f.attrs["provenance"] = json.dumps(provenance)
        files.append(copy)
    results = analyze(tmp_path / "report", *files)
    gpu = next(r for r in results["runs"] if r["role"] != "reference")
    assert gpu["provenance"]["engine"] == "acme"
    whys = [u["why"] for u in gpu["unmatched"]["only_in_reference"]]
    assert len(whys) == 10 and all(w.startswith("not observable on this backend: never written") for w in whys)
    assert gpu["verdict"] == "pass"


def test_litert_cpu_checks_every_activation_with_a_sentinel_without_changing_the_run(tmp_path):
    """The CPU interpreter's activations are filled with a sentinel before the run; every one was written, and
    the dumped outputs are those of the interpreter run plainly (bit for bit)."""
    np.save(tmp_path / "x.npy", image_input((1, 128, 128, 3)))
    proc = engine_run("litert", tmp_path / "out", "--model", str(tflite_model(FACE)), "--input", f"input={tmp_path / 'x.npy'}",
                      "--backend", "cpu", "--precision", "normal")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dump = read_raw_dump(tmp_path / "out")
    record = dump.footer["observability"]
    assert record["checked_by"] == "sentinel" and record["indirect"] is False and record["not_observable"] == {}
    assert dump.footer["not_observable"] == []
    values = {t.name: a for t, a in dump.iter_arrays()}
    assert len(values) == 90 and all(np.isfinite(a).all() for a in values.values())  # no sentinel (NaN) left
    assert dump.footer["plain_run"]["identical"] is True


def test_the_sentinel_leaves_tensors_tflite_computes_when_preparing_alone(tmp_path):
    """Basic Pitch's TFLite model reshapes by a SHAPE it takes of an activation: TFLite computes that once, when the
    model is prepared, so a sentinel written there would reach the RESHAPE. Those tensors are not filled, every
    activation is written, and the outputs are those of LiteRT's own interpreter (builtin kernels, as at `high`),
    bit for bit."""
    import importlib.metadata

    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from layerdiff.collector.engines.litert import cpu
    from layerdiff.collector.engines.litert.graph import load_graph

    try:
        model = Path(importlib.metadata.distribution("basic-pitch").locate_file("basic_pitch/saved_models/icassp_2022/nmp.tflite"))
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("basic-pitch is not installed (tests/corpus-wheels.txt)")
    graph = load_graph(model.read_bytes(), str(model))
    assert {graph.ops[i].op_type for i in range(len(graph.ops))} >= {"SHAPE", "RESHAPE"} and cpu.prepared_tensors(graph)
    audio = (np.random.default_rng(0).random((1, 43844, 1)) * 0.2 - 0.1).astype(np.float32)
    np.save(tmp_path / "audio.npy", audio)
    proc = engine_run("litert", tmp_path / "out", "--model", str(model), "--input", f"serving_default_input_2:0={tmp_path / 'audio.npy'}",
                      "--backend", "cpu", "--precision", "high")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dump = read_raw_dump(tmp_path / "out")
    assert dump.footer["observability"]["not_observable"] == {} and dump.footer["not_observable"] == []
    plain = Interpreter(model_path=str(model), experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    plain.allocate_tensors()
    plain.set_tensor(plain.get_input_details()[0]["index"], audio)
    plain.invoke()
    dumped = {t.name: a for t, a in dump.iter_arrays()}
    for detail in plain.get_output_details():
        assert dumped[detail["name"]].tobytes() == plain.get_tensor(detail["index"]).tobytes(), detail["name"]


@pytest.mark.parametrize("model, engine, backend", [
    (("convnet.mnn",), "mnn", "cpu"),
    (("convnet.param", "convnet.bin"), "ncnn", "cpu"),
    (("convnet.param", "convnet.bin"), "ncnn", "vulkan"),
])
def test_engines_that_read_each_tensor_from_its_op_record_why_it_was_written(tmp_path, model, engine, backend):
    files = [SAMPLES / "models" / f for f in model]
    proc = collect(tmp_path, files[0], "--backend", backend, "--precision", "high,low",
                   "--input", f"data={SAMPLES / 'inputs' / 'convnet.npy'}")
    if engine == "ncnn" and backend == "vulkan" and "no Vulkan device" in proc.stdout + proc.stderr:
        pytest.skip("no Vulkan device (lavapipe)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    h5 = sorted(tmp_path.glob(f"{engine}_{backend}_*.h5"))[0]
    with DumpFile(h5) as dump:
        record = json.loads(dump.attrs["observability"])
    assert record["checked_by"] == "direct_read" and record["state"] == "written" and record["indirect"] is False
    from layerdiff.collector.engines import ENGINES

    assert record["written"] == ENGINES[engine].written_why(backend) != ""
    results = json.loads((tmp_path / "report" / "results.json").read_text())  # collect's own report
    assert [run["observability"] for run in results["runs"]] == [record, record]


def _vulkan_fp16(icd: str) -> tuple[bool, bool]:
    """shaderFloat16 and storageBuffer16BitAccess as vulkaninfo reports them under this driver (the test's own read)."""
    text = subprocess.run(["vulkaninfo"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "VK_ICD_FILENAMES": icd}).stdout
    flags = [re.search(rf"\b{name}\s*=\s*(true|false)", text) for name in ("shaderFloat16", "storageBuffer16BitAccess")]
    if not all(flags):
        pytest.skip(f"vulkaninfo gives no 16-bit features under {icd}")
    return flags[0].group(1) == "true", flags[1].group(1) == "true"


def test_litert_gpu_records_the_precision_the_device_computes(tmp_path):
    """fp16 is recorded only where the device offers it: SwiftShader has no shaderFloat16, so a normal-precision run
    records fp32 with the driver's own flags; a driver that has both flags (lavapipe) makes the same run fp16."""
    gpu_available()
    from layerdiff.collector.engines.litert import gpu

    icd, _ = gpu.vulkan_icd()
    np.save(tmp_path / "x.npy", image_input((1, 128, 128, 3)))
    proc = engine_run("litert", tmp_path / "out", "--model", str(tflite_model(FACE)), "--input", f"input={tmp_path / 'x.npy'}",
                      "--backend", "gpu", "--precision", "normal")
    assert proc.returncode == 0, proc.stderr[-2000:]
    header = read_raw_dump(tmp_path / "out").header
    arith, storage = _vulkan_fp16(icd)
    features = header["options"]["device_fp16"]
    assert (features["shaderFloat16"], features["storageBuffer16BitAccess"]) == (arith, storage)
    assert header["precision_effective"] == ("fp16" if arith and storage else "fp32")
    assert "shaderFloat16 = false" in header["options"]["precision_why"] or header["precision_effective"] == "fp16"
    lavapipe = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")
    if not lavapipe.is_file():
        pytest.skip("lavapipe (mesa-vulkan-drivers) is not installed here")
    arith, storage = _vulkan_fp16(str(lavapipe))
    effective, why = gpu.effective_precision(gpu.device_fp16(str(lavapipe)), enforce_f32=False)
    assert effective == ("fp16" if arith and storage else "fp32"), why
    assert gpu.effective_precision(gpu.device_fp16(str(lavapipe)), enforce_f32=True)[0] == "fp32"


def _same_bytes(path: Path) -> dict[str, set[str]]:
    """key -> the other keys of the same run holding exactly its bytes (numpy, outside the analyzer); tensors of
    one repeated value (all zeros) are left out: equal bytes there say nothing about a buffer."""
    groups: dict[tuple, list[str]] = {}
    with DumpFile(path) as dump:
        for key in dump.layers["key"]:
            array = np.ascontiguousarray(dump.tensor_by_key(key))
            if array.size < 2 or np.all(array.reshape(-1) == array.reshape(-1)[0]):
                continue
            groups.setdefault((array.dtype.str, array.shape, hash(array.tobytes())), []).append(key)
    return {k: set(keys) - {k} for keys in groups.values() if len(keys) > 1 for k in keys}


def _stale_candidates(run: Path, reference: Path) -> list[tuple[str, str]]:
    """Pairs of tensors with the same bytes in the run whose counterparts (same key) in the reference differ."""
    ours, theirs = _same_bytes(run), _same_bytes(reference)
    with DumpFile(reference) as dump:
        present = set(dump.layers["key"])
    return [(k, other) for k, others in ours.items() for other in others
            if k in present and other in present and other not in theirs.get(k, set())]


@pytest.fixture(scope="module")
def ocr_cls(tmp_path_factory):
    from tests.corpus import MODELS, convert_corpus

    work = tmp_path_factory.mktemp("corpus")
    return convert_corpus(work, [m for m in MODELS if m.stem == "ocr_cls"])["ocr_cls"]


def test_mnn_and_ncnn_dumps_hold_no_stale_candidate(ocr_cls, tmp_path):
    """The engines declared `written` hold up on a real network: no two tensors of an MNN run (against the ONNX
    Runtime golden) or of an ncnn Vulkan run (against ncnn on the CPU) share their bytes where the reference's differ."""
    proc = collect(tmp_path / "mnn", ocr_cls.mnn, "--input", str(ocr_cls.inputs), "--precision", "high")
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = collect(tmp_path / "ort", ocr_cls.onnx, "--input", str(ocr_cls.inputs))
    assert proc.returncode == 0, proc.stderr[-2000:]
    [mnn], [ort] = sorted((tmp_path / "mnn").glob("*.h5")), sorted((tmp_path / "ort").glob("*.h5"))
    assert _same_bytes(mnn)  # MNN's own copies (a HardSigmoid's BinaryOp) share bytes: the check looks at pairs
    assert _stale_candidates(mnn, ort) == []
    proc = collect(tmp_path / "ncnn", ocr_cls.ncnn, "--input", str(ocr_cls.ncnn_inputs), "--backend", "cpu,vulkan",
                   "--precision", "high")
    if "no Vulkan device" in proc.stdout + proc.stderr:
        pytest.skip("no Vulkan device (lavapipe)")
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    [cpu], [vulkan] = sorted((tmp_path / "ncnn").glob("ncnn_cpu_*.h5")), sorted((tmp_path / "ncnn").glob("ncnn_vulkan_*.h5"))
    assert _same_bytes(vulkan)  # ncnn's Split copies share their input's bytes, on both backends
    assert _stale_candidates(vulkan, cpu) == []
