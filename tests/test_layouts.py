"""Layouts are facts: every engine dumps the graph's order and records how it held each tensor, and the
analyzer compares only tensors recorded in the same byte order.

Real engines, real models: a transformer-like classifier built with `onnx` (tests/transformer_model.py:
int32 ids through Gather, LayerNorm, attention with 4-D Softmax, GELU, a Conv1d) run on ONNX Runtime,
on MNN (converted by MNN's converter, which holds tensors as NCHW and as NC4HW4) and on ncnn (pnnx;
ncnn packs channels by 4/8/16 on x86); and magika's pretrained model (the `magika` wheel), where MNN
3.6.1 on x86 writes packed bytes into a tensor it declares NCHW. Every engine tensor is held against
ONNX Runtime's values in numpy.
"""
from __future__ import annotations

import importlib.metadata
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.findings.layouts import packed_order, unpack_channels
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.formats.layouts import PLAIN, bytes_layout, engine_layout
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import resolve_model
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.samples.onnx_emit import convert_many
from tests.corpus import convert_with_pnnx
from tests.transformer_model import DIM, SEQ, embeddings, token_ids, write_transformer

MAGIKA_MEMBER = "magika/models/standard_v3_3/model.onnx"


def _collect(model: Path, inputs: dict[str, np.ndarray], out: Path, label: str) -> Path:
    outcome = collect_run(LocalDevice(), RunSpec(resolve_model(model), "cpu", "high", InputSet(label, inputs, label)), out)
    assert outcome.status == "done", outcome.message
    return outcome.paths[0]


def _tensors(path: Path) -> dict[str, tuple[np.ndarray, str]]:
    with DumpFile(path) as dump:
        return {row.key: (dump.tensor(row.order), str(row.layout)) for row in dump.layers.itertuples()}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    """The tiny transformer on ONNX Runtime, MNN and ncnn: {engine: HDF5 path}."""
    work = tmp_path_factory.mktemp("transformer")
    onnx_path = write_transformer(work / "tiny.onnx")
    embedded = write_transformer(work / "emb.onnx", embedded=True)
    convert_many([(onnx_path, work / "tiny.mnn", False)])
    param = convert_with_pnnx(embedded, f"[1,{SEQ},{DIM}]f32", work)
    ids = token_ids()
    return {"ort": _collect(onnx_path, {"ids": ids}, work / "runs", "ids"),
            "mnn": _collect(work / "tiny.mnn", {"ids": ids}, work / "runs", "ids"),
            "ncnn": _collect(param, {"in0": embeddings(ids)[0]}, work / "runs", "emb")}  # ncnn: [seq, dim], no batch


def test_mnn_dumps_the_graph_order_of_every_format_it_holds(transformer):
    golden, mnn = _tensors(transformer["ort"]), _tensors(transformer["mnn"])
    held = {engine_layout(layout) for _, layout in mnn.values()}
    assert {"MNN NCHW", "MNN NC4HW4"} <= held  # both of MNN's formats occur, and each is recorded
    assert all(bytes_layout(layout) == PLAIN for _, layout in mnn.values())
    compared = {fmt: 0 for fmt in held}
    for key, (array, layout) in mnn.items():
        if key in golden and golden[key][0].size == array.size and array.dtype == np.float32:
            assert _rel(array, golden[key][0]) < 1e-3, f"{key} ({layout}) differs from ONNX Runtime"
            compared[engine_layout(layout)] += 1
    assert compared["MNN NC4HW4"] >= 8 and compared["MNN NCHW"] >= 5, compared


def test_ncnn_dumps_unpacked_blobs_in_the_graph_order(transformer):
    """ncnn packs the Conv1d and GELU blobs (32 channels: elempack 8 or 16 on x86); the dump holds
    them unpacked: each golden tensor of the conv/GELU tail has an ncnn blob with its values."""
    golden, ncnn = _tensors(transformer["ort"]), _tensors(transformer["ncnn"])
    assert {layout for _, layout in ncnn.values()} <= {"NC", "HW", "NCHW", "NCDHW"}
    for key in ("c0_out:0", "t5:0", "t8:0", "pool:0", "prob:0"):
        target = golden[key][0]
        close = [k for k, (a, _) in ncnn.items() if a.size == target.size and _rel(a, target) < 1e-4]
        assert close, f"no ncnn blob holds {key}'s values in the graph's order"


def test_onnxruntime_records_the_graph_order(transformer):
    assert all(bytes_layout(layout) == PLAIN for _, layout in _tensors(transformer["ort"]).values())


