"""Merging runs into an indexed set; exporting to Model Explorer node data and Polygraphy JSON."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from layerdiff.analyzer.cli.app import main
from layerdiff.analyzer.formats.dumpfile import DumpFile, DumpWriter
from layerdiff.errors import LayerdiffError
from layerdiff.analyzer.report.export import export_model_explorer, export_polygraphy
from layerdiff.analyzer.importers import import_any
from layerdiff.analyzer.runs.merge import merge

REF = {"/conv/Conv_output_0": np.array([1.0, 2.0, 3.0, 4.0], np.float32), "/tk/TopK_output_1": np.array([1.0, 0.0], np.float32)}


def write_run(path, arrays: dict[str, tuple[str, int, np.ndarray]], **attrs):
    with DumpWriter(path, {"model_sha256": "aa" * 32, "engine": "mnn", **attrs}) as writer:
        for order, (name, (op, index, array)) in enumerate(arrays.items()):
            writer.add_tensor({"order": order, "op": op, "output_index": index, "name": name}, array)
    return path


def mnn_run(path, scale=1.0, nan=False, **attrs):
    conv = REF["/conv/Conv_output_0"] * scale
    if nan:
        conv = conv.copy()
        conv[1] = np.nan
    return write_run(path, {
        "t_conv": ("/conv/Conv_output_0", 0, conv.reshape(1, 4)),
        "t_raster": ("/conv/Conv_output_0_raster_0", 0, conv),
        "t_idx": ("/tk/TopK_output_0", 1, REF["/tk/TopK_output_1"]),
    }, **attrs)


def test_merge_gathers_runs_and_writes_the_index(tmp_path):
    a = mnn_run(tmp_path / "a.h5", device_serial="P1", backend_requested="opencl", precision_requested="low", input_label="cat")
    b = mnn_run(tmp_path / "b.h5", scale=1.01, device_serial="P2", backend_requested="vulkan", precision_requested="normal")
    np.savez(tmp_path / "ort.npz", **REF)
    result = merge([a, b, tmp_path / "ort.npz", tmp_path / "missing.h5"], tmp_path / "set")
    assert len(result.added) == 3 and any("missing.h5" in e for e in result.errors)
    with open(result.index, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["backend_requested"] for r in rows] == ["opencl", "vulkan", ""]
    assert rows[0]["device_serial"] == "P1" and rows[0]["input_label"] == "cat" and rows[0]["model_sha256"] == "aa" * 32
    assert all((tmp_path / "set" / r["file"]).is_file() for r in rows)
    again = merge([a], tmp_path / "set")
    assert again.added == [] and len(again.skipped_duplicates) == 1


def test_merge_refuses_different_models_unless_allowed(tmp_path):
    a = mnn_run(tmp_path / "a.h5")
    b = mnn_run(tmp_path / "b.h5", model_sha256="bb" * 32)
    with pytest.raises(LayerdiffError, match="2 different models.*--allow-model-mismatch"):
        merge([a, b], tmp_path / "set")
    assert not (tmp_path / "set").exists()
    assert len(merge([a, b], tmp_path / "set", allow_model_mismatch=True).added) == 2
    c = mnn_run(tmp_path / "c.h5", model_sha256="cc" * 32)
    with pytest.raises(LayerdiffError, match="different models"):
        merge([c], tmp_path / "set")  # also checked against runs already in the set


def test_model_explorer_values_are_the_reports(tmp_path):
    """The export measures with the analysis the report uses: the same rel_l2/max_abs per aligned layer."""
    from layerdiff.analyzer.analysis import analyze_paths

    np.savez(tmp_path / "ort.npz", **REF)
    ref = import_any(tmp_path / "ort.npz", None, tmp_path / "ref.h5")
    run = mnn_run(tmp_path / "run.h5", scale=1.1)
    analysis = analyze_paths([run], ref=ref)
    try:
        table = analysis.comparison.table.set_index("key")
    finally:
        analysis.close()
    for metric in ("rel_l2", "max_abs"):
        values = json.loads(export_model_explorer(run, ref, tmp_path / f"{metric}.json", metric=metric).read_text())["results"]
        assert values and all(values[name]["value"] == pytest.approx(float(table.loc[name + ":0", metric]))
                              for name in values), (metric, values)


def test_model_explorer_export_honours_the_name_map(tmp_path):
    """A run whose layer names differ from the reference's aligns through --name-map, as in the report."""
    from layerdiff.analyzer.align.byname import NameRules

    np.savez(tmp_path / "ort.npz", **REF)
    ref = import_any(tmp_path / "ort.npz", None, tmp_path / "ref.h5")
    conv = REF["/conv/Conv_output_0"] * 1.1
    run = write_run(tmp_path / "renamed.h5", {"t_conv": ("conv_renamed", 0, conv),
                                              "t_tk": ("/tk/TopK_output_1", 0, REF["/tk/TopK_output_1"])})
    plain = json.loads(export_model_explorer(run, ref, tmp_path / "plain.json").read_text())["results"]
    assert "/conv/Conv_output_0" not in plain and plain["/tk/TopK_output_1"]["value"] == 0.0
    rules = NameRules(name_map={"conv_renamed": "/conv/Conv_output_0"})
    data = json.loads(export_model_explorer(run, ref, tmp_path / "me.json", rules=rules).read_text())["results"]
    assert data["/conv/Conv_output_0"]["value"] == pytest.approx(0.1, rel=1e-5)
    assert data["/tk/TopK_output_1"]["value"] == 0.0


