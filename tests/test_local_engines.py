"""The `local` device on real engines: every engine × backend × precision available here."""
from __future__ import annotations

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.samples.forward import forward
from layerdiff.samples.catalog import MODELS
from tests.conftest import sample_input

HIGH_PRECISION_CASES = [("convnet.param", "cpu"), ("convnet.param", "vulkan"), ("convnet.mnn", "cpu")]


def _reference(stem: str) -> dict[str, np.ndarray]:
    return forward(MODELS[stem](), sample_input(stem))


def _assert_matches_reference(path, stem: str, atol: float, rtol: float) -> int:
    reference = _reference(stem)
    compared = 0
    with DumpFile(path) as dump:
        for row in dump.layers.itertuples():
            if row.key not in reference:
                continue  # engine helpers (ncnn Split, MNN raster) have no reference value
            actual, expected = dump.tensor(row.order), reference[row.key]
            assert actual.squeeze().shape == expected.squeeze().shape, f"{row.key}: {actual.shape} vs {expected.shape}"
            np.testing.assert_allclose(actual.squeeze(), expected.squeeze(), atol=atol, rtol=rtol,
                                       err_msg=f"{path.name}: layer {row.key}")
            compared += 1
    return compared


@pytest.mark.parametrize("model, backend", HIGH_PRECISION_CASES)
def test_high_precision_matches_independent_numpy_forward(local_runs, model, backend):
    path = local_runs(model, backend, "high")
    compared = _assert_matches_reference(path, "convnet", atol=2e-4, rtol=1e-3)
    # MNN does not dump the model input and turns the concat into a raster op: two fewer.
    assert compared >= len(MODELS["convnet"]().layers) - (2 if model.endswith(".mnn") else 0)


def test_provenance_records_what_really_ran(local_runs):
    with DumpFile(local_runs("convnet.param", "vulkan", "low")) as dump:
        attrs = dump.attrs
        assert attrs["engine"] == "ncnn" and attrs["backend_actual"] == "vulkan"
        assert attrs["precision_requested"] == "low" and attrs["precision_effective"].startswith("fp16")
        assert attrs["device_serial"] == "local" and len(attrs["model_sha256"]) == 64
        assert len(attrs["input_sha256"]) == 64 and attrs["complete"]
        assert [name for name, _ in dump.inputs()] == ["data"]
        assert dump.layers["memory"].eq("device").all()
        # the GPU named is the one ncnn computed on (its own header), the same the dump's provenance holds
        assert attrs["gpu"] and attrs["gpu"] == dump.provenance["device"]["gpu"]
        assert attrs["gpu"] == dump.provenance["raw_header"]["options"]["vulkan_device"]
    with DumpFile(local_runs("convnet.param", "cpu", "low")) as dump:
        assert dump.attrs["precision_effective"] == "bf16-storage"  # x86 has no fp16 arithmetic


def test_mnn_gpu_request_is_recorded_as_the_cpu_run_it_really_was(local_runs):
    with DumpFile(local_runs("convnet.mnn", "opencl", "high")) as dump:
        assert dump.attrs["backend_requested"] == "opencl"
        assert dump.attrs["backend_actual"] == "cpu"
        assert "fell back" in dump.stderr()


def test_low_precision_really_differs_from_high(local_runs):
    def max_diff(a, b):
        with DumpFile(local_runs(*a)) as x, DumpFile(local_runs(*b)) as y:
            return float(np.abs(x.tensor_by_key("prob:0") - y.tensor_by_key("prob:0")).max())

    assert max_diff(("convnet.param", "vulkan", "low"), ("convnet.param", "cpu", "high")) > 1e-5
    assert max_diff(("convnet.param", "cpu", "low"), ("convnet.param", "cpu", "high")) > 1e-5


def test_mnn_dump_has_graph_edges_between_ops(local_runs):
    with DumpFile(local_runs("convnet.mnn", "cpu", "high")) as dump:
        layers = dump.layers.set_index("name")
        add_inputs = eval_json(layers.loc["block4/add", "inputs"]) if "block4/add" in layers.index else []
        assert add_inputs, "the residual add must name its two producers"
        assert all(name in layers.index for name in add_inputs)


def test_overflow_sample_overflows_on_vulkan_low(local_runs):
    with DumpFile(local_runs("overflow.param", "vulkan", "low")) as low, DumpFile(local_runs("overflow.param", "cpu", "high")) as high:
        assert high.layers[["n_nan", "n_posinf", "n_neginf"]].to_numpy().sum() == 0
        assert high.layers["n_fp16_overflow"].sum() > 0
        broken = low.layers[(low.layers.n_nan + low.layers.n_posinf + low.layers.n_neginf + low.layers.n_fp16_saturated) > 0]
        assert len(broken) > 0


def eval_json(text: str) -> list:
    import json

    return json.loads(text)