def test_tensors_recorded_in_different_orders_are_not_compared(transformer, tmp_path):
    """A producer that writes a tensor packed, and says so, gets that layer set aside (status
    layout_mismatch, a layout_mismatch finding), never a failure blamed on its op."""
    packed = tmp_path / "mnn_packed.h5"
    shutil.copy(transformer["mnn"], packed)
    with h5py.File(packed, "r+") as f:
        layers = f["layers"][:]
        row = next(i for i, r in enumerate(layers) if r["key"].decode() == "t5:0")
        order = str(layers[row]["order"])
        plain = f["tensors"][order][:]
        f["tensors"][order][...] = plain.reshape(1, 32 // 8, 8, -1).transpose(0, 1, 3, 2).reshape(plain.shape)
        layers[row]["layout"] = "NC8W8"
        f["layers"][...] = layers
    analysis = analyze_paths([transformer["ort"], packed], ref=str(transformer["ort"]))
    table = analysis.comparison.table
    row = table[table["key"] == "t5:0"].iloc[0]
    assert row["status"] == "layout_mismatch" and "NC8W8" in row["reasons"]
    assert set(table[table["key"] != "t5:0"]["status"]) <= {"pass", "warn"}
    kinds = {f.kind: f for f in analysis.findings}
    assert "layout_mismatch" in kinds and "t5:0" in kinds["layout_mismatch"].sentence
    assert "failure_source" not in kinds


def test_unpacking_undoes_mnn_packs():
    rng = np.random.default_rng(0)
    plain = rng.standard_normal((1, 32, 5, 3)).astype(np.float32)
    for pack in (4, 8, 16):
        packed = plain.reshape(1, 32 // pack, pack, 15).transpose(0, 1, 3, 2).reshape(plain.shape)
        assert np.array_equal(unpack_channels(packed, pack), plain)
        assert packed_order(plain, packed)[0] == pack
    assert packed_order(plain, plain + 1) is None


@pytest.fixture(scope="module")
def magika(tmp_path_factory):
    try:
        source = Path(importlib.metadata.distribution("magika").locate_file(MAGIKA_MEMBER))
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("magika is not installed; run device_scripts/setup_host.sh --test")
    work = tmp_path_factory.mktemp("magika")
    onnx_path = work / "magika.onnx"
    onnx_path.write_bytes(source.read_bytes())
    convert_many([(onnx_path, work / "magika.mnn", False)])
    text = Path(__file__).read_bytes()  # a Python file, as magika feeds it: first and last 1024 bytes
    ids = np.concatenate([np.frombuffer(text[:1024], np.uint8), np.frombuffer(text[-1024:], np.uint8)])
    inputs = {"bytes": ids.astype(np.int32)[None]}
    return {"ort": _collect(onnx_path, inputs, work / "runs", "source"),
            "mnn": _collect(work / "magika.mnn", inputs, work / "runs", "source")}


def test_magika_mnn_mislaid_tensor_is_named_as_a_layout_fault(magika):
    """MNN's GELU Add after a Conv reads an NC4HW4 tensor and writes its packed bytes (pack 8 on AVX)
    into a tensor MNN declares NCHW. Numpy: unpacked, the values are ONNX Runtime's; as declared they
    are not, and MNN's own later ops read them as declared (the logits move). The analysis says so."""
    golden, mnn = _tensors(magika["ort"]), _tensors(magika["mnn"])
    key = "jax2tf_get_logits_/pjit_get_logits_/MagikaV2/ApplyActivation_1/AddV2_1:0:0"
    array, layout = mnn[key]
    reference = golden[key][0]
    assert engine_layout(layout) == "MNN NCHW" and bytes_layout(layout) == PLAIN
    tanh = mnn[key.replace("AddV2_1", "Tanh")]
    assert engine_layout(tanh[1]) == "MNN NC4HW4" and _rel(tanh[0], golden[key.replace("AddV2_1", "Tanh")][0]) < 1e-4
    assert _rel(array, reference) > 0.5
    pack, rel = packed_order(reference, array)
    assert rel < 1e-4 and pack in (4, 8, 16)
    logits = "jax2tf_get_logits_/pjit_get_logits_/Sub:0:0"
    assert _rel(mnn[logits][0], golden[logits][0]) > 0.01  # the damage is real: MNN's logits moved
    analysis = analyze_paths([magika["ort"], magika["mnn"]], ref=str(magika["ort"]))
    packed = [f for f in analysis.findings if f.kind == "packed_order"]
    assert len(packed) == 1 and packed[0].layer == key and packed[0].numbers["pack"] == pack
    assert "MNN NC4HW4" in packed[0].sentence and packed[0].numbers["mislaid_in"] == analysis_label(analysis, "mnn")


def analysis_label(analysis, engine: str) -> str:
    return next(r.label for r in analysis.runs if r.attrs.get("engine") == engine)


def test_every_mnn_tensor_of_magika_records_its_format(magika):
    formats = [engine_layout(layout) for _, layout in _tensors(magika["mnn"]).values()]
    assert formats and all(f in ("MNN NCHW", "MNN NC4HW4", "MNN NHWC") for f in formats)
    assert json.dumps(sorted(set(formats)))  # recorded for every tensor, none left blank


def test_magika_on_an_emulated_arm_core_mislays_by_its_own_pack(magika, tmp_path):
    """The same fault in MNN's aarch64 build (qemu cortex-a76): its fp32 backend packs by 4, its Arm82
    fp16 backend (low) by 8; each run's label says what its bytes are, and the analysis names the pack."""
    from layerdiff.analyzer.measure.storage import storage_evidence
    from layerdiff.collector.transport.arm64 import Arm64Device

    model = Path(magika["mnn"]).parent.parent / "magika.mnn"
    with DumpFile(magika["mnn"]) as dump:
        inputs = dict(dump.inputs())
    expected = {"high": (4, "fp32"), "low": (8, "fp16")}
    for precision, (pack, label) in expected.items():
        outcome = collect_run(Arm64Device("cortex-a76"), RunSpec(resolve_model(model), "cpu", precision,
                                                                 InputSet("source", inputs, "source")), tmp_path / precision)
        assert outcome.status == "done", outcome.message
        with DumpFile(outcome.paths[0]) as dump:
            assert dump.attrs["precision_effective"] == label
            assert storage_evidence(dump.tensor(o) for o in dump.layers["order"]).measured() == label
        analysis = analyze_paths([magika["ort"], outcome.paths[0]], ref=str(magika["ort"]))
        packed = [f for f in analysis.findings if f.kind == "packed_order"]
        assert packed and packed[0].numbers["pack"] == pack and "AddV2_1" in packed[0].layer
