"""Runs never overwrite each other, every failure of a run is a failed run in one line, a resume
compares everything that changes a dump, and the exit codes README promises hold on every path.

Every test runs the `collect` / `analyze` console scripts of this installation as a user does
(docs/runs-and-resume.md says what they promise)."""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from tests.faults.support import REPO

MODEL = REPO / "samples" / "models" / "convnet.mnn"
BIN = Path(sys.executable).parent


def _env(extra: dict | None = None) -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OPENBLAS_NUM_THREADS": "1",
            **(extra or {})}


def console(tool: str, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The installed console script `tool` (collect / analyze), as a user runs it."""
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, env=_env(env), timeout=timeout)


def start(tool: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / tool), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(env))


def rows(out: Path) -> list[dict]:
    with open(out / "index.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def no_half_written(out: Path) -> None:
    left = [p for p in out.rglob("*") if p.name.endswith(".partial") or ".layerdiff-fetch-" in p.name]
    assert not left, left


def _array(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((1, 3, 32, 32), dtype=np.float32)


def _input_sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(np.load(path)).tobytes()).hexdigest()


# --- file names: two runs never share one ---------------------------------------------------------

def test_inputs_whose_labels_collide_get_a_file_each_and_resume(tmp_path):
    inputs = tmp_path / "in"
    for k, name in enumerate(["a b.npy", "a_b.npy"]):
        inputs.mkdir(exist_ok=True)
        np.save(inputs / name, _array(k))
    for k, folder in enumerate(["x", "y", "z"]):  # the same stem from two folders, and a stem that is a made-up label
        (tmp_path / folder).mkdir()
        np.save(tmp_path / folder / ("a-2.npy" if folder == "z" else "a.npy"), _array(10 + k))
    given = [inputs / "a b.npy", inputs / "a_b.npy", tmp_path / "x" / "a.npy", tmp_path / "y" / "a.npy",
             tmp_path / "z" / "a-2.npy"]
    out = tmp_path / "out"
    args = ["-m", str(MODEL), *[a for path in given for a in ("-i", str(path))], "--no-report", "-o", str(out)]
    proc = console("collect", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = rows(out)
    files = [r["files"] for r in table]
    assert len(set(files)) == len(given) == len(table), files  # one file per planned run, recorded in index.csv
    assert len({r["input"] for r in table}) == len(given)
    for row, path in zip(table, given):
        with DumpFile(out / row["files"]) as dump:  # each file holds its own input, none was overwritten
            assert dump.attrs["input_sha256"] == row["input_sha256"] == _input_sha(path)
    print(f"figure: {len(given)} inputs, {len(set(files))} files: {files}")
    inodes = {f: (out / f).stat().st_ino for f in files}
    again = console("collect", *args)
    resumed = [line for line in lines(again.stderr) if line.startswith("done") and "already collected" in line]
    assert again.returncode == 0 and len(resumed) == len(given), again.stderr[-3000:]
    assert {f: (out / f).stat().st_ino for f in files} == inodes
    forced = console("collect", *args, "--force")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert [r["files"] for r in rows(out)] == files
    for row, path in zip(rows(out), given):
        with DumpFile(out / row["files"]) as dump:
            assert dump.attrs["input_sha256"] == _input_sha(path)
    alone = console("collect", "-m", str(MODEL), "-i", str(inputs / "a_b.npy"), "--no-report", "-o", str(out))
    assert alone.returncode == 0 and "already collected" in alone.stderr, alone.stderr[-3000:]  # found under its suffix


# --- every failure in a worker is a failed run, one line, exit 1 ----------------------------------

def test_a_directory_in_the_way_of_a_forced_run_is_one_failed_line(tmp_path):
    out = tmp_path / "out"
    (out / "mnn_cpu_high_random0.h5").mkdir(parents=True)
    proc = console("collect", "-m", str(MODEL), "--force", "-o", str(out))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    failed = [line for line in lines(proc.stderr) if line.startswith("failed")]
    assert len(failed) == 1 and "mnn_cpu_high_random0.h5 is in the way" in failed[0], proc.stderr
    assert [r["status"] for r in rows(out)] == ["failed"]
    no_half_written(out)


def test_an_unexpected_error_inside_a_run_is_a_failed_run_not_exit_0(tmp_path):
    """A directory where the run's temporary file goes: the HDF5 library's own OSError, inside the worker."""
    out = tmp_path / "out"
    (out / ".mnn_cpu_high_random0.h5.partial").mkdir(parents=True)
    proc = console("collect", "-m", str(MODEL), "-i", "random:0", "-i", "random:1", "--no-report", "-o", str(out))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    failed = [line for line in lines(proc.stderr) if line.startswith("failed")]
    assert len(failed) == 1 and "random0" in failed[0] and "Is a directory" in failed[0], proc.stderr
    assert {r["input"]: r["status"] for r in rows(out)} == {"random0": "failed", "random1": "done"}  # none `running`
    assert not [p for p in out.rglob("*.partial") if p.is_file()]


# --- resume keys on every setting that changes a dump ---------------------------------------------

@pytest.mark.parametrize("first, then, option", [
    (["--layers", "stem.*"], [], "--layers"),
    (["--threads", "2"], [], "--threads"),
    (["--max-bytes", "4096"], [], "--max-bytes"),
])
def test_a_dump_made_with_other_settings_is_not_already_collected(tmp_path, first, then, option):
    out = tmp_path / "out"
    made = console("collect", "-m", str(MODEL), *first, "--no-report", "-o", str(out))
    assert made.returncode == 0, made.stderr[-3000:]
    [row] = rows(out)
    with DumpFile(out / row["files"]) as dump:  # the settings are recorded in the dump itself
        recorded = {k: dump.attrs[k] for k in ("layers_filter", "threads_requested", "max_bytes")}
        layers = len(dump.layers)
    assert recorded == {"layers_filter": "stem.*" if option == "--layers" else "",
                        "threads_requested": 2 if option == "--threads" else 1,
                        "max_bytes": 4096 if option == "--max-bytes" else 0}
    mtime = (out / row["files"]).stat().st_mtime_ns
    full = console("collect", "-m", str(MODEL), *then, "--no-report", "-o", str(out))
    assert full.returncode == 1, full.stderr[-3000:]
    assert "already collected" not in full.stderr
    [line] = [line for line in lines(full.stderr) if line.startswith("failed")]
    assert "exists from other settings" in line and option in line and "--force" in line, line
    assert (out / row["files"]).stat().st_mtime_ns == mtime  # never overwritten without --force
    forced = console("collect", "-m", str(MODEL), *then, "--force", "--no-report", "-o", str(out))
    assert forced.returncode == 0, forced.stderr[-3000:]
    with DumpFile(out / row["files"]) as dump:
        assert dump.attrs["layers_filter"] == "" and dump.attrs["threads_requested"] == 1
        assert option != "--layers" or len(dump.layers) > layers
    print(f"figure: {option}: resume refused the earlier dump ({layers} layers), --force replaced it")


# --- exit codes -----------------------------------------------------------------------------------

def test_a_report_that_cannot_be_written_is_exit_1_in_one_line(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report").write_text("not a directory")
    proc = console("collect", "-m", str(MODEL), "-i", "random:1", "-i", "random:2", "-o", str(out))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [line] = [line for line in lines(proc.stderr) if line.startswith("collect:")]
    assert line.startswith("collect: no report:") and str(out / "report") in line, line
    assert [r["status"] for r in rows(out)] == ["done", "done"]  # the runs themselves are kept


def test_an_index_that_cannot_be_written_is_exit_1_in_one_line_and_the_runs_kept(tmp_path):
    out = tmp_path / "out"
    (out / "index.csv").mkdir(parents=True)  # a folder where the index goes
    proc = console("collect", "-m", str(MODEL), "--no-report", "-o", str(out))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [line] = [line for line in lines(proc.stderr) if line.startswith("collect:")]
    assert str(out / "index.csv") in line and "not a file" in line, line
    assert (out / "mnn_cpu_high_random0.h5").is_file()  # the run itself is kept
    no_half_written(out)


@pytest.mark.parametrize("tool, args", [("collect", ["-m", str(MODEL), "--no-report"]), ("analyze", [])])
def test_a_limit_that_does_not_parse_is_one_line(tmp_path, tool, args):
    target = ["-o", str(tmp_path / "out")] if tool == "collect" else [str(REPO / "samples"), "-o", str(tmp_path / "r")]
    proc = console(tool, *args, *target, env={"LAYERDIFF_MAX_TENSOR_BYTES": "abc"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    [line] = lines(proc.stderr)
    assert line.startswith(f"{tool}: LAYERDIFF_MAX_TENSOR_BYTES") and "abc" in line, proc.stderr[-3000:]


SIGTERM_CAUGHT = 1 << (signal.SIGTERM - 1)


def _our_code_runs(pid: int) -> bool:
    """The console script's own code has started (it catches SIGTERM), or the command's imports are
    under way (numpy is loaded); before either the interpreter is still starting (site-packages'
    .pth files), which no program can cover."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:") and int(line.split()[1], 16) & SIGTERM_CAUGHT:
                return True
        return "_multiarray_umath" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("tool", ["collect", "analyze"])
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.3])
def test_ctrl_c_while_the_command_starts_is_one_line_and_130(tmp_path, tool, delay):
    args = (["-m", str(MODEL), "--no-report", "-o", str(tmp_path / "out")] if tool == "collect"
            else [str(REPO / "samples" / "models"), "-o", str(tmp_path / "r")])
    proc = start(tool, *args)
    deadline = time.monotonic() + 30
    while not _our_code_runs(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    # analyze of a folder without dumps ends by itself with 1 and its one line; collect with 0
    finished = proc.returncode == 0 or (tool == "analyze" and proc.returncode == 1 and "needs at least two runs" in err)
    if finished and "interrupted" not in err:
        pytest.skip("the command finished before the interrupt arrived")
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert any("interrupted" in line for line in lines(err)), err
    print(f"figure: {tool}, Ctrl-C {delay}s after start-up: exit 130, {len(lines(err))} line(s)")


# --- scratch of killed processes -------------------------------------------------------------------

def _scratch(tmp: Path) -> list[Path]:
    return [p for p in tmp.iterdir() if p.name.startswith(".layerdiff-") and p.is_dir()]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_the_scratch_of_a_killed_collect_is_removed(tmp_path, how):
    """A run's raw dump lives in the temp folder while the harness writes it; whatever ends collect,
    none of it stays there past the next start."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out"
    big = REPO / "samples" / "models" / "sizenet_large.mnn"
    args = ["-m", str(big), *[a for k in range(6) for a in ("-i", f"random:{k}")], "--repeat", "3", "--no-report",
            "-o", str(out)]
    proc = start("collect", *args, env={"TMPDIR": str(tmp)})
    deadline = time.monotonic() + 120
    while not any((p / "dump").exists() for p in _scratch(tmp)) and proc.poll() is None:
        assert time.monotonic() < deadline, "no run scratch appeared"
        time.sleep(0.02)
    if proc.poll() is not None:
        pytest.skip("collect finished before it could be killed")
    proc.send_signal(how)
    _, err = proc.communicate(timeout=120)
    if how == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
        assert _scratch(tmp), "kill -9 left nothing to clean up (the test did not test anything)"
    else:  # SIGTERM and SIGHUP take Ctrl-C's path: rows recorded, scratch removed now, 128 + signal
        assert proc.returncode == 128 + how, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        assert not _scratch(tmp)
        assert "running" not in {r["status"] for r in rows(out)}
    left = len(_scratch(tmp))
    resumed = console("collect", *args, env={"TMPDIR": str(tmp)})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not _scratch(tmp)
    assert all(r["status"] == "done" for r in rows(out))
    no_half_written(out)
    print(f"figure: {signal.Signals(how).name}: {left} scratch folder(s) left, 0 after the next collect")


KILL_AT_FIRST_REPORT_FILE = """
import os, signal, sys
from pathlib import Path
real_replace = os.replace
report = Path(sys.argv[-1]).resolve()

def replace(src, dst, *a, **k):  # dies as kill -9 would, with the first report file half-written
    if Path(dst).resolve().parent == report:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst, *a, **k)

