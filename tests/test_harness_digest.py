"""Harness cache keys per engine: an engine's own source files rebuild only that engine's binaries
(an edit to the MNN or Paddle-Lite engine must not cost every ncnn user a 10-minute rebuild)."""
from __future__ import annotations

import shutil

from layerdiff.collector.harness import build


def test_an_engines_own_files_count_only_for_its_builds(tmp_path, monkeypatch):
    scripts = tmp_path / "device_scripts"
    shutil.copytree(build.DEVICE_SCRIPTS / "harness", scripts / "harness", ignore=shutil.ignore_patterns("build*"))
    shutil.copytree(build.DEVICE_SCRIPTS / "cmake", scripts / "cmake")
    monkeypatch.setattr(build, "DEVICE_SCRIPTS", scripts)
    ncnn, mnn, lite = (build.HarnessSpec("host"), build.HarnessSpec("host", False, "/m"),
                       build.HarnessSpec("host", False, None, paddle_lite_root="/p"))
    assert build.spec_engines(ncnn) == {"ncnn"} and build.spec_engines(lite) == {"paddle-lite"}

    def digests():
        return [build.sources_digest(build.spec_engines(s)) for s in (ncnn, mnn, lite)]

    before = digests()
    with open(scripts / "harness" / "src" / "mnn_backend.cpp", "a") as f:
        f.write("// edited\n")
    after_mnn = digests()
    assert after_mnn[0] == before[0] and after_mnn[2] == before[2] and after_mnn[1] != before[1]
    with open(scripts / "harness" / "src" / "paddle_lite_engine.cpp", "a") as f:
        f.write("// edited\n")
    after_lite = digests()
    assert after_lite[:2] == after_mnn[:2] and after_lite[2] != after_mnn[2]
    with open(scripts / "harness" / "src" / "engine.cpp", "a") as f:
        f.write("// edited\n")
    assert all(a != b for a, b in zip(digests(), after_lite))  # a common file rebuilds every engine
