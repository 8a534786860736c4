"""Op isolation on the local device: a broken kernel stays broken alone, an inheritor comes out clean."""
from __future__ import annotations

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import LayerdiffError
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.collector.run.isolate import isolate
from layerdiff.collector.inputs.modelfiles import resolve_model
from tests.conftest import MODELS


def _isolated(local_runs, tmp_path, model, backend, precision, keys):
    ref = local_runs(model, "cpu", "high")
    outcome = isolate(LocalDevice(), resolve_model(MODELS / model), backend, precision, ref, keys, tmp_path)
    assert outcome.status == "done", outcome.message
    return ref, outcome.paths[0]


def test_overflowing_layer_overflows_alone_and_a_downstream_layer_is_clean_alone(local_runs, tmp_path):
    ref_path, iso_path = _isolated(local_runs, tmp_path, "overflow.param", "vulkan", "low",
                                   ["block2/amplify:0", "head/conv:0"])
    with DumpFile(ref_path) as ref, DumpFile(iso_path) as iso:
        assert iso.attrs["mode"] == "isolate" and iso.attrs["isolated_from"] == ref_path.name
        assert list(iso.layers["key"]) == ["block2/amplify:0", "head/conv:0"]
        amplify = iso.layers.set_index("key").loc["block2/amplify:0"]
        assert amplify.n_posinf + amplify.n_neginf + amplify.n_fp16_saturated > 0  # the kernel itself overflows
        head = iso.tensor_by_key("head/conv:0")
        assert np.isfinite(head).all()
        assert np.abs(head - ref.tensor_by_key("head/conv:0")).max() < 0.05  # only fp16 rounding


def test_mnn_isolation_cuts_the_graph_at_the_reference_tensors(local_runs, tmp_path):
    ref_path, iso_path = _isolated(local_runs, tmp_path, "convnet.mnn", "cpu", "high", ["block4/add:0", "block3/clip"])
    with DumpFile(ref_path) as ref, DumpFile(iso_path) as iso:
        for key in ("block4/add:0", "block3/clip:0"):
            np.testing.assert_allclose(iso.tensor_by_key(key), ref.tensor_by_key(key), atol=1e-6)


def test_unknown_layer_is_refused_before_anything_runs(local_runs, tmp_path):
    ref = local_runs("convnet.param", "cpu", "high")
    with pytest.raises(LayerdiffError, match="no layer 'nope:0'"):
        isolate(LocalDevice(), resolve_model(MODELS / "convnet.param"), "cpu", "low", ref, ["nope:0"], tmp_path)
    assert not list(tmp_path.glob("*.h5"))


def test_mnn_isolation_looks_through_layout_conversions_and_constants(local_runs, tmp_path):
    """stem/conv and image read MNN-inserted layout conversions, dec/up a constant scale: all three
    are cut at tensors the reference has and reproduce it exactly on the same backend."""
    keys = ["stem/conv:0", "dec/up:0", "image:0"]
    ref_path, iso_path = _isolated(local_runs, tmp_path, "underflow.mnn", "cpu", "high", keys)
    with DumpFile(ref_path) as ref, DumpFile(iso_path) as iso:
        assert ref.layers.set_index("key").loc["dec/up:0", "inputs"] == '["dec/conv"]'  # graph edge, not a reused buffer
        for key in keys:
            np.testing.assert_allclose(iso.tensor_by_key(key), ref.tensor_by_key(key), atol=1e-6)


def test_failing_from_a_report_isolates_what_the_analyzer_flagged(local_runs, tmp_path):
    import subprocess
    import sys

    ref = local_runs("overflow.param", "cpu", "high")
    low = local_runs("overflow.param", "vulkan", "low")
    report = tmp_path / "report"
    subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", str(ref), str(low), "-o", str(report)],
                   capture_output=True, text=True, timeout=300, check=True)
    result = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "isolate", "--model", str(MODELS / "overflow.param"),
                             "--backend", "vulkan", "--precision", "low", "--ref", str(ref),
                             "--failing-from", str(report), "-o", str(tmp_path / "iso")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    [iso] = list((tmp_path / "iso").glob("isolated_*.h5"))
    with DumpFile(iso) as dump:
        assert "block2/amplify:0" in set(dump.layers["key"])
