"""AdbDevice through the real adb server to a stand-in phone: staging, running, fetching, facts."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from layerdiff.analyzer.formats.rawdump import read_raw_dump
from layerdiff.collector.transport.adb import AdbDevice, harness_command
from layerdiff.collector.transport.devices import DeviceError


def test_info_reads_properties(standins):
    phone = standins.start(props={"ro.soc.model": "SM8550", "ro.board.platform": "kalama",
                                  "ro.hardware.egl": "adreno"}, gles="Qualcomm, Adreno (TM) 740, OpenGL ES 3.2")
    info = AdbDevice(phone.serial).info()
    assert (info.kind, info.soc, info.board, info.abi, info.abis) == ("adb", "SM8550", "kalama", "x86_64", ["x86_64", "x86"])
    assert (info.android_release, info.sdk, info.model) == ("14", "34", "StandIn x86_64")
    assert info.gpu == "Qualcomm, Adreno (TM) 740, OpenGL ES 3.2"


def test_stage_pushes_once_and_again_when_bytes_change(standin, tmp_path):
    device = AdbDevice(standin.serial)
    local = tmp_path / "model.bin"
    local.write_bytes(b"A" * 100_000)
    remote = device.stage(local, "/ignored")
    assert standin.host_path(remote).read_bytes() == local.read_bytes()
    assert device.stage(local, "/ignored") == remote and device.pushed == [remote]
    standin.host_path(remote).write_bytes(b"B" * 100_000)  # same size, other bytes on the phone
    device.stage(local, "/ignored")  # one object (one collect) trusts what it checked or pushed itself
    assert device.pushed == [remote]
    again = AdbDevice(standin.serial)  # the next command checks the bytes again
    again.stage(local, "/ignored")
    assert again.pushed == [remote] and standin.host_path(remote).read_bytes() == local.read_bytes()


def test_execute_exit_code_stderr_and_streaming(standin):
    device = AdbDevice(standin.serial)
    seen: list[tuple[float, str]] = []
    start = time.monotonic()
    result = device.execute(["sh", "-c", "echo first; echo oops >&2; sleep 1; echo second; exit 3"], env={},
                            deadline_s=30, on_stdout_line=lambda line: seen.append((time.monotonic() - start, line)))
    assert (result.exit_status, result.stderr, result.timed_out) == (3, "oops\n", False)
    assert [line for _t, line in seen] == ["first", "second"]
    assert seen[0][0] < seen[1][0] - 0.5  # the first line arrived while the command still ran


def test_every_argument_and_env_value_is_quoted(standin):
    device = AdbDevice(standin.serial)
    nasty = ["a b", "it's", "$(touch /data/local/tmp/pwned)", ";exit 9", "*", 'x"y', "back\\slash"]
    out: list[str] = []
    result = device.execute(["sh", "-c", 'printf "%s\\n" "$@"; echo "$V"', "sh", *nasty], env={"V": "$HOME `id`"},
                            deadline_s=30, on_stdout_line=out.append)
    assert result.exit_status == 0 and out == nasty + ["$HOME `id`"]
    assert not standin.host_path("/data/local/tmp/pwned").exists()
    with pytest.raises(DeviceError, match="invalid environment variable"):
        harness_command(["x"], {"A;rm": "1"}, 5)


def test_deadline_is_enforced_on_the_device(standin):
    result = AdbDevice(standin.serial).execute(["sleep", "60"], env={}, deadline_s=1)
    assert result.timed_out and result.exit_status == -15 and result.duration_s < 15


def test_crash_by_signal_adds_logcat_for_the_harness_pid(standin, fake_harness):
    device = AdbDevice(standin.serial)
    harness = device.stage(fake_harness, "")
    run_dir = device.new_run_dir("crash")
    result = device.execute([harness, "--out", f"{run_dir}/dump", "--abort-after", "2"], env={}, deadline_s=30)
    assert result.exit_status == -6 and "about to abort" in result.stderr
    assert f"pid {result.pid}" in result.device_log and "Fatal signal 6 (SIGABRT)" in result.device_log
    local = device.fetch_dir(f"{run_dir}/dump", Path(standin.workdir) / "pulled")
    dump = read_raw_dump(local)
    assert len(dump.tensors) == 2 and dump.footer is None  # what was dumped before the crash survives


def test_fetch_dir_pulls_the_dump_and_remove_cleans_up(standin, fake_harness, tmp_path):
    device = AdbDevice(standin.serial)
    harness = device.stage(fake_harness, "")
    run_dir = device.new_run_dir("ok run")
    progress: list[str] = []
    result = device.execute([harness, "--out", f"{run_dir}/dump", "--tensors", "5"], env={"LD_LIBRARY_PATH": run_dir},
                            deadline_s=30, on_stdout_line=progress.append)
    assert result.exit_status == 0 and len([p for p in progress if p.startswith("@@ld ")]) == 5
    local = device.fetch_dir(f"{run_dir}/dump", tmp_path / "dump")
    assert sorted(p.name for p in local.iterdir()) == ["manifest.jsonl", "tensors.bin"]
    assert len(read_raw_dump(local).tensors) == 5
    assert device.fetch_dir(f"{run_dir}/missing", tmp_path / "none") == tmp_path / "none"
    device.remove(run_dir)
    assert not standin.host_path(run_dir).exists() and standin.host_path(harness).exists()
    with pytest.raises(DeviceError, match="refusing to delete"):
        device.remove("/data/local/tmp")


def test_free_bytes_follows_the_quota(standin):
    device = AdbDevice(standin.serial)
    assert device.free_bytes("/data/local/tmp") > 0
    standin.set_faults(quota_bytes=50 * 1024 * 1024)
    assert 49 * 1024 * 1024 <= device.free_bytes("/data/local/tmp/layerdiff") <= 50 * 1024 * 1024


def test_prepare_harness_stages_the_binary_for_the_abi(standin, fake_harness, monkeypatch):
    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(fake_harness))
    device = AdbDevice(standin.serial)
    invocation = device.prepare_harness("ncnn")
    assert invocation.argv[0].startswith("/data/local/tmp/layerdiff/bin/") and "LD_LIBRARY_PATH" in invocation.env
    out: list[str] = []
    assert device.execute(invocation.argv + ["--version"], env=invocation.env, deadline_s=30,
                          on_stdout_line=out.append).exit_status == 0
    assert out == ["layerdiff-harness 0.1.0 (fake)"]
    device.prepare_harness("ncnn")
    assert len(device.pushed) == 1  # second time: same bytes already there


def test_no_harness_for_the_abi_is_one_line(standins, monkeypatch):
    phone = standins.start(props={"ro.product.cpu.abi": "mips", "ro.product.cpu.abilist": "mips"})
    with pytest.raises(DeviceError, match=r"\(mips\): no layerdiff harness build exists for ABI 'mips'"):
        AdbDevice(phone.serial).prepare_harness("ncnn")


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None or shutil.which("qemu-aarch64") is None,
                    reason="needs aarch64-linux-gnu-gcc and qemu-user")
def test_arm64_standin_runs_aarch64_binaries_under_qemu(standins, tmp_path):
    source = tmp_path / "hello.c"
    source.write_text('#include <stdio.h>\n#include <stdlib.h>\nint main(int c, char **v) {\n'
                      '  printf("aarch64 says %s\\n", c > 1 ? v[1] : "-");\n  if (c > 2) abort();\n  return 4; }\n')
    binary = tmp_path / "hello"
    subprocess.run(["aarch64-linux-gnu-gcc", "-static", "-O1", "-o", str(binary), str(source)], check=True)
    phone = standins.start(abi="arm64-v8a")
    device = AdbDevice(phone.serial)
    assert device.info().abi == "arm64-v8a"
    remote = device.stage(binary, "")
    out: list[str] = []
    result = device.execute([remote, "hi there"], env={}, deadline_s=60, on_stdout_line=out.append)
    assert (result.exit_status, out) == (4, ["aarch64 says hi there"])
    crashed = device.execute([remote, "x", "abort"], env={}, deadline_s=60)
    assert crashed.exit_status == -6 and "Fatal signal 6" in crashed.device_log
