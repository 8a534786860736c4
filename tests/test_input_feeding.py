"""Inputs are fed as the model declares them, and every run records what its engine received.

Each engine's harness reads its input back from the engine's own input tensor after feeding it (the
raw dump's `input_fed` record); these tests check that read-back against the array given, on an NHWC
model (mediapipe's .tflite files, and their MNN conversions) and an NCHW one (PP-OCR's ONNX
classifier and its conversions). The verdict check runs the engines' own Python APIs here, fed by
hand in the model's layout, and judges MNN against LiteRT with numpy.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from layerdiff.analyzer.formats.rawdump import convert_raw_dump, read_raw_dump
from layerdiff.errors import ConversionError
from layerdiff.samples.onnx_emit import convert_many
from tests.corpus import MODELS, cls_inputs, convert_with_pnnx, copy_paddle_model, PADDLE_MODELS, wheel_file
from tests.litert_models import image_input, tflite_model

OCR_CLS = next(m for m in MODELS if m.stem == "ocr_cls")


def harness(engine: str, *args: str) -> subprocess.CompletedProcess:
    module = f"layerdiff.collector.engines.{engine}.engine"
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=600)


def run_raw(engine: str, tmp: Path, models: list[Path], inputs: dict[str, np.ndarray], tag: str = ""):
    """The engine's harness command line in a child process (as the local device runs it); its raw dump."""
    argv = []
    for model in models:
        argv += ["--model", str(model)]
    for k, (name, array) in enumerate(inputs.items()):
        np.save(tmp / f"{engine}{tag}_in{k}.npy", array)
        argv += ["--input", f"{name}={tmp / f'{engine}{tag}_in{k}.npy'}"]
    out = tmp / f"{engine}{tag}-{models[0].stem}-raw"
    proc = harness(engine, *argv, "--backend", "cpu", "--precision", "high", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return read_raw_dump(out)


def fed_arrays(dump) -> dict[str, tuple[np.ndarray, str, tuple[int, ...]]]:
    return {f.name: (dump.read_fed(f), f.layout, f.axes) for f in dump.fed}


def assert_fed_as_given(dump, given: dict[str, np.ndarray], layout: str) -> None:
    fed = fed_arrays(dump)
    assert set(fed) == set(given), f"read-back of {sorted(fed)}, inputs given {sorted(given)}"
    for name, array in given.items():
        values, recorded, axes = fed[name]
        assert recorded.startswith(layout), recorded
        np.testing.assert_array_equal(values, np.transpose(array, axes).astype(values.dtype), err_msg=name)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("feeding")


@pytest.fixture(scope="module")
def face(workdir):
    """face_landmark.tflite (NHWC input [1, 192, 192, 3]), its MNN conversion, and an input image."""
    tflite = workdir / "face_landmark.tflite"
    tflite.write_bytes(tflite_model("face_landmark").read_bytes())
    mnn = workdir / "face_landmark.mnn"
    convert_many([(tflite, mnn, False)], source_format="TFLITE")
    return tflite, mnn, {"input_1": image_input((1, 192, 192, 3))}


@pytest.fixture(scope="module")
def ocr_cls(workdir):
    """PP-OCR's direction classifier (NCHW input [1, 3, 48, 192]) as ONNX and as MNN."""
    onnx_path = workdir / "ocr_cls.onnx"
    onnx_path.write_bytes(wheel_file(OCR_CLS).read_bytes())
    mnn = workdir / "ocr_cls.mnn"
    convert_many([(onnx_path, mnn, False)])
    return onnx_path, mnn, cls_inputs()


def litert_outputs(tflite: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    """The model's outputs from a plain LiteRT interpreter (its own API, fed NHWC as it declares)."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(tflite))
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}


def mnn_outputs(mnn: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs from pymnn directly, each input fed in the dimension type MNN declares for
    it (Tensorflow = NHWC for a TFLite-origin model), each output read in its own."""
    import MNN

    interpreter = MNN.Interpreter(str(mnn))
    session = interpreter.createSession({"backend": "CPU", "precision": "high", "numThread": 1})
    for name, array in inputs.items():
        tensor = interpreter.getSessionInput(session, name)
        tensor.copyFrom(MNN.Tensor(array.shape, MNN.Halide_Type_Float, np.ascontiguousarray(array, np.float32),
                                   tensor.getDimensionType()))
    interpreter.runSession(session)
    out = {}
    for name, tensor in interpreter.getSessionOutputAll(session).items():
        host = MNN.Tensor(tensor.getShape(), MNN.Halide_Type_Float, tensor.getDimensionType())
        tensor.copyToHostTensor(host)
        out[name] = np.array(host.getNumpyData(), copy=True).reshape(tensor.getShape())
    return out


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


# --- the read-back equals the input given, per engine -------------------------------------------

def test_mnn_reads_back_an_nhwc_input_as_given(face, workdir):
    _, mnn, given = face
    assert_fed_as_given(run_raw("mnn", workdir, [mnn], given), given, "NHWC (MNN NHWC)")


def test_mnn_reads_back_an_nchw_input_as_given(ocr_cls, workdir):
    _, mnn, given = ocr_cls
    assert_fed_as_given(run_raw("mnn", workdir, [mnn], given), given, "NCHW (MNN NCHW)")


def test_litert_reads_back_an_nhwc_input_as_given(face, workdir):
    tflite, _, given = face
    assert_fed_as_given(run_raw("litert", workdir, [tflite], given), given, "NHWC")


def test_onnxruntime_records_the_nchw_array_it_was_handed(ocr_cls, workdir):
    onnx_path, _, given = ocr_cls
    assert_fed_as_given(run_raw("ort", workdir, [onnx_path], given), given, "NCHW")


def test_ncnn_reads_back_the_mat_it_was_fed(ocr_cls, workdir):
    onnx_path, _, given = ocr_cls
    pnnx_dir = workdir / "pnnx"
    pnnx_dir.mkdir(exist_ok=True)
    (pnnx_dir / onnx_path.name).write_bytes(onnx_path.read_bytes())
    param = convert_with_pnnx(pnnx_dir / onnx_path.name, OCR_CLS.pnnx_shapes, pnnx_dir)
    renamed = {"in0": given["x"]}
    dump = run_raw("ncnn", workdir, [param, param.with_suffix(".bin")], renamed)
    assert_fed_as_given(dump, renamed, "NCHW (ncnn dims 3)")


def test_paddle_records_the_nchw_array_it_was_handed(workdir):
    program = copy_paddle_model(PADDLE_MODELS["ocr_cls"], workdir / "paddle")
    given = cls_inputs()
    dump = run_raw("paddle", workdir, [program, program.with_suffix(".pdiparams")], given)
    assert_fed_as_given(dump, given, "NCHW")


# --- the verdict: MNN fed correctly agrees with LiteRT, and layerdiff's run is that run ------------

def test_mnn_fed_in_the_models_layout_agrees_with_litert(face):
    """Judged here with numpy: both engines' own APIs, each fed the image the way its model declares."""
    tflite, mnn, given = face
    reference = litert_outputs(tflite, given["input_1"])
    ours = mnn_outputs(mnn, given)
    for name, value in reference.items():
        assert rel_l2(ours[name], value) < 1e-4, (name, rel_l2(ours[name], value))
    assert abs(float(reference["conv2d_31"].ravel()[0])) > 1  # the face-presence logit: a real answer


def test_collect_of_a_tflite_origin_mnn_model_gives_mnn_fed_correctly(face, workdir):
    import layerdiff

    _, mnn, given = face
    np.save(workdir / "face_image.npy", given["input_1"])
    result = layerdiff.collect(mnn, inputs=[f"input_1={workdir / 'face_image.npy'}"], out=workdir / "collected")
    assert result.exit_code == 0, result.sweep.failed
    [path] = result.paths
    expected = mnn_outputs(mnn, given)
    with h5py.File(path) as f:
        assert f.attrs["input_fed_check"] == "equal"
        fed = f["inputs_fed/0"]
        assert fed.attrs["layout"] == "NHWC (MNN NHWC)"
        np.testing.assert_array_equal(fed[()], given["input_1"])
        layers = {row["name"].decode(): row["order"] for row in f["layers"][()]}
        for name, value in expected.items():
            dumped = f[f"tensors/{layers[name]}"][()]
            np.testing.assert_allclose(dumped.reshape(value.shape), value, rtol=1e-5, atol=1e-5, err_msg=name)


def test_an_input_the_engine_received_otherwise_is_said_in_one_line(face, workdir):
    """The same raw dump converted against a channels-first copy of the image: the check names it."""
    _, mnn, given = face
    dump = run_raw("mnn", workdir, [mnn], given, tag="check")
    scrambled = given["input_1"].reshape(1, 3, 192, 192).transpose(0, 2, 3, 1)
    out = convert_raw_dump(dump, workdir / "scrambled.h5", inputs=[("input_1", scrambled)])
    with h5py.File(out) as f:
        line = f.attrs["input_fed_check"]
    assert line.startswith("input 'input_1': the engine computed on other values than the input given")
    assert "\n" not in line and "NHWC (MNN NHWC)" in line
    import layerdiff

    fed_right = convert_raw_dump(dump, workdir / "fed_right.h5", inputs=[("input_1", given["input_1"])])
    with layerdiff.analyze([fed_right, out], ref=fed_right) as results:
        said = [p for p in results.problems if "the engine computed on other values" in p]
    assert len(said) == 1 and said[0].endswith(line), results.problems


# --- refusals name their cause ---------------------------------------------------------------------

def test_mnn_converter_refusal_is_a_failed_conversion_naming_the_operator(workdir):
    sparse = workdir / "face_detection_full_range_sparse.tflite"
    sparse.write_bytes(tflite_model("face_detection_full_range_sparse").read_bytes())
    with pytest.raises(ConversionError, match=r"does not support: DENSIFY"):
        convert_many([(sparse, workdir / "sparse.mnn", False)], source_format="TFLITE")
    assert not (workdir / "sparse.mnn").exists()


def where_model(path: Path) -> Path:
    """A small ONNX graph with Where and ReduceMax: pnnx converts ReduceMax and leaves Greater / Where
    as PyTorch operators (`torch.gt`, `torch.where`) in the ncnn .param it writes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Greater", ["r", "zero"], ["m"]),
             helper.make_node("Where", ["m", "r", "x"], ["w"]),
             helper.make_node("ReduceMax", ["w"], ["y"], axes=[1], keepdims=1)]
    graph = helper.make_graph(nodes, "where", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.zeros((1,), np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # the ONNX Runtime inside pnnx reads IR 8
    onnx.save(model, path)
    return path


def test_ncnn_refusal_names_the_layer_types_pnnx_left_unconverted(workdir):
    pnnx_dir = workdir / "pnnx-where"
    pnnx_dir.mkdir()
    param = convert_with_pnnx(where_model(pnnx_dir / "where.onnx"), "[1,3,8,8]f32", pnnx_dir)
    assert "torch.where" in param.read_text()  # pnnx's own output, not written here
    np.save(workdir / "where_in.npy", np.ones((1, 3, 8, 8), np.float32))
    proc = harness("ncnn", "--model", str(param), "--model", str(param.with_suffix(".bin")),
                   "--input", f"in0={workdir / 'where_in.npy'}", "--out", str(workdir / "where-raw"))
    assert proc.returncode == 3
    [line] = proc.stderr.strip().splitlines()[-1:]
    assert "ncnn does not know the layer type(s) torch.gt, torch.where" in line, line
    assert "could not parse" not in line


def test_litert_gpu_refusal_keeps_its_reasons(workdir):
    """face_landmark_with_attention has mediapipe custom ops no LiteRT kernel implements: the GPU
    accelerator's refusal says so, not just the source location of its first line."""
    from layerdiff.collector.engines.litert import gpu

    if not gpu.availability()["ok"]:
        pytest.skip(f"no WebGPU adapter here: {gpu.availability().get('reason')}")
    np.save(workdir / "attention_in.npy", image_input((1, 192, 192, 3)))
    proc = harness("litert", "--model", str(tflite_model("face_landmark_with_attention")), "--backend", "gpu",
                   "--input", f"input_1={workdir / 'attention_in.npy'}", "--out", str(workdir / "attention-raw"))
    assert proc.returncode == 4
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("layerdiff-harness: LiteRT's GPU accelerator cannot compile the model (")
    assert "Failed to modify graph with delegate" in line and "unresolved custom op: Landmarks2TransformMatrix" in line
    assert "litert_compiled_model.h" not in line


# --- a free batch dimension is fed with batch 1, or refused in one line ------------------------------

def free_batch_tflite(path: Path) -> Path:
    """face_landmark with its input's batch declared free (shape_signature [-1, 192, 192, 3]), as a
    converter exporting a dynamic batch writes it."""
    import flatbuffers

    from layerdiff.collector.engines.litert.graph import TFLITE_IDENTIFIER, _schema

    data = tflite_model("face_landmark").read_bytes()
    schema = _schema()
    model = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)
    tensor = model.subgraphs[0].tensors[model.subgraphs[0].inputs[0]]
    tensor.shapeSignature = [-1, *[int(d) for d in tensor.shape[1:]]]
    builder = flatbuffers.Builder(len(data) + 4096)
    builder.Finish(model.Pack(builder), file_identifier=TFLITE_IDENTIFIER)
    path.write_bytes(bytes(builder.Output()))
    return path


def test_a_free_batch_is_fed_as_batch_one(workdir):
    import layerdiff

    model = free_batch_tflite(workdir / "free_batch.tflite")
    from layerdiff.collector.engines import ENGINES

    assert ENGINES["litert"].input_specs(model)["input_1"][0] == (-1, 192, 192, 3)
    image = image_input((1, 192, 192, 3))[0]
    np.save(workdir / "hwc.npy", image)  # no batch axis at all
    for spec in ("random", f"input_1={workdir / 'hwc.npy'}"):
        result = layerdiff.collect(model, inputs=[spec], out=workdir / f"free-{spec[:6]}")
        assert result.exit_code == 0, result.sweep.failed
        [path] = result.paths
        with h5py.File(path) as f:
            assert f["inputs_fed/0"].shape == (1, 192, 192, 3) and f.attrs["input_fed_check"] == "equal"
            if spec != "random":
                np.testing.assert_array_equal(f["inputs_fed/0"][()][0], image)


def test_free_sizes_besides_the_batch_are_refused_in_one_line(ocr_cls, workdir):
    import layerdiff
    from layerdiff.errors import InputError

    onnx_path, _, _ = ocr_cls  # declares x as [-1, 3, -1, -1]: batch, height and width free
    with pytest.raises(InputError) as refused:
        layerdiff.collect(onnx_path, inputs=["random"], out=workdir / "free-ocr")
    assert str(refused.value) == ("model input 'x' has an unknown size [-1, 3, -1, -1]; pass --shape x=1x3xHxW "
                                  "(its real sizes) or --input with a .npy")


# --- the arm64 device and the local one name a model's tensors the same way ---------------------------

def test_arm64_and_local_mnn_dumps_key_tensors_alike(workdir):
    """pose_landmark_full converted to MNN: its conversion swaps names (the convolution op `Identity_3`
    writes `Identity_3__before_tr`, the transpose after it writes the output `Identity_3`); both devices
    key every tensor by the tensor it is, feed the image NHWC, and give the same outputs (dumped in the
    graph's NCHW order, as the C++ harness dumps them: NHWC tensors are measured after a transpose)."""
    import layerdiff

    tflite = workdir / "pose_landmark_full.tflite"
    tflite.write_bytes(tflite_model("pose_landmark_full").read_bytes())
    mnn = workdir / "pose_landmark_full.mnn"
    convert_many([(tflite, mnn, False)], source_format="TFLITE")
    np.save(workdir / "pose_image.npy", image_input((1, 256, 256, 3)))
    result = layerdiff.collect(mnn, devices=["local", "arm64"], inputs=[f"input_1={workdir / 'pose_image.npy'}"],
                               out=workdir / "pose-devices")
    assert result.exit_code == 0, result.sweep.failed
    tables = {}
    for path in result.paths:
        with h5py.File(path) as f:
            assert f.attrs["input_fed_check"] == "equal"
            rows = f["layers"][()]
            tables[f.attrs["device_serial"]] = {r["name"].decode(): (r["op_type"].decode(), r["shape"].decode(),
                                                                     f[f"tensors/{r['order']}"][()]) for r in rows}
    local, arm = tables["local"], tables["arm64"]
    assert set(local) == set(arm)
    assert local["Identity_3"][:2] == arm["Identity_3"][:2] == ("Output", "[1, 39, 64, 64]")
    assert local["Identity_3__before_tr"][:2] == ("Convolution", "[1, 39, 64, 64]")
    expected = mnn_outputs(mnn, {"input_1": np.load(workdir / "pose_image.npy")})
    for name, value in expected.items():  # the ARM kernels round otherwise: the pose flag (~8e-9) moves 6e-4
        for table, tolerance in ((local, 1e-4), (arm, 2e-3)):
            dumped = table[name][2]
            nchw = value.transpose(0, 3, 1, 2) if value.ndim == 4 and dumped.shape != value.shape else value
            assert rel_l2(dumped.reshape(nchw.shape), nchw) < tolerance, name


# --- the C++ harness (phones; built here for the host with ncnn) ---------------------------------------

def test_cpp_harness_ncnn_records_the_mat_it_fed(ocr_cls, workdir):
    from tests.test_harness_support import host_harness

    onnx_path, _, given = ocr_cls
    pnnx_dir = workdir / "pnnx-cpp"
    pnnx_dir.mkdir()
    (pnnx_dir / onnx_path.name).write_bytes(onnx_path.read_bytes())
    param = convert_with_pnnx(pnnx_dir / onnx_path.name, OCR_CLS.pnnx_shapes, pnnx_dir)
    np.save(workdir / "cpp_in.npy", given["x"])
    out = workdir / "cpp-ncnn-raw"
    proc = subprocess.run([str(host_harness()), "--engine", "ncnn", "--model", str(param), "--model",
                           str(param.with_suffix(".bin")), "--input", f"in0={workdir / 'cpp_in.npy'}", "--backend", "cpu",
                           "--precision", "high", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_fed_as_given(read_raw_dump(out), {"in0": given["x"]}, "NCHW (ncnn dims 3)")


def test_cpp_harness_ncnn_refusal_names_unknown_layer_types(workdir):
    from tests.test_harness_support import host_harness

    pnnx_dir = workdir / "pnnx-where-cpp"
    pnnx_dir.mkdir()
    param = convert_with_pnnx(where_model(pnnx_dir / "where.onnx"), "[1,3,8,8]f32", pnnx_dir)
    np.save(workdir / "where_cpp_in.npy", np.ones((1, 3, 8, 8), np.float32))
    proc = subprocess.run([str(host_harness()), "--engine", "ncnn", "--model", str(param), "--model",
                           str(param.with_suffix(".bin")), "--input", f"in0={workdir / 'where_cpp_in.npy'}",
                           "--backend", "cpu", "--precision", "high", "--out", str(workdir / "where-cpp-raw")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3
    line = proc.stderr.strip().splitlines()[-1]
    assert "ncnn does not know the layer type(s) torch.gt, torch.where" in line, line
