"""Op isolation in the C++ harness (ncnn): `--inject DIR --target KEY` runs each target
layer alone on the chosen backend/precision, fed the reference run's tensors from DIR."""
from __future__ import annotations

import numpy as np
import pytest

from layerdiff.analyzer.formats.rawdump import RawDumpWriter

from tests.test_harness_support import dump_model, host_harness, run_harness, MODELS


pytestmark = pytest.mark.slow  # builds the host harness (cached) on first use


@pytest.fixture(scope="module")
def harness() -> list[str]:
    return [str(host_harness())]


@pytest.fixture(scope="module")
def reference(harness, tmp_path_factory):
    """cpu/high dump of the overflow sample: the tensors isolated layers are fed."""
    out = tmp_path_factory.mktemp("iso") / "ref"
    return dump_model(harness, "overflow", "cpu", "high", out)


def isolate(harness, ref_dir, backend, precision, out, *targets):
    args = ["--engine", "ncnn", "--model", str(MODELS / "overflow.param"), "--model", str(MODELS / "overflow.bin"),
            "--backend", backend, "--precision", precision, "--inject", str(ref_dir)]
    for target in targets:
        args += ["--target", target]
    return run_harness(harness, args, out)


def test_overflowing_layer_overflows_alone_and_downstream_layer_is_clean(harness, reference, tmp_path):
    run = isolate(harness, reference.out, "vulkan", "low", tmp_path / "iso", "block2/amplify:0", "head/conv:0")
    assert run.returncode == 0, run.stderr
    dump = run.dump()
    assert dump.complete and dump.header["mode"] == "isolate"
    assert dump.header["targets"] == ["block2/amplify:0", "head/conv:0"]
    ref = {t.name: arr for t, arr in reference.dump().iter_arrays()}
    got = {t.op: (t, arr) for t, arr in dump.iter_arrays()}
    assert list(got) == ["block2/amplify", "head/conv"]
    assert got["block2/amplify"][0].inputs == ["block1/add"]
    assert not np.isfinite(got["block2/amplify"][1]).all()
    conv = got["head/conv"][1]
    assert np.isfinite(conv).all()
    assert np.max(np.abs(conv - ref["head/conv"])) < 0.05 * np.max(np.abs(ref["head/conv"]))


def test_isolated_op_at_high_precision_reproduces_the_reference(harness, reference, tmp_path):
    run = isolate(harness, reference.out, "cpu", "high", tmp_path / "iso", "block1/add:0", "block2/shrink:0")
    assert run.returncode == 0, run.stderr
    ref = {t.name: arr for t, arr in reference.dump().iter_arrays()}
    for tensor, array in run.dump().iter_arrays():
        scale = max(1.0, float(np.max(np.abs(ref[tensor.name]))))
        assert np.max(np.abs(array - ref[tensor.name])) <= 1e-5 * scale


@pytest.mark.parametrize(
    ("targets", "mentions"),
    [(["nosuch/layer:0"], "no layer 'nosuch/layer'"), (["block2/amplify:3"], "has 1 output(s)"),
     (["data:0"], "model input")],
)
def test_bad_targets_are_refused(harness, reference, tmp_path, targets, mentions):
    run = isolate(harness, reference.out, "cpu", "high", tmp_path / "iso", *targets)
    assert run.returncode == 2 and mentions in run.stderr.strip().splitlines()[-1]


def test_missing_reference_tensor_is_named(harness, tmp_path):
    partial = dump_model(harness, "overflow", "cpu", "high", tmp_path / "ref", "--layers", "^stem/")
    run = isolate(harness, partial.out, "cpu", "high", tmp_path / "iso", "block1/add:0")
    assert run.returncode == 2
    assert "has no tensor 'stem/pool_splitncnn_1' that layer block1/add consumes" in run.stderr


def test_inject_dump_from_the_python_writer_is_read(harness, reference, tmp_path):
    """The collector stages inject dumps with layerdiff.analyzer.formats.rawdump.RawDumpWriter; its JSON (NaN
    included, as Python writes it) must parse in the C++ harness."""
    ref = {t.name: arr for t, arr in reference.dump().iter_arrays()}
    writer = RawDumpWriter(tmp_path / "inject", {"engine": "ncnn", "harness": "layerdiff-inject",
                                                 "targets": {"head/conv:0": ["block2/pool"]}})
    writer.add(op="block2/pool", op_type="Pooling", array=ref["block2/pool"], name="block2/pool")
    writer.close(infer_ms=float("nan"))
    run = isolate(harness, tmp_path / "inject", "cpu", "high", tmp_path / "iso", "head/conv:0")
    assert run.returncode == 0, run.stderr
    (tensor, array), = list(run.dump().iter_arrays())
    assert tensor.name == "head/conv" and np.allclose(array, ref["head/conv"], rtol=1e-5, atol=1e-5)


def test_replace_is_refused_by_the_ncnn_engine(harness, reference, tmp_path):
    """The what-if `--inject DIR --replace KEY` is MNN's; ncnn keeps a layer at high precision with
    its feature mask instead, so the ncnn engine refuses it in one line, exit 2, and writes nothing."""
    args = ["--engine", "ncnn", "--model", str(MODELS / "overflow.param"), "--model", str(MODELS / "overflow.bin"),
            "--input", f"data={MODELS.parent / 'inputs' / 'overflow.npy'}", "--backend", "cpu", "--precision", "high",
            "--inject", str(reference.out), "--replace", "block2/amplify:0"]
    run = run_harness(harness, args, tmp_path / "what-if")
    assert run.returncode == 2 and "--replace is not supported by this engine" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / "what-if").exists()
