"""The litert engine on real mediapipe models: every activation, in flatbuffer order, never a weight.

Every check is against LiteRT itself run a second, independent way (a plain interpreter without
`preserve_all_tensors`, or the other kernel set), never against the engine's own output.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.rawdump import read_raw_dump
from layerdiff.collector.engines.litert.graph import load_graph
from tests.litert_models import image_input, tflite_model

ENGINE = "layerdiff.collector.engines.litert.engine"


def harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", ENGINE, *args], capture_output=True, text=True, timeout=300)


def collect_raw(tmp: Path, stem: str, backend: str = "cpu", precision: str = "high", *extra: str):
    """Run the engine's harness command line in a child process, as the local device does."""
    model = tflite_model(stem)
    graph = load_graph(model.read_bytes())
    shape = tuple(graph.tensor_shapes[graph.inputs[0]])
    x = image_input(shape)
    np.save(tmp / "x.npy", x)
    out = tmp / f"{stem}-{backend}-{precision}"
    proc = harness("--model", str(model), "--input", f"{graph.name(graph.inputs[0])}={tmp / 'x.npy'}",
                   "--backend", backend, "--precision", precision, "--out", str(out), *extra)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, graph, x


def plain_outputs(model: Path, x: np.ndarray, xnnpack: bool = False) -> dict[str, np.ndarray]:
    """The model's outputs from an ordinary interpreter (nothing preserved)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kernels = OpResolverType.BUILTIN if xnnpack else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    it = Interpreter(model_path=str(model), experimental_op_resolver_type=kernels)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}


@pytest.fixture(scope="module")
def face_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("litert-face")
    return {p: collect_raw(tmp, "face_detection_short_range", "cpu", p) for p in ("high", "normal")}


def test_every_activation_in_flatbuffer_order_and_no_weight(face_runs):
    out, graph, _ = face_runs["high"]
    dump = read_raw_dump(out)
    names = [t.name for t in dump.tensors]
    expected = [graph.name(t) for t in graph.activations()]
    assert names == expected and len(names) == 90  # 164 operators, 74 of them decode weights
    assert not any(name.endswith("_dequantize") for name in names)
    assert not set(graph.weights) & {graph.tensor_names.index(n) for n in names}
    known = set(names) | {graph.name(i) for i in graph.inputs}
    assert all(i in known for t in dump.tensors for i in t.inputs), "every edge names a dumped tensor or a model input"
    assert dump.header["options"]["kernels"] == "builtin" and dump.header["backends_actual"] == ["cpu"]
    assert dump.header["options"]["weight_ops_not_dumped"] == 74


def test_dumped_outputs_equal_a_plain_interpreter_run(face_runs):
    out, graph, x = face_runs["high"]
    dump = read_raw_dump(out)
    by_name = {t.name: a for t, a in dump.iter_arrays()}
    reference = plain_outputs(tflite_model("face_detection_short_range"), x)
    assert set(reference) <= set(by_name)
    for name, value in reference.items():
        np.testing.assert_array_equal(by_name[name], value, err_msg=name)
    assert np.abs(reference["classificators"]).max() > 1  # a real detector output, not a constant


def test_xnnpack_activations_are_computed_not_zeros(face_runs):
    """XNNPACK (precision normal) gives every activation, each close to the builtin kernels' value."""
    high, normal = (read_raw_dump(face_runs[p][0]) for p in ("high", "normal"))
    assert normal.header["options"]["kernels"] == "xnnpack"
    assert [t.name for t in high.tensors] == [t.name for t in normal.tensors]
    worst = 0.0
    for (t, a), (_, b) in zip(high.iter_arrays(), normal.iter_arrays()):
        scale = max(float(np.abs(a).max()), 1e-3)
        worst = max(worst, float(np.abs(a - b).max()) / scale)
        if np.abs(a).max() > 0:
            assert np.abs(b).max() > 0, f"{t.name}: XNNPACK value reads as zeros"
    assert worst < 1e-4


def test_selfie_segmentation_runs_on_xnnpack_and_says_why(tmp_path):
    """Its MediaPipe custom op has no builtin kernel: high runs on XNNPACK, recorded, not hidden."""
    out, graph, x = collect_raw(tmp_path, "selfie_segmentation")
    dump = read_raw_dump(out)
    assert len(dump.tensors) == len(graph.activations()) == 136 and dump.complete
    assert dump.header["options"]["kernels"] == "xnnpack"
    assert "Convolution2DTransposeBias" in dump.header["options"]["kernels_why"]
    mask = dict((t.name, a) for t, a in dump.iter_arrays())[graph.name(graph.outputs[0])]
    reference = next(iter(plain_outputs(tflite_model("selfie_segmentation"), x, xnnpack=True).values()))
    np.testing.assert_array_equal(mask, reference)
    assert 0.01 < float(mask.std()) and 0 <= mask.min() and mask.max() <= 1  # a real mask, not a constant


