"""A full disk or a read-only output: one line naming the path and the space needed, the run marked
`failed` with a `no space` reason, completed runs kept, exit 1, and a resume that works once space is
freed. The same for analyze's report files. Needs root (it mounts small tmpfs file systems)."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layerdiff.collector.sweep.index import INDEX_NAME
from tests.faults.support import REPO, assert_one_line_error, cli, write_dump

MODEL = REPO / "samples" / "models" / "sizenet_large.mnn"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not Path("/proc/mounts").exists(),
                                reason="mounting a small tmpfs needs root (CI runs as root)")


def _mount(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()})")


@pytest.fixture
def small_disk(tmp_path):
    mounted: list[Path] = []

    def make(size: str, name: str = "disk", read_only: bool = False) -> Path:
        path = tmp_path / name
        _mount(path, f"size={size}" + (",ro" if read_only else ""))
        mounted.append(path)
        return path

    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _rows(out: Path) -> list[dict]:
    with open(out / INDEX_NAME, newline="") as fh:
        return list(csv.DictReader(fh))


def _run_bytes(tmp_path: Path) -> int:
    """Size of one run's HDF5 dump of MODEL, measured on a normal disk."""
    probe = tmp_path / "probe"
    proc = cli("collect", "--model", str(MODEL), "-i", "random:1", "--no-report", "-o", str(probe))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return sum(p.stat().st_size for p in probe.glob("*.h5"))


def test_disk_full_during_a_sweep(tmp_path, small_disk):
    one = _run_bytes(tmp_path)
    disk = small_disk(f"{int(one * 2.5) + (64 << 10)}")  # room for two runs, not three
    out = disk / "runs"
    args = ["--model", str(MODEL), "-i", "random:1", "-i", "random:2", "-i", "random:3", "-i", "random:4",
            "--no-report", "-o", str(out)]
    proc = cli("collect", *args)
    err = proc.stderr
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err and "Segmentation" not in err, err[-3000:]
    no_space = [line for line in err.splitlines() if "no space" in line]
    assert len(no_space) >= 1 and str(out) in no_space[0] and "free" in no_space[0] and "needed" in no_space[0], err
    rows = _rows(out)
    statuses = [r["status"] for r in rows]
    assert statuses.count("failed") == 1 and statuses.count("done") >= 1, rows
    assert next(r for r in rows if r["status"] == "failed")["reason"].startswith("no space")
    assert not [p for p in out.rglob("*") if p.name.endswith(".partial") or ".layerdiff-fetch-" in p.name]
    kept = {r["files"]: (out / r["files"]).stat().st_ino for r in rows if r["status"] == "done"}
    print(f"figure: disk of {one * 2.5 / 2**20:.1f} MiB, {len(kept)} complete runs kept, exit {proc.returncode}")
    # resume once space is freed: remount bigger, same command
    subprocess.run(["mount", "-o", f"remount,size={one * 8}", str(disk)], check=True)
    resumed = cli("collect", *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert all(r["status"] == "done" for r in _rows(out))
    assert {f: (out / f).stat().st_ino for f in kept} == kept  # the runs completed before were not redone


def test_resume_on_a_still_full_disk_is_one_line(tmp_path, small_disk):
    disk = small_disk("64k")
    (disk / "filler").write_bytes(b"\0" * (60 << 10))
    out = disk / "runs"
    proc = cli("collect", "--model", str(MODEL), "-i", "random:1", "--no-report", "-o", str(out))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "no space" in proc.stderr and str(out) in proc.stderr


def test_read_only_output_is_one_line(tmp_path, small_disk):
    disk = small_disk("1m", read_only=True)
    proc = cli("collect", "--model", str(MODEL), "-i", "random:1", "-o", str(disk / "runs"))
    assert_one_line_error(proc, str(disk / "runs"), "cannot write here")


def test_analyze_into_a_full_disk(tmp_path, small_disk):
    runs = [write_dump(tmp_path / f"r{k}.h5", [np.random.default_rng(k).standard_normal(4096).astype(np.float32)] * 8,
                       attrs={"backend_requested": b}) for k, b in enumerate(("cpu", "vulkan"))]
    disk = small_disk("48k")
    report = disk / "report"
    proc = cli("analyze", "compare", *map(str, runs), "-o", str(report))
    line = assert_one_line_error(proc, str(report), "no space")
    assert not [p for p in report.rglob("*") if p.name.endswith(".partial")]  # no 0-byte .partial left
    print(f"figure: analyze into a 48 KiB disk: exit 1, '{line[:120]}'")
    ro = small_disk("1m", name="ro", read_only=True)
    assert_one_line_error(cli("analyze", "compare", *map(str, runs), "-o", str(ro / "report")), str(ro / "report"))


ONNX_MODEL = REPO / "samples" / "models" / "convnet.onnx"  # its dump size is estimated below 256 KiB: HDF5 starts writing


@pytest.mark.parametrize("repeat", [[], ["--repeat", "3"]])
def test_a_256k_disk_is_one_line_and_exit_1_never_a_crash(small_disk, repeat):
    """a dump whose estimate fits but whose file does not: the space check refuses before
    HDF5 sees a write fail (which crashed the process at exit: SIGSEGV, 139)."""
    out = small_disk("256k") / "runs"
    proc = cli("collect", "--model", str(ONNX_MODEL), "-i", "random:1", "--no-report", "-o", str(out), *repeat)
    line = assert_one_line_error(proc, str(out), "no space", "free", "needed")
    assert ".partial" not in line
    assert not [p for p in out.rglob("*") if p.name.endswith(".partial")]


RACE = """
import sys
from layerdiff.analyzer.formats import diskspace
diskspace.SpaceGuard.reserve = lambda self, raw, strings=0: None  # the disk fills after the check, as another writer would
from layerdiff.collector.cli import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("repeat", [[], ["--repeat", "3"]])
def test_a_write_hdf5_sees_fail_still_ends_in_one_line_and_exit_1(small_disk, repeat):
    """When the disk fills between the check and HDF5's write, the library cannot release its handles
    and would crash at exit: the process ends without that clean-up, its error said in one line."""
    out = small_disk("256k") / "runs"
    proc = subprocess.run([sys.executable, "-c", RACE, "--model", str(ONNX_MODEL), "-i", "random:1", "--no-report",
                           "-o", str(out), *repeat], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert_one_line_error(proc, str(out), "no space")
