"""Mutated foreign files never crash the importers and never allocate beyond a bound.

Each example builds a small valid file, mutates it (fields replaced by arbitrary JSON, headers
rewritten, bytes flipped, attributes retyped), imports it, and asserts: the only exception is
`LayerdiffError`, and tracemalloc's peak (numpy reports its buffers to it) stays under 64 MiB
although mutations declare tensors of up to 10^12 elements.
"""
from __future__ import annotations

import base64
import io
import json
import os
import shutil
import tempfile
import tracemalloc
import zipfile
from pathlib import Path

import h5py
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerdiff.errors import LayerdiffError
from layerdiff.analyzer.importers import import_any

PEAK_LIMIT = 64 << 20
# CI runs a fixed, fast set; LAYERDIFF_FUZZ_EXAMPLES=2000 runs a deeper random search by hand.
_DEEP = os.environ.get("LAYERDIFF_FUZZ_EXAMPLES")
FUZZ = settings(max_examples=int(_DEEP or 40), deadline=None, derandomize=_DEEP is None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**13), 10**13) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=8,
)
sizes = st.sampled_from([0, 1, 3, 10**6, 10**12, -1, 2**40])


def run_import(src: Path, out_dir: Path, attrs: dict | None = None) -> None:
    tracemalloc.start()
    try:
        import_any(src, attrs, out_dir / "out.h5")
    except LayerdiffError as err:
        assert "\n" not in str(err)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < PEAK_LIMIT, f"peak {peak} bytes"


def _workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="ld-fuzz-"))


def _raw_lines() -> list[dict]:
    return [
        {"record": "header", "format": "layerdiff-raw", "format_version": 1, "engine": "mnn", "threads": 2,
         "backends_actual": ["cpu"], "model": [{"file": "m.mnn", "sha256": "ab"}], "inputs": []},
        {"record": "tensor", "order": 0, "op": "a/b", "output_index": 0, "name": "t0", "inputs": [], "shape": [2, 2],
         "dtype": "float32", "layout": "NCHW", "offset": 0, "nbytes": 16, "memory": "host"},
        {"record": "footer", "tensors": 1, "bytes": 16, "infer_ms": 1.0, "status": "ok"},
    ]


@FUZZ
@given(line=st.integers(0, 2), field=st.sampled_from(["record", "format_version", "shape", "dtype", "offset", "nbytes",
                                                       "order", "threads", "model", "backends_actual", "infer_ms", "status", "op"]),
       value=json_values | sizes, cut=st.integers(0, 600))
def test_mutated_raw_manifest(line, field, value, cut):
    work = _workdir()
    try:
        raw = work / "raw"
        raw.mkdir()
        (raw / "tensors.bin").write_bytes(np.arange(4, dtype="<f4").tobytes())
        lines = _raw_lines()
        lines[line][field] = value
        text = "".join(json.dumps(x) + "\n" for x in lines)
        (raw / "manifest.jsonl").write_text(text[: cut] if cut < len(text) and cut % 3 == 0 else text)
        run_import(raw, work)
    finally:
        shutil.rmtree(work)


def _npy(shape_text: str, descr: str, payload: bytes) -> bytes:
    header = f"{{'descr': {descr}, 'fortran_order': False, 'shape': {shape_text}, }}".encode()
    header += b" " * (63 - len(header) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + payload


@FUZZ
@given(shape=st.lists(sizes, max_size=3).map(lambda s: repr(tuple(s))) | st.text(max_size=12),
       descr=st.sampled_from(["'<f4'", "'|O'", "'<U3'", "'<c8'", "[('a', '<f4')]", "'>i8'", "'|b1'", "5", "'xyz'"]),
       payload=st.binary(max_size=64), compress=st.booleans(), flip=st.integers(0, 400))
def test_mutated_npz(shape, descr, payload, compress, flip):
    work = _workdir()
    try:
        method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
        with zipfile.ZipFile(work / "a.npz", "w", compression=method) as zf:
            zf.writestr("x.npy", _npy(shape, descr, payload))
            zf.writestr("y.npy", _npy("(2,)", "'<f4'", b"\0" * 8))
        data = bytearray((work / "a.npz").read_bytes())
        if flip < len(data) and flip % 2:
            data[flip] ^= 0xFF
        (work / "a.npz").write_bytes(bytes(data))
        run_import(work / "a.npz", work)
    finally:
        shutil.rmtree(work)


text_tokens = st.sampled_from(["1", "-2.5", "nan", "-nan", "inf", "1e999", "x", "", "\t", "\n", "\r\n", " ", "\x00", "é", "0x1p3"])


@FUZZ
@given(body=st.lists(text_tokens, max_size=40).map("".join), order=st.lists(st.text(max_size=10), max_size=4),
       shapes=json_values, log=st.lists(st.sampled_from([
           "Dimensions: 4, W,H,C,B: 2 X 1 X 1 X 1, OP name a/b : 0",
           "Dimensions: 2, 1000000 X 1000000, OP name a/b : 0",
           "Dimensions: 1, 2, OP name a_b : 0", "backendType is 99", "precision:7", "Use extra forward type: x"]), max_size=3))
def test_mutated_mnn_text(body, order, shapes, log):
    work = _workdir()
    try:
        out = work / "run" / "output"
        out.mkdir(parents=True)
        (out / "a_b_0").write_text(body, encoding="utf-8")
        (out / "c_0").write_text("1\t2\t\n")
        (work / "run" / ".order").write_text("\n".join(order + ["output/a_b_0", "output/c_0"]), encoding="utf-8")
        (work / "run" / "shapes.json").write_text(json.dumps(shapes))
        (work / "run" / "stdout.txt").write_text("\n".join(log))
        run_import(work / "run", work)
    finally:
        shutil.rmtree(work)


def _polygraphy_doc(array_obj, name: str = "bad") -> dict:
    buf = io.BytesIO()
    np.save(buf, np.ones(3, np.float32))
    good = {"values": {"array": base64.b64encode(buf.getvalue()).decode(), "polygraphy_class": "ndarray"}}
    return {"lst": [["onnxrt-runner", [{"outputs": {"good": good, name: array_obj}, "runtime": 0.1, "runner_name": "r"}]]]}


@FUZZ
@given(array_obj=json_values, npy_shape=st.lists(sizes, max_size=2).map(lambda s: repr(tuple(s))), where=st.integers(0, 3),
       name=st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.characters(), max_size=3))
