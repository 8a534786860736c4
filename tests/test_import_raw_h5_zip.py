"""Raw dump dirs, layerdiff HDF5 from elsewhere, zips, and sets where some files are bad."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.importers import detect_format, import_any, import_many

REPO = Path(__file__).resolve().parents[1]


def write_raw(root: Path, arrays: list[np.ndarray], footer: bool = True, header: dict | None = None) -> Path:
    """A raw dump as FORMATS.md §1 describes it, written with plain json + bytes."""
    root.mkdir(parents=True)
    lines = [{"record": "header", "format": "layerdiff-raw", "format_version": 1, "engine": "mnn", "engine_version": "3.6.1",
              "backend_requested": "opencl", "backends_actual": ["cpu"], "precision_requested": "low",
              "precision_effective": "fp32", "threads": 4, "model": [{"file": "m.mnn", "sha256": "ab" * 32, "bytes": 10}],
              "inputs": [], "harness": "test", "started": "2025-01-01T00:00:00Z", **(header or {})}]
    offset = 0
    with open(root / "tensors.bin", "wb") as fh:
        for i, array in enumerate(arrays):
            fh.write(array.astype("<f4").tobytes())
            lines.append({"record": "tensor", "order": i, "op": f"blk/op{i}", "op_type": "Conv", "output_index": 0,
                          "name": f"t{i}", "inputs": [], "shape": list(array.shape), "dtype": "float32", "layout": "NCHW",
                          "offset": offset, "nbytes": array.size * 4, "memory": "host"})
            offset += array.size * 4
    if footer:
        lines.append({"record": "footer", "tensors": len(arrays), "bytes": offset, "infer_ms": 3.5, "finished": "x", "status": "ok"})
    (root / "manifest.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


ARRAYS = [np.arange(6, dtype=np.float32).reshape(1, 2, 3), np.full((4,), -1.0, np.float32)]


def test_raw_dump_with_collector_files_and_set_attrs(tmp_path):
    raw = write_raw(tmp_path / "raw", ARRAYS)
    (raw / "stderr.txt").write_text("warning: fallback\n")
    (raw / "exit_status").write_text("0\n")
    assert detect_format(raw) == "layerdiff-raw"
    with DumpFile(import_any(raw, {"device_model": "Pixel 7"}, tmp_path / "r.h5")) as dump:
        for order, array in enumerate(ARRAYS):
            np.testing.assert_array_equal(dump.tensor(order), array)
        assert dump.attrs["backend_actual"] == "cpu" and dump.attrs["device_model"] == "Pixel 7"
        assert dump.stderr() == "warning: fallback\n" and dump.complete


def test_raw_dump_with_truncated_tensors_bin_names_file_and_layer(tmp_path):
    raw = write_raw(tmp_path / "raw", ARRAYS)
    with open(raw / "tensors.bin", "r+b") as fh:
        fh.truncate(30)
    out = import_any(raw, None, tmp_path / "r.h5")  # the tensor before the cut is kept, the run marked incomplete
    with DumpFile(out) as dump:
        assert not dump.complete and len(dump.layers) == 1
        assert "inside layer 'blk/op1' (manifest.jsonl:3)" in " ".join(dump.provenance["raw_problems"])


def test_raw_header_with_wrong_types_is_one_line(tmp_path):
    raw = write_raw(tmp_path / "raw", ARRAYS, header={"threads": "four", "model": ["m.mnn"]})
    with pytest.raises(DumpFormatError, match=r"manifest\.jsonl:1: header field 'threads'"):
        import_any(raw, None, tmp_path / "r.h5")


def test_h5_from_elsewhere_is_used_in_place_or_relabelled(tmp_path):
    h5 = import_any(write_raw(tmp_path / "raw", ARRAYS), None, tmp_path / "a.h5")
    assert import_any(h5) == h5
    relabelled = import_any(h5, {"device_serial": "XYZ"}, tmp_path / "b.h5")
    with DumpFile(relabelled) as dump:
        assert dump.attrs["device_serial"] == "XYZ" and dump.attrs["engine"] == "mnn"
        np.testing.assert_array_equal(dump.tensor(0), ARRAYS[0])


def test_truncated_and_crafted_h5_are_refused(tmp_path):
    h5 = import_any(write_raw(tmp_path / "raw", ARRAYS), None, tmp_path / "a.h5")
    data = h5.read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(DumpFormatError, match=r"cut\.h5"):
        import_any(tmp_path / "cut.h5")
    crafted = tmp_path / "crafted.h5"
    crafted.write_bytes(data)
    with h5py.File(crafted, "a") as fh:
        del fh["tensors/1"]
        fh["tensors"].create_dataset("1", shape=(2**28,), dtype="f4", chunks=(1024,))  # declared, never written
    with pytest.raises(DumpFormatError, match=r"crafted\.h5: /tensors/1 declares 1 GiB but stores 0 bytes"):
        import_any(crafted)
    attrs = tmp_path / "attrs.h5"
    attrs.write_bytes(data)
    with h5py.File(attrs, "a") as fh:
        fh.attrs["format_version"] = "one"
    with pytest.raises(DumpFormatError, match=r"attrs\.h5: (damaged layerdiff dump attributes|format_version 'one' is not an integer)"):
        import_any(attrs)


def test_zip_of_a_dump_and_zip_path_escapes(tmp_path):
    raw = write_raw(tmp_path / "raw", ARRAYS)
    with zipfile.ZipFile(tmp_path / "dump.zip", "w") as zf:
        for p in raw.iterdir():
            zf.write(p, f"pulled/{p.name}")
    assert detect_format(tmp_path / "dump.zip") == "zip"
    with DumpFile(import_any(tmp_path / "dump.zip", None, tmp_path / "z.h5")) as dump:
        assert len(dump.layers) == 2
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zf:
        zf.writestr("../../escape.npy", b"x")
    with pytest.raises(DumpFormatError, match=r"evil\.zip: member '\.\./\.\./escape\.npy' escapes"):
        import_any(tmp_path / "evil.zip")
    link = zipfile.ZipInfo("run/link.npy")
    link.external_attr = (0o120777 << 16)
    with zipfile.ZipFile(tmp_path / "link.zip", "w") as zf:
        zf.writestr(link, "/etc/passwd")
    with pytest.raises(DumpFormatError, match="symbolic link"):
        import_any(tmp_path / "link.zip")


def test_zip_bomb_stops_at_the_extract_limit(tmp_path, monkeypatch):
    from layerdiff.analyzer.importers import archive

    with zipfile.ZipFile(tmp_path / "bomb.zip", "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("run/a.npy", b"\0" * (8 << 20))
    with pytest.raises(DumpFormatError, match="extracts to more than 1 MiB"):
        archive.extract_zip(tmp_path / "bomb.zip", tmp_path / "x", max_bytes=1 << 20)
    assert not (tmp_path / "x").exists()


def test_import_many_keeps_going_past_bad_files(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERDIFF_CACHE_DIR", str(tmp_path / "cache"))
    good = write_raw(tmp_path / "set" / "good", ARRAYS)
    (tmp_path / "set" / "broken.json").write_text('{"lst": [[')
    np.savez(tmp_path / "set" / "ok.npz", a=np.ones(2))
    bad_raw = write_raw(tmp_path / "set" / "cut", ARRAYS)
    (bad_raw / "tensors.bin").write_bytes(b"")
    paths, errors = import_many([tmp_path / "set", tmp_path / "nothing-here"])
    assert len(paths) == 2 and all(p.is_file() for p in paths)
    assert any("broken.json" in e for e in errors) and any("cut" in e and "tensors.bin" in e for e in errors)
    assert any("nothing-here" in e for e in errors)
    assert good.is_dir()
    again, _ = import_many([tmp_path / "set"])
    assert sorted(again) == sorted(paths)  # cached conversions are reused


_CHILD = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
    from pathlib import Path
    from layerdiff.errors import LayerdiffError
    from layerdiff.analyzer.importers import import_any
    try:
        import_any(Path(sys.argv[1]), None, Path(sys.argv[2]))
    except LayerdiffError as err:
        print("REFUSED", err)
""")


@pytest.mark.parametrize("kind", ["raw", "npz", "mnn-shapes"])
def test_a_trillion_element_declaration_is_refused_under_a_memory_limit(tmp_path, kind):
    if kind == "raw":
        src = write_raw(tmp_path / "raw", ARRAYS[:1])
        lines = (src / "manifest.jsonl").read_text().splitlines()
        tensor = json.loads(lines[1])
        tensor.update(shape=[10**12], nbytes=4 * 10**12)
        (src / "manifest.jsonl").write_text("\n".join([lines[0], json.dumps(tensor)]) + "\n")
    elif kind == "npz":
        header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }"
        header += b" " * (63 - len(header) % 64) + b"\n"
        src = tmp_path / "t.npz"
        with zipfile.ZipFile(src, "w") as zf:
            zf.writestr("x.npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 16)
    else:
        src = tmp_path / "mnn"
        (src / "output").mkdir(parents=True)
        (src / "output" / "x_0").write_text("1\t2\t\n")
        (src / "shapes.json").write_text('{"x_0": [1000000, 1000000]}')
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(src), str(tmp_path / "o.h5")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "REFUSED" in proc.stdout and len(proc.stdout.strip().splitlines()) == 1
