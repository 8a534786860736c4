"""The C++ harness builds a test run needs, made while the tests that need none run.

A cold run builds ncnn and the harness for the host (with Vulkan) and for aarch64, llama.cpp's
`layerdiff-ggml` for both, and the older releases the engine-version tests compare with: 30-35 minutes of
building on a 2-core machine, which used to pass before the first test
while the machine was half idle (a build keeps ~1.2 cores busy, the suite ~1). Now (tests/conftest.py):
- the tests of modules that use a build are ordered last, by the last build they need;
- the builds run one after another in a child process started with the environment the session began
  with (a test's monkeypatched LAYERDIFF_CACHE or PATH must not redirect a build), its progress lines
  relayed onto pytest's terminal as before;
- a test that needs a build waits for it in its setup. Cached builds cost nothing: the child says so at once.

Run as `python -m tests.harness_builds NAME...` it builds NAMEs in order, printing the builders' progress
lines and, after each, `DONE_MARK NAME ok` or `DONE_MARK NAME failed: reason`.
"""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Iterable

# The older releases the engine-version tests build from their own sdists, beside the pinned ones
GGML_OLDER = "0.3.17"  # llama-cpp-python: its ggml reports 0.9.8 (tests/test_engine_versions_ggml.py)
NCNN_OLDER = "1.0.20250916"  # tests/test_engine_versions_ncnn.py
HARNESS_USERS = {  # build name -> what in a test module's source means it runs that build (in build order)
    "host": ("host_harness", "HOST_SPEC", 'ncnn_spec("host"'),
    "aarch64": ("aarch64_harness", "AARCH64_SPEC", 'ncnn_spec("aarch64"'),
    "ggml-host": ("ggml_binary",),
    "ggml-aarch64": ('GgmlSpec("aarch64")', 'engine="ggml"'),
    # the older releases last: only the version tests wait for them
    "ncnn-older-aarch64": ('ncnn_spec("aarch64", test_build=True, release=OLDER)',),
    "ggml-older-host": ("GgmlSpec(release=OLDER)",),
    "ggml-older-aarch64": ('GgmlSpec("aarch64", release=OLDER)',),
}
BUILD_ORDER = list(HARNESS_USERS)
DONE_MARK = "harness-build-done"
REPO = Path(__file__).resolve().parent.parent


def builds_of(path: Path, cache: dict[Path, tuple[str, ...]]) -> tuple[str, ...]:
    """The builds a test module uses, from its source text (read once per module)."""
    if path not in cache:
        text = path.read_text(errors="replace") if path.suffix == ".py" else ""
        cache[path] = tuple(name for name, marks in HARNESS_USERS.items() if any(m in text for m in marks))
    return cache[path]


def order_key(builds: tuple[str, ...]) -> int:
    """Modules needing no build first (-1), then by the last build they need: they can start as soon as it is."""
    return max((BUILD_ORDER.index(b) for b in builds), default=-1)


def build(name: str, reporter) -> None:
    """Build one target unless it is cached (the builders say nothing then)."""
    if "ggml" in name:
        from layerdiff.collector.engines.ggml.build import GgmlSpec, binary_dir, ensure_built

        spec = {"ggml-host": GgmlSpec(), "ggml-aarch64": GgmlSpec("aarch64"),
                "ggml-older-host": GgmlSpec(release=GGML_OLDER),
                "ggml-older-aarch64": GgmlSpec("aarch64", release=GGML_OLDER)}[name]
        if not (binary_dir(spec) / "layerdiff-ggml").is_file():
            ensure_built(spec, reporter)
        return
    from layerdiff.collector.engines.ncnn.harness import ncnn_spec
    from layerdiff.collector.harness.build import binary_dir, ensure_built
    from tests.test_harness_support import AARCH64_SPEC, HOST_SPEC

    spec = {"host": HOST_SPEC, "aarch64": AARCH64_SPEC,
            "ncnn-older-aarch64": ncnn_spec("aarch64", test_build=True, release=NCNN_OLDER)}[name]
    if not (binary_dir(spec) / "layerdiff-harness").is_file():
        ensure_built(spec, reporter)


class BackgroundBuilds:
    """The child process that builds `names` in order, and one event per build set when it is done."""

    def __init__(self, names: Iterable[str], say: Callable[[str, bool], None], env: dict[str, str]) -> None:
        self.names = list(names)
        self.done = {name: threading.Event() for name in self.names}
        self.failed: dict[str, str] = {}
        self._say = say
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.harness_builds", *self.names], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self._thread = threading.Thread(target=self._relay, name="harness-builds", daemon=True)
        self._thread.start()

    def _relay(self) -> None:
        try:
            for line in self._proc.stdout:
                line = line.rstrip("\n")
                if line.startswith(DONE_MARK + " "):
                    name, _, outcome = line[len(DONE_MARK) + 1:].partition(" ")
                    if outcome != "ok":
                        self.failed[name] = outcome
                        self._say(f"harness: {name}: {outcome}", True)
                    self.done[name].set()
                elif line.strip():
                    self._say(line, False)
            self._proc.wait()
        finally:
            for name, event in self.done.items():  # a child that died early: the waiting tests go on and fail
                if not event.is_set():
                    self.failed.setdefault(name, f"the build process ended (status {self._proc.poll()})")
                    event.set()

    def wait(self, names: Iterable[str], while_waiting: Callable[[], None] = lambda: None) -> None:
        """Until every build of `names` is done (unknown names are not waited for); `while_waiting` runs each second."""
        for event in (self.done[name] for name in names if name in self.done):
            while not event.wait(timeout=1.0):
                while_waiting()

    def stop(self) -> None:
        """End the child (a session cut short by -x or Ctrl-C); the builders end their own process groups."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()


def main(names: list[str]) -> int:
    from layerdiff.collector.harness.build import HarnessError
    from layerdiff.collector.harness.buildprogress import PlainReporter

    reporter = PlainReporter(stream=sys.stdout, every_s=30.0)
    for name in names:
        try:
            build(name, reporter)
            outcome = "ok"
        except HarnessError as err:  # the tests that need it fail with this reason themselves
            outcome = "failed: " + " ".join(str(err).split())  # one line: the parent reads lines
        print(f"{DONE_MARK} {name} {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
