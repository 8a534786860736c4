"""The C++ harness built for this host (ncnn from its PyPI sdist, Vulkan on Mesa lavapipe).

Real binary, real models, real engines: its dumps must agree with pip ncnn's (the `local` device
engine) at high precision, and its low-precision Vulkan dumps must really differ.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.formats.rawdump import convert_raw_dump, read_raw_dump
from tests.test_harness_support import (
    INPUTS,
    MODELS,
    REPO,
    arrays_by_key,
    check_well_formed,
    dump_model,
    host_harness,
    max_abs_diff,
    max_scaled_diff,
    model_args,
    run_harness,
)


pytestmark = pytest.mark.slow  # builds the host harness (cached) on first use


@pytest.fixture(scope="module")
def harness() -> list[str]:
    return [str(host_harness())]


def pip_ncnn_dump(stem: str, backend: str, precision: str, out):
    """The same run through the pip ncnn engine of the `local` device (the reference)."""
    cmd = [sys.executable, "-m", "layerdiff.collector.engines.ncnn.engine", *model_args(stem),
           "--backend", backend, "--precision", precision, "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    return read_raw_dump(out)


def test_version_names_engine_and_abi(harness):
    result = subprocess.run([*harness, "--version"], capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stdout.startswith("layerdiff-harness 0.1.0 (ncnn 1.0.20261020, x86_64)")


def test_probe_reports_cpu_and_lavapipe_vulkan(harness):
    result = subprocess.run([*harness, "--probe"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    probe = json.loads(result.stdout)
    backends = probe["engines"]["ncnn"]["backends"]
    assert probe["abi"] == "x86_64"
    assert backends["cpu"] == {"ok": True, "fp16": False, "fp16_storage": False, "bf16": False, "low": "bf16-storage"}
    assert backends["vulkan"]["ok"] is True and "llvmpipe" in backends["vulkan"]["device"]
    assert backends["opencl"]["ok"] is False


@pytest.mark.parametrize("stem", ["convnet", "overflow"])
def test_cpu_high_agrees_with_pip_ncnn(harness, tmp_path, stem):
    run = dump_model(harness, stem, "cpu", "high", tmp_path / "harness")
    ours = check_well_formed(run)
    reference = pip_ncnn_dump(stem, "cpu", "high", tmp_path / "pip")
    assert [(t.op, t.output_index, t.shape) for t in ours.tensors] == \
        [(t.op, t.output_index, t.shape) for t in reference.tensors]
    assert [t.inputs for t in ours.tensors] == [t.inputs for t in reference.tensors]
    assert max_scaled_diff(arrays_by_key(ours), arrays_by_key(reference)) <= 1e-4
    assert ours.header["precision_effective"] == "fp32"
    assert ours.header["backends_actual"] == ["cpu"]


def test_header_records_provenance(harness, tmp_path):
    run = dump_model(harness, "convnet", "cpu", "low", tmp_path / "d", "--threads", "2")
    header = check_well_formed(run).header
    model_sha = subprocess.run(["sha256sum", str(MODELS / "convnet.param")], capture_output=True, text=True)
    assert header["model"][0] == {"file": "convnet.param", "sha256": model_sha.stdout.split()[0],
                                  "bytes": (MODELS / "convnet.param").stat().st_size}
    assert header["inputs"][0]["shape"] == [1, 3, 32, 32] and header["inputs"][0]["name"] == "data"
    assert header["precision_effective"] == "bf16-storage"  # x86 has no fp16 CPU arithmetic
    assert header["threads"] == 2 and header["options"]["use_bf16_storage"] is True
    assert header["harness"] == "layerdiff-harness 0.1.0"


def test_vulkan_low_differs_from_cpu_high(harness, tmp_path):
    high = arrays_by_key(dump_model(harness, "convnet", "cpu", "high", tmp_path / "high").dump())
    run = dump_model(harness, "convnet", "vulkan", "low", tmp_path / "vk")
    low = check_well_formed(run)
    assert low.header["backends_actual"] == ["vulkan"]
    assert low.header["precision_effective"].startswith("fp16")
    assert {t.memory for t in low.tensors if t.op_type != "Input"} == {"device"}
    assert 1e-3 < max_abs_diff(arrays_by_key(low), high) < 1.0


def test_vulkan_low_overflow_sample_breaks_fp16(harness, tmp_path):
    dump = dump_model(harness, "overflow", "vulkan", "low", tmp_path / "vk").dump()
    amplify = next(arr for t, arr in dump.iter_arrays() if t.op == "block2/amplify")
    assert not np.isfinite(amplify).all()


def test_layer_filter_dumps_only_matching_ops(harness, tmp_path):
    run = dump_model(harness, "convnet", "cpu", "high", tmp_path / "d", "--layers", "^block1/")
    dump = check_well_formed(run)
    assert [t.op for t in dump.tensors] == ["block1/conv1", "block1/conv2", "block1/add"]


def test_byte_budget_stops_dumping_and_says_so(harness, tmp_path):
    run = dump_model(harness, "convnet", "cpu", "high", tmp_path / "d", "--max-bytes", "50000")
    dump = run.dump()
    assert 0 < dump.footer["bytes"] - sum(f.nbytes for f in dump.fed) <= 50000  # the input read back is not a layer
    assert dump.footer["status"].startswith("byte budget exhausted")
    assert len(dump.tensors) == dump.footer["tensors"] == 2  # 12288 + 32768 bytes, the next breaks it


def test_repeat_writes_one_dump_per_run(harness, tmp_path):
    dump_model(harness, "convnet", "cpu", "high", tmp_path / "d", "--repeat", "2")
    first, second = read_raw_dump(tmp_path / "d" / "r0"), read_raw_dump(tmp_path / "d" / "r1")
    assert (first.header["repeat"], second.header["repeat"]) == (0, 1)
    assert first.complete and second.complete
    assert (tmp_path / "d/r0/tensors.bin").read_bytes() == (tmp_path / "d/r1/tensors.bin").read_bytes()


def test_abort_after_leaves_dump_without_footer_that_converts_incomplete(harness, tmp_path):
    out = tmp_path / "d"
    run = run_harness(harness, [*model_args("convnet"), "--backend", "cpu", "--precision", "high",
                                "--abort-after", "5"], out)
    assert run.returncode == -signal.SIGABRT
    dump = read_raw_dump(out)
    assert dump.footer is None and len(dump.tensors) == 5 and (dump.tensors[-1].op, dump.tensors[-1].output_index) == ("splitncnn_0", 1)
    h5 = convert_raw_dump(dump, tmp_path / "run.h5", exit_status=run.returncode)
    with DumpFile(h5) as stored:
        assert not stored.attrs["complete"]
        assert len(stored.layers) == 5


def kill_mid_repeat(harness, out) -> list:
    """SIGKILL a `--repeat 500` run once it has dumped a while; returns its dumps in run order."""
    cmd = [*harness, *model_args("convnet"), "--backend", "cpu", "--precision", "high", "--repeat", "500",
           "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    for seen, line in enumerate(proc.stdout, start=1):
        if seen == 45:
            break
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.stdout.close()
    runs = sorted(out.iterdir(), key=lambda d: int(d.name[1:]))
    manifest = runs[-1] / "manifest.jsonl"
    if not manifest.exists() or manifest.stat().st_size == 0:  # killed between creating a directory and its header
        runs = runs[:-1]
    return [read_raw_dump(d) for d in runs]


def test_sigkill_mid_run_leaves_usable_partial_dump(harness, tmp_path):
    # The kill lands wherever the harness is (stdout is buffered ahead of us); it lands between
    # runs only rarely, so a few attempts always catch one mid-run.
    for attempt in range(5):
        dumps = kill_mid_repeat(harness, tmp_path / f"d{attempt}")
        assert all(d.complete for d in dumps[:-1])
        last = dumps[-1]
        if last.footer is None:
            break
    assert last.footer is None and len(last.tensors) <= 30  # 30: killed in the plain run, after the last tensor
    for tensor, array in last.iter_arrays():  # every line names complete bytes
        assert array.shape == tensor.shape


@pytest.mark.parametrize(
    ("args", "code", "mentions"),
    [
        (["--engine", "ncnn", "--bogus", "1"], 2, "unknown option --bogus"),
        ([*model_args("convnet"), "--backend", "tpu", "--precision", "high"], 2, "--backend must be"),
        ([*model_args("convnet"), "--backend", "cpu", "--precision", "max"], 2, "--precision must be"),
        (["--engine", "ncnn", "--model", "/nonexistent.param", "--model", "/nonexistent.bin",
          "--input", f"data={INPUTS / 'convnet.npy'}", "--backend", "cpu", "--precision", "high"], 3, "/nonexistent.param"),
        ([*model_args("convnet"), "--backend", "opencl", "--precision", "high"], 4, "no OpenCL"),
        (["--engine", "mnn", "--model", str(MODELS / "convnet.mnn"), "--input", f"data={INPUTS / 'convnet.npy'}",
          "--backend", "cpu", "--precision", "high"], 4, "not built into"),
        (["--engine", "ncnn", "--model", str(MODELS / "convnet.param"), "--model", str(MODELS / "convnet.bin"),
          "--input", f"pixels={INPUTS / 'convnet.npy'}", "--backend", "cpu", "--precision", "high"], 5, "no input blob 'pixels'"),
        (["--engine", "ncnn", "--model", str(MODELS / "convnet.param"), "--model", str(MODELS / "convnet.bin"),
          "--input", f"data={MODELS / 'convnet.bin'}", "--backend", "cpu", "--precision", "high"], 2, "not a .npy"),
    ],
)
def test_errors_give_distinct_codes_and_one_stderr_line(harness, tmp_path, args, code, mentions):
    run = run_harness(harness, args, tmp_path / "d")
    assert run.returncode == code, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("layerdiff-harness: ") and mentions in lines[0], run.stderr


def test_nonempty_out_dir_is_refused_untouched(harness, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep.txt").write_text("collected earlier")
    run = run_harness(harness, [*model_args("convnet"), "--backend", "cpu", "--precision", "high"], tmp_path / "d")
    assert run.returncode == 2 and "not empty" in run.stderr
    assert os.listdir(tmp_path / "d") == ["keep.txt"]


def test_npy_version_2_header_is_read(harness, tmp_path):
    path = tmp_path / "x.npy"
    with open(path, "wb") as handle:
        np.lib.format.write_array(handle, np.load(INPUTS / "convnet.npy"), version=(2, 0))
    run = run_harness(harness, ["--engine", "ncnn", "--model", str(MODELS / "convnet.param"), "--model",
                                str(MODELS / "convnet.bin"), "--input", f"data={path}", "--backend", "cpu",
                                "--precision", "high"], tmp_path / "d")
    assert run.returncode == 0, run.stderr
    assert run.dump().header["inputs"][0]["shape"] == [1, 3, 32, 32]


@pytest.mark.parametrize(
    "array",
    [np.arange(12, dtype="<f8").reshape(1, 3, 2, 2), np.asfortranarray(np.arange(12, dtype="<f4").reshape(3, 4)),
     np.arange(12, dtype=">f4")],
    ids=["float64", "fortran", "big-endian"],
)
def test_npy_other_than_little_endian_float32_c_order_is_refused(harness, tmp_path, array):
    path = tmp_path / "x.npy"
    np.save(path, array)
    run = run_harness(harness, ["--engine", "ncnn", "--model", str(MODELS / "convnet.param"), "--model",
                                str(MODELS / "convnet.bin"), "--input", f"data={path}", "--backend", "cpu",
                                "--precision", "high"], tmp_path / "d")
    assert run.returncode == 2 and "x.npy" in run.stderr and run.stderr.count("\n") == 1