def test_mutated_polygraphy_json(array_obj, npy_shape, where, name):
    work = _workdir()
    try:
        if where == 0:
            array_obj = {"array": base64.b64encode(_npy(npy_shape, "'<f4'", b"\0" * 8)).decode()}
            name = name or "x"
        doc = _polygraphy_doc(array_obj, name if name != "good" else "x")
        if where == 3:
            doc["lst"][0] = array_obj
        (work / "r.json").write_text(json.dumps(doc))  # ensure_ascii: lone surrogates become \\udXXX escapes
        run_import(work / "r.json", work)
    finally:
        shutil.rmtree(work)


def _h5_seed(work: Path) -> Path:
    np.savez(work / "s.npz", a=np.ones((2, 2), np.float32), b=np.zeros(3, np.float32))
    return import_any(work / "s.npz", None, work / "seed.h5")


@FUZZ
@given(attr=st.sampled_from(["layerdiff_format", "format_version", "provenance", "complete", "threads", "infer_ms", "engine"]),
       value=st.one_of(st.integers(-(2**62), 2**62), st.floats(), st.text(max_size=10).filter(lambda t: "\0" not in t), st.binary(max_size=10).filter(lambda b: b"\0" not in b),  # h5py cannot store NULs
                       st.lists(st.integers(0, 5), min_size=1, max_size=3)),
       flip=st.integers(0, 4000), relabel=st.booleans())
def test_mutated_hdf5(attr, value, flip, relabel):
    work = _workdir()
    try:
        path = _h5_seed(work)
        with h5py.File(path, "a") as fh:
            fh.attrs[attr] = np.array(value) if isinstance(value, list) else value
        data = bytearray(path.read_bytes())
        if flip < len(data) and flip % 4 == 1:
            data[flip] ^= 0x5A
            path.write_bytes(bytes(data))
        tracemalloc.start()
        try:
            import_any(path, {"device_serial": "x"} if relabel else None, work / "o.h5" if relabel else None)
        except LayerdiffError as err:
            assert "\n" not in str(err)
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < PEAK_LIMIT
    finally:
        shutil.rmtree(work)


_SUMMARY_HEAD = ("\n\n===== Detailed Precision Profiler Summary =====\n"
                 "operator:(kernel_info) output_tensor_name:(tensor_info) dims mean std_deviation ave_grow_rate*\n")


@FUZZ
@given(kernel=st.sampled_from(["conv2d:arm/float/NCHW", "conv2d:opencl/float16/ImageDefault", "x", ":a/b/c"]),
       output=st.sampled_from(["c.tmp_0_1:arm/float/NCHW", "c.tmp_0:arm/float/NCHW", "c.tmp_0_x:a/b/c", "_1:a/b/c"]),
       dims=st.sampled_from(["{1,2}", "{1000000,1000000}", "{}", "{-1,2}", "{1099511627776}", "{1,2", "1,2"]),
       mean=st.sampled_from(["0.5", "unused", "nan"]), values=st.text(st.sampled_from("[]0123456789.- \nnaie"), max_size=60),
       extra=st.booleans())
def test_mutated_paddle_lite_profile(kernel, output, dims, mean, values, extra):
    work = _workdir()
    try:
        run = work / "PaddleLite_x"
        run.mkdir()
        line = f"{kernel} {output} {dims} {mean} 0.1 0.0" + (" 9" if extra else "")
        (run / "precision_summary.log").write_text(_SUMMARY_HEAD + line + "\nrelu:arm/float/NCHW r.tmp_0_1:arm/float/NCHW {2} 1 0 0\n")
        (run / "c.tmp_0_1.txt").write_text(values)
        (run / "r.tmp_0_1.txt").write_text("[0] 1.000000 \n[1] 2.000000 \n")
        run_import(run, work)
    finally:
        shutil.rmtree(work)


@FUZZ
@given(name=st.text(max_size=6), dims=st.sampled_from(["{1,2}", "{1000000,1000000}", "{}", "{-3}", "{1099511627776,2}"]),
       values=st.text(st.sampled_from("0123456789.-e \tnai"), max_size=40),
       topo=st.sampled_from(["conv2d\t(X:x)\t(Out:a)\n", "conv2d\t(X:x)\n", "", "feed\t(X:feed)\t(Out:x)\n"]))
def test_mutated_paddle_lite_debug_tool(name, dims, values, topo):
    work = _workdir()
    try:
        (work / "tensor_cpp.txt").write_text(f"a\t{{1,2}}\t1 2\n{name}\t{dims}\t{values}\n", encoding="utf-8")
        if topo:
            (work / "topo_file.txt").write_text(topo)
        run_import(work / "tensor_cpp.txt", work)
    finally:
        shutil.rmtree(work)
