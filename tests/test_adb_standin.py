"""The stand-in itself, driven by the real `adb` command line: if adb's own client is happy with our
wire protocol (shell v2 exit codes and stderr, push/pull, stat), tests built on it mean something."""
from __future__ import annotations

import os


def test_adb_shell_v2_reports_exit_code_and_separate_stderr(adb_server, standin):
    result = adb_server.run("-s", standin.serial, "shell", "echo out; echo err >&2; exit 7")
    assert (result.returncode, result.stdout, result.stderr) == (7, "out\n", "err\n")


def test_adb_push_pull_round_trip_and_device_paths(adb_server, standin, tmp_path):
    payload = os.urandom(3 * 1024 * 1024 + 17)
    (tmp_path / "a.bin").write_bytes(payload)
    assert adb_server.run("-s", standin.serial, "push", str(tmp_path / "a.bin"), "/data/local/tmp/x/a.bin").returncode == 0
    assert standin.host_path("/data/local/tmp/x/a.bin").read_bytes() == payload
    assert adb_server.run("-s", standin.serial, "pull", "/data/local/tmp/x/a.bin", str(tmp_path / "b.bin")).returncode == 0
    assert (tmp_path / "b.bin").read_bytes() == payload
    listing = adb_server.run("-s", standin.serial, "shell", "sha256sum /data/local/tmp/x/a.bin").stdout
    assert listing.endswith("  /data/local/tmp/x/a.bin\n")  # sandbox paths are mapped back


def test_getprop_and_banner(adb_server, standins):
    phone = standins.start(props={"ro.product.model": "Pixel Stand", "ro.board.platform": "kalama"})
    assert adb_server.run("-s", phone.serial, "shell", "getprop ro.board.platform").stdout == "kalama\n"
    assert "model:Pixel_Stand" in adb_server.run("devices", "-l").stdout


def test_pull_of_missing_file_fails(adb_server, standin, tmp_path):
    result = adb_server.run("-s", standin.serial, "pull", "/data/local/tmp/nope", str(tmp_path / "n"))
    assert result.returncode != 0 and "No such file" in result.stderr + result.stdout


def test_adb_directory_push_and_pull_use_lis2(adb_server, standin, tmp_path):
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha")
    (src / "sub" / "b.bin").write_bytes(bytes(range(256)) * 100)
    assert adb_server.run("-s", standin.serial, "push", str(src), "/data/local/tmp/").returncode == 0
    assert standin.host_path("/data/local/tmp/tree/sub/b.bin").read_bytes() == bytes(range(256)) * 100
    back = tmp_path / "back"
    back.mkdir()
    result = adb_server.run("-s", standin.serial, "pull", "/data/local/tmp/tree", str(back))
    assert result.returncode == 0, result.stderr
    assert (back / "tree" / "a.txt").read_text() == "alpha" and (back / "tree" / "sub" / "b.bin").stat().st_size == 25600
