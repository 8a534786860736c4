"""`collect` as a user runs it: a real subprocess, real engines, real files."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from tests.conftest import MODELS, SAMPLES

COLLECT = [sys.executable, "-m", "layerdiff.collector.cli"]


def collect(*args, env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(COLLECT + [str(a) for a in args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def test_cross_product_writes_one_hdf5_per_run_and_an_index(tmp_path):
    out = tmp_path / "runs"
    result = collect("--device", "local", "--model", MODELS / "convnet.param", "--backend", "cpu,vulkan",
                     "--precision", "high", "--precision", "low", "--input", SAMPLES / "inputs" / "convnet.npy", "-o", out)
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in out.glob("*.h5"))
    assert names == [f"ncnn_{b}_{p}_convnet.h5" for b in ("cpu", "vulkan") for p in ("high", "low")]
    index = (out / "index.csv").read_text().splitlines()
    assert len(index) == 5 and all(",done," in line for line in index[1:])
    assert (out / "report" / "index.html").is_file() and "report:" in result.stderr  # sweeps end with a report
    with DumpFile(out / "ncnn_vulkan_low_convnet.h5") as dump:
        stored = dict(dump.inputs())["data"]
        np.testing.assert_array_equal(stored, np.load(SAMPLES / "inputs" / "convnet.npy"))


def test_config_pairs_run_exactly_those_and_the_verdict_is_printed(tmp_path):
    """`--config cpu/high,vulkan/low`: the two runs a "does vulkan/low compute like the CPU?" question
    needs, not the four of the cross product; the sweep's report prints the verdict on stdout."""
    out = tmp_path / "runs"
    result = collect("--device", "local", "--model", MODELS / "convnet.param", "--config", "cpu/high,vulkan/low",
                     "--input", SAMPLES / "inputs" / "convnet.npy", "-o", out)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.glob("*.h5")) == ["ncnn_cpu_high_convnet.h5", "ncnn_vulkan_low_convnet.h5"]
    assert "Reference: cpu/high" in result.stdout and "vulkan/low" in result.stdout
    assert "First divergence in vulkan/low" in result.stdout and (out / "report" / "index.html").is_file()


def test_random_input_takes_the_model_shape_and_is_reproducible(tmp_path):
    for sub in ("a", "b"):
        assert collect("--model", MODELS / "convnet.mnn", "--input", "random:7", "-o", tmp_path / sub).returncode == 0
    with DumpFile(tmp_path / "a" / "mnn_cpu_high_random7.h5") as a, DumpFile(tmp_path / "b" / "mnn_cpu_high_random7.h5") as b:
        assert dict(a.inputs())["data"].shape == (1, 3, 32, 32)
        assert a.attrs["input_sha256"] == b.attrs["input_sha256"]


def test_existing_runs_are_kept_unless_forced(tmp_path):
    out = tmp_path / "runs"
    assert collect("--model", MODELS / "convnet.param", "-o", out).returncode == 0
    target = out / "ncnn_cpu_high_random0.h5"
    before = target.stat().st_mtime_ns
    again = collect("--model", MODELS / "convnet.param", "-o", out)
    assert again.returncode == 0 and "already collected" in again.stderr and target.stat().st_mtime_ns == before
    forced = collect("--model", MODELS / "convnet.param", "-o", out, "--force")
    assert forced.returncode == 0 and target.stat().st_mtime_ns != before


def _bad_param(tmp_path):
    (tmp_path / "bad.param").write_text("not a model\n")
    (tmp_path / "bad.bin").write_bytes(b"")
    return tmp_path / "bad.param"


def _bad_mnn(tmp_path):
    (tmp_path / "bad.mnn").write_bytes(os.urandom(2048))
    return tmp_path / "bad.mnn"


def _wrong_shape(tmp_path):
    np.save(tmp_path / "wrong.npy", np.zeros((1, 3, 8, 8), np.float32))
    return tmp_path / "wrong.npy"


BAD_INPUTS = {
    "missing model": (lambda t: ["--model", t / "nope.param"], "nope.param does not exist"),
    "unparsable ncnn model": (lambda t: ["--model", _bad_param(t)], "not an ncnn .param file"),
    "unparsable mnn model": (lambda t: ["--model", _bad_mnn(t)], "MNN could not load this model"),
    "input of the wrong shape": (lambda t: ["--input", _wrong_shape(t)], "the model expects [1, 3, 32, 32]"),
    "output is a file": (lambda t: ["-o", MODELS / "convnet.bin"], "is a file"),
    "missing input file": (lambda t: ["--input", t / "x.npy"], "no such file"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gives_one_line_and_a_failing_exit(tmp_path, case):
    extra, expected = BAD_INPUTS[case]
    args = ["--model", MODELS / "convnet.param", "-o", tmp_path / "out"] + extra(tmp_path)
    result = collect(*args)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout


USAGE_ERRORS = {  # args (OUT stands for the output dir), expected text
    "unknown option": (["-o", "OUT", "--bogus-flag"], "No such option: --bogus-flag"),
    "wrong type": (["--threads", "abc", "-o", "OUT"], "Invalid value for '--threads'"),
    "missing value": (["-o", "OUT", "--model"], "requires an argument"),
    "unknown backend": (["--backend", "cpu,npu", "-o", "OUT"], "unknown backend 'npu'"),
    "unknown precision": (["--precision", "fp8", "-o", "OUT"], "unknown precision 'fp8'"),
    "unknown engine": (["--engine", "tflite", "-o", "OUT"], "unknown engine 'tflite'"),
    "bad config pair": (["--config", "cpu/high,vulkan", "-o", "OUT"], "'vulkan': write BACKEND/PRECISION"),
    "config with backend": (["--config", "cpu/high", "--backend", "cpu", "-o", "OUT"], "drop --backend/--precision"),
    "isolate: bad choice": (["isolate", "-m", "m.param", "-b", "npu", "-p", "low", "--ref", "r.h5", "-o", "OUT"],
                            "unknown backend 'npu'"),
    "isolate: missing option": (["isolate", "-b", "cpu", "-p", "low", "-o", "OUT"], "Missing option"),
    "devices: extra argument": (["devices", "x"], "unexpected extra argument"),
}


@pytest.mark.parametrize("case", sorted(USAGE_ERRORS))
def test_usage_errors_follow_the_click_convention(tmp_path, case):
    """Exit 2 with "Usage: ... Error: ..." (no traceback), as every click/typer tool does."""
    args, expected = USAGE_ERRORS[case]
    result = collect(*[tmp_path / "out" if a == "OUT" else a for a in args], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "Error:" in result.stderr and expected in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_vulkan_without_a_vulkan_device_names_the_package_and_keeps_other_runs(tmp_path):
    out = tmp_path / "out"
    result = collect("--model", MODELS / "convnet.param", "--backend", "cpu,vulkan", "-o", out,
                     env={"VK_ICD_FILENAMES": str(tmp_path / "no-icd.json")})
    assert result.returncode == 3  # nothing failed, but the vulkan run was impossible
    skipped = [line for line in result.stderr.splitlines() if line.startswith("skipped")]
    assert len(skipped) == 1 and "mesa-vulkan-drivers" in skipped[0]
    assert (out / "ncnn_cpu_high_random0.h5").exists()
    assert ",skipped,vulkan unavailable" in (out / "index.csv").read_text()