def test_model_explorer_node_data_keyed_by_reference_tensor_names(tmp_path):
    np.savez(tmp_path / "ort.npz", **REF)
    ref = import_any(tmp_path / "ort.npz", None, tmp_path / "ref.h5")
    run = mnn_run(tmp_path / "run.h5", scale=1.1)
    out = export_model_explorer(run, ref, tmp_path / "me.json")
    data = json.loads(out.read_text())
    assert set(data["results"]) == set(REF)  # raster helper left out, TopK output 1 aligned
    assert data["results"]["/conv/Conv_output_0"]["value"] == pytest.approx(0.1, rel=1e-5)
    assert data["results"]["/tk/TopK_output_1"]["value"] == 0.0
    assert [t["value"] for t in data["thresholds"]] == sorted(t["value"] for t in data["thresholds"])
    nan_run = mnn_run(tmp_path / "nan.h5", nan=True)
    data = json.loads(export_model_explorer(nan_run, ref, tmp_path / "me2.json", key_by="op", graph_id="main").read_text())
    assert data["main"]["results"]["/conv/Conv_output_0"]["bgColor"]
    assert data["main"]["results"]["/conv/Conv_output_0"]["value"] > 1e29


def test_polygraphy_export_round_trips_through_our_importer(tmp_path):
    run = mnn_run(tmp_path / "run.h5", infer_ms=12.0, backend_requested="cpu", precision_requested="low")
    out = export_polygraphy(run, tmp_path / "pg.json")
    doc = json.loads(out.read_text())
    assert doc["polygraphy_class"] == "RunResults" and doc["lst"][0][0] == "layerdiff-mnn-cpu-low"
    iteration = doc["lst"][0][1][0]
    assert iteration["polygraphy_class"] == "IterationResult" and iteration["runtime"] == pytest.approx(0.012)
    with DumpFile(run) as src, DumpFile(import_any(out, None, tmp_path / "back.h5")) as back:
        assert list(back.layers["name"]) == list(src.layers["name"])
        for order in range(len(src.layers)):
            np.testing.assert_array_equal(back.tensor(order), src.tensor(order))


def test_polygraphy_itself_loads_our_run_results(tmp_path):
    pytest.importorskip("polygraphy")
    from polygraphy.comparator import RunResults

    run = mnn_run(tmp_path / "run.h5")
    results = RunResults.load(str(export_polygraphy(run, tmp_path / "pg.json", runner_name="mnn-phone")))
    (name, iterations), = results.items()
    assert name == "mnn-phone"
    np.testing.assert_array_equal(iterations[0]["t_conv"], REF["/conv/Conv_output_0"].reshape(1, 4))


def test_cli_import_merge_export(tmp_path, capsys):
    def run_cli(*args):
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out + err

    np.savez(tmp_path / "ort.npz", **REF)
    code, output = run_cli("import", tmp_path / "ort.npz", "-o", tmp_path / "ref.h5", "--set", "backend_requested=cpu", "--set", "threads=2")
    assert code == 0, output
    with DumpFile(tmp_path / "ref.h5") as dump:
        assert dump.attrs["threads"] == 2 and dump.attrs["backend_requested"] == "cpu"
    code, output = run_cli("import", tmp_path / "ort.npz", "-o", tmp_path / "x.h5", "--set", "threads=two")
    assert code == 1 and "threads must be an integer" in output and "Traceback" not in output
    code, output = run_cli("import", tmp_path / "nope", "-o", tmp_path / "x.h5")
    assert code == 1 and output.count("\n") == 1
    run = mnn_run(tmp_path / "run.h5")
    code, output = run_cli("merge", run, tmp_path / "ref.h5", "-o", tmp_path / "set")
    assert code == 0 and (tmp_path / "set" / "index.csv").is_file(), output
    code, output = run_cli("export", run, "--reference", tmp_path / "ref.h5", "-o", tmp_path / "me.json")
    assert code == 0 and "results" in json.loads((tmp_path / "me.json").read_text())
    code, output = run_cli("export", run, "--to", "polygraphy", "-o", tmp_path / "pg.json")
    assert code == 0 and (tmp_path / "pg.json").is_file()
    code, output = run_cli("export", run, "-o", tmp_path / "me.json")
    assert code == 1 and "--reference" in output