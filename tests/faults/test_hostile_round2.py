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
