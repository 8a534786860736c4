"""`collect repro`: a failing ncnn layer as a bundle that runs with only the `ncnn` wheel and numpy.

The scenario is the sample `overflow` model on vulkan/low against cpu/high, collected for real; the
analyzer names `block2/amplify` as the failure source (its fp16 accumulation overflows). The bundle's
runner is executed in a fresh venv holding only `ncnn` (the version pyproject.toml pins) and numpy.
"""
from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.samples.catalog import stored_network
from tests.conftest import MODELS, SAMPLES
from tests.repro_support import bare_venv, pin, run_bundle
from tests.test_collect_cli import collect

LAYER = "block2/amplify"
RUN_H5, REF_H5 = "ncnn_vulkan_low_overflow.h5", "ncnn_cpu_high_overflow.h5"


def _ncnn_pin() -> str:
    return pin("ncnn", "ncnn")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """vulkan/low and cpu/high of the overflow sample, with the analyzer's report."""
    out = tmp_path_factory.mktemp("repro") / "runs"
    done = collect("--device", "local", "--model", MODELS / "overflow.param", "--config", "cpu/high,vulkan/low",
                   "--input", SAMPLES / "inputs" / "overflow.npy", "-o", out)
    assert done.returncode == 0, done.stderr
    assert (out / "report" / "results.json").is_file()
    return out


