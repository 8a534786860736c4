"""`--engine ncnn==RELEASE` on the emulated `arm64` core: the C++ harness built against an older ncnn release's
sdist, run beside the pinned release's build on the same sample model and input; the dump records the version
the binary reports and the release asked for, and the report says at which layer the two releases part, or that
they agree, judged against numpy on the two dumps' tensors (read with h5py, outside layerdiff).

The older release's build takes minutes on two busy cores the first time (cached afterwards, under keys of its
own beside the pinned release's); the refusals build nothing, or only run CMake on a tree that fails. MNN and
Paddle-Lite have no source distribution on the package index, so their releases are refused beyond the host."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import layerdiff
from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.collector.engines import ENGINES
from layerdiff.collector.engines.ncnn.harness import NCNN_VERSION, ncnn_key, ncnn_spec, source_folder
from layerdiff.collector.engines.ncnn.releases import KNOWN_BUILDING, check, reported_release
from layerdiff.collector.engines.versions import release_devices, same_release, source_for
from layerdiff.collector.harness.build import binary_dir, cache_root, ensure_built
from layerdiff.errors import EngineVersionError
from tests.test_engine_versions import cli, nonblank_lines
from tests.harness_builds import NCNN_OLDER
from tests.release_judgement import h5_tensors, parts

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "samples" / "models" / "convnet.param"
INPUT = REPO / "samples" / "inputs" / "convnet.npy"
OLDER = NCNN_OLDER  # an older ncnn release with an sdist on PyPI (pinned: NCNN_VERSION)
AARCH64_SPEC = ncnn_spec("aarch64", vulkan=False, test_build=True)  # what the arm64 device runs in the tests


@pytest.fixture(scope="module")
def pinned_aarch64() -> Path:
    return ensure_built(AARCH64_SPEC)


@pytest.fixture(scope="module")
def older_aarch64() -> Path:
    from layerdiff.collector.harness.buildprogress import PlainReporter

    return ensure_built(ncnn_spec("aarch64", test_build=True, release=OLDER), PlainReporter())


def _both_releases(stem: str, precision: str, out: Path) -> dict:
    """A sample model on its input on the emulated arm64 core: ncnn OLDER's C++ harness and the pinned one's, one
    output folder."""
    model, inputs = MODEL.with_name(f"{stem}.param"), [f"data={INPUT.with_name(f'{stem}.npy')}"]
    runs = {}
    for name, release in (("older", OLDER), ("pinned", NCNN_VERSION)):
        done = layerdiff.collect(model, devices=["arm64"], engine=f"ncnn=={release}", precisions=[precision],
                                 inputs=inputs, out=out)
        assert done.exit_code == 0
        runs[name] = done.paths[0]
    return {"out": out, **runs}


def _first_parting(pair: dict) -> tuple[list[str], int]:
    """numpy's first layers where the two releases part (by layer key, both dumps in execution order) and how many
    layers both hold."""
    _, older = h5_tensors(pair["older"])
    _, pinned = h5_tensors(pair["pinned"])
    assert [k for k, _o, _t in older] == [k for k, _o, _t in pinned]
    return [key for (key, _op, a), (_k, _p, b) in zip(older, pinned) if parts(a, b)], len(older)


@pytest.fixture(scope="module")
def two_releases(monkeypatch_module, pinned_aarch64, older_aarch64, tmp_path_factory) -> dict:
    """The sample convnet at high precision, with both releases."""
    return _both_releases("convnet", "high", tmp_path_factory.mktemp("ncnn-releases") / "runs")


@pytest.fixture(scope="module")
def monkeypatch_module():
    """The harness builds the tests make are the faster test builds (the suite's own, already cached)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("LAYERDIFF_HARNESS_TEST_BUILD", "1")
    yield patch
    patch.undo()


@pytest.mark.slow
def test_older_release_runs_on_arm64_from_its_own_build_and_the_dump_records_both_versions(two_releases,
                                                                                           older_aarch64):
    assert older_aarch64.parent == binary_dir(ncnn_spec("aarch64", test_build=True, release=OLDER))
    assert older_aarch64.parent != binary_dir(AARCH64_SPEC)
    source = Path(source_folder(OLDER).replace("{cache}", str(cache_root() / "harness")))
    assert (source / "CMakeLists.txt").is_file()
    older_attrs, older = h5_tensors(two_releases["older"])
    pinned_attrs, pinned = h5_tensors(two_releases["pinned"])
    assert older_attrs["engine_version"] == OLDER and older_attrs["engine_requested"] == f"ncnn=={OLDER}"
    assert pinned_attrs["engine_version"] == NCNN_VERSION and pinned_attrs["engine_requested"] == f"ncnn=={NCNN_VERSION}"
    assert older_attrs["abi"] == "arm64-v8a" == pinned_attrs["abi"]
    assert two_releases["older"].name.startswith(f"ncnn-{OLDER}_cpu_high_")
    rows = (two_releases["out"] / "index.csv").read_text().splitlines()
    assert any(f",ncnn=={OLDER},cpu,high," in line for line in rows)
    assert any(f",ncnn=={NCNN_VERSION},cpu,high," in line for line in rows)
    assert [k for k, _o, _t in older] == [k for k, _o, _t in pinned] and len(older) >= 5


def _check_report_against_numpy(pair: dict) -> str:
    """The report's `release_parting` finding names numpy's first parting layer, or says the releases agree when
    numpy finds none; returns which."""
    parting, layers = _first_parting(pair)
    analysis = analyze_paths([pair["older"], pair["pinned"]])
    try:
        [finding] = [f for f in analysis.findings if f.kind == "release_parting"]
        assert OLDER in finding.numbers["older"] and NCNN_VERSION in finding.numbers["newer"], finding.numbers
        assert finding.numbers["layers_compared"] >= layers - 2, finding.sentence
        if not parting:
            assert finding.severity == "info" and "agree" in finding.sentence and finding.layer == "", finding.sentence
            return "agree"
        assert "regressed between" in finding.sentence and OLDER in finding.sentence
        assert finding.layer == parting[0], (finding.sentence, parting[:5])
        return "part"
    finally:
        analysis.close()


@pytest.mark.slow
def test_report_names_the_first_layer_where_the_releases_part_as_numpy_does(two_releases):
    _check_report_against_numpy(two_releases)


@pytest.mark.slow
def test_at_low_precision_the_releases_part_at_the_layer_numpy_names(monkeypatch_module, pinned_aarch64,
                                                                     older_aarch64, tmp_path):
    """The overflow sample at low precision (fp16 storage and arithmetic on the emulated Cortex-A76): the two
    releases' fp16 kernels give values apart at a layer numpy finds by itself; the report must name that layer."""
    pair = _both_releases("overflow", "low", tmp_path / "runs")
    older_attrs, _ = h5_tensors(pair["older"])
    pinned_attrs, _ = h5_tensors(pair["pinned"])
    assert older_attrs["precision_effective"] == pinned_attrs["precision_effective"] == "fp16-storage+arith"
    assert _check_report_against_numpy(pair) == "part"


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("qemu-aarch64"), reason="needs qemu-user (apt) to run the aarch64 harness")
def test_the_older_release_runs_on_an_arm64_standin_phone_from_its_own_staged_build(two_releases, standins,
                                                                                   monkeypatch_module, tmp_path):
    """An arm64-v8a stand-in phone runs the release's static aarch64 build for its CPU, staged on the phone beside
    (not over) the pinned one; the same build on the same input writes the same values as on the arm64 device."""
    phone = standins.start(abi="arm64-v8a")
    out = tmp_path / "phone"
    done = layerdiff.collect(MODEL, devices=[phone.serial], engine=f"ncnn=={OLDER}", inputs=[f"data={INPUT}"], out=out)
    assert done.exit_code == 0
    attrs, on_phone = h5_tensors(done.paths[0])
    _, emulated = h5_tensors(two_releases["older"])
    assert attrs["device_serial"] == phone.serial and attrs["engine_requested"] == f"ncnn=={OLDER}"
    assert attrs["engine_version"] == OLDER and attrs["abi"] == "arm64-v8a"
    assert [k for k, _o, _t in on_phone] == [k for k, _o, _t in emulated]
    assert all(np.array_equal(a, b) for (_k, _o, a), (_l, _p, b) in zip(on_phone, emulated))


