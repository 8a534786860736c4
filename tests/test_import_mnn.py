"""MNN text dumps, written here the way MNNV2Basic.out / ModuleBasic.out write them, then imported."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.importers import detect_format, import_any, import_one
from layerdiff.analyzer.align.naming import naming_of
from layerdiff.analyzer.importers.mnnnames import split_mnn_file_name


def mnn_text(array: np.ndarray) -> str:
    """dumpTensor2File: rows of the last dimension, each value followed by a tab (1-D: one per row)."""
    width = array.shape[-1] if array.ndim > 1 else 1
    rows = array.reshape(-1, width)
    return "".join("".join(f"{v:.6g}\t" for v in row) + "\n" for row in rows)


def write_mnn_dump(root: Path, tensors: list[tuple[str, int, np.ndarray]], order_name: str = ".order",
                   log: bool = True, extra_order: list[str] = ()) -> Path:
    """A working directory as MNNV2Basic leaves it: output/<op>_<i>, .order, console log."""
    (root / "output").mkdir(parents=True)
    order, log_lines = [], ["Use extra forward type: 3", "Session Info: memory use 1.0 MB, flops is 2.0 M, backendType is 3"]
    for op, index, array in tensors:
        rel = f"output/{op.replace('/', '_')}_{index}"
        (root / rel).write_text(mnn_text(array))
        order.append(rel)
        if array.ndim == 4:
            b, c, h, w = array.shape
            log_lines.append(f"Dimensions: 4, W,H,C,B: {w} X {h} X {c} X {b}, OP name {op} : {index}")
        else:
            dims = " X ".join(str(d) for d in array.shape)
            log_lines.append(f"Dimensions: {array.ndim}, {dims}, OP name {op} : {index}")
    (root / "output.txt").write_text(mnn_text(tensors[-1][2]))
    (root / order_name).write_text("\n".join(order + list(extra_order) + ["./output.txt"]) + "\n")
    if log:
        log_lines.append("precision:2, memory: 0, Run 1 time:")
        (root / "stdout.txt").write_text("\n".join(log_lines) + "\n")
    return root


def sample_tensors() -> list[tuple[str, int, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        ("/blk/conv/Conv_output_0", 0, rng.standard_normal((1, 4, 3, 5)).astype(np.float32)),
        ("/blk/conv/Conv_output_0_raster_0", 0, rng.standard_normal((1, 4, 3, 5)).astype(np.float32)),
        ("/tk/TopK_output_0", 0, rng.standard_normal((2, 3)).astype(np.float32)),
        ("/tk/TopK_output_0", 1, np.array([[0, 2, 1], [1, 0, 2]], dtype=np.float32)),
        ("vec", 0, np.array([np.nan, np.inf, -np.inf, 1.5], dtype=np.float32)),
    ]


def test_mnn_dump_round_trips_with_shapes_names_and_backend(tmp_path):
    tensors = sample_tensors()
    root = write_mnn_dump(tmp_path / "run", tensors, extra_order=["output/Input__blk_conv_Conv_output_0_0"])
    assert detect_format(root) == "mnn-text"
    out = import_any(root, {"device_serial": "abc"}, tmp_path / "mnn.h5")
    with DumpFile(out) as dump:
        layers = dump.layers
        assert list(layers["op"]) == [op for op, _, _ in tensors]  # original names ('/') from the log
        assert list(layers["output_index"]) == [i for _, i, _ in tensors]
        for order, (_, _, array) in enumerate(tensors):
            got = dump.tensor(order)
            assert got.shape == array.shape
            np.testing.assert_allclose(got, array, rtol=1e-5, equal_nan=True)
        assert dump.attrs["backend_requested"] == "opencl" and dump.attrs["backend_actual"] == "opencl"
        assert dump.attrs["precision_requested"] == "low" and dump.attrs["engine"] == "mnn"
        assert dump.attrs["device_serial"] == "abc"
        assert dump.provenance["import_format"] == "mnn-text"


def test_without_log_tensors_are_flat_and_names_come_from_files(tmp_path):
    root = write_mnn_dump(tmp_path / "run", sample_tensors()[:1], log=False)
    with DumpFile(import_any(root, None, tmp_path / "x.h5")) as dump:
        assert dump.layers["op"][0] == "_blk_conv_Conv_output_0"
        assert dump.tensor(0).shape == (60,)


def test_shapes_json_sidecar_and_module_basic_order_file(tmp_path):
    tensors = sample_tensors()[2:4]
    root = write_mnn_dump(tmp_path / "run", tensors, order_name="order.txt", log=False)
    (root / "shapes.json").write_text('{"_tk_TopK_output_0_0": [3, 2]}')
    with DumpFile(import_any(root, None, tmp_path / "x.h5")) as dump:
        assert dump.tensor(0).shape == (3, 2)
        assert dump.attrs["harness"] == "MNN ModuleBasic"


def test_order_file_decides_layer_order(tmp_path):
    tensors = sample_tensors()[2:5]
    root = write_mnn_dump(tmp_path / "run", tensors)
    (root / ".order").write_text("output/vec_0\noutput/_tk_TopK_output_0_1\noutput/_tk_TopK_output_0_0\n")
    with DumpFile(import_any(root, None, tmp_path / "x.h5")) as dump:
        assert list(dump.layers["key"]) == ["vec:0", "/tk/TopK_output_0:1", "/tk/TopK_output_0:0"]


def test_ragged_rows_skip_that_layer_and_name_file_and_line(tmp_path):
    root = write_mnn_dump(tmp_path / "run", sample_tensors()[2:5])
    (root / "output" / "vec_0").write_text("1\t2\t\n3\t\n")
    result = import_one(root, None, tmp_path / "x.h5")
    assert any("vec_0:2" in p and "ragged" in p for p in result.problems)
    with DumpFile(result.path) as dump:
        assert "vec:0" not in set(dump.layers["key"]) and len(dump.layers) == 2


def test_order_file_paths_cannot_reach_outside_the_dump(tmp_path):
    secret = tmp_path / "secret_0"
    secret.write_text("42\t\n")
    root = write_mnn_dump(tmp_path / "run", sample_tensors()[4:5])
    (root / ".order").write_text("../secret_0\n/etc/passwd\noutput/vec_0\n")
    with DumpFile(import_any(root, None, tmp_path / "x.h5")) as dump:
        assert list(dump.layers["key"]) == ["vec:0"]


def test_all_layers_bad_is_one_error_line(tmp_path):
    root = write_mnn_dump(tmp_path / "run", sample_tensors()[4:5])
    (root / "output" / "vec_0").write_text("1\tabc\t\n")
    with pytest.raises(DumpFormatError, match=r"vec_0.*not a number"):
        import_any(root, None, tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.parametrize(
    ("onnx_tensor", "mnn_file"),
    [
        ("/blk/conv/Conv_output_0", "_blk_conv_Conv_output_0_0"),
        ("/tk/TopK_output_1", "_tk_TopK_output_0_1"),  # 2nd output of a node = output 1 of the MNN op
        ("y", "y_0"),
    ],
)
def test_onnx_runtime_names_align_with_mnn_file_names(onnx_tensor, mnn_file):
    """The name rules an MNN dump brings (its engine's declaration, for a dump that does not record them)."""
    naming = naming_of({"engine": "mnn"})
    op, index = split_mnn_file_name(mnn_file)
    assert naming.canonical(f"{onnx_tensor}:0") == naming.canonical(f"{op}:{index}")


def test_mnn_raster_helpers_are_marked_and_keys_with_colons_survive():
    naming = naming_of({"engine": "mnn"})
    assert naming.is_helper("/add/Add_output_0_raster_1") and not naming.is_helper("/add/Add_output_0")
    assert naming.canonical("a:b/c:2") == "a:b_c:2"


def test_ort_npz_aligns_with_mnn_dump_without_a_name_map(tmp_path):
    tensors = sample_tensors()
    root = write_mnn_dump(tmp_path / "run", tensors, log=False)
    ort = {"/blk/conv/Conv_output_0": tensors[0][2], "/tk/TopK_output_0": tensors[2][2], "/tk/TopK_output_1": tensors[3][2]}
    np.savez(tmp_path / "ort.npz", **ort)
    with DumpFile(import_any(root, None, tmp_path / "m.h5")) as mnn, DumpFile(import_any(tmp_path / "ort.npz", None, tmp_path / "o.h5")) as ref:
        naming = naming_of(mnn.attrs, ref.attrs)  # the imported dump names its engine; its rules come from there
        mnn_keys = {naming.canonical(k): o for k, o, op in zip(mnn.layers["key"], mnn.layers["order"], mnn.layers["op"]) if not naming.is_helper(op)}
        ref_keys = {naming.canonical(k): o for k, o in zip(ref.layers["key"], ref.layers["order"])}
        assert set(ref_keys) <= set(mnn_keys)
        for key, order in ref_keys.items():
            np.testing.assert_allclose(mnn.tensor(mnn_keys[key]).reshape(-1), ref.tensor(order).reshape(-1), rtol=1e-5)


@pytest.mark.parametrize("layout", ["root-renamed", "output-renamed-order-inside", "output-renamed-order-beside"])
def test_renamed_dump_folders_are_recognised_by_content(tmp_path, layout):
    """a colleague's MNNV2Basic dump sent as a renamed folder still imports."""
    import os
    import shutil

    from layerdiff.analyzer.runs.sources import open_runs

    tensors = sample_tensors()
    work = write_mnn_dump(tmp_path / "MNNV2Basic.out", tensors)
    if layout == "root-renamed":
        os.rename(work, tmp_path / "from_bob")
        given = tmp_path / "from_bob"
    elif layout == "output-renamed-order-inside":
        shutil.copy(work / ".order", work / "output" / ".order")
        os.rename(work / "output", tmp_path / "bob_dump")
        shutil.rmtree(work)
        given = tmp_path / "bob_dump"
    else:
        os.rename(work / "output", work / "tensors")
        given = work
    assert detect_format(given) == "mnn-text"
    sources = open_runs([tmp_path])  # found when searching the parent directory, too
    try:
        assert len(sources.runs) == 1, sources.problems
        ops = list(sources.runs[0].layers["op"])
        assert len(ops) == len(tensors) and ops[0] in (tensors[0][0], tensors[0][0].replace("/", "_"))
    finally:
        sources.close()


def test_a_folder_of_other_numbered_files_is_not_an_mnn_dump(tmp_path):
    (tmp_path / "notes_1").write_text("meeting notes, not numbers\n")
    (tmp_path / "photo_2").write_bytes(b"\x89PNG\r\n\x1a\n....")
    assert detect_format(tmp_path) is None