@pytest.fixture(scope="module")
def bundle(runs) -> Path:
    """The bundle of the failure source the report names."""
    target = runs.parent / "bundle"
    done = collect("repro", "--model", MODELS / "overflow.param", "--from-report", runs / "report", "-o", target)
    assert done.returncode == 0, done.stderr
    assert LAYER in done.stderr
    return target


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A venv without system site-packages holding only the pinned `ncnn` wheel and numpy."""
    return bare_venv(tmp_path_factory.mktemp("bare") / "venv", _ncnn_pin(), "numpy")


def _conv3x3(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """A 3x3, stride 1, pad 1 convolution in float64 (NCHW, batch 1)."""
    x = np.pad(x[0].astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    c_out, _, kh, kw = weight.shape
    h, w = x.shape[1] - 2, x.shape[2] - 2
    out = np.zeros((c_out, h, w))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("oc,chw->ohw", weight[:, :, i, j].astype(np.float64), x[:, i:i + h, j:j + w])
    return (out + bias[:, None, None])[None]


def test_bundle_holds_the_layer_as_an_ncnn_model_with_the_reference_tensors(bundle, runs):
    spec = json.loads((bundle / "repro.json").read_text())
    assert spec["layer"] == LAYER and spec["layers"] == [LAYER]
    lines = (bundle / "model" / "repro.param").read_text().splitlines()
    assert lines[0] == "7767517" and lines[1] == "2 2"
    assert lines[2] == "Input block1/add 0 1 block1/add 2=8 1=16 0=16"
    assert lines[3].split()[:2] == ["Convolution", LAYER]

    # the weights cut from the .bin are the sample's own, judged against the network definition
    layer = stored_network("overflow").layer(LAYER)
    raw = (bundle / "model" / "repro.bin").read_bytes()
    assert len(raw) == 4 + layer.weights["weight"].size * 4 + layer.weights["bias"].size * 4
    assert raw[:4] == b"\0\0\0\0"
    weight = np.frombuffer(raw[4:4 + layer.weights["weight"].size * 4], "<f4").reshape(layer.weights["weight"].shape)
    np.testing.assert_array_equal(weight, layer.weights["weight"].astype(np.float32))

    table = json.loads((bundle / "tensors.json").read_text())
    with DumpFile(runs / REF_H5) as ref, DumpFile(runs / RUN_H5) as run:
        add, amplify, failed = ref.tensor_by_key("block1/add:0"), ref.tensor_by_key(f"{LAYER}:0"), run.tensor_by_key(f"{LAYER}:0")
    for path, info in table.items():
        array = np.load(bundle / info["npy"])
        assert np.frombuffer((bundle / path).read_bytes(), "<f4").reshape(info["shape"]).tobytes() == array.tobytes()
    np.testing.assert_array_equal(np.load(bundle / spec["inputs"][0]["npy"]), add)
    np.testing.assert_array_equal(np.load(bundle / spec["outputs"][0]["reference_npy"]), amplify)
    np.testing.assert_array_equal(np.load(bundle / spec["outputs"][0]["run_npy"]), failed)
    recorded = spec["outputs"][0]["recorded_error"]
    assert recorded["nan"] == int(np.isnan(failed).sum()) and recorded["nan"] + recorded["pos_inf"] + recorded["neg_inf"] > 0

    # the reference output is the convolution of the reference input with those weights
    expected = _conv3x3(add, layer.weights["weight"], layer.weights["bias"])
    assert np.abs(amplify - expected).max() <= 1e-5 * np.abs(expected).max()

    print_ = spec["fingerprint"]["run"]
    assert print_["backend_requested"] == "vulkan" and print_["precision_requested"] == "low"
    assert print_["engine_version"] and print_["gpu"] and print_["options"]["use_fp16_arithmetic"] is True
    assert spec["configs"]["run"]["options"]["use_vulkan_compute"] is True
    assert spec["configs"]["reference"]["options"]["use_vulkan_compute"] is False
    readme = (bundle / "README.md").read_text()
    assert LAYER in readme and "vulkan" in readme and _ncnn_pin() in readme and "python run_repro.py" in readme
    cpp = (bundle / "repro.cpp").read_text()
    assert '#include "net.h"' in cpp and "opt.use_fp16_arithmetic = true;" in cpp and "@" not in cpp

    with zipfile.ZipFile(bundle.with_suffix(".zip")) as archive:
        names = set(archive.namelist())
    on_disk = {f"bundle/{p.relative_to(bundle)}" for p in bundle.rglob("*") if p.is_file()}
    assert on_disk <= names


def test_runner_without_layerdiff_shows_the_overflow_and_the_reference_bit_for_bit(bundle, bare_python):
    result = run_bundle(bare_python, bundle)
    run = result["configs"]["run"]
    assert run["ran"] and (run["backend"], run["precision"]) == ("vulkan", "low")
    error = run["outputs"][LAYER]
    assert error["nan"] + error["pos_inf"] + error["neg_inf"] > 0 and error["reproduces"] is True
    reference = result["configs"]["reference"]["outputs"][LAYER]
    assert reference["bit_identical"] is True and reference["rel_l2"] == 0.0


def test_check_confirms_the_bundle_reproduces_and_says_when_it_does_not(bundle, tmp_path):
    done = collect("repro", "--check", bundle)
    assert done.returncode == 0, done.stderr
    assert "still reproduces" in done.stderr and "bit for bit" in done.stderr

    # the same layer under the reference's own options cannot fail: the check says so and exits 1
    tamed = tmp_path / "tamed"
    subprocess.run(["cp", "-r", str(bundle), str(tamed)], check=True)
    spec = json.loads((tamed / "repro.json").read_text())
    spec["configs"]["run"] = spec["configs"]["reference"]
    (tamed / "repro.json").write_text(json.dumps(spec))
    done = collect("repro", "--check", tamed)
    assert done.returncode == 1 and "does not reproduce" in done.stderr


def test_a_range_bundles_the_island_and_names_the_tensors_it_reads(runs, tmp_path, bare_python):
    target = tmp_path / "island"
    done = collect("repro", "--model", MODELS / "overflow.param", "--run", runs / RUN_H5, "--ref", runs / REF_H5,
                   "--layer", f"{LAYER}..block2/shrink", "-o", target)
    assert done.returncode == 0, done.stderr
    spec = json.loads((target / "repro.json").read_text())
    assert spec["layers"] == [LAYER, "block2/shrink"] and [i["blob"] for i in spec["inputs"]] == ["block1/add"]
    result = run_bundle(bare_python, target)
    assert result["configs"]["run"]["outputs"]["block2/shrink"]["reproduces"] is True
    with DumpFile(runs / REF_H5) as ref:
        shrink = ref.tensor_by_key("block2/shrink:0")
    assert result["configs"]["reference"]["outputs"]["block2/shrink"]["bit_identical"] is True
    np.testing.assert_array_equal(np.load(target / spec["outputs"][0]["reference_npy"]), shrink)


def test_bad_requests_get_one_line(runs, tmp_path):
    common = ["repro", "--run", runs / RUN_H5, "--ref", runs / REF_H5, "-o", tmp_path / "b"]
    done = collect(*common, "--model", MODELS / "overflow.param", "--layer", "no/such")
    assert done.returncode != 0 and "no layer 'no/such'" in done.stderr and "Traceback" not in done.stderr
    done = collect(*common, "--model", MODELS / "convnet.param", "--layer", LAYER)
    assert done.returncode != 0 and "another model" in done.stderr and "Traceback" not in done.stderr
    done = collect(*common, "--model", MODELS / "overflow.onnx", "--layer", LAYER)  # ONNX is bundled, from its own runs
    assert done.returncode != 0 and "another model" in done.stderr and "Traceback" not in done.stderr
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "overflow.param").write_text((MODELS / "overflow.param").read_text().replace("Convolution      stem/conv",
                                                                                        "Mystery          stem/conv"))
    (odd / "overflow.bin").write_bytes((MODELS / "overflow.bin").read_bytes())
    from layerdiff.collector.engines.ncnn.cut import cut
    from layerdiff.errors import InputError
    with pytest.raises(InputError, match="Mystery"):
        cut(odd / "overflow.param", odd / "overflow.bin", LAYER, LAYER, {"block1/add": (1, 8, 16, 16)})
    done = collect("repro", "--check", tmp_path)
    assert done.returncode != 0 and "not a repro bundle" in done.stderr
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    done = collect(*common[:-1], occupied, "--model", MODELS / "overflow.param", "--layer", LAYER)
    assert done.returncode != 0 and "not a repro bundle" in done.stderr and (occupied / "notes.txt").is_file()
    report = tmp_path / "report"
    report.mkdir()
    (report / "results.json").write_text('{"runs": {"not": "a list"}}')
    done = collect("repro", "--model", MODELS / "overflow.param", "--from-report", report, "-o", tmp_path / "r")
    assert done.returncode != 0 and "not the analyzer's results" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_cpp_file_builds_against_ncnn_and_shows_the_overflow(bundle, tmp_path):
    """repro.cpp with its CMakeLists.txt against the host ncnn layerdiff builds (Vulkan on; no NDK here)."""
    from layerdiff.collector.engines.ncnn.harness import ncnn_key
    from layerdiff.collector.harness.build import cache_root
    from tests.test_harness_support import HOST_SPEC, host_harness

    host_harness()  # builds (or finds cached) the host ncnn the harness links
    ncnn_dir = cache_root() / "harness" / f"ncnn-{HOST_SPEC.target}-{ncnn_key(HOST_SPEC.target, HOST_SPEC.vulkan, HOST_SPEC.test_build)}" / "lib" / "cmake" / "ncnn"
    build = tmp_path / "build"
    for cmd in (["cmake", "-S", str(bundle), "-B", str(build), f"-Dncnn_DIR={ncnn_dir}", "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(build)]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = subprocess.run([str(build / "repro"), "run"], capture_output=True, text=True, timeout=300, cwd=bundle)
    assert run.returncode == 0, run.stderr
    spec = json.loads((bundle / "repro.json").read_text())
    recorded = spec["outputs"][0]["recorded_error"]
    line = next(x for x in run.stdout.splitlines() if x.startswith(LAYER))
    assert "non-finite" in line and f"NaN {recorded['nan']}," in line
    ref = subprocess.run([str(build / "repro"), "reference"], capture_output=True, text=True, timeout=300, cwd=bundle)
    assert ref.returncode == 0, ref.stderr
    numbers = next(x for x in ref.stdout.splitlines() if x.startswith(LAYER))
    rel_l2 = float(numbers.split("rel L2 ")[1].split(",")[0])
    assert "NaN 0, +Inf 0, -Inf 0" in numbers and rel_l2 < 1e-5  # another build of ncnn: close, maybe not bitwise


@pytest.fixture(scope="module")
def pnnx_models(tmp_path_factory) -> dict:
    """The corpus's real ONNX models converted to ncnn by pnnx, with their inputs by pnnx's names."""
    from tests.corpus import INPUT_MAKERS, MODELS as CORPUS, convert_with_pnnx, wheel_file

    work = tmp_path_factory.mktemp("pnnx")
    out = {}
    for model in CORPUS:
        onnx = work / f"{model.stem}.onnx"
        onnx.write_bytes(wheel_file(model).read_bytes())
        param = convert_with_pnnx(onnx, model.pnnx_shapes, work)
        out[model.stem] = (param, dict(zip(model.ncnn_names, INPUT_MAKERS[model.make_inputs]().values())))
    return out


def _ncnn_fp32_net(param: Path):
    import ncnn

    net = ncnn.Net()
    for flag in ("use_fp16_packed", "use_fp16_storage", "use_fp16_arithmetic", "use_bf16_storage", "use_bf16_packed"):
        if hasattr(net.opt, flag):
            setattr(net.opt, flag, False)
    net.opt.num_threads = 1
    assert net.load_param(str(param)) == 0 and net.load_model(str(param.with_suffix(".bin"))) == 0
    return net


def _extract(net, feeds: dict[str, np.ndarray], blobs: list[str]) -> dict[str, np.ndarray]:
    import ncnn

    ex = net.create_extractor()
    for name, array in feeds.items():
        data = array[0] if array.ndim in (2, 4, 5) and array.shape[0] == 1 else array
        ex.input(name, ncnn.Mat(np.ascontiguousarray(data, dtype=np.float32)).clone())
    out = {}
    for blob in blobs:
        status, mat = ex.extract(blob)
        assert status == 0, blob
        out[blob] = np.array(mat, dtype=np.float32)
    return out


# One layer of every weighted type pnnx writes for the corpus (first of its type in the model).
CORPUS_CUTS = {"ocr_det": ("Convolution", "ConvolutionDepthWise", "Deconvolution", "InnerProduct"),
               "ocr_rec": ("MultiHeadAttention", "Gemm", "InnerProduct"), "vad_lstm": ("LSTM",)}


def test_real_pnnx_models_cut_into_layers_that_compute_what_they_computed_in_the_full_graph(pnnx_models, tmp_path):
    """Each cut layer, fed the full graph's own tensors (pip ncnn, fp32), gives its full-graph output bit for bit."""
    from layerdiff.collector.engines.ncnn.cut import cut, read_param, weight_spans

    compared = []
    for stem, (param, feeds) in pnnx_models.items():
        layers = read_param(param)
        spans = weight_spans(layers, param.with_suffix(".bin").read_bytes(), param)  # ends at the .bin's end
        assert len(spans) == len(layers)
        full = _ncnn_fp32_net(param)
        for kind in CORPUS_CUTS.get(stem, ()):
            layer = next(item for item in layers if item.type == kind)
            blobs = _extract(full, feeds, [*layer.bottoms, *layer.tops])
            shapes = {b: ((1, *a.shape) if a.ndim in (1, 3, 4) else a.shape) for b, a in blobs.items()}
            piece = cut(param, param.with_suffix(".bin"), layer.name, layer.name, shapes)
            folder = tmp_path / f"{stem}_{kind}"
            folder.mkdir()
            (folder / "m.param").write_text(piece.param_text)
            (folder / "m.bin").write_bytes(piece.weights)
            alone = _extract(_ncnn_fp32_net(folder / "m.param"), {b: blobs[b] for b in piece.inputs}, piece.outputs)
            for top in piece.outputs:
                assert alone[top].shape == blobs[top].shape, (stem, kind)
                assert np.array_equal(alone[top], blobs[top]), (stem, kind, np.abs(alone[top] - blobs[top]).max())
                assert np.abs(blobs[top]).max() > 0, (stem, kind)  # a real value, not an all-zero blob
            compared.append(kind)
    assert sorted(compared) == sorted(kind for kinds in CORPUS_CUTS.values() for kind in kinds)


