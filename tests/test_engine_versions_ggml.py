"""`--engine ggml==RELEASE`: layerdiff-ggml built from an older llama-cpp-python release's sdist, run beside the
pinned release's build on the same GGUF model and prompt; the dump records the ggml version the binary reports
and the release asked for, and the report says at which node the two releases part, or that they agree, judged
against numpy on the two dumps' tensors (read with h5py, outside layerdiff).

The older release's build takes about 5 minutes on two busy cores the first time (cached afterwards, under a key
of its own beside the pinned release's); the refusals build nothing, or only run CMake on a tree that fails."""
from __future__ import annotations

import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

import layerdiff
from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.collector.engines import ENGINES
from layerdiff.collector.engines.ggml.build import (OLDEST_BUILDING, PINNED_RELEASE, GgmlSpec, binary_dir, build_dir,
                                                    source_dir)
from layerdiff.collector.engines.ggml.releases import check, reported_release
from layerdiff.collector.engines.versions import release_devices, same_release
from layerdiff.errors import EngineVersionError
from tests.ggml_support import ggml_binary, ggml_samples  # noqa: F401  (fixtures)
from tests.test_engine_versions import cli, nonblank_lines
from tests.harness_builds import GGML_OLDER
from tests.release_judgement import h5_tensors, parts, text_of

OLDER = GGML_OLDER  # an older llama-cpp-python release whose ggml reports a version: 0.9.8 (pinned: 0.25.3)


@pytest.fixture(scope="module")
def older_binary() -> Path:
    from layerdiff.collector.engines.ggml.build import ensure_built
    from layerdiff.collector.harness.buildprogress import PlainReporter

    return ensure_built(GgmlSpec(release=OLDER), PlainReporter())


@pytest.fixture(scope="module")
def two_releases(ggml_binary, older_binary, ggml_samples, tmp_path_factory) -> dict:  # noqa: F811
    """The seeded tiny llama on its prompt, with llama-cpp-python OLDER's build and the pinned one, one folder."""
    out = tmp_path_factory.mktemp("ggml-releases") / "runs"
    prompt = [f"prompt={ggml_samples['prompt']}"]
    older = layerdiff.collect(ggml_samples["tinyllama"], engine=f"ggml=={OLDER}", inputs=prompt, out=out)
    pinned = layerdiff.collect(ggml_samples["tinyllama"], engine="ggml", inputs=prompt, out=out)
    assert older.exit_code == 0 and pinned.exit_code == 0
    return {"out": out, "older": older.paths[0], "pinned": pinned.paths[0], "binary": older_binary}


@pytest.mark.slow
def test_older_release_is_built_from_its_own_sdist_and_the_dump_records_both_versions(two_releases):
    assert two_releases["binary"].parent == binary_dir(GgmlSpec(release=OLDER)) != binary_dir(GgmlSpec())
    assert (source_dir(OLDER) / "include" / "llama.h").is_file() and source_dir(OLDER) != source_dir()
    assert build_dir(GgmlSpec(release=OLDER)) != build_dir(GgmlSpec())
    reported = subprocess.run([str(two_releases["binary"]), "--version"], capture_output=True, text=True,
                              check=True).stdout
    assert f"llama-cpp-python {OLDER} sdist" in reported and "ggml 0.9.8" in reported
    older_attrs, _ = h5_tensors(two_releases["older"])
    pinned_attrs, _ = h5_tensors(two_releases["pinned"])
    assert older_attrs["engine_version"] == f"ggml 0.9.8 (llama-cpp-python {OLDER} sdist)"
    assert older_attrs["engine_requested"] == f"ggml=={OLDER}"
    assert pinned_attrs["engine_version"].startswith(f"ggml 0.25.3 (llama-cpp-python {PINNED_RELEASE} sdist")
    assert "engine_requested" not in pinned_attrs
    assert two_releases["older"].name.startswith(f"ggml-{OLDER}_cpu_high_")
    rows = (two_releases["out"] / "index.csv").read_text().splitlines()
    assert any(line.startswith(f"local,ggml=={OLDER},cpu,high,") for line in rows)
    assert any(line.startswith("local,ggml,cpu,high,") for line in rows)