@pytest.mark.slow
def test_a_cached_build_that_reports_another_release_fails_the_run_saying_so(pinned_aarch64, tmp_path):
    """The request is checked against the version the binary reports: a binary in the release's cache folder that
    was built from another release (here the pinned one) fails its run, and nothing is built."""
    cache = tmp_path / "cache"
    (cache / "arm64").parent.mkdir(parents=True)
    (cache / "arm64").symlink_to(cache_root() / "arm64")  # the emulated core's Python runtime, as built
    release = "1.0.20250503"
    source = cache / "harness" / "src" / f"ncnn-{release}"
    source.mkdir(parents=True)
    (source / "CMakeLists.txt").write_text("# never built: the binary below is already in the cache\n")
    misplaced = cache / "harness" / binary_dir(ncnn_spec("aarch64", test_build=True, release=release)).name
    misplaced.mkdir(parents=True)
    shutil.copy2(pinned_aarch64, misplaced / "layerdiff-harness")
    done = cli("--model", str(MODEL), "--device", "arm64", "--engine", f"ncnn=={release}", "--input", f"data={INPUT}",
               "-o", str(tmp_path / "runs"), "--no-report", LAYERDIFF_CACHE=str(cache), LAYERDIFF_HARNESS_TEST_BUILD="1")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    said = done.stderr + (tmp_path / "runs" / "index.csv").read_text()
    assert f"ncnn=={release} was asked for but the engine reported version {NCNN_VERSION}" in said, said


