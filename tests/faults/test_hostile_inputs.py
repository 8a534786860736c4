"""Hostile inputs wherever a file or option declares a size or a depth: model files that crash their
engine's reader, deeply nested JSON, huge declared shapes, endless phone output lines, symbolic links
inside dump folders, FIFOs, huge attributes, and numeric options that are not numbers. Each ends in
one line naming the file or option, never a traceback, a crash or a hang."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.faults.support import REPO, assert_one_line_error, cli, write_dump

MODEL = REPO / "samples" / "models" / "convnet.mnn"
DEEP = "[" * 2000 + "]" * 2000


def _collect(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return cli("collect", "--device", "local", "-o", str(tmp_path / "out"), *args, env=env, timeout=240)


# -- model files are read in a limited child ------------------------------------------------------

def test_sparse_20gb_mnn_is_one_line_at_once(tmp_path):
    big = tmp_path / "big.mnn"
    with open(big, "wb") as fh:
        fh.truncate(20 << 30)  # sparse: no disk used
    proc = _collect(tmp_path, "--model", str(big), "--input", "random")
    assert_one_line_error(proc, "big.mnn", "LAYERDIFF_MODEL_READ_MEMORY")
    assert not (tmp_path / "out").exists()


def _crashing_mutant(tmp_path: Path) -> Path:
    """A copy of the sample .mnn with a few bytes changed on which pymnn itself dies by a signal."""
    source = MODEL.read_bytes()
    rng = random.Random(0)
    probe = "import MNN, sys; MNN.Interpreter(sys.argv[1]).createSession({'backend': 'CPU'})"
    for index in range(80):
        data = bytearray(source)
        for _ in range(8):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path = tmp_path / f"mutant{index}.mnn"
        path.write_bytes(data)
        bare = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, timeout=60)
        if bare.returncode < 0:
            return path
        path.unlink()
    pytest.fail("no mutant of the sample model crashes pymnn; the test needs one")


def test_mutated_mnn_that_crashes_pymnn_is_one_line(tmp_path):
    mutant = _crashing_mutant(tmp_path)
    proc = _collect(tmp_path, "--model", str(mutant), "--input", "random")
    assert_one_line_error(proc, mutant.name, "crashed", "killed by SIG")


def test_model_reader_memory_limit_is_enforced(tmp_path):
    proc = _collect(tmp_path, "--model", str(MODEL), "--input", "random",
                    env={"LAYERDIFF_MODEL_READ_MEMORY": "64M", "LAYERDIFF_CACHE": str(tmp_path / "cache")})
    assert_one_line_error(proc, "convnet.mnn", "LAYERDIFF_MODEL_READ_MEMORY")


def test_model_read_in_a_threaded_process_answers_the_same(tmp_path, monkeypatch):
    """A process running threads starts the reader as `python -m` instead of forking."""
    import threading

    from layerdiff.collector.inputs.modelread import read_specs_isolated

    monkeypatch.setenv("LAYERDIFF_CACHE", str(tmp_path / "cache"))  # no kept answer: the child must run

    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert threading.active_count() > 1
        assert read_specs_isolated("mnn", MODEL) == {"data": ((1, 3, 32, 32), "float32")}
    finally:
        stop.set()
        worker.join()


def test_model_answer_is_kept_per_file_version(tmp_path, monkeypatch):
    """A second collect of the same file reads the kept answer; a changed file is read again."""
    from layerdiff.collector.inputs import modelread

    monkeypatch.setenv("LAYERDIFF_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "net.mnn"
    model.write_bytes(MODEL.read_bytes())
    assert modelread.read_specs_isolated("mnn", model) == {"data": ((1, 3, 32, 32), "float32")}
    [kept] = (tmp_path / "cache" / modelread.CACHE_FOLDER).glob("*.json")
    kept.write_text(json.dumps({"specs": [["data", [1, 3, 8, 8], "float32"]]}))  # marks a cache hit
    assert modelread.read_specs_isolated("mnn", model) == {"data": ((1, 3, 8, 8), "float32")}
    os.utime(model, ns=(1, 1))  # another version of the file: read again
    assert modelread.read_specs_isolated("mnn", model) == {"data": ((1, 3, 32, 32), "float32")}


# -- JSON nesting ---------------------------------------------------------------------------------

def _dump_with_deep_inputs_cell(path: Path) -> Path:
    write_dump(path, [np.arange(10, dtype=np.float32) + i for i in range(3)], inputs={"data": np.zeros(4, np.float32)})
    with h5py.File(path, "a") as fh:
        table = fh["layers"][...]
        table["inputs"][1] = DEEP.encode()
        fh["layers"][...] = table
    return path


def test_deep_layers_cell_is_one_line_in_analyze(tmp_path):
    dump = _dump_with_deep_inputs_cell(tmp_path / "deep.h5")
    proc = cli("analyze", "inspect", str(dump))
    assert_one_line_error(proc, "deep.h5", "nested more than")


def test_deep_layers_cell_is_one_line_in_isolate(tmp_path):
    dump = _dump_with_deep_inputs_cell(tmp_path / "deep.h5")
    proc = cli("collect", "isolate", "--model", str(MODEL), "-b", "cpu", "-p", "low", "--ref", str(dump),
               "--layer", "op1", "-o", str(tmp_path / "iso"))
    assert_one_line_error(proc, "deep.h5", "nested more than")


def test_deep_preprocess_file_is_one_line(tmp_path):
    pre = tmp_path / "pre.json"
    pre.write_text('{"mean": ' + DEEP + "}")
    proc = _collect(tmp_path, "--model", str(MODEL), "--input", "random", "--preprocess", str(pre))
    assert_one_line_error(proc, "pre.json", "nested more than")


def test_deep_name_map_is_one_line(tmp_path):
    a = write_dump(tmp_path / "a.h5", [np.ones(4, np.float32)])
    b = write_dump(tmp_path / "b.h5", [np.ones(4, np.float32)])
    names = tmp_path / "names.json"
    names.write_text(DEEP)
    proc = cli("analyze", str(a), str(b), "--name-map", str(names), "-o", str(tmp_path / "rep"))
    assert_one_line_error(proc, "names.json", "nested more than")


# -- declared sizes -------------------------------------------------------------------------------

def test_huge_shape_is_refused_before_allocating(tmp_path):
    proc = _collect(tmp_path, "--model", str(MODEL), "--input", "random", "--shape", "data=1x3x100000x100000")
    assert_one_line_error(proc, "'data'", "1x3x100000x100000", "LAYERDIFF_MAX_TENSOR_BYTES")


def test_npy_input_declaring_terabytes_is_refused_before_allocating(tmp_path):
    crafted = tmp_path / "huge.npy"
    with open(crafted, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": (1, 3, 10**6, 10**6)})
        fh.write(bytes(1000))
    proc = _collect(tmp_path, "--model", str(MODEL), "--input", str(crafted))
    assert_one_line_error(proc, "huge.npy")


def test_phone_output_without_newlines_is_kept_bounded():
    from layerdiff.collector.transport.adb import MAX_LINE_BYTES, _LineSplitter

    lines: list[str] = []
    splitter = _LineSplitter(lines.append)
    block = b"x" * (1 << 16)
    for _ in range(1600):  # 100 MiB without a newline, in the chunks the adb transport hands over
        splitter.feed(block)
    splitter.feed(b"\nnext\r\nla")
    splitter.feed(b"st\n")
    splitter.flush()
    assert len(lines) == 3 and lines[1:] == ["next", "last"]
    assert lines[0].startswith("x" * 100) and len(lines[0]) < MAX_LINE_BYTES + 100
    assert f"{1600 * len(block) - MAX_LINE_BYTES} more bytes" in lines[0]


def test_phone_stderr_keeps_its_end_within_a_bound():
    from layerdiff.collector.transport.adb import MAX_STDERR_BYTES, _TailBytes

    tail = _TailBytes(MAX_STDERR_BYTES)
    for _ in range(40):  # 40 MiB of stderr
        tail.feed(b"y" * (1 << 20))
    tail.feed(b"\nAborted: the reason\n")
    text = tail.text()
    assert text.endswith("Aborted: the reason\n") and len(text) < MAX_STDERR_BYTES + 100
    assert text.startswith(f"[... {40 * (1 << 20) + 21 - MAX_STDERR_BYTES} earlier bytes")


def test_model_reader_time_limit_is_enforced(tmp_path):
    onnx_model = REPO / "samples" / "models" / "convnet.onnx"
    proc = _collect(tmp_path, "--model", str(onnx_model), "--input", "random",
                    env={"LAYERDIFF_MODEL_READ_SECONDS": "0.001", "LAYERDIFF_CACHE": str(tmp_path / "cache")})
    assert_one_line_error(proc, "convnet.onnx", "took longer than 0.001 s", "LAYERDIFF_MODEL_READ_SECONDS")


# -- links and special files ----------------------------------------------------------------------

def test_raw_dump_with_symlinked_tensors_is_refused(tmp_path, secret):
    raw = tmp_path / "raw"
    raw.mkdir()
    header = {"record": "header", "format": "layerdiff-raw", "format_version": 1, "engine": "mnn"}
    tensor = {"record": "tensor", "order": 0, "op": "op0", "op_type": "Conv", "output_index": 0, "name": "op0",
              "inputs": [], "shape": [4], "dtype": "float32", "layout": "", "offset": 0, "nbytes": 16}
    (raw / "manifest.jsonl").write_text("\n".join(json.dumps(r) for r in (header, tensor)) + "\n")
    (raw / "tensors.bin").symlink_to(secret)
    proc = cli("analyze", "import", str(raw), "-o", str(tmp_path / "o.h5"))
    assert_one_line_error(proc, "tensors.bin", "symbolic link")
    assert not (tmp_path / "o.h5").exists()


def test_npy_folder_with_symlinked_file_is_refused(tmp_path, secret):
    folder = tmp_path / "npys"
    folder.mkdir()
    np.save(folder / "a.npy", np.ones(4, np.float32))
    (folder / "b.npy").symlink_to(secret)
    proc = cli("analyze", "import", str(folder), "-o", str(tmp_path / "o.h5"))
    assert_one_line_error(proc, "b.npy", "symbolic link")
    assert not (tmp_path / "o.h5").exists()


def test_input_folder_with_symlinked_file_is_refused(tmp_path, secret):
    folder = tmp_path / "inputs"
    folder.mkdir()
    np.save(folder / "a.npy", np.zeros((1, 3, 32, 32), np.float32))
    (folder / "b.npy").symlink_to(secret)
    proc = _collect(tmp_path, "--model", str(MODEL), "--input", str(folder))
    assert_one_line_error(proc, "b.npy", "symbolic link")


def test_polygraphy_folder_with_symlinked_iteration_is_refused(tmp_path, secret):
    folder = tmp_path / "poly"
    folder.mkdir()
    (folder / "0.json").write_text(json.dumps({"lst": [["trt", [{"outputs": {}}]]]}))
    (folder / "1.json").symlink_to(secret)
    proc = cli("analyze", "import", str(folder), "--format", "polygraphy-json", "-o", str(tmp_path / "o.h5"))
    assert_one_line_error(proc, "1.json", "symbolic link")


def test_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "run.h5"
    os.mkfifo(fifo)
    proc = cli("analyze", "inspect", str(fifo), timeout=60)
    assert_one_line_error(proc, "run.h5", "FIFO")


@pytest.mark.parametrize("option", ["--model", "--input"])
def test_fifo_given_to_collect_is_named(tmp_path, option):
    fifo = tmp_path / ("net.mnn" if option == "--model" else "x.npy")
    os.mkfifo(fifo)
    args = ["--model", str(fifo)] if option == "--model" else ["--model", str(MODEL), "--input", str(fifo)]
    proc = _collect(tmp_path, *args)
    assert_one_line_error(proc, fifo.name, "FIFO")


def test_empty_h5_says_empty(tmp_path):
    empty = tmp_path / "run.h5"
    empty.write_bytes(b"")
    proc = cli("analyze", "inspect", str(empty))
    assert_one_line_error(proc, "run.h5", "empty file")


def test_huge_root_attribute_is_refused_before_reading(tmp_path):
    plain = write_dump(tmp_path / "plain.h5", [np.ones(4, np.float32)])
    padded = tmp_path / "padded.h5"
    with h5py.File(plain) as src, h5py.File(padded, "w", libver="latest") as dst:  # dense attribute storage
        for key in src:
            src.copy(src[key], dst, key)
        dst.attrs.update(dict(src.attrs))
        dst.attrs["unused"] = np.zeros(8 << 20, np.float32)  # 32 MiB
    proc = cli("analyze", "inspect", str(padded))
    assert_one_line_error(proc, "padded.h5", "LAYERDIFF_MAX_ATTR_BYTES")
    assert cli("analyze", "inspect", str(padded), env={"LAYERDIFF_MAX_ATTR_BYTES": "64M"}).returncode == 0


# -- analyze's numbers ----------------------------------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["--atol", "nan"], "--atol nan"),
    (["--rtol", "-1"], "--rtol -1"),
    (["--fail-rel-l2", "-1"], "--fail-rel-l2 -1"),
    (["--warn-rel-l2", "inf"], "--warn-rel-l2 inf"),
    (["--min-pass-fraction", "2"], "--min-pass-fraction 2"),
])
def test_analyze_refuses_numbers_no_judgement_can_use(tmp_path, args, needle):
    a = write_dump(tmp_path / "a.h5", [np.ones(4, np.float32)])
    b = write_dump(tmp_path / "b.h5", [np.ones(4, np.float32)])
    proc = cli("analyze", str(a), str(b), "-o", str(tmp_path / "rep"), *args)
    assert_one_line_error(proc, needle)
    assert not (tmp_path / "rep").exists()


# -- honest spread --------------------------------------------------------------------------------

def test_spread_is_not_bit_identical_when_a_layer_could_not_be_compared(tmp_path):
    layers = [np.arange(8, dtype=np.float32), np.ones(8, np.float32)]
    inputs = {"data": np.zeros(4, np.float32)}
    write_dump(tmp_path / "rep1.h5", layers, inputs=inputs)
    write_dump(tmp_path / "rep2.h5", [layers[0], np.ones(6, np.float32)], inputs=inputs)  # layer 1: another shape
    proc = cli("analyze", str(tmp_path / "rep1.h5"), str(tmp_path / "rep2.h5"), "-o", str(tmp_path / "rep"), "--json")
    doc = json.loads(proc.stdout)
    spread = [f for f in doc["findings"] if f["kind"] == "run_spread"]
    assert spread, [f["kind"] for f in doc["findings"]]
    assert "bit-identical" not in spread[0]["sentence"], spread[0]["sentence"]
    assert "1 of 2" in spread[0]["sentence"]


# -- one-liners that say what is wrong -------------------------------------------------------------

def test_input_pair_naming_no_model_input_says_so(tmp_path):
    array = tmp_path / "x.npy"
    np.save(array, np.zeros((1, 3, 32, 32), np.float32))
    proc = _collect(tmp_path, "--model", str(MODEL), "-i", f"nosuch={array}")
    line = assert_one_line_error(proc, "no input 'nosuch'", "data")
    assert "no such file" not in line


def test_zip_extraction_bound_follows_the_archive_size():
    from layerdiff.analyzer.formats.limits import EXTRACT_FLOOR_BYTES, MAX_EXTRACT_BYTES, MAX_EXTRACT_RATIO, extract_limit

    assert extract_limit(23 << 20) == min(MAX_EXTRACT_BYTES, max(EXTRACT_FLOOR_BYTES, MAX_EXTRACT_RATIO * (23 << 20)))
    assert extract_limit(23 << 20) < 23 << 30 and extract_limit(1) == min(MAX_EXTRACT_BYTES, EXTRACT_FLOOR_BYTES)


def test_merge_refuses_a_dump_with_a_damaged_chunk(tmp_path):
    good = write_dump(tmp_path / "good.h5", [np.arange(4096, dtype=np.float32), np.ones(4096, np.float32)],
                      attrs={"device_serial": "good"})
    bad = write_dump(tmp_path / "bad.h5", [np.arange(4096, dtype=np.float32), np.ones(4096, np.float32)],
                     attrs={"device_serial": "bad"})
    with h5py.File(bad, "a") as fh:
        attrs = dict(fh["tensors/1"].attrs)
        del fh["tensors/1"]
        fh.create_dataset("tensors/1", data=np.random.default_rng(0).random(4096, dtype=np.float32),
                          chunks=(4096,), compression="gzip")
        fh["tensors/1"].attrs.update(attrs)
        offset = fh["tensors/1"].id.get_chunk_info(0).byte_offset
    with open(bad, "r+b") as fh:
        fh.seek(offset + 16)
        fh.write(b"\xff" * 64)
    proc = cli("analyze", "merge", str(good), str(bad), "-o", str(tmp_path / "merged"))
    assert "bad.h5" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    copied = sorted(p.name for p in (tmp_path / "merged").glob("*.h5"))
    assert len(copied) == 1 and "good" in copied[0], copied


def test_index_that_is_a_folder_is_named(tmp_path):
    dump = write_dump(tmp_path / "a.h5", [np.ones(4, np.float32)])
    (tmp_path / "merged" / "index.csv").mkdir(parents=True)
    proc = cli("analyze", "merge", str(dump), "-o", str(tmp_path / "merged"))
    line = assert_one_line_error(proc, "merged/index.csv", "not a file")
    assert ".partial" not in line


def test_adb_server_resetting_connections_is_named(tmp_path):
    """Something listening on the --adb-server port that resets every connection is not an adb server."""
    import socket
    import struct
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def reset_everything():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # timeout: look at `stop` again
                continue
            conn.settimeout(5)
            try:
                conn.recv(64)  # the request, then a reset instead of an answer
            except OSError:
                pass
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    server = threading.Thread(target=reset_everything, daemon=True)
    server.start()
    try:
        proc = cli("collect", "--model", str(MODEL), "--device", "SERIAL1", "--adb-server", f"127.0.0.1:{port}",
                   "-o", str(tmp_path / "out"))
    finally:
        stop.set()
        server.join()  # no thread outlives the test: later tests fork the model reader
        listener.close()
    line = assert_one_line_error(proc, f"127.0.0.1:{port}", "adb server")
    assert "check the path" not in line