def test_bad_model_and_bad_backend_are_one_line(tmp_path):
    bad = tmp_path / "broken.tflite"
    bad.write_bytes(b"\x00" * 64)
    np.save(tmp_path / "x.npy", np.zeros((1, 4), np.float32))
    proc = harness("--model", str(bad), "--input", f"x={tmp_path / 'x.npy'}", "--out", str(tmp_path / "o"))
    assert proc.returncode == 3 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "broken.tflite" in proc.stderr and "not a .tflite" in proc.stderr
    proc = harness("--model", str(tflite_model("face_detection_short_range")), "--input", f"x={tmp_path / 'x.npy'}",
                   "--backend", "opencl", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "unknown backend 'opencl' for litert" in proc.stderr, proc.stderr


def test_wrong_input_name_is_one_line(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 128, 128, 3), np.float32))
    proc = harness("--model", str(tflite_model("face_detection_short_range")), "--input", f"pixels={tmp_path / 'x.npy'}",
                   "--out", str(tmp_path / "o"))
    assert proc.returncode == 5 and "has no input 'pixels'" in proc.stderr and "input" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_collect_local_picks_litert_for_tflite(tmp_path):
    from layerdiff.analyzer.formats.dumpfile import DumpFile
    from layerdiff.collector.inputs.modelfiles import input_specs, resolve_model

    model = resolve_model(tflite_model("face_detection_short_range"))
    assert model.engine == "litert"
    assert input_specs(model) == {"input": ((1, 128, 128, 3), "float32")}
    proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--model",
                           str(model.files[0]), "--backend", "cpu", "--precision", "high", "-o", str(tmp_path / "c")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [h5] = sorted((tmp_path / "c").glob("litert_cpu_high_*.h5"))
    with DumpFile(h5) as dump:
        assert dump.attrs["engine"] == "litert" and len(dump.layers) == 90
        assert dump.layers["layout"].iloc[0] == "NHWC"


# ---- the GPU accelerator (WebGPU over Vulkan on SwiftShader, chromium-common) ----

def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(a64), 1e-30))


@pytest.fixture(scope="module")
def face_gpu(tmp_path_factory):
    return collect_raw(tmp_path_factory.mktemp("litert-face-gpu"), "face_detection_short_range", "gpu", "high")


def test_probe_offers_gpu_through_swiftshader():
    import json

    proc = harness("--probe")
    gpu = json.loads(proc.stdout.strip().splitlines()[-1])["engines"]["litert"]["backends"]["gpu"]
    assert gpu["ok"] and gpu["api"] == "WebGPU over Vulkan" and gpu["vulkan_icd"].endswith("vk_swiftshader_icd.json")


def test_gpu_run_is_recorded_as_webgpu_on_vulkan_fp32(face_gpu):
    out, graph, _ = face_gpu
    header = read_raw_dump(out).header
    assert header["backend_requested"] == "gpu" and header["backends_actual"] == ["gpu"]
    assert header["precision_effective"] == "fp32" and "no fp16" in header["options"]["precision_why"]
    placement = header["options"]["placement"]
    assert "SwiftShader" in placement["adapter"] and "backend=Vulkan" in placement["adapter"]
    assert placement["fully_accelerated"] and not placement["split"]
    assert "OpenCL" not in str(header) and "WebGPU" in header["options"]["accelerator"]


def test_gpu_fused_tensors_are_listed_not_dumped_and_the_rest_agree_with_cpu(face_runs, face_gpu):
    """The PADs the GPU fuses are never written: listed as not observable; every written tensor is
    within 1e-4 (rel L2) of the CPU interpreter's value for the same input."""
    out, graph, _ = face_gpu
    gpu = read_raw_dump(out)
    cpu = {t.name: a for t, a in read_raw_dump(face_runs["high"][0]).iter_arrays()}
    hidden = {entry["name"]: entry for entry in gpu.header["not_observable"]}
    assert len(hidden) == 10 and all(e["op_type"] == "PAD" for e in hidden.values())
    assert all("not observable on this backend" in e["why"] for e in hidden.values())
    dumped = {t.name: a for t, a in gpu.iter_arrays()}
    assert not set(hidden) & set(dumped) and set(hidden) | set(dumped) == set(cpu)
    assert all(np.isfinite(cpu[name]).all() for name in hidden)  # real tensors on the CPU, not NaN ones
    worst = max(_rel(cpu[name], value) for name, value in dumped.items())
    assert worst < 1e-4 and all(np.isfinite(v).all() for v in dumped.values())


