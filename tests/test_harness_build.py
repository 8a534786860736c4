"""layerdiff.collector.harness.build: choosing, caching and building harness binaries.

The concurrency test builds a real harness (about half a minute) against the ncnn already in the
cache; everything else is pure bookkeeping and runs in milliseconds.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from layerdiff.collector.engines import phoneharness
from layerdiff.collector.harness import build as harness
from layerdiff.collector.engines.ncnn.harness import NCNN_VERSION, ncnn_key, ncnn_spec
from layerdiff.collector.harness.build import HarnessError
from tests.test_harness_support import HOST_SPEC, REPO, host_harness


def test_spec_follows_abi_engine_and_backend(monkeypatch):
    monkeypatch.delenv("MNN_ROOT", raising=False)
    assert phoneharness.spec_for(harness.host_abi(), "ncnn").target == "host"
    assert phoneharness.spec_for(harness.host_abi(), "ncnn").vulkan is True
    assert phoneharness.spec_for("arm64-v8a", "ncnn", "cpu") == ncnn_spec("aarch64")
    assert phoneharness.spec_for("arm64-v8a", "ncnn", "vulkan").target == "android-arm64-v8a"
    assert phoneharness.spec_for("armeabi-v7a", "ncnn").target == "android-armeabi-v7a"
    with pytest.raises(HarnessError, match="MNN_ROOT"):
        phoneharness.spec_for("arm64-v8a", "mnn", "opencl")
    with pytest.raises(HarnessError, match="mips"):
        phoneharness.spec_for("mips", "ncnn")
    with pytest.raises(HarnessError, match="local device only"):
        phoneharness.spec_for("arm64-v8a", "onnxruntime")


def test_android_without_ndk_names_the_build_command(monkeypatch, tmp_path):
    monkeypatch.delenv("ANDROID_NDK", raising=False)
    monkeypatch.setenv("LAYERDIFF_CACHE", str(tmp_path))
    with pytest.raises(HarnessError) as caught:
        phoneharness.harness_for("armeabi-v7a", "ncnn")
    message = str(caught.value)
    assert "\n" not in message and "ANDROID_NDK" in message
    assert "build_android.sh" in message and "--abi armeabi-v7a" in message


def test_cache_root_and_keys(monkeypatch, tmp_path):
    monkeypatch.setenv("LAYERDIFF_CACHE", str(tmp_path))
    assert harness.binary_dir(HOST_SPEC).parent == tmp_path / "harness"
    assert harness.harness_key(HOST_SPEC) == harness.harness_key(ncnn_spec("host", vulkan=True, test_build=True))
    variants = {HOST_SPEC, ncnn_spec("host", vulkan=False, test_build=True), ncnn_spec("host", vulkan=True)}
    assert len({harness.harness_key(s) for s in variants}) == 3
    assert len({ncnn_key(s.target, s.vulkan, s.test_build) for s in variants}) == 3


def test_prebuilt_override(monkeypatch, tmp_path):
    binary = tmp_path / "layerdiff-harness"
    binary.write_bytes(b"\x7fELF")
    monkeypatch.setenv("LAYERDIFF_HARNESS_ARMEABI_V7A", str(binary))
    assert phoneharness.harness_for("armeabi-v7a", "ncnn", "vulkan") == binary
    monkeypatch.setenv("LAYERDIFF_HARNESS_ARMEABI_V7A", str(tmp_path / "missing"))
    with pytest.raises(HarnessError, match="LAYERDIFF_HARNESS_ARMEABI_V7A"):
        phoneharness.harness_for("armeabi-v7a", "ncnn")


BUILD_ONE = """
import sys
from layerdiff.collector.engines.ncnn.harness import ncnn_spec
from layerdiff.collector.harness.build import ensure_built
path = ensure_built(ncnn_spec("host", vulkan=True, test_build=True))
print(path, path.stat().st_ino)
"""


@pytest.mark.slow
def test_concurrent_callers_build_once(tmp_path):
    """Two processes ask for the same uncached binary at once: one builds, the other waits and reuses it."""
    real = host_harness().parent.parent  # the shared cache's harness/ directory, with ncnn built
    cache = tmp_path / "cache"
    (cache / "harness").mkdir(parents=True)
    (cache / "harness" / "src").symlink_to(real / "src")
    ncnn_dir = f"ncnn-host-{ncnn_key(HOST_SPEC.target, HOST_SPEC.vulkan, HOST_SPEC.test_build)}"
    (cache / "harness" / ncnn_dir).symlink_to(real / ncnn_dir)
    env = {**os.environ, "LAYERDIFF_CACHE": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_ONE], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    paths = {r[0].split()[0] for r in results}
    inodes = {r[0].split()[1] for r in results}
    assert len(paths) == 1 and len(inodes) == 1
    builds = (Path(paths.pop()).parent / "builds.txt").read_text().splitlines()
    assert len(builds) == 1


def test_ncnn_sdist_is_found_through_the_pypi_json_api():
    """The index can list the sdist with a URL relative to itself; it must come back absolute."""
    fetch = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'device_scripts'); import fetch_ncnn_source as f; "
         f"print(*f.sdist_url('{NCNN_VERSION}'))"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert fetch.returncode == 0, fetch.stderr
    url, sha256 = fetch.stdout.split()
    assert url.startswith("https://") and "/../" not in url and url.endswith(f"ncnn-{NCNN_VERSION}.tar.gz")
    assert len(sha256) == 64


class _Recorder:
    def __init__(self):
        self.events = []

    def started(self, what):
        self.events.append(("started", what))

    def update(self, status):
        self.events.append(("update", status.step, status.done, status.total))

    def finished(self, ok, elapsed_s):
        self.events.append(("finished", ok))


def test_a_build_says_what_why_and_how_long_then_follows_ninja(tmp_path, monkeypatch):
    """The build script's step marks and ninja's [N/M] lines become progress (the real parser, a scripted build)."""
    monkeypatch.setenv("LAYERDIFF_CACHE", str(tmp_path / "cache"))
    step_log = tmp_path / "ncnn-build.log"
    script = (f"echo 'layerdiff-build-step: ncnn-build {step_log}'; "
              f"for i in 1 2 3; do echo \"[$i/40] Building CXX object\" >> {step_log}; sleep 0.4; done")
    recorder = _Recorder()
    ok = harness.run_build_script(["bash", "-c", script], tmp_path / "build.log", harness.describe_build(HOST_SPEC), recorder)
    assert ok and recorder.events[-1] == ("finished", True)
    kind, what = recorder.events[0]
    assert kind == "started" and "host harness" in what and "with Vulkan" in what and "about" in what
    assert "ncnn is not built yet" in what  # the empty cache: why it builds
    updates = [e for e in recorder.events if e[0] == "update"]
    assert updates[0][1] == "ncnn-build" and max(e[2] for e in updates) >= 2 and updates[-1][3] == 40
    assert "layerdiff-build-step" in (tmp_path / "build.log").read_text()


def test_a_failed_build_reports_and_returns_false(tmp_path):
    recorder = _Recorder()
    assert not harness.run_build_script(["bash", "-c", "exit 3"], tmp_path / "build.log", harness.describe_build(HOST_SPEC), recorder)
    assert recorder.events[-1] == ("finished", False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie has ended


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_killed_collector_leaves_no_build_running(tmp_path, how):
    """A collector killed outright (not Ctrl-C: kill -9, a CI timeout) must not leave its harness
    build compiling: the guard leading the build's process group ends it (cmake/ninja stand-in:
    a bash script whose grandchild `sleep` writes its pid)."""
    import signal
    import time

    pid_file = tmp_path / "compiler.pid"
    script = f"sleep 300 & echo $! > {pid_file}; echo 'layerdiff-build-step: ncnn-build x'; wait"
    collector = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
                 "from layerdiff.collector.harness import build\n"
                 "from layerdiff.collector.harness.buildprogress import PlainReporter\n"
                 "from tests.test_harness_support import HOST_SPEC\n"
                 f"build.run_build_script(['bash', '-c', {script!r}], __import__('pathlib').Path({str(tmp_path / 'b.log')!r}), "
                 "'test build', PlainReporter())\n")
    proc = subprocess.Popen([sys.executable, "-c", collector], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LAYERDIFF_CACHE": str(tmp_path / "cache")})
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.1)
    compiler = int(pid_file.read_text())
    assert _alive(compiler)
    proc.send_signal(getattr(signal, how))
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _alive(compiler) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(compiler), f"the build's compiler {compiler} outlived its collector"
