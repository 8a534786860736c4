"""The suite's harness builds run beside the tests (tests/harness_builds.py): ordering and the build child."""
from __future__ import annotations

import os
from pathlib import Path

from tests.harness_builds import BUILD_ORDER, BackgroundBuilds, builds_of, order_key

TESTS = Path(__file__).resolve().parent


def test_modules_are_ordered_by_the_last_build_they_need():
    cache: dict = {}
    assert builds_of(TESTS / "test_errors.py", cache) == ()
    assert builds_of(TESTS / "test_harness_digest.py", cache) == ("host",)
    assert "ggml-host" in builds_of(TESTS / "test_ggml_collect.py", cache)
    keys = [order_key(builds_of(TESTS / name, cache)) for name in ("test_errors.py", "test_harness_digest.py",
                                                                    "test_ggml_collect.py")]
    assert keys == sorted(keys) and keys[0] == -1 and keys[1] == BUILD_ORDER.index("host")


def test_a_build_that_cannot_start_is_said_in_one_line_and_releases_its_waiters(tmp_path):
    """A real child process, with a real builder refusing at once (a prebuilt binary that is not a file)."""
    env = {**os.environ, "LAYERDIFF_CACHE": str(tmp_path / "cache"), "LAYERDIFF_GGML_BINARY": str(tmp_path / "missing")}
    said: list[tuple[str, bool]] = []
    builds = BackgroundBuilds(["ggml-host"], lambda line, red: said.append((line, red)), env)
    builds.wait(["ggml-host", "not-a-build"])  # unknown names are not waited for
    builds.stop()
    assert list(builds.failed) == ["ggml-host"]
    assert "does not name a file" in builds.failed["ggml-host"]
    (line, red), = [entry for entry in said if "ggml-host" in entry[0]]
    assert red and line.startswith("harness: ggml-host: failed:") and "\n" not in line
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("layerdiff-ggml"))
