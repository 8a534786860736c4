"""Crafted dumps and inputs a hostile user would try, each ending in one line (or a report), never a traceback.

Every file here is a genuine dump written by the real writer and then altered the way a hand-edited or
crafted file would be; the CLI runs as a user runs it."""
from __future__ import annotations

import json

import h5py
import numpy as np

from tests.faults.support import assert_one_line_error, cli, write_dump

ARRAYS = [np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4), np.linspace(-1, 1, 8).astype(np.float32)]


def _pair(tmp_path, mutate):
    """A good reference and a run altered by `mutate(h5py.File)`."""
    ref = write_dump(tmp_path / "ref.h5", ARRAYS)
    run = write_dump(tmp_path / "run.h5", [a + 0.01 for a in ARRAYS], attrs={"backend_requested": "opencl"})
    with h5py.File(run, "r+") as f:
        mutate(f)
    return ref, run


def _analyze(tmp_path, ref, run, *extra):
    return cli("analyze", str(ref), str(run), "-o", str(tmp_path / "rep"), *extra)


def test_layers_table_with_two_dimensions_is_one_line(tmp_path):
    def stack(f):
        table = f["layers"][...]
        del f["layers"]
        f.create_dataset("layers", data=np.stack([table, table]))
    ref, run = _pair(tmp_path, stack)
    assert_one_line_error(_analyze(tmp_path, ref, run), str(run), "/layers table has 2 dimensions")


def test_tensor_with_an_empty_dataspace_is_one_line(tmp_path):
    def empty(f):
        del f["tensors/1"]
        f.create_dataset("tensors/1", shape=None, dtype="f4")
    ref, run = _pair(tmp_path, empty)
    proc = _analyze(tmp_path, ref, run)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "/tensors/1 holds no data" in proc.stderr
    report = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert report  # the rest of the run is still reported


def test_array_valued_root_attributes_become_lists_not_crashes(tmp_path):
    def arrays(f):
        f.attrs["threads"] = np.arange(3)
        f.attrs["input_fed_check"] = np.arange(5)
    ref, run = _pair(tmp_path, arrays)
    proc = _analyze(tmp_path, ref, run)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2, proc.stderr[-3000:]  # the input check did not say `equal`: a problem, reported
    assert (tmp_path / "rep" / "results.json").is_file()


def test_name_map_that_is_not_utf8_is_one_line(tmp_path):
    ref, run = _pair(tmp_path, lambda f: None)
    name_map = tmp_path / "map.csv"
    name_map.write_bytes(b"\xff\xfe,\x00\nop0,x\n")
    proc = _analyze(tmp_path, ref, run, "--name-map", str(name_map))
    assert_one_line_error(proc, str(name_map), "not UTF-8")


def test_rename_naming_a_group_the_expression_lacks_is_one_line(tmp_path):
    ref, run = _pair(tmp_path, lambda f: None)
    proc = _analyze(tmp_path, ref, run, "--rename", r"op(\d)=\9")
    assert_one_line_error(proc, "--rename", "bad replacement")


def test_rename_with_valid_named_and_numbered_groups_still_applies(tmp_path):
    ref, run = _pair(tmp_path, lambda f: None)
    proc = _analyze(tmp_path, ref, run, "--rename", r"op(?P<n>\d)=op\g<n>", "--rename", r"^op(\d)$=op\1")
    assert proc.returncode == 0, proc.stderr[-3000:]


def _with_orders(orders, dtype):
    def mutate(f):
        table = f["layers"][...]
        del f["layers"]
        fields = [(n, dtype if n == "order" else table.dtype[n]) for n in table.dtype.names]
        out = np.zeros(len(orders), fields)
        for name in table.dtype.names:
            out[name] = np.resize(table[name], len(orders))
        out["order"] = orders
        f.create_dataset("layers", data=out)
    return mutate


def test_fractional_layer_orders_are_refused_not_judged(tmp_path):
    ref, run = _pair(tmp_path, _with_orders([0.5, 0.5], "f8"))
    assert_one_line_error(_analyze(tmp_path, ref, run), str(run), "column 'order' holds float64 values, not integers")


