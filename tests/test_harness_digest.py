"""Harness cache keys per engine: an engine's own source files rebuild only that engine's binaries
(an edit to the MNN or Paddle-Lite engine must not cost every ncnn user a 10-minute rebuild)."""
from __future__ import annotations

import shutil

from layerdiff.collector.engines.mnn.harness import mnn_spec
from layerdiff.collector.engines.ncnn.harness import ncnn_spec
from layerdiff.collector.engines.paddle_lite.harness import paddle_lite_spec
from layerdiff.collector.harness import build


def test_an_engines_own_files_count_only_for_its_builds(tmp_path, monkeypatch):
    scripts = tmp_path / "device_scripts"
    shutil.copytree(build.DEVICE_SCRIPTS / "harness", scripts / "harness", ignore=shutil.ignore_patterns("build*"))
    shutil.copytree(build.DEVICE_SCRIPTS / "cmake", scripts / "cmake")
    monkeypatch.setattr(build, "DEVICE_SCRIPTS", scripts)
    ncnn, mnn, lite = ncnn_spec("host"), mnn_spec("host", "/m"), paddle_lite_spec("host", "/p")
    assert [p.title for p in lite.libraries] == ["Paddle-Lite"] and len(lite.absent) == 2  # the other two left out

    def digests():
        return [build.sources_digest(tuple(p.source_prefix for p in s.absent)) for s in (ncnn, mnn, lite)]

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