os.replace = replace
from layerdiff.analyzer.cli.app import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_analyze_killed_during_its_first_report_file_reruns_without_force(tmp_path):
    runs = tmp_path / "runs"
    made = console("collect", "-m", str(MODEL), "-p", "high,low", "-o", str(runs), "--no-report")
    assert made.returncode == 0, made.stderr[-3000:]
    report = tmp_path / "report"
    env = _env({"LAYERDIFF_CACHE": str(tmp_path / "cache")})
    killed = subprocess.run([sys.executable, "-c", KILL_AT_FIRST_REPORT_FILE, str(runs), "-o", str(report)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert any(p.name.endswith(".partial") for p in report.iterdir())  # the half-written first file
    again = subprocess.run([str(BIN / "analyze"), str(runs), "-o", str(report)], capture_output=True, text=True,
                           env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (report / "index.html").is_file() and not [p for p in report.iterdir() if p.name.startswith(".")]


# --- a phone's dump cut short while its harness reported success ------------------------------------

def test_a_phone_dump_cut_short_after_harness_success_is_failed(standins, fake_harness, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(fake_harness))
    monkeypatch.setenv("LAYERDIFF_FAKE_HARNESS_NO_FOOTER", "1")  # the stand-in's harness runs with it
    phone = standins.start()
    out = tmp_path / "out"
    proc = console("collect", "--device", phone.serial, "-m", str(REPO / "samples" / "models" / "convnet.param"),
                   "-o", str(out), env=dict(os.environ))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [line] = [line for line in lines(proc.stderr) if line.startswith("failed")]
    assert "reported success" in line and "cut short" in line and "no footer" in line, line
    [row] = rows(out)
    assert row["status"] == "failed" and row["files"]  # what was dumped is kept, marked incomplete
    with DumpFile(out / row["files"]) as dump:
        assert not dump.complete and len(dump.layers) > 0


LEAVE_SCRATCH = """
import sys
from pathlib import Path
from layerdiff.collector.transport.scratch import make_scratch_dir
path = make_scratch_dir(Path(sys.argv[1]), "gone")
(Path(path) / "dump").mkdir()
print(path)
"""  # the process ends without removing it, as a killed one would


def test_a_later_collect_removes_only_scratch_whose_owner_has_ended(tmp_path):
    from layerdiff.collector.transport.scratch import make_scratch_dir, remove_scratch_dir

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    live = Path(make_scratch_dir(tmp, "live"))  # held by this (live) test process
    kept = tmp / ".layerdiff-run-1-kept-x"  # not ours to judge without its .owner: pid 1 lives
    kept.mkdir()
    dead = Path(subprocess.run([sys.executable, "-c", LEAVE_SCRATCH, str(tmp)], capture_output=True, text=True,
                               check=True, env=_env()).stdout.strip())
    assert dead.is_dir()
    proc = console("collect", "-m", str(MODEL), "--no-report", "-o", str(tmp_path / "out"), env={"TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not dead.exists() and live.is_dir() and kept.is_dir()
    assert sorted(_scratch(tmp)) == sorted([live, kept])  # the run's own scratch is gone too
    remove_scratch_dir(str(live))


FAIL_FIRST_CONVERSION = """
import sys
from layerdiff.collector.run import pipeline
real = pipeline.convert_raw_dump
calls = []

def convert(*args, **kwargs):  # a failure no part of layerdiff foresaw, inside the first run's conversion
    calls.append(1)
    if len(calls) == 1:
        raise ValueError("injected fault")
    return real(*args, **kwargs)

pipeline.convert_raw_dump = convert
from layerdiff.console import collect
collect()
"""


def test_any_exception_in_a_run_is_a_failed_run_with_its_traceback_in_a_log(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", FAIL_FIRST_CONVERSION, "-m", str(MODEL), "-i", "random:0", "-i",
                           "random:1", "--no-report", "-o", str(out)], capture_output=True, text=True, env=_env(),
                          timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [line] = [line for line in lines(proc.stderr) if line.startswith("failed")]
    assert "unexpected error ValueError: injected fault" in line and "collect-errors.log" in line, line
    assert {r["input"]: r["status"] for r in rows(out)} == {"random0": "failed", "random1": "done"}
    log = (out / "collect-errors.log").read_text()
    assert "Traceback" in log and "injected fault" in log
    no_half_written(out)
