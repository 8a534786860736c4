"""Messages true for the device and engine at hand: what the user typed names the
device and the command, an emulated phone is said to have no GPU, a piped device table is whole."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.transport.arm64 import Arm64Device
from tests.conftest import MODELS

COLLECT = [sys.executable, "-m", "layerdiff.collector.cli"]
ANALYZE = [sys.executable, "-m", "layerdiff.analyzer.cli.app"]


def test_arm64_vulkan_says_the_emulated_phone_has_no_gpu(tmp_path):
    Arm64Device().runtime()  # prepared (setup_host.sh does it); the probe runs under qemu
    done = subprocess.run(COLLECT + ["--device", "arm64", "--model", str(MODELS / "convnet.param"), "--backend", "vulkan",
                                     "-i", "random:1", "--no-report", "-o", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    skipped = [line for line in done.stderr.splitlines() if line.startswith("skipped")]
    assert len(skipped) == 1 and "emulated arm64 device has no GPU" in skipped[0], done.stderr
    assert "mesa-vulkan-drivers" not in done.stderr


def test_local_mnn_on_a_gpu_backend_is_skipped_as_the_readme_says(tmp_path):
    done = subprocess.run(COLLECT + ["--model", str(MODELS / "convnet.mnn"), "--backend", "opencl", "-i", "random:1",
                                     "--no-report", "-o", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr  # nothing failed, a requested combination is impossible here
    assert "opencl unavailable: the MNN wheel from PyPI has no GPU backend" in done.stderr
    assert not list(tmp_path.glob("*.h5"))


def test_local_runs_are_labelled_local_not_the_host_name(tmp_path):
    done = subprocess.run(COLLECT + ["--model", str(MODELS / "convnet.param"), "-i", "random:1", "--no-report",
                                     "-o", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with DumpFile(next(tmp_path.glob("*.h5"))) as dump:
        assert dump.attrs["device_model"] == "local" and dump.attrs["device_serial"] == "local"
        assert dump.provenance["device"]["extra"]["hostname"]  # the host name stays in the provenance


def test_analyze_help_shows_the_options_of_the_command_without_a_word():
    done = subprocess.run(ANALYZE + ["--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    for option in ("--ref", "--json", "--atol", "--rename", "--task"):
        assert option in done.stdout, option
    assert "inspect" in done.stdout and "import" in done.stdout  # the sub-commands are still listed


def test_a_bad_option_names_the_command_the_user_typed(tmp_path):
    implied = subprocess.run(ANALYZE + [str(tmp_path), "-o", str(tmp_path / "r"), "--bogus"], capture_output=True,
                             text=True, timeout=120)
    assert implied.returncode == 2 and "--bogus" in implied.stderr
    assert "analyze compare" not in implied.stderr and "Try 'analyze --help'" in implied.stderr
    typed = subprocess.run(ANALYZE + ["compare", str(tmp_path), "-o", str(tmp_path / "r"), "--bogus"],
                           capture_output=True, text=True, timeout=120)
    assert typed.returncode == 2 and "Try 'analyze compare --help'" in typed.stderr


def test_collect_devices_piped_is_quick_and_whole():
    Arm64Device().runtime()
    subprocess.run(COLLECT + ["devices"], capture_output=True, text=True, timeout=600)  # the arm64 probe is kept
    started = time.monotonic()
    done = subprocess.run(COLLECT + ["devices"], capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    for word in ("serial", "model", "harness backends", "local", "arm64", "mnn: cpu", "ncnn: cpu"):
        assert word in done.stdout, (word, done.stdout)
    print(f"figure: collect devices (piped, no adb server, arm64 probe kept) {took:.1f} s")
    listed = json.loads(subprocess.run(COLLECT + ["devices", "--json"], capture_output=True, text=True,
                                       timeout=600).stdout)["devices"]
    assert listed[1]["backends"] == {"ncnn": ["cpu"], "mnn": ["cpu"]}
