"""`collect prepare`: harnesses built and staged on a fleet ahead of time, through the real adb server."""
from __future__ import annotations

import subprocess
import sys


def _prepare(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "prepare", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env)


def test_prepare_stages_the_harness_on_every_phone_and_names_what_cannot_be_had(standins, fake_harness, monkeypatch):
    import os

    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(fake_harness))
    monkeypatch.delenv("ANDROID_NDK", raising=False)
    phones = standins(2)
    arm = standins.start(abi="armeabi-v7a")  # needs an NDK build, which the host cannot make
    result = _prepare("--device", "all", "--backend", "cpu", env=dict(os.environ))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    for phone in phones:
        ready = [ln for ln in lines if ln.startswith("ready") and phone.serial in ln]
        assert len(ready) == 1 and "ncnn/cpu" in ready[0]
        staged = list(phone.host_path("/data/local/tmp/layerdiff/bin").glob("*/layerdiff-harness"))
        assert len(staged) == 1 and staged[0].read_bytes() == fake_harness.read_bytes()
    failed = [ln for ln in lines if ln.startswith("failed") and arm.serial in ln]
    assert len(failed) == 1 and "ANDROID_NDK" in failed[0]
    assert "Traceback" not in result.stderr


def test_prepare_with_nothing_to_prepare_is_one_line(adb_server):
    result = _prepare("--device", "all", "--exclude", "local,arm64")
    assert result.returncode == 1 and "no device" in result.stderr and "Traceback" not in result.stderr