def test_the_release_keys_the_build_and_the_pinned_one_keeps_its_keys():
    assert ncnn_key("aarch64", False, True) == ncnn_key("aarch64", False, True, release=NCNN_VERSION)
    assert ncnn_key("aarch64", False, True, release=OLDER) != ncnn_key("aarch64", False, True)
    older = ncnn_spec("aarch64", test_build=True, release=OLDER)
    assert binary_dir(older) != binary_dir(AARCH64_SPEC) and ncnn_spec("aarch64", test_build=True) == AARCH64_SPEC
    assert f"ncnn-{OLDER}" in " ".join(older.libraries[0].args) and older.libraries[0].fetch[-1] == OLDER
    assert older.libraries[0].title == f"ncnn {OLDER}"


def test_the_local_device_runs_the_wheel_and_arm64_and_phones_the_source_build():
    ncnn = ENGINES["ncnn"]
    assert source_for(ncnn, "local") is None  # `ncnn==X` on the host: that release's wheel, as before
    assert source_for(ncnn, "qemu") is not None and source_for(ncnn, "adb") is not None
    assert set(release_devices(ncnn)) == {"local", "qemu", "adb"}
    assert release_devices(ENGINES["mnn"]) == ("local",) and release_devices(ENGINES["paddle-lite"]) == ()
    assert OLDER in KNOWN_BUILDING and NCNN_VERSION in KNOWN_BUILDING
    assert reported_release(OLDER) == OLDER and same_release(OLDER, reported_release(OLDER))
    assert not same_release(OLDER, reported_release(NCNN_VERSION))


def test_a_release_number_that_is_not_ncnn_s_is_refused_before_anything_is_fetched(tmp_path):
    with pytest.raises(EngineVersionError, match="1.0.YYYYMMDD"):
        check("20250916")
    check(OLDER)
    done = cli("--model", str(MODEL), "--device", "arm64", "--engine", "ncnn==2.1", "-o", str(tmp_path / "runs"),
               LAYERDIFF_CACHE=str(tmp_path / "cache"))
    lines = nonblank_lines(done.stderr)
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "--engine ncnn==2.1: ncnn's releases are numbered 1.0.YYYYMMDD" in lines[0]
    assert not (tmp_path / "cache" / "harness").exists() and not (tmp_path / "runs").exists()


def test_a_release_the_index_has_no_sdist_of_is_one_line_naming_the_ones_it_has(tmp_path):
    done = cli("--model", str(MODEL), "--device", "arm64", "--engine", "ncnn==1.0.20250101", "--input",
               f"data={INPUT}", "-o", str(tmp_path / "runs"), LAYERDIFF_CACHE=str(tmp_path / "cache"))
    lines = nonblank_lines(done.stderr)
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "no ncnn 1.0.20250101 sdist" in lines[0] and NCNN_VERSION in lines[0] and OLDER in lines[0]
    assert not list((tmp_path / "cache").rglob("ncnn-1.0.20250101")) and not list(tmp_path.rglob("*.h5"))


def test_a_release_whose_source_does_not_build_is_one_line_naming_its_build_log(tmp_path):
    """A source tree of a release the harness cannot build against (its CMake stops), already in the cache: the
    collect stops before any run with one line naming the release, the build log and the releases that build."""
    release = "1.0.20240102"
    tree = tmp_path / "cache" / "harness" / "src" / f"ncnn-{release}"
    tree.mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text('message(FATAL_ERROR "an ncnn this harness does not know")\n')
    done = cli("--model", str(MODEL), "--device", "arm64", "--engine", f"ncnn=={release}", "--input",
               f"data={INPUT}", "-o", str(tmp_path / "runs"), LAYERDIFF_CACHE=str(tmp_path / "cache"),
               LAYERDIFF_HARNESS_TEST_BUILD="1")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    last = nonblank_lines(done.stderr)[-1]
    assert f"did not build against ncnn {release}'s source" in last and f"{NCNN_VERSION} (pinned)" in last, last
    assert OLDER in last
    log = Path(last.split("(log: ", 1)[1].split(")", 1)[0])
    assert log.is_file() and "an ncnn this harness does not know" in log.read_text()
    assert [line for line in nonblank_lines(done.stderr) if release in line and "collect:" in line] == [last]
    assert not list(tmp_path.rglob("*.h5"))


def test_mnn_and_paddle_lite_releases_beyond_the_host_are_refused_for_want_of_an_sdist(tmp_path):
    mnn = cli("--model", str(MODEL.with_suffix(".mnn")), "--device", "arm64", "--engine", "mnn==3.5.0",
              "-o", str(tmp_path / "a"))
    lines = nonblank_lines(mnn.stderr)
    assert mnn.returncode == 1 and len(lines) == 1 and "Traceback" not in mnn.stderr, mnn.stderr
    assert "--engine mnn==3.5.0 runs on the local device only" in lines[0]
    assert "the package index has no MNN source distribution" in lines[0]
    model = tmp_path / "m.nb"
    model.write_bytes(b"\0")
    lite = cli("--model", str(model), "--engine", "paddle-lite==2.13", "-o", str(tmp_path / "b"))
    lines = nonblank_lines(lite.stderr)
    assert lite.returncode == 1 and len(lines) == 1 and "Traceback" not in lite.stderr, lite.stderr
    assert "the package index has no Paddle-Lite source distribution" in lines[0]