def test_no_webgpu_adapter_on_lavapipe_is_one_line(tmp_path):
    lavapipe = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")
    if not lavapipe.is_file():
        pytest.skip("lavapipe (mesa-vulkan-drivers) is not installed here")
    np.save(tmp_path / "x.npy", np.zeros((1, 128, 128, 3), np.float32))
    proc = subprocess.run([sys.executable, "-m", ENGINE, "--model", str(tflite_model("face_detection_short_range")),
                           "--input", f"input={tmp_path / 'x.npy'}", "--backend", "gpu", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300, env={**__import__("os").environ,
                                                                             "VK_ICD_FILENAMES": str(lavapipe)})
    assert proc.returncode == 4, proc.stderr[-1500:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("layerdiff-harness: WebGPU found no GPU adapter") and "lvp_icd" in last


def test_pose_detection_gpu_graph_is_split_and_its_output_wrong(tmp_path):
    """DENSIFY is rejected: 108 ops on the GPU, 183 on the CPU, and the output is far from the CPU's."""
    cpu_out, graph, x = collect_raw(tmp_path, "pose_detection", "cpu", "high")
    gpu_out, _, _ = collect_raw(tmp_path, "pose_detection", "gpu", "high")
    gpu = read_raw_dump(gpu_out)
    placement = gpu.header["options"]["placement"]
    assert gpu.header["backends_actual"] == ["gpu", "cpu"] and placement["split"]
    assert (placement["gpu_ops"], placement["cpu_ops"]) == (108, 183) and placement["ops"] == 291
    assert {r["op_type"] for r in placement["rejected"]} == {"DENSIFY", "DEQUANTIZE"}
    assert any("Densify" in r["reason"] for r in placement["rejected"] if r["op_type"] == "DEQUANTIZE")
    # op by op: TFLite's partition rule reproduces the logged 108/183; the first PAD (cut off from the rest
    # by the weights it precedes) and the 182 weight-decoding ops are the CPU's, and the dump says it per tensor
    per_op = placement["per_op"]
    assert per_op["derived"] and len(per_op["cpu"]) == 183
    assert [c["name"] for c in per_op["cpu"] if not c["weight"]] == ["model_1/model/zero_padding2d/Pad"]
    assert {c["op_type"] for c in per_op["cpu"] if c["weight"]} == {"DENSIFY", "DEQUANTIZE"}
    host = [t.name for t, _ in gpu.iter_arrays() if t.memory == "host"]
    assert host == ["model_1/model/zero_padding2d/Pad"]
    assert {t.memory for t, _ in gpu.iter_arrays() if t.name not in host} == {"device"}
    reference = plain_outputs(tflite_model("pose_detection"), x)
    values = {t.name: a for t, a in gpu.iter_arrays()}
    errors = {name: _rel(ref, values[name]) for name, ref in reference.items()}
    assert max(errors.values()) > 0.3, errors  # measured 1 to 2.6: a wrong output, not rounding


def _with_signature(source: Path, target: Path) -> None:
    """The model with a signature whose names are aliases (`pixels`, `out0`, ...), as converters write them."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(source.read_bytes()), 0)
    sub = model.subgraphs[0]

    def entries(indices, prefix):
        out = []
        for k, t in enumerate(indices):
            entry = schema.TensorMapT()
            entry.name, entry.tensorIndex = (b"pixels" if prefix == "in" else f"{prefix}{k}".encode()), int(t)
            out.append(entry)
        return out

    signature = schema.SignatureDefT()
    signature.signatureKey, signature.subgraphIndex = b"serving_default", 0
    signature.inputs, signature.outputs = entries(sub.inputs, "in"), entries(sub.outputs, "out")
    model.signatureDefs = [signature]
    builder = flatbuffers.Builder(1 << 20)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    target.write_bytes(bytes(builder.Output()))


def test_a_signature_with_aliases_is_fed_and_read_by_tensor(tmp_path, face_runs):
    """Signature names differ from tensor names: the GPU run still feeds `input` and dumps every tensor."""
    model = tmp_path / "face_sig.tflite"
    _with_signature(tflite_model("face_detection_short_range"), model)
    _, graph, x = face_runs["high"]
    np.save(tmp_path / "x.npy", x)
    proc = harness("--model", str(model), "--input", f"input={tmp_path / 'x.npy'}", "--backend", "gpu",
                   "--out", str(tmp_path / "gpu"))
    assert proc.returncode == 0, proc.stderr[-1500:]
    dumped = {t.name: a for t, a in read_raw_dump(tmp_path / "gpu").iter_arrays()}
    reference = plain_outputs(tflite_model("face_detection_short_range"), x)
    assert set(reference) <= set(dumped) and len(dumped) == 80
    assert max(_rel(ref, dumped[name]) for name, ref in reference.items()) < 1e-4


def test_partition_rule_reproduces_the_accelerators_counts_only_where_it_holds():
    """The per-op list is claimed only when the rule gives the logged counts; otherwise the dump says why."""
    from layerdiff.collector.engines.litert.placement import per_op

    graph = load_graph(tflite_model("pose_detection").read_bytes())
    derived = per_op(graph, {"DENSIFY", "DEQUANTIZE"}, 108, 183)
    assert derived["derived"] and derived["cpu"][0] == 0 and len(derived["cpu"]) == 183
    wrong = per_op(graph, {"DENSIFY", "DEQUANTIZE"}, 109, 182)
    assert not wrong["derived"] and "108 GPU / 183 CPU" in wrong["why"] and "cpu" not in wrong
    assert not per_op(graph, {"DENSIFY"}, None, None)["derived"]