def test_repeated_layer_orders_are_refused_not_judged(tmp_path):
    ref, run = _pair(tmp_path, _with_orders([0, 1, 0, 1], "i8"))
    assert_one_line_error(_analyze(tmp_path, ref, run), str(run), "lists order 0 more than once")


def test_notebook_analyze_refuses_a_path_that_is_not_a_path():
    import pytest

    import layerdiff
    from layerdiff.errors import UsageError

    with pytest.raises(UsageError, match="1 is not a file or directory path"):
        layerdiff.analyze(iter([1, 2]))


def test_notebook_analyze_refuses_a_threshold_that_is_not_a_number(tmp_path):
    import pytest

    import layerdiff
    from layerdiff.errors import UsageError

    ref, run = _pair(tmp_path, lambda f: None)
    with pytest.raises(UsageError, match="--atol 'big': give a number"):
        layerdiff.analyze([ref, run], atol="big")
    with pytest.raises(UsageError, match="--rtol True: give a number"):
        layerdiff.analyze([ref, run], rtol=True)


def test_notebook_name_map_with_non_text_entries_is_read_as_text(tmp_path):
    import layerdiff

    ref, run = _pair(tmp_path, lambda f: None)
    with layerdiff.analyze([ref, run], name_map={1: None, "op9": ["x"]}) as results:
        assert set(results.layers["key"]) == {"op0:0", "op1:0"}


def test_model_explorer_export_names_a_layer_it_could_not_measure(tmp_path):
    def checksummed(f):
        tensor = f["tensors/1"][...]
        del f["tensors/1"]
        f.create_dataset("tensors/1", data=tensor, chunks=(8,), fletcher32=True)
    ref, run = _pair(tmp_path, checksummed)
    with h5py.File(run, "r") as f:
        offset = f["tensors/1"].id.get_chunk_info(0).byte_offset
    data = bytearray(run.read_bytes())
    data[offset + 5] ^= 0xFF  # the chunk no longer matches its checksum
    run.write_bytes(bytes(data))
    out = tmp_path / "nodes.json"
    proc = cli("analyze", "export", str(run), "--reference", str(ref), "-o", str(out))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "tensor 1 is unreadable" in proc.stderr
    assert set(json.loads(out.read_text())["results"]) == {"op0"}  # the readable layer is still exported


def test_name_map_that_is_a_device_is_refused_not_read_forever(tmp_path):
    ref, run = _pair(tmp_path, lambda f: None)
    proc = cli("analyze", str(ref), str(run), "-o", str(tmp_path / "rep"), "--name-map", "/dev/zero", timeout=60)
    assert_one_line_error(proc, "/dev/zero", "not a regular file")


def test_name_map_over_the_json_limit_is_refused(tmp_path):
    ref, run = _pair(tmp_path, lambda f: None)
    name_map = tmp_path / "map.csv"
    name_map.write_text("op0,x\n" * 200)
    proc = cli("analyze", str(ref), str(run), "-o", str(tmp_path / "rep"), "--name-map", str(name_map),
               env={"LAYERDIFF_MAX_JSON_BYTES": "1000"})
    assert_one_line_error(proc, "map.csv", "LAYERDIFF_MAX_JSON_BYTES")


def test_a_foreign_dump_with_no_layer_in_common_is_named_by_the_file_given(tmp_path):
    ref = write_dump(tmp_path / "ref.h5", ARRAYS)
    npz = tmp_path / "run.npz"
    np.savez(npz, other=np.zeros(4, np.float32))
    proc = _analyze(tmp_path, ref, npz)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"analyze: {npz}: no layer in common with ref.h5" in proc.stderr
    assert "conversions" not in proc.stderr  # never the converted copy in the cache


def test_png_figures_of_float64_values_near_the_limit_are_drawn(tmp_path):
    ref = write_dump(tmp_path / "ref.h5", [np.array([1e308, -1e308, 5e-324, 1.0], np.float64)])
    run = write_dump(tmp_path / "run.h5", [np.array([-1e308, 1e308, -5e-324, 2.0], np.float64)],
                     attrs={"backend_requested": "opencl"})
    proc = _analyze(tmp_path, ref, run, "--png")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "rep" / "failure_source.png").stat().st_size > 0
    assert proc.stderr.strip() == ""  # no numpy overflow warning lines: the values are measured as inf


