"""`.npy` directories and `.npz` archives (incl. ONNX Runtime name -> array), imported and read back."""
from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.importers import detect_format, import_any, import_one


def test_npy_directory_in_natural_order_with_values(tmp_path):
    arrays = {f"layer{i}": np.full((2, i + 1), i, dtype=np.float32) for i in (1, 2, 10)}
    for name, array in arrays.items():
        np.save(tmp_path / f"{name}.npy", array)
    assert detect_format(tmp_path) == "npy-dir"
    with DumpFile(import_any(tmp_path, None, tmp_path / "out" / "d.h5")) as dump:
        assert list(dump.layers["op"]) == ["layer1", "layer2", "layer10"]
        for order, name in enumerate(["layer1", "layer2", "layer10"]):
            np.testing.assert_array_equal(dump.tensor(order), arrays[name])


def test_order_sidecar_and_explicit_order_file(tmp_path):
    for name in ("a", "b", "c"):
        np.save(tmp_path / f"{name}.npy", np.zeros(3, np.float32))
    (tmp_path / "order.txt").write_text("c\nb.npy\nmissing\n")
    result = import_one(tmp_path, None, tmp_path / "o1.h5")
    with DumpFile(result.path) as dump:
        assert list(dump.layers["op"]) == ["c", "b", "a"]
    assert any("no tensor" in p for p in result.problems) and any("at the end" in p for p in result.problems)
    explicit = tmp_path / "mine.txt"
    explicit.write_text("b\na\nc\n")
    with DumpFile(import_any(tmp_path, None, tmp_path / "o2.h5", order_file=explicit)) as dump:
        assert list(dump.layers["op"]) == ["b", "a", "c"]


def test_npz_keeps_archive_order_dtypes_and_fortran_arrays(tmp_path):
    f = np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3))
    np.savez_compressed(tmp_path / "ort.npz", z=np.arange(4, dtype=np.int64), a=f, m=np.array([True, False]),
                        big=np.arange(3, dtype=">f4"))
    with DumpFile(import_any(tmp_path / "ort.npz", None, tmp_path / "o.h5")) as dump:
        assert list(dump.layers["op"]) == ["z", "a", "m", "big"]
        np.testing.assert_array_equal(dump.tensor(1), f)
        assert dump.tensor(2).dtype == np.uint8 and dump.tensor(3).dtype == np.float32
        np.testing.assert_array_equal(dump.tensor(3), [0, 1, 2])


def test_npz_order_sidecar_beside_archive(tmp_path):
    np.savez(tmp_path / "run.npz", a=np.zeros(1), b=np.ones(1))
    (tmp_path / "run.order.txt").write_text("b\na\n")
    with DumpFile(import_any(tmp_path / "run.npz", None, tmp_path / "o.h5")) as dump:
        assert list(dump.layers["op"]) == ["b", "a"]


def _npy_header(shape, descr="<f4") -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}".encode()
    header += b" " * (63 - len(header) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


def test_object_arrays_and_pickles_are_refused_per_layer(tmp_path):
    buf = io.BytesIO()
    np.save(buf, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(tmp_path / "bad.npz", "w") as zf:
        zf.writestr("evil.npy", buf.getvalue())
        good = io.BytesIO()
        np.save(good, np.ones(2, np.float32))
        zf.writestr("good.npy", good.getvalue())
    result = import_one(tmp_path / "bad.npz", None, tmp_path / "o.h5")
    assert any("evil" in p and "objects" in p for p in result.problems)
    with DumpFile(result.path) as dump:
        assert list(dump.layers["op"]) == ["good"]


def test_huge_declared_npy_is_refused_before_allocation(tmp_path):
    (tmp_path / "huge.npy").write_bytes(_npy_header((10**12,)) + b"\0" * 64)
    with pytest.raises(DumpFormatError, match=r"huge\.npy.*1000000000000 elements"):
        import_any(tmp_path, None, tmp_path / "o.h5")


def test_truncated_npy_names_the_file(tmp_path):
    (tmp_path / "t.npy").write_bytes(_npy_header((100,)) + b"\0" * 40)
    with pytest.raises(DumpFormatError, match=r"t\.npy.*only 40 bytes follow"):
        import_any(tmp_path, None, tmp_path / "o.h5")


def test_not_a_zip_npz_is_one_line(tmp_path):
    (tmp_path / "x.npz").write_bytes(b"garbage")
    with pytest.raises(DumpFormatError, match=r"x\.npz: not a readable \.npz"):
        import_any(tmp_path / "x.npz", None, tmp_path / "o.h5")


def test_npz_import_opens_the_archive_once_whatever_its_members(tmp_path, monkeypatch):
    """Opening an archive reads its whole central directory: once per member was quadratic."""
    from layerdiff.analyzer.importers import npyfiles

    opened = []

    class Counting(zipfile.ZipFile):
        def __init__(self, *args, **kwargs):
            opened.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(npyfiles.zipfile, "ZipFile", Counting)
    opens = []
    for members in (20, 2000):
        opened.clear()
        arrays = {f"layer_{i}": np.full((2, 2), i, np.float32) for i in range(members)}
        path = tmp_path / f"m{members}.npz"
        np.savez(path, **arrays)
        with DumpFile(import_any(path, None, tmp_path / f"m{members}.h5")) as dump:
            assert len(dump.layers) == members
            np.testing.assert_array_equal(dump.tensor(members - 1), arrays[f"layer_{members - 1}"])
        opens.append(len(opened))
    assert opens[0] == opens[1] <= 3  # the same few opens (listing, reading) for 20 members as for 2,000
