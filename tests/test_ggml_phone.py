"""The ggml engine on a phone: layerdiff-ggml for the phone's ABI staged with the GGUF model, run and its dump
pulled through the real adb server, on the device stand-in (the host build: a stand-in has the host's ABI).
The Android NDK build (arm64 phones' Vulkan / Adreno OpenCL) is never run here: without $ANDROID_NDK it is
refused in one line naming what to set."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from pathlib import Path

import pytest

from tests.ggml_support import ggml_binary, ggml_samples  # noqa: F401


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)


def _collect(device: str, model, tokens, out) -> Path:
    proc = _cli("layerdiff.collector.cli", "--device", device, "--model", str(model), "--input", str(tokens),
                "--backend", "cpu", "--precision", "high", "-o", str(out), "--no-report")
    assert proc.returncode == 0, proc.stderr[-2000:]
    [run] = out.glob("ggml_cpu_high_*.h5")
    return run


def test_tinyllama_on_a_standin_phone_dumps_every_node_and_passes_against_local(ggml_binary, ggml_samples,
                                                                                  standin, tmp_path):
    from layerdiff.analyzer.formats.dumpfile import DumpFile

    model, tokens = str(ggml_samples["tinyllama"]), str(ggml_samples["tokens"])
    runs = {device: _collect(device, model, tokens, tmp_path / device.replace(":", "_"))
            for device in ("local", standin.serial)}
    with DumpFile(runs["local"]) as here, DumpFile(runs[standin.serial]) as phone:
        assert phone.attrs["engine"] == "ggml" and phone.attrs["device_serial"] == standin.serial
        assert phone.attrs["abi"] == here.attrs["abi"] and bool(phone.attrs["complete"])
        assert list(phone.layers["key"]) == list(here.layers["key"])  # every node, in execution order
        assert {"attn_norm-0:0", "Qcur-0:0", "ffn_out-1:0", "result_output:0"} <= set(phone.layers["key"])
    both = tmp_path / "both"
    both.mkdir()
    shutil.copyfile(runs["local"], both / "local.h5")  # analyze follows no link inside a folder
    shutil.copyfile(runs[standin.serial], both / "phone.h5")
    proc = _cli("layerdiff.analyzer.cli.app", str(both), "-o", str(tmp_path / "rep"), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    [phone_run] = [r for r in doc["runs"] if r["role"] == "compared"]
    assert phone_run["provenance"]["device_serial"] == standin.serial and phone_run["reference"] == "local"
    compared = [layer for layer in phone_run["layers"] if layer.get("status") in ("pass", "warn", "fail")]
    # the same host build on the same inputs: every node compared, every value identical (judged, not just passed)
    assert len(compared) >= 50 and all(layer["status"] == "pass" and layer["max_abs"] == 0 for layer in compared)
    assert phone_run["verdict"] == "pass"


@pytest.mark.skipif(bool(os.environ.get("ANDROID_NDK")), reason="with an NDK the android build would start")
@pytest.mark.parametrize("backend", ["vulkan", "opencl"])
def test_an_arm64_phones_gpu_without_the_ndk_is_one_line_naming_android_ndk(backend):
    from layerdiff.collector.engines.phoneharness import harness_for
    from layerdiff.collector.harness.build import HarnessError

    with pytest.raises(HarnessError) as err:
        harness_for("arm64-v8a", "ggml", backend)
    line = str(err.value)
    assert "\n" not in line and "set ANDROID_NDK" in line and "--target android" in line and f"--{backend} ON" in line


@pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-g++")),
                    reason="needs qemu-user and g++-aarch64-linux-gnu (apt) to build and run the aarch64 build")
def test_an_arm64_phones_cpu_runs_the_static_aarch64_build_with_its_fp16_kernels(ggml_binary, ggml_samples,
                                                                                 standins, tmp_path):
    """An arm64-v8a stand-in (a cortex-a76 under qemu) gets the static aarch64 layerdiff-ggml: node for node
    the `arm64` device's run of the same build and CPU, the same fp16 arithmetic, identical values."""
    from layerdiff.analyzer.formats.dumpfile import DumpFile

    phone = standins.start(abi="arm64-v8a", qemu_cpu="cortex-a76")
    model, tokens = ggml_samples["tinyllama"], ggml_samples["tokens"]
    on_phone = _collect(phone.serial, model, tokens, tmp_path / "runs" / "phone")
    emulated = _collect("arm64", model, tokens, tmp_path / "runs" / "arm64")
    with DumpFile(on_phone) as a, DumpFile(emulated) as b:
        assert a.attrs["abi"] == "arm64-v8a" and a.attrs["device_serial"] == phone.serial
        assert "cpu fp16 vector arithmetic" in a.attrs["precision_effective"]
        assert list(a.layers["key"]) == list(b.layers["key"]) and len(a.layers["key"]) >= 50
    proc = _cli("layerdiff.analyzer.cli.app", str(tmp_path / "runs"), "--ref", str(emulated), "-o",
                str(tmp_path / "rep"), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [run] = [r for r in json.loads(proc.stdout)["runs"] if r["role"] == "compared"]
    compared = [layer for layer in run["layers"] if layer.get("status") in ("pass", "warn", "fail")]
    assert len(compared) >= 50 and all(layer["max_abs"] == 0 for layer in compared) and run["verdict"] == "pass"


def test_a_prompt_is_tokenized_on_the_phone_by_the_models_tokenizer(ggml_binary, ggml_samples, standin, tmp_path):
    """`--input prompt=FILE.txt` on a phone: its bytes are staged, the harness there tokenizes them, and the run
    records the ids that ran: those the model's tokenizer gives (the tokenize helper, run here)."""
    from layerdiff.analyzer.formats.dumpfile import DumpFile
    from layerdiff.collector.engines.ggml.tokenize import tokenize

    prompt = ggml_samples["prompt"]
    run = _collect(standin.serial, ggml_samples["tinyllama"], f"prompt={prompt}", tmp_path / "p")
    with DumpFile(run) as dump:
        options = dump.provenance["raw_header"]["options"]
        assert dump.attrs["device_serial"] == standin.serial and options["input_kind"] == "prompt"
        assert options["tokens"] == tokenize(ggml_samples["tinyllama"], prompt.read_text(encoding="utf-8"))


def test_an_abi_without_a_ggml_build_is_one_line():
    from layerdiff.collector.engines.phoneharness import harness_for
    from layerdiff.collector.harness.build import HarnessError

    with pytest.raises(HarnessError) as err:
        harness_for("armeabi-v7a", "ggml", "cpu")
    assert "\n" not in str(err.value) and "'armeabi-v7a'" in str(err.value) and "arm64-v8a" in str(err.value)


def test_isolation_on_a_standin_phone_stages_the_reference_input_and_inject_dump(ggml_binary, ggml_samples, standin,
                                                                                 tmp_path):
    """`collect isolate --device SERIAL`: the reference's input and the inject dump go to the phone with the GGUF;
    IM2COL alone at normal overflows there exactly as numpy says f16 cannot hold the im2col values."""
    import numpy as np

    from layerdiff.analyzer.formats.dumpfile import DumpFile

    model, large = str(ggml_samples["conv2d"]), str(ggml_samples["conv_large"])
    ref = _collect(standin.serial, model, large, tmp_path / "runs")
    proc = _cli("layerdiff.collector.cli", "isolate", "--device", standin.serial, "--model", model, "--backend", "cpu",
                "--precision", "normal", "--ref", str(ref), "--layer", "conv.im2col:0", "-o", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    x = np.load(large)[0].astype(np.float64)
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, ky:ky + 32, kx:kx + 32] for ky in range(3) for kx in range(3)], axis=1)
    with np.errstate(over="ignore"):
        overflow = int(np.isinf(cols.astype(np.float16)).sum())
    [iso] = (tmp_path / "runs").glob("isolated_*.h5")
    with DumpFile(iso) as dump:
        assert dump.attrs["device_serial"] == standin.serial and dump.attrs["mode"] == "isolate"
        assert int((~np.isfinite(dump.tensor_by_key("conv.im2col:0"))).sum()) == overflow > 1000