@pytest.mark.slow
def test_report_names_the_first_node_where_the_releases_part_as_numpy_does(two_releases):
    """numpy pairs the nodes by execution position (both releases build this graph with the same ops in the same
    order), not by name: the two releases name some nodes differently (0.3.17 calls the reshape before a ROPE
    `Qcur-0 (reshaped)`, 0.3.36 `Qcur-0#1`, so its ROPE is `Qcur-0#2`), which must not read as a parting."""
    _, older = h5_tensors(two_releases["older"])
    _, pinned = h5_tensors(two_releases["pinned"])
    assert [op for _k, op, _t in older] == [op for _k, op, _t in pinned] and len(older) >= 50
    assert any(a != b for (a, _o, _t), (b, _p, _u) in zip(older, pinned))  # some names differ between the releases
    parting = [key for (key, _op, a), (_k, _p, b) in zip(older, pinned) if parts(a, b)]
    analysis = analyze_paths([two_releases["older"], two_releases["pinned"]])
    try:
        [finding] = [f for f in analysis.findings if f.kind == "release_parting"]
        assert "0.9.8" in finding.numbers["older"] and "0.25.3" in finding.numbers["newer"]
        assert finding.numbers["layers_compared"] >= len(older) - 2, finding.sentence
        named = [finding.sentence, *(run.label for run in analysis.runs), *(run.config_label for run in analysis.runs)]
        assert not [text for text in named if "ggml ggml" in text], named  # the engine named once
        if not parting:
            assert finding.severity == "info" and "agree" in finding.sentence and finding.layer == "", finding.sentence
        else:
            assert "regressed between" in finding.sentence
            assert finding.layer.rsplit(":", 1)[0] == parting[0].rsplit(":", 1)[0], (finding.sentence, parting[:5])
    finally:
        analysis.close()


def test_a_release_older_than_the_harness_builds_against_is_refused_before_anything_is_fetched(tmp_path):
    with pytest.raises(EngineVersionError, match="older than the ggml harness builds against"):
        check("0.3.9")
    check(OLDEST_BUILDING)  # the oldest known to build passes
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    done = cli("--model", str(model), "--engine", "ggml==0.2.90", "-o", str(tmp_path / "runs"),
               LAYERDIFF_CACHE=str(tmp_path / "cache"))
    lines = nonblank_lines(done.stderr)
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "llama-cpp-python 0.2.90's llama.cpp is older" in lines[0] and f"{OLDEST_BUILDING} (oldest)" in lines[0]
    assert PINNED_RELEASE in lines[0]
    assert not (tmp_path / "cache" / "harness").exists() and not (tmp_path / "runs").exists()


def test_a_release_the_index_has_no_sdist_of_is_one_line_naming_the_ones_it_has(ggml_samples, tmp_path):  # noqa: F811
    done = cli("--model", str(ggml_samples["tinyllama"]), "--engine", "ggml==0.3.999",
               "--input", f"prompt={ggml_samples['prompt']}", "-o", str(tmp_path / "runs"),
               LAYERDIFF_CACHE=str(tmp_path / "cache"))
    lines = nonblank_lines(done.stderr)
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "no llama-cpp-python 0.3.999 sdist" in lines[0] and PINNED_RELEASE in lines[0] and OLDEST_BUILDING in lines[0]
    assert not list((tmp_path / "cache").rglob("llama.cpp-0.3.999")) and not list(tmp_path.rglob("*.h5"))


