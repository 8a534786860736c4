"""The two dump formats: round trips, partial dumps, and refusal of malformed files."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile, DumpWriter, partial_path
from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.formats.rawdump import MANIFEST, TENSORS, RawDumpWriter, convert_raw_dump, read_raw_dump
from layerdiff.analyzer.formats.tensorstats import tensor_stats

AWKWARD_NAMES = ["block1/conv", "model:0/relu:1", "layer with spaces", "ünïcode/π"]


def _write_raw(path, arrays, *, footer=True):
    writer = RawDumpWriter(path, {"engine": "ncnn", "backend_requested": "vulkan", "backends_actual": ["vulkan"],
                                  "precision_requested": "low", "precision_effective": "fp16-storage",
                                  "model": [{"file": "m.param", "sha256": "aa"}, {"file": "m.bin", "sha256": "bb"}]})
    for i, (name, array) in enumerate(arrays.items()):
        writer.add(op=name, op_type="Convolution", array=array, output_index=i % 2, inputs=["data"])
    if footer:
        writer.close(infer_ms=3.5)
    else:
        writer._data.close()
        writer._manifest.close()
    return path


def _arrays():
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal((1, 3, 5, 7)).astype(np.float32) * (i + 1) for i, name in enumerate(AWKWARD_NAMES)}


def test_raw_to_hdf5_round_trip_keeps_names_values_and_provenance(tmp_path):
    arrays = _arrays()
    _write_raw(tmp_path / "raw", arrays)
    out = convert_raw_dump(tmp_path / "raw", tmp_path / "run.h5", attrs={"device_serial": "ABC 123"},
                           inputs=[("data", np.ones((1, 3), np.float32))], stderr="warn: x\n", exit_status=0)
    with DumpFile(out) as dump:
        assert list(dump.layers["op"]) == AWKWARD_NAMES
        assert list(dump.layers["key"]) == [f"{n}:{i % 2}" for i, n in enumerate(AWKWARD_NAMES)]
        for i, name in enumerate(AWKWARD_NAMES):
            np.testing.assert_array_equal(dump.tensor(i), arrays[name])
            np.testing.assert_array_equal(dump.tensor_by_key(f"{name}:{i % 2}"), arrays[name])
        attrs = dump.attrs
        assert attrs["complete"] is True and attrs["backend_actual"] == "vulkan"
        assert attrs["device_serial"] == "ABC 123" and attrs["infer_ms"] == 3.5
        assert len(attrs["model_sha256"]) == 64  # two files → sha256 of their sha256s
        assert dump.provenance["raw_header"]["precision_effective"] == "fp16-storage"
        assert [n for n, _ in dump.inputs()] == ["data"] and dump.stderr() == "warn: x\n"
        assert json.loads(dump.layers.loc[0, "inputs"]) == ["data"]


def test_tensors_carry_no_attributes_and_files_whose_tensors_do_read_alike(tmp_path):
    """A tensor's key, name and op live in /layers alone (format minor 2); a file of an older minor, whose
    tensors carry them as attributes (the sample dumps: minor 0, the HDF5 library's earliest layout), reads the
    same, and written again it is of this writer's format."""
    old = Path(__file__).resolve().parent.parent / "samples" / "dumps" / "ncnn_cpu_high_overflow.h5"
    with h5py.File(old, "r") as fh:
        assert "format_minor" not in fh.attrs and dict(fh["tensors/1"].attrs)["key"] == "stem/conv:0"
    with DumpFile(old) as dump:
        layers, attrs = dump.layers, dump.attrs
        tensors = {int(order): dump.tensor(int(order)) for order in layers["order"]}
    new = tmp_path / "new.h5"
    with DumpWriter(new, {**{k: v for k, v in attrs.items() if k != "provenance"}, "format_minor": 0}) as writer:
        for row in layers.itertuples(index=False):
            writer.add_tensor({"order": row.order, "op": row.op, "output_index": row.output_index, "name": row.name,
                               "op_type": row.op_type, "inputs": json.loads(row.inputs), "layout": row.layout},
                              tensors[int(row.order)])
    with h5py.File(new, "r") as fh:
        assert fh.attrs["format_minor"] == 2
        assert all(len(fh["tensors"][name].attrs) == 0 for name in fh["tensors"])
    with DumpFile(new) as dump:
        for column in ("order", "key", "op", "op_type", "output_index", "name", "inputs", "shape", "dtype"):
            assert dump.layers[column].tolist() == layers[column].tolist(), column
        for order, array in tensors.items():
            np.testing.assert_array_equal(dump.tensor(order), array)
            np.testing.assert_array_equal(dump.tensor_by_key(layers.loc[layers["order"] == order, "key"].item()), array)
        assert dump.attrs["engine"] == attrs["engine"] == "ncnn" and dump.attrs["complete"] == attrs["complete"]


def test_a_root_attribute_too_large_for_the_header_is_kept_whole(tmp_path):
    """Root attributes live in the root's own header, which holds 64 KiB: a larger one (a long stderr tail in the
    provenance, a model's long output list) goes to the file's heap and reads back whole, beside the others."""
    long = "ü" * 150_000
    with DumpWriter(tmp_path / "run.h5", {"outputs": long, "device_serial": "ABC", "provenance": {"note": long}}) as w:
        w.add_tensor({"order": 0, "op": "conv"}, np.ones((2, 3), np.float32))
    with DumpFile(tmp_path / "run.h5") as dump:
        assert dump.attrs["outputs"] == long and dump.attrs["device_serial"] == "ABC"
        assert dump.provenance["note"] == long and dump.layers["key"].tolist() == ["conv:0"]


def test_dump_without_footer_converts_to_incomplete_hdf5_with_every_tensor(tmp_path):
    arrays = _arrays()
    _write_raw(tmp_path / "raw", arrays, footer=False)
    with open(tmp_path / "raw" / MANIFEST, "a") as fh:
        fh.write('{"record": "tensor", "order": 9, "op": "half-writ')  # harness killed mid-line
    raw = read_raw_dump(tmp_path / "raw")
    assert not raw.complete and "last op 'ünïcode/π'" in raw.problems[0]
    out = convert_raw_dump(raw, tmp_path / "run.h5", exit_status=-9)
    with DumpFile(out) as dump:
        assert dump.complete is False and dump.attrs["exit_status"] == -9
        assert len(dump.layers) == len(arrays)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda t: t.update(nbytes=12), "does not match shape"),
        (lambda t: t.update(shape=[10**7, 10**7]), "more than any real tensor"),
        (lambda t: t.update(dtype="object"), "unsupported dtype"),
        (lambda t: t.update(shape=[-1, 4]), "negative dimension"),
    ],
)
def test_raw_reader_refuses_lying_manifests_before_allocating(tmp_path, mutate, message):
    _write_raw(tmp_path / "raw", {"a": np.zeros((2, 3), np.float32)})
    lines = (tmp_path / "raw" / MANIFEST).read_text().splitlines()
    tensor = json.loads(lines[1])
    mutate(tensor)
    lines[1] = json.dumps(tensor)
    (tmp_path / "raw" / MANIFEST).write_text("\n".join(lines) + "\n")
    with pytest.raises(DumpFormatError, match=message) as err:
        read_raw_dump(tmp_path / "raw")
    assert f"{MANIFEST}:2" in str(err.value)