def _raw(tmp_path, edit):
    """A raw dump written as FORMATS.md §1 describes it, its manifest lines then edited by `edit`."""
    from tests.test_import_raw_h5_zip import write_raw

    root = write_raw(tmp_path / "raw", ARRAYS)
    lines = [json.loads(line) for line in (root / "manifest.jsonl").read_text().splitlines()]
    edit(lines)
    (root / "manifest.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


import pytest  # noqa: E402


@pytest.mark.parametrize("field, value, needle", [
    ("inputs", "t0", "'inputs' must be a list of tensor names"),
    ("shape", [True, 2, 3, 4], "'shape' must be a list of integers"),
    ("order", "0", "'order' must be an integer"),
    ("offset", 0.0, "'offset' must be an integer"),
    ("op", {"x": 1}, "'op' must be a string"),
])
def test_raw_tensor_line_with_a_field_of_another_type_is_one_line(tmp_path, field, value, needle):
    root = _raw(tmp_path, lambda lines: lines[1].__setitem__(field, value))
    proc = cli("analyze", "import", str(root), "-o", str(tmp_path / "o.h5"))
    assert_one_line_error(proc, "manifest.jsonl:2", needle)


def test_raw_footer_counting_more_tensors_than_listed_marks_the_run_incomplete(tmp_path):
    from layerdiff.analyzer.formats.dumpfile import DumpFile

    root = _raw(tmp_path, lambda lines: lines[-1].__setitem__("tensors", 5))
    proc = cli("analyze", "import", str(root), "-o", str(tmp_path / "o.h5"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the footer counts 5 tensors but the manifest lists 2" in proc.stderr
    with DumpFile(tmp_path / "o.h5") as dump:
        assert not dump.complete
        assert len(dump.layers) == 2  # what is listed is kept


def _retyped(column, dtype, value):
    def mutate(f):
        table = f["layers"][...]
        del f["layers"]
        out = np.zeros(table.shape, [(n, dtype if n == column else table.dtype[n]) for n in table.dtype.names])
        for name in table.dtype.names:
            if name != column:
                out[name] = table[name]
        out[column] = value
        f.create_dataset("layers", data=out)
    return mutate


@pytest.mark.parametrize("column, dtype, value, needle", [
    ("min", "S8", b"abc", "column 'min' holds |S8 values, not numbers"),
    ("n_nan", "f8", np.nan, "column 'n_nan' holds float64 values, not integers"),
])
def test_layers_statistics_of_another_type_are_one_line(tmp_path, column, dtype, value, needle):
    ref, run = _pair(tmp_path, _retyped(column, dtype, value))
    assert_one_line_error(_analyze(tmp_path, ref, run, "--png"), str(run), needle)


def test_raw_tensor_overlapping_the_one_before_is_one_line(tmp_path):
    def overlap(lines):
        lines[2]["offset"] = 0
        lines[2]["nbytes"] = 32
    root = _raw(tmp_path, overlap)
    proc = cli("analyze", "import", str(root), "-o", str(tmp_path / "o.h5"))
    assert_one_line_error(proc, "manifest.jsonl:3", "inside the bytes of the tensor before it")


def test_raw_footer_count_that_is_not_an_integer_is_one_line(tmp_path):
    root = _raw(tmp_path, lambda lines: lines[-1].__setitem__("tensors", "many"))
    proc = cli("analyze", "import", str(root), "-o", str(tmp_path / "o.h5"))
    assert_one_line_error(proc, "manifest.jsonl", "footer field 'tensors' must be an integer")


def test_collect_with_an_absurd_repeat_count_is_refused_at_once(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"not read: the option is refused first")
    proc = cli("collect", "-m", str(model), "-o", str(tmp_path / "out"), "--repeat", "1000000000000", timeout=60)
    assert_one_line_error(proc, "--repeat 1000000000000", "at most 10000 repeats")
    assert not (tmp_path / "out").exists()
