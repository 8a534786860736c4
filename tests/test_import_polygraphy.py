"""Polygraphy RunResults JSON written by hand in Polygraphy's serde layout, then imported."""
from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.importers import detect_format, import_any, import_one


def npy_b64(array: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode()


def lazy(array: np.ndarray) -> dict:
    return {"values": {"array": npy_b64(array), "polygraphy_class": "ndarray"}, "polygraphy_class": "LazyArray"}


def run_results(runners: dict[str, list[dict[str, np.ndarray]]], runtime: float = 0.0125) -> dict:
    lst = [[name, [{"outputs": {k: lazy(v) for k, v in it.items()}, "runtime": runtime, "runner_name": name,
                    "polygraphy_class": "IterationResult"} for it in iterations]]
           for name, iterations in runners.items()]
    return {"lst": lst, "polygraphy_class": "RunResults"}


OUTS = {"/conv/Conv_output_0": np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2), "y": np.array([1.0, -2.0], np.float32)}


def test_single_runner_round_trip_with_provenance(tmp_path):
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(run_results({"onnxrt-runner-N0-01/01/25": [OUTS]}), indent=4))
    assert detect_format(path) == "polygraphy-json"
    with DumpFile(import_any(path, {"device_serial": "host"}, tmp_path / "o.h5")) as dump:
        assert list(dump.layers["name"]) == list(OUTS)
        for order, array in enumerate(OUTS.values()):
            np.testing.assert_array_equal(dump.tensor(order), array)
        assert dump.attrs["engine"] == "onnxruntime" and dump.attrs["infer_ms"] == pytest.approx(12.5)
        assert dump.provenance["polygraphy_runner"].startswith("onnxrt-runner")


def test_runner_and_iteration_selection(tmp_path):
    second = {"y": np.array([5.0], np.float32)}
    path = tmp_path / "two.json"
    path.write_text(json.dumps(run_results({"trt-runner-N0": [OUTS], "onnxrt-runner-N0": [OUTS, second]})))
    with DumpFile(import_any(path, None, tmp_path / "o.h5", runner="onnxrt", iteration=1)) as dump:
        assert list(dump.layers["name"]) == ["y"] and dump.tensor(0)[0] == 5.0
    with pytest.raises(DumpFormatError, match="runners are: trt-runner-N0, onnxrt-runner-N0"):
        import_any(path, None, tmp_path / "p.h5", runner="tf")
    with pytest.raises(DumpFormatError, match="iteration 3 does not exist"):
        import_any(path, None, tmp_path / "q.h5", runner=1, iteration=3)


def test_legacy_markers_and_latin1_payload(tmp_path):
    buf = io.BytesIO()
    np.save(buf, np.array([3.0, 4.0], np.float32))
    legacy = {"lst": [["onnxrt-runner", [{"outputs": {"t": {"array": buf.getvalue().decode("latin-1"),
                                                              "__polygraphy_encoded_ndarray": "polygraphy_serialized_json_type"}},
                                           "runtime": None, "runner_name": "onnxrt-runner"}]]],
              "__polygraphy_encoded_RunResults": "polygraphy_serialized_json_type"}
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps(legacy))
    with DumpFile(import_any(path, None, tmp_path / "o.h5")) as dump:
        np.testing.assert_array_equal(dump.tensor(0), [3.0, 4.0])


def test_iteration_directory_is_one_run(tmp_path):
    run_dir = tmp_path / "outs"
    run_dir.mkdir()
    (run_dir / "0000000000.json").write_text(json.dumps(run_results({"onnxrt-runner": [OUTS]})))
    assert detect_format(run_dir) == "polygraphy-json"
    with DumpFile(import_any(run_dir, None, tmp_path / "o.h5")) as dump:
        assert len(dump.layers) == 2


def test_torch_tensors_pickles_and_bad_payloads_are_refused_per_layer(tmp_path):
    doc = run_results({"onnxrt-runner": [OUTS]})
    outputs = doc["lst"][0][1][0]["outputs"]
    outputs["torchy"] = {"values": {"tensor": "gAR9cQBYAQAAAHhxAUsBcy4=", "polygraphy_class": "Tensor"}, "polygraphy_class": "LazyArray"}
    buf = io.BytesIO()
    np.save(buf, np.array([object()], dtype=object), allow_pickle=True)
    outputs["pickled"] = {"array": base64.b64encode(buf.getvalue()).decode(), "polygraphy_class": "ndarray"}
    outputs["junk"] = {"array": 12}
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(doc))
    result = import_one(path, None, tmp_path / "o.h5")
    text = "\n".join(result.problems)
    assert "'torchy'" in text and "never loaded" in text and "'pickled'" in text and "'junk'" in text
    with DumpFile(result.path) as dump:
        assert list(dump.layers["name"]) == list(OUTS)


@pytest.mark.parametrize("content", ['{"lst": [[', '{"lst": 5}', "[" * 100000 + "]" * 100000, '{"lst": [["r", [{"outputs": 3}]]]}'])
def test_bad_json_is_one_line_naming_the_file(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content if content.startswith("{") else '{"lst": ' + content + "}")
    with pytest.raises(DumpFormatError, match=r"bad\.json"):
        import_any(path, None, tmp_path / "o.h5")


def test_hostile_names_and_numbers_are_stored_or_refused_in_one_line(tmp_path):
    doc = run_results({"onnxrt-runner": [{"a\u0000b\udc80": np.ones(2, np.float32)}]}, runtime=10**400)
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(doc))
    with DumpFile(import_any(path, None, tmp_path / "o.h5")) as dump:
        assert dump.layers["name"][0] == "a\ufffdb\ufffd" and dump.attrs["infer_ms"] != dump.attrs["infer_ms"]
    (tmp_path / "digits.json").write_text('{"lst": [["r", [{"outputs": {}, "runtime": ' + "9" * 5000 + "}]]]}")
    with pytest.raises(DumpFormatError, match=r"digits\.json: not valid JSON"):
        import_any(tmp_path / "digits.json", None, tmp_path / "p.h5")