def test_raw_reader_refuses_newer_versions_and_foreign_headers(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / MANIFEST).write_text(json.dumps({"record": "header", "format": "layerdiff-raw", "format_version": 2}) + "\n")
    (tmp_path / "raw" / TENSORS).write_bytes(b"")
    with pytest.raises(DumpFormatError, match="version 2 is not supported"):
        read_raw_dump(tmp_path / "raw")
    (tmp_path / "raw" / MANIFEST).write_text('{"hello": 1}\n')
    with pytest.raises(DumpFormatError, match="not a layerdiff raw dump header"):
        read_raw_dump(tmp_path / "raw")


def test_failed_conversion_leaves_no_partial_file_and_keeps_the_old_one(tmp_path):
    target = tmp_path / "run.h5"
    target.write_bytes(b"previous run")
    with pytest.raises(RuntimeError):
        with DumpWriter(target, {}) as writer:
            writer.add_tensor({"order": 0, "op": "a"}, np.zeros(3, np.float32))
            raise RuntimeError("harness connection lost")
    assert target.read_bytes() == b"previous run"
    assert not partial_path(target).exists()


def test_hdf5_reader_refuses_foreign_and_newer_files(tmp_path):
    with h5py.File(tmp_path / "other.h5", "w") as fh:
        fh["x"] = np.zeros(3)
    with pytest.raises(DumpFormatError, match="not a layerdiff dump"):
        DumpFile(tmp_path / "other.h5")
    with DumpWriter(tmp_path / "new.h5", {}) as writer:
        writer.add_tensor({"order": 0, "op": "a"}, np.zeros(3, np.float32))
    with h5py.File(tmp_path / "new.h5", "a") as fh:
        fh.attrs["format_version"] = 99
    with pytest.raises(DumpFormatError, match="newer than this layerdiff reads"):
        DumpFile(tmp_path / "new.h5")
    (tmp_path / "junk.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    with pytest.raises(DumpFormatError, match="not a readable HDF5 file"):
        DumpFile(tmp_path / "junk.h5")


def test_hdf5_reader_refuses_a_huge_declared_tensor_without_allocating(tmp_path, monkeypatch):
    with DumpWriter(tmp_path / "big.h5", {}) as writer:
        writer.add_tensor({"order": 0, "op": "a"}, np.zeros(3, np.float32))
    with h5py.File(tmp_path / "big.h5", "a") as fh:
        del fh["tensors/0"]
        fh["tensors"].create_dataset("0", shape=(10**6, 10**6), dtype="f4", chunks=(1, 1024))
    with DumpFile(tmp_path / "big.h5") as dump, pytest.raises(DumpFormatError, match="over the"):
        dump.tensor(0)


def test_tensor_stats_match_numpy_including_nonfinite_and_fp16_ranges():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(700_001).astype(np.float32) * 3e4
    x[:50] = 0
    x[50:60] = 1e-6
    x[60:70] = 65504
    x[70:80] = 1e6
    x[80] = np.nan
    x[81:84] = np.inf
    x[84] = -np.inf
    s = tensor_stats(x)
    finite = x[np.isfinite(x)].astype(np.float64)
    assert (s.n_nan, s.n_posinf, s.n_neginf) == (1, 3, 1)
    assert s.n_zero == 50 and s.n_fp16_saturated == 10
    assert s.n_fp16_overflow == int(np.count_nonzero(np.abs(finite) > 65504))
    assert s.n_fp16_underflow == int(np.count_nonzero((np.abs(finite) > 0) & (np.abs(finite) < 6.103515625e-05)))
    assert s.min == finite.min() and s.max == finite.max()
    # float32 chunk sums: exact to ~1e-7 of the spread, which is all a summary statistic needs
    assert s.mean == pytest.approx(finite.mean(), abs=1e-6 * finite.std()) and s.std == pytest.approx(finite.std(), rel=1e-6)
    empty = tensor_stats(np.full(4, np.nan, np.float32))
    assert empty.n_nan == 4 and np.isnan(empty.mean)


def test_tensor_stats_of_float64_values_near_its_limit_stay_finite(recwarn):
    """Squared deviations of values near 1e308 overflow float64: the sums are kept scaled down, so the
    standard deviation is the true one, not inf, and numpy warns of nothing."""
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.standard_normal(300_000) * 1e300, [1.7e308, -1.7e308]])
    s = tensor_stats(x)
    peak = np.abs(x).max()
    assert s.std == pytest.approx(np.std(x / peak) * peak, rel=1e-9)
    assert s.mean == pytest.approx(np.mean(x / peak) * peak, abs=1e-9 * peak)
    assert (s.min, s.max) == (-1.7e308, 1.7e308)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_truncated_tensor_file_keeps_every_tensor_before_the_cut(tmp_path):
    arrays = _arrays()
    _write_raw(tmp_path / "raw", arrays)
    data = tmp_path / "raw" / TENSORS
    data.write_bytes(data.read_bytes()[: 2 * arrays[AWKWARD_NAMES[0]].nbytes + 10])  # a pull cut mid-tensor
    raw = read_raw_dump(tmp_path / "raw")
    assert not raw.complete and len(raw.tensors) == 2 and "inside layer 'layer with spaces'" in raw.problems[-1]
    with DumpFile(convert_raw_dump(raw, tmp_path / "run.h5")) as dump:
        assert dump.complete is False and len(dump.layers) == 2