def test_an_mnn_op_bundle_runs_with_only_the_mnn_wheel_and_reproduces_both_runs_bit_for_bit(tmp_path):
    """MNN: the op cut with MNN's expression API; the runner, in a venv with only MNN and numpy, computes the
    reference's and the failing run's own tensors again, bit for bit."""
    runs = tmp_path / "runs"
    done = collect("--device", "local", "--model", MODELS / "overflow.mnn", "--config", "cpu/high,cpu/low",
                   "--input", SAMPLES / "inputs" / "overflow.npy", "-o", runs, "--no-report")
    assert done.returncode == 0, done.stderr
    target = tmp_path / "bundle"
    done = collect("repro", "--model", MODELS / "overflow.mnn", "--run", runs / "mnn_cpu_low_overflow.h5",
                   "--ref", runs / "mnn_cpu_high_overflow.h5", "--layer", f"{LAYER}:0", "-o", target)
    assert done.returncode == 0, done.stderr
    spec = json.loads((target / "repro.json").read_text())
    assert spec["engine"] == "mnn" and spec["model"] == {"mnn": "model/repro.mnn"}
    assert [item["blob"] for item in spec["inputs"]] == ["block1/add"]
    assert "MNN==" in (target / "README.md").read_text() and not (target / "repro.cpp").exists()

    python = bare_venv(tmp_path / "venv", pin("mnn", "MNN"), "numpy")
    result = run_bundle(python, target, "--save", str(tmp_path / "out"))
    assert result["engine_version"] == pin("mnn", "MNN").split("==")[1]
    assert result["configs"]["reference"]["outputs"][LAYER]["bit_identical"] is True
    with DumpFile(runs / "mnn_cpu_low_overflow.h5") as run, DumpFile(runs / "mnn_cpu_high_overflow.h5") as ref:
        failed, expected = run.tensor_by_key(f"{LAYER}:0"), ref.tensor_by_key(f"{LAYER}:0")
    name = spec["outputs"][0]["npy_name"]
    assert np.array_equal(np.load(tmp_path / "out" / "run" / name), failed)
    assert np.array_equal(np.load(tmp_path / "out" / "reference" / name), expected)
    layer = stored_network("overflow").layer(LAYER)
    with DumpFile(runs / "mnn_cpu_high_overflow.h5") as ref:
        add = ref.tensor_by_key("block1/add:0")
    reference = _conv3x3(add, layer.weights["weight"], layer.weights["bias"])
    assert np.abs(expected - reference).max() <= 1e-5 * np.abs(reference).max()

    done = collect("repro", "--model", MODELS / "overflow.mnn", "--run", runs / "mnn_cpu_low_overflow.h5",
                   "--ref", runs / "mnn_cpu_high_overflow.h5", "--layer", f"{LAYER}..block2/shrink", "-o", tmp_path / "r")
    assert done.returncode != 0 and "one op" in done.stderr
