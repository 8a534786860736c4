"""The sample models are what every other test trusts, so they are checked against real engines here.

- the generator runs, is byte-for-byte deterministic, and the committed files are what it writes;
- ncnn (CPU and Vulkan/lavapipe) and MNN (CPU) reproduce the independent numpy forward at high
  precision, layer by layer, under the same `<name>:0` keys;
- the overflow model's reference passes fp16's range mid-network and stays finite in fp32, and real
  low-precision arithmetic on the host shows the effects the samples exist to demonstrate.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `samples` is a directory of the repository, not an installed package
    sys.path.insert(0, str(REPO))

from layerdiff.samples import generate as gen# noqa: E402
from layerdiff.samples.catalog import CATALOG, MODELS, input_filename, reference, sample_input  # noqa: E402
from layerdiff.samples.forward import forward  # noqa: E402
from layerdiff.samples.onnx_emit import ConversionError, convert_onnx_to_mnn  # noqa: E402
from layerdiff.samples.ncnn_emit import TAG_FP16, TAG_FP32, float32_to_float16_ncnn, param_text, weight_bytes  # noqa: E402
from layerdiff.samples.ncnn_emit import write_ncnn  # noqa: E402
from layerdiff.samples.netdef import KINDS, Layer, NetBuilder, Network, validate  # noqa: E402
from layerdiff.samples.onnx_emit import write_onnx  # noqa: E402
from layerdiff.samples.runners import compare, run_mnn, run_ncnn  # noqa: E402

FP16_MAX = 65504.0
HIGH_TOLERANCE = 1e-4  # max |engine - reference| / max |reference|, per layer, at precision high
MODEL_DIR = REPO / "samples" / "models"
STEMS = sorted(CATALOG)
RUNS = [(stem, label) for stem in STEMS for label in CATALOG[stem].inputs]


def _has_vulkan() -> bool:
    import ncnn
    return ncnn.get_gpu_count() > 0


needs_vulkan = pytest.mark.skipif(not _has_vulkan(), reason="no Vulkan device (install mesa-vulkan-drivers)")


@pytest.fixture(scope="module")
def references() -> dict[str, dict[str, np.ndarray]]:
    """Reference of each model on its default input, keyed by stem (labelled inputs: `stem[label]`)."""
    refs = {stem: reference(stem) for stem in STEMS}
    refs.update({f"{stem}[{label}]": reference(stem, label) for stem, label in RUNS if label})
    return refs


def _ref(references, stem: str, label: str = "") -> dict[str, np.ndarray]:
    return references[f"{stem}[{label}]" if label else stem]


def _ncnn_files(stem: str) -> tuple[Path, Path]:
    return MODEL_DIR / f"{stem}.param", MODEL_DIR / f"{stem}.bin"


# --- generator ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("generated")
    gen.generate(out)
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_generator_writes_every_format_for_every_model(generated):
    files = _files(generated)
    for stem, label in RUNS:
        for name in (f"models/{stem}.param", f"models/{stem}.bin", f"models/{stem}.onnx",
                     f"models/{stem}.mnn", f"inputs/{input_filename(stem, label)}"):
            assert files.get(name), f"{name} missing or empty"
    assert not [n for n in files if ".partial" in n]


def test_committed_samples_are_what_the_generator_writes(generated):
    fresh = _files(generated)
    committed = {n: (REPO / "samples" / n).read_bytes() for n in fresh if (REPO / "samples" / n).exists()}
    assert committed.keys() == fresh.keys(), "run `python samples/generate.py` and commit the result"
    assert [n for n in fresh if fresh[n] != committed[n]] == [], "committed samples are stale"


def test_generate_script_is_deterministic_and_reports_bad_names(generated, tmp_path):
    ok = subprocess.run([sys.executable, str(REPO / "samples" / "generate.py"), "--out", str(tmp_path),
                         "--only", "convnet", "convnet_fp16w"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    again, first = _files(tmp_path), _files(generated)
    assert again and all(again[name] == first[name] for name in again)  # a second process, same bytes
    bad = subprocess.run([sys.executable, str(REPO / "samples" / "generate.py"), "--out", str(tmp_path),
                          "--only", "nosuchmodel"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert "nosuchmodel" in bad.stderr and "Traceback" not in bad.stderr


def test_conversion_failure_names_the_file_and_leaves_nothing(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"this is not an onnx model")
    with pytest.raises(ConversionError, match="broken.onnx"):
        convert_onnx_to_mnn(broken, tmp_path / "broken.mnn")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.onnx"]


# --- the network description and the ncnn files --------------------------------------------
def test_convnet_has_the_required_structure():
    net = MODELS["convnet"]()
    kinds = [layer.kind for layer in net.layers]
    assert 15 <= len(net.layers) <= 30
    assert {"add", "concat"} <= set(kinds) and {"maxpool", "avgpool", "gap"} <= set(kinds)
    assert {"sigmoid", "tanh", "hardswish", "clip"} & set(kinds)
    assert kinds[-1] == "softmax" and net.output_name == "prob" and net.input_name == "data"
    assert any("/" in layer.name for layer in net.layers)


def test_param_inserts_split_for_every_shared_blob():
    net = MODELS["convnet"]()
    lines = param_text(net).splitlines()
    assert lines[0] == "7767517"
    layer_count, blob_count = map(int, lines[1].split())
    body = [line.split() for line in lines[2:]]
    assert layer_count == len(body)
    shared = [name for name, users in net.consumers().items() if len(users) > 1]
    splits = [row for row in body if row[0] == "Split"]
    assert sorted(row[4] for row in splits) == sorted(shared)
    consumed = [blob for row in body for blob in row[4:4 + int(row[2])]]
    assert len(consumed) == len(set(consumed)), "a blob feeds two layers without a Split"
    produced = [blob for row in body for blob in row[4 + int(row[2]):4 + int(row[2]) + int(row[3])]]
    assert blob_count == len(set(produced)) == len(produced)


def test_weight_storage_tags_and_sizes():
    net = MODELS["convnet"]()
    first = net.layers[1]
    assert first.kind == "conv"
    fp32, fp16 = weight_bytes(net, "fp32"), weight_bytes(net, "fp16")
    assert int.from_bytes(fp32[:4], "little") == TAG_FP32
    assert int.from_bytes(fp16[:4], "little") == TAG_FP16
    n = first.weights["weight"].size
    assert np.array_equal(np.frombuffer(fp32[4:4 + 4 * n], "<f4"), first.weights["weight"].ravel())
    halves = np.frombuffer(fp16[4:4 + 2 * n], "<f2").astype(np.float32)
    exact = first.weights["weight"].ravel()
    assert np.all(np.abs(halves) <= np.abs(exact))  # truncation toward zero, like ncnn's writer
    assert np.max(np.abs(halves - exact) / np.abs(exact)) < 2.0 ** -10
    assert len(fp16) < len(fp32)


def test_fp16_conversion_follows_ncnn_rules():
    values = np.array([1.0, -2.5, 0.1, 65504.0, 1e6, -1e6, 1e-6, 0.0, np.inf, np.nan], np.float32)
    halves = float32_to_float16_ncnn(values).view(np.float16).astype(np.float32)
    assert list(halves[:2]) == [1.0, -2.5] and halves[2] < 0.1 and halves[2] > 0.0999
    assert halves[3] == 65504.0 and np.isposinf(halves[4]) and np.isneginf(halves[5])
    assert halves[6] == 0.0 and halves[7] == 0.0 and np.isposinf(halves[8]) and np.isnan(halves[9])


def test_validate_refuses_bad_networks():
    b = NetBuilder("bad", (1, 3, 8, 8), seed=0)
    b.relu("r", "data")
    good = b.build()
    dup = Network("dup", good.layers + (Layer("r", "relu", ("data",), shape=(1, 3, 8, 8)),), "r")
    spaced = Network("spaced", good.layers + (Layer("a b", "relu", ("r",), shape=(1, 3, 8, 8)),), "a b")
    dangling = Network("dangling", good.layers + (Layer("x", "relu", ("nope",), shape=(1, 3, 8, 8)),), "x")
    for net, words in ((dup, "duplicate"), (spaced, "spaces"), (dangling, "not defined")):
        with pytest.raises(ValueError, match=words):
            validate(net)


def test_forward_refuses_a_wrong_input_shape():
    with pytest.raises(ValueError, match="shape"):
        forward(MODELS["convnet"](), np.zeros((1, 3, 16, 16), np.float32))


def _every_kind_network() -> Network:
    """A small net using every layer kind the emitters know (not a committed sample)."""
    b = NetBuilder("every_kind", (1, 3, 16, 16), seed=3)
    c = b.conv("a/conv", "data", 4, activation="relu")
    g = b.sigmoid("a/sigmoid", c)
    d = b.div("a/div", c, g)
    e = b.exp("a/exp", b.tanh("a/tanh", d))
    x = b.sub("a/sub", e, b.clip("a/clip", c, 0.5, 2.0))
    x = b.concat("a/concat", [x, b.hardswish("a/hswish", c)])
    x = b.mul("a/mul", x, b.gap("a/gap", x))                       # per-channel broadcast
    x = b.add("a/add", b.interp("a/up_nearest", x, 2, "nearest"), b.interp("a/up_linear", x, 2))
    x = b.grid_sample("a/warp", x, wobble_px=1.5)
    x = b.avgpool("a/avgpool", b.relu("a/relu", b.maxpool("a/maxpool", x)), kernel=2)  # no ReLU after Add: MNN fuses it
    x = b.reduce_sum("a/sum", x)
    b.softmax("prob", b.dense("a/fc", x, 5))
    return b.build()


def test_every_layer_kind_runs_the_same_on_both_engines(tmp_path):
    net = _every_kind_network()
    assert {layer.kind for layer in net.layers} == set(KINDS)
    x = np.random.default_rng(0).standard_normal(net.input_shape).astype(np.float32)
    ref = forward(net, x)
    write_ncnn(net, tmp_path / "m.param", tmp_path / "m.bin")
    write_onnx(net, tmp_path / "m.onnx")
    convert_onnx_to_mnn(tmp_path / "m.onnx", tmp_path / "m.mnn")
    _assert_matches(ref, run_ncnn(tmp_path / "m.param", tmp_path / "m.bin", x, "cpu", "high"), ref.keys())
    mnn_keys = [layer.key for layer in net.layers if layer.kind not in ("input", "concat", "reduce_sum")]
    _assert_matches(ref, run_mnn(tmp_path / "m.mnn", x, "high"), mnn_keys)


# --- engines at precision high match the numpy reference ------------------------------------
def _assert_matches(reference, run, expected_keys):
    errors = compare(reference, run)
    missing = [k for k in expected_keys if k not in errors]
    assert not missing, f"layers missing from the engine's output: {missing}"
    bad = {k: e for k, e in errors.items() if not e <= HIGH_TOLERANCE}
    assert not bad, f"layers off the reference: {bad}"


@pytest.mark.parametrize("stem,label", RUNS)
def test_ncnn_cpu_high_matches_reference(stem, label, references):
    run = run_ncnn(*_ncnn_files(stem), sample_input(stem, label), "cpu", "high")
    _assert_matches(_ref(references, stem, label), run, _ref(references, stem, label).keys())


@needs_vulkan
@pytest.mark.parametrize("stem,label", RUNS)
def test_ncnn_vulkan_high_matches_reference(stem, label, references):
    run = run_ncnn(*_ncnn_files(stem), sample_input(stem, label), "vulkan", "high")
    _assert_matches(_ref(references, stem, label), run, _ref(references, stem, label).keys())


@pytest.mark.parametrize("stem,label", RUNS)
def test_mnn_cpu_high_matches_reference(stem, label, references):
    run = run_mnn(MODEL_DIR / f"{stem}.mnn", sample_input(stem, label), "high")
    net = MODELS[stem]()
    # MNN does not report the input, turns Concat into a Raster op named after its consumer, and
    # splits ReduceSum into `<name>_raster_0` (Raster) + `<name>_raster_1` (Reduction)
    expected = [layer.key for layer in net.layers if layer.kind not in ("input", "concat", "reduce_sum")]
    _assert_matches(_ref(references, stem, label), run, expected)


# --- what the samples demonstrate ----------------------------------------------------------
def test_overflow_reference_exceeds_fp16_and_stays_finite(references):
    ref = references["overflow"]
    assert all(np.all(np.isfinite(v)) for v in ref.values())
    over = [k for k, v in ref.items() if np.max(np.abs(v)) > FP16_MAX]
    assert over == ["block2/amplify:0"]
    assert np.max(np.abs(ref["block2/amplify:0"])) > 10 * FP16_MAX
    assert np.max(np.abs(ref["prob:0"])) <= 1.0


def test_convnet_reference_stays_inside_fp16_range(references):
    assert max(float(np.max(np.abs(v))) for v in references["convnet"].values()) < 100.0


@needs_vulkan
def test_overflow_breaks_vulkan_fp16_at_the_amplifying_layer():
    run = run_ncnn(*_ncnn_files("overflow"), sample_input("overflow"), "vulkan", "low")
    first_bad = next(k for k, v in run.items() if not np.all(np.isfinite(v)) or np.any(np.abs(v) == FP16_MAX))
    assert first_bad == "block2/amplify:0"


def test_bf16_storage_on_cpu_differs_from_fp32(references):
    low = run_ncnn(*_ncnn_files("convnet"), sample_input("convnet"), "cpu", "low")
    high = run_ncnn(*_ncnn_files("convnet"), sample_input("convnet"), "cpu", "high")
    low_err, high_err = compare(references["convnet"], low), compare(references["convnet"], high)
    assert max(high_err.values()) < HIGH_TOLERANCE
    assert max(low_err.values()) > 1e-3  # bf16 keeps ~3 significant digits


# --- the five field-report scenarios, measured on the host's real low-precision arithmetic --
def _low(stem: str, label: str = "", backend: str = "vulkan") -> dict[str, np.ndarray]:
    return run_ncnn(*_ncnn_files(stem), sample_input(stem, label), backend, "low")


@needs_vulkan
def test_deepnet_low_precision_error_grows_with_depth(references):
    assert 25 <= len(MODELS["deepnet"]().layers) <= 35
    for backend in ("vulkan", "cpu"):
        errors = compare(references["deepnet"], _low("deepnet", backend=backend))
        deepest = max(e for k, e in errors.items() if k.startswith("stage6/"))
        assert deepest > 1.5 * errors["stem/conv:0"], (backend, errors)  # measured: x6 vulkan, x2.9 cpu


def test_fp16_weight_storage_drifts_but_keeps_the_ranking(references):
    fp32_reference = references["convnet"]
    for run in (run_ncnn(*_ncnn_files("convnet_fp16w"), sample_input("convnet_fp16w"), "cpu", "high"),
                run_mnn(MODEL_DIR / "convnet_fp16w.mnn", sample_input("convnet_fp16w"), "high")):
        errors = compare(fp32_reference, run)
        assert 1e-4 < max(errors.values()) < 1e-2
        assert errors["block3/clip:0"] > errors["stem/conv:0"]  # drift grows with depth
        ranking = np.argsort(-fp32_reference["prob:0"].ravel())[:5]
        assert np.array_equal(np.argsort(-run["prob:0"].ravel())[:5], ranking)


@needs_vulkan
def test_sepool_pool_alone_fails_with_fp16_accumulation(references):
    vulkan = compare(references["sepool"], _low("sepool"))
    assert vulkan["se/pool:0"] > 0.1
    assert vulkan["block/conv:0"] < 0.01 and vulkan["stem/conv:0"] < 0.01  # its inputs pass
    bf16 = compare(references["sepool"], _low("sepool", backend="cpu"))
    assert bf16["se/pool:0"] < 0.01  # bf16 storage with fp32 sums does not show it


@needs_vulkan
def test_underflow_dark_input_collapses_to_zeros_in_fp16(references):
    dark_ref = _ref(references, "underflow", "dark")
    gate = np.abs(dark_ref["gate/scale:0"])
    assert 0 < gate.max() < 6.1e-5  # the reference itself warns: below fp16's smallest normal
    dark = _low("underflow", "dark")
    assert np.all(dark["image:0"] == 0) and np.all(dark_ref["image:0"] != 0)
    assert np.all(dark["dec/conv:0"] == 0)
    for label in ("", "dim"):
        run = _low("underflow", label)
        assert np.count_nonzero(run["image:0"]) > 0.9 * run["image:0"].size
    assert compare(_ref(references, "underflow"), _low("underflow"))["image:0"] < 0.01


@needs_vulkan
def test_sizenet_overflows_in_fp16_only_at_the_large_size(references):
    small_ref, large_ref = references["sizenet"], references["sizenet_large"]
    assert np.max(small_ref["pool/sum:0"]) < FP16_MAX < np.max(large_ref["pool/sum:0"])
    assert all(np.all(np.isfinite(v)) for v in large_ref.values())
    small = _low("sizenet")
    assert all(np.all(np.isfinite(v)) for v in small.values())
    large = _low("sizenet_large")
    assert np.isinf(large["pool/sum:0"]).any() and np.isnan(large["head/fc1:0"]).any()
    first_bad = next(k for k in large_ref if not np.all(np.isfinite(large[k])))
    assert first_bad == "pool/sum:0"