def test_a_release_whose_llama_cpp_does_not_build_is_one_line_naming_its_build_log(ggml_samples, tmp_path):  # noqa: F811
    """A source tree of a release the harness cannot build against (its CMake stops), already in the cache: the
    collect stops before any run with one line naming the release, the build log and the releases that build."""
    tree = tmp_path / "cache" / "harness" / "src" / "llama.cpp-0.3.40"
    (tree / "include").mkdir(parents=True)
    (tree / "include" / "llama.h").write_text("/* a llama.cpp this harness cannot build against */\n")
    (tree / "CMakeLists.txt").write_text('message(FATAL_ERROR "llama.cpp API this harness does not know")\n')
    done = cli("--model", str(ggml_samples["tinyllama"]), "--engine", "ggml==0.3.40",
               "--input", f"prompt={ggml_samples['prompt']}", "-o", str(tmp_path / "runs"),
               LAYERDIFF_CACHE=str(tmp_path / "cache"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    last = nonblank_lines(done.stderr)[-1]
    assert "did not build against llama-cpp-python 0.3.40's llama.cpp" in last and f"{OLDEST_BUILDING} (oldest)" in last
    log = Path(last.split("(log: ", 1)[1].split(")", 1)[0])
    assert log.is_file() and "llama.cpp API this harness does not know" in log.read_text()
    assert [line for line in nonblank_lines(done.stderr) if "0.3.40" in line and "collect:" in line] == [last]
    assert not list(tmp_path.rglob("*.h5"))


def test_the_release_a_build_reports_is_what_the_request_is_checked_against():
    assert reported_release(f"ggml 0.9.8 (llama-cpp-python {OLDER} sdist)") == OLDER
    assert reported_release("ggml 0.25.3 (unknown)") == ""
    assert same_release(OLDER, reported_release(f"ggml 0.9.8 (llama-cpp-python {OLDER} sdist)"))
    assert not same_release(OLDER, reported_release(f"ggml 0.25.3 (llama-cpp-python {PINNED_RELEASE} sdist)"))
    assert set(release_devices(ENGINES["ggml"])) >= {"local", "qemu"} and release_devices(ENGINES["mnn"]) == ("local",)


def _release_dump(path: Path, names: list[str], arrays: list[np.ndarray], version: str, facts: str) -> Path:
    """A ggml dump written with the project's writer: a MUL_MAT, its reshape, a ROPE of it and a MUL, named as the
    release names them."""
    from tests.analyze_dumps import write_dump

    types = ["MUL_MAT", "RESHAPE", "ROPE", "MUL"]
    layers = [(name, op_type, [names[k - 1]] if k else ["x"], array.shape)
              for k, (name, op_type, array) in enumerate(zip(names, types, arrays))]
    return write_dump(path, dict(zip(names, arrays)), layers=layers, engine="ggml", engine_version=version,
                      engine_requested=f"ggml=={version.split()[-2]}", engine_facts=facts)


def test_a_counted_node_name_that_moved_to_another_op_between_releases_is_not_a_parting(tmp_path):
    """0.3.17 names the reshape before a ROPE `Qcur-0 (reshaped)`, 0.3.36 names it `Qcur-0` too, so the harness
    counts it `Qcur-0#1` and the ROPE becomes `Qcur-0#2`: the same computation under shifted counts agrees; with
    the counted names undeclared, the name match pairs a ROPE with a RESHAPE and reads as a parting."""
    rng = np.random.default_rng(7)
    q = rng.normal(size=(6, 8)).astype(np.float32)
    arrays = [q, q.reshape(6, 2, 4), (q.reshape(6, 2, 4) * 0.5 + 1.0).astype(np.float32), (q * 3.0).astype(np.float32)]
    older_names = ["Qcur-0", "Qcur-0 (reshaped)", "Qcur-0#1", "out"]
    newer_names = ["Qcur-0", "Qcur-0#1", "Qcur-0#2", "out"]
    declared = ENGINES["ggml"].facts.to_json()
    for facts, agree in ((declared, True), (declared.replace('"counted": [{', '"uncounted": [{'), False)):
        folder = tmp_path / ("declared" if agree else "undeclared")
        folder.mkdir()
        old = _release_dump(folder / "old.h5", older_names, arrays, "ggml 0.9.8 (llama-cpp-python 0.3.17 sdist)", facts)
        _release_dump(folder / "new.h5", newer_names, arrays, "ggml 0.25.3 (llama-cpp-python 0.3.36 sdist)", facts)
        analysis = analyze_paths([folder], ref=str(old))
        try:
            [finding] = [f for f in analysis.findings if f.kind == "release_parting"]
            if agree:
                assert "agree" in finding.sentence and finding.numbers["layers_compared"] == 4, finding.sentence
            else:
                assert "regressed between" in finding.sentence and finding.layer == "Qcur-0#1:0", finding.sentence
        finally:
            analysis.close()


@pytest.mark.slow
def test_the_older_release_runs_on_a_standin_phone_from_its_own_staged_build(two_releases, ggml_samples,  # noqa: F811
                                                                             standin, tmp_path):
    """A stand-in phone has the host's ABI, so it runs the release's host build, staged on the phone beside (not
    over) the pinned one; the same build on the same prompt writes the same values as on the local device."""
    out = tmp_path / "phone"
    done = cli("--device", standin.serial, "--model", str(ggml_samples["tinyllama"]), "--engine", f"ggml=={OLDER}",
               "--input", f"prompt={ggml_samples['prompt']}", "-o", str(out), "--no-report")
    assert done.returncode == 0, done.stderr[-2000:]
    [run] = out.glob(f"ggml-{OLDER}_cpu_high_*.h5")
    attrs, phone = h5_tensors(run)
    _, local = h5_tensors(two_releases["older"])
    assert attrs["device_serial"] == standin.serial and attrs["engine_requested"] == f"ggml=={OLDER}"
    assert attrs["engine_version"] == f"ggml 0.9.8 (llama-cpp-python {OLDER} sdist)"
    assert [k for k, _o, _t in phone] == [k for k, _o, _t in local]
    assert all(np.array_equal(a, b) for (_k, _o, a), (_l, _p, b) in zip(phone, local))


@pytest.mark.slow
def test_the_older_release_runs_on_the_emulated_arm64_core_from_its_static_aarch64_build(ggml_samples,  # noqa: F811
                                                                                         tmp_path):
    from layerdiff.collector.engines.ggml.build import ensure_built
    from layerdiff.collector.harness.buildprogress import PlainReporter

    binary = ensure_built(GgmlSpec("aarch64", release=OLDER), PlainReporter())
    assert binary.parent == binary_dir(GgmlSpec("aarch64", release=OLDER)) != binary_dir(GgmlSpec("aarch64"))
    out = tmp_path / "arm64"
    done = layerdiff.collect(ggml_samples["tinyllama"], devices=["arm64"], engine=f"ggml=={OLDER}",
                             inputs=[f"prompt={ggml_samples['prompt']}"], out=out)
    assert done.exit_code == 0
    attrs, nodes = h5_tensors(done.paths[0])
    assert attrs["engine_version"] == f"ggml 0.9.8 (llama-cpp-python {OLDER} sdist)" and attrs["abi"] == "arm64-v8a"
    assert attrs["engine_requested"] == f"ggml=={OLDER}" and len(nodes) >= 50
    assert all(np.isfinite(t).all() for _k, _o, t in nodes)


@pytest.mark.slow
def test_the_convolution_parts_at_its_im2col_where_the_newer_ggml_builds_it_in_f16(ggml_binary, older_binary,  # noqa: F811
                                                                                   ggml_samples, tmp_path):
    """The convolution graph at normal precision on the large input (seed 004): ggml 0.9.8's `ggml_conv_2d` builds
    the IM2COL in the kernel's type (f32), ggml 0.25.3's in f16, where the input's large values overflow to inf.
    numpy, pairing the nodes by position, finds the first node that parts; the report must name the same one."""
    out = tmp_path / "conv"
    inputs = [f"x={ggml_samples['conv_large']}"]
    older = layerdiff.collect(ggml_samples["conv2d"], engine=f"ggml=={OLDER}", precisions=["normal"], inputs=inputs, out=out)
    pinned = layerdiff.collect(ggml_samples["conv2d"], engine="ggml", precisions=["normal"], inputs=inputs, out=out)
    assert older.exit_code == 0 and pinned.exit_code == 0
    older_attrs, old = h5_tensors(older.paths[0])
    pinned_attrs, new = h5_tensors(pinned.paths[0])
    assert [op for _k, op, _t in old] == [op for _k, op, _t in new]
    # the header says what each release's graph ran, not what was asked for
    assert (older_attrs["precision_effective"], pinned_attrs["precision_effective"]) == \
        ("im2col f32, kernel f32", "im2col f16, kernel f32")
    parting = [key for (key, _op, a), (_k, _p, b) in zip(old, new) if parts(a, b)]
    assert parting, "numpy finds the two releases' convolutions identical: pick another input"
    with h5py.File(older.paths[0], "r") as f, h5py.File(pinned.paths[0], "r") as g:
        first = {text_of(row["key"]): text_of(row["layout"]) for row in f["layers"][()]}[parting[0]]
        then = {text_of(row["key"]): text_of(row["layout"]) for row in g["layers"][()]}[parting[0]]
    analysis = analyze_paths([older.paths[0], pinned.paths[0]])
    try:
        [finding] = [f for f in analysis.findings if f.kind == "release_parting"]
        assert "regressed between" in finding.sentence and finding.layer == parting[0], (finding.sentence, parting)
        assert finding.layer == "conv.im2col:0" and (first, then) == ("ggml/f32@CPU", "ggml/f16@CPU")
    finally:
        analysis.close()


@pytest.mark.slow
def test_a_cached_build_that_reports_another_release_fails_the_run_saying_so(ggml_binary, ggml_samples,  # noqa: F811
                                                                            tmp_path, monkeypatch):
    """The request is checked against the release the binary names, as a wheel's reported version is: a binary in
    the release's cache folder that was built from another release (here the pinned one) fails its run."""
    import shutil

    monkeypatch.setenv("LAYERDIFF_CACHE", str(tmp_path / "cache"))
    misplaced = binary_dir(GgmlSpec(release=OLDER)) / "layerdiff-ggml"
    misplaced.parent.mkdir(parents=True)
    shutil.copy2(ggml_binary, misplaced)
    done = cli("--model", str(ggml_samples["tinyllama"]), "--engine", f"ggml=={OLDER}", "--input",
               f"prompt={ggml_samples['prompt']}", "-o", str(tmp_path / "runs"), "--no-report",
               LAYERDIFF_CACHE=str(tmp_path / "cache"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"ggml=={OLDER} was asked for but the engine reported version ggml 0.25.3 (llama-cpp-python " \
           f"{PINNED_RELEASE} sdist)" in done.stderr + (tmp_path / "runs" / "index.csv").read_text()
