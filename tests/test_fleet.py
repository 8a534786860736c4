"""Driver identity on every Vulkan run, and verdicts grouped by driver: the same model run with ncnn on
Mesa's lavapipe and on SwiftShader (two real Vulkan drivers picked with VK_ICD_FILENAMES) records two
driver identities, and `analyze` of both against a CPU reference shows one fleet group per driver."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import layerdiff.api

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.findings.thresholds import Thresholds
from layerdiff.analyzer.report.page import results_document
from layerdiff.collector.engines.ncnn.engine import decode_driver_version
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import resolve_model
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.driverlibs import mapped_libraries
from tests.conftest import MODELS, sample_input

LAVAPIPE = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")
SWIFTSHADER = Path("/usr/lib/chromium/vk_swiftshader_icd.json")
DRIVERS = {"lavapipe": (LAVAPIPE, "libvulkan_lvp.so"), "swiftshader": (SWIFTSHADER, "libvk_swiftshader.so")}

pytestmark = pytest.mark.skipif(not (LAVAPIPE.exists() and SWIFTSHADER.exists()),
                                reason="needs Mesa's lavapipe and Chromium's SwiftShader Vulkan drivers")


@pytest.fixture(scope="module")
def fleet_runs(tmp_path_factory):
    """{driver: HDF5} of convnet's vulkan/low run on each driver, plus 'reference': its cpu/high run."""
    out = tmp_path_factory.mktemp("fleet")
    files = resolve_model(MODELS / "convnet.param")
    inputs = InputSet("convnet", {"data": sample_input("convnet")}, "samples/inputs/convnet.npy")
    runs = {}
    with pytest.MonkeyPatch.context() as env:
        for name, (manifest, _) in DRIVERS.items():
            env.setenv("VK_ICD_FILENAMES", str(manifest))
            outcome = collect_run(LocalDevice(), RunSpec(files, "vulkan", "low", inputs), out / name)
            assert outcome.status == "done", outcome.message
            runs[name] = outcome.paths[0]
    outcome = collect_run(LocalDevice(), RunSpec(files, "cpu", "high", inputs), out / "reference")
    assert outcome.status == "done", outcome.message
    runs["reference"] = outcome.paths[0]
    return runs


def _driver(path: Path) -> tuple[dict, dict]:
    with DumpFile(path) as dump:
        return dict(dump.attrs), dump.provenance["raw_header"]["options"]["vulkan_driver"]


def test_each_vulkan_run_records_the_driver_it_really_mapped(fleet_runs):
    seen = {}
    for name, (manifest, library) in DRIVERS.items():
        attrs, driver = _driver(fleet_runs[name])
        assert [Path(lib["path"]).name for lib in driver["libraries"]] == [library]
        assert driver["libraries"][0]["manifest"] == str(manifest)
        assert driver["libraries"][0]["size"] == Path(driver["libraries"][0]["path"]).stat().st_size
        assert library in attrs["gpu_driver"] and attrs["gpu"] == driver["device_name"]
        assert len(bytes.fromhex(driver["pipeline_cache_uuid"])) == 16 and attrs["gpu_driver_build"] == driver["pipeline_cache_uuid"]
        assert driver["driver_version"] == decode_driver_version(int(driver["vendor_id"], 16), driver["driver_version_raw"])
        seen[name] = (attrs["gpu"], attrs["gpu_driver"], driver["vendor_id"])
    assert seen["lavapipe"] != seen["swiftshader"]
    assert seen["swiftshader"][2] == "0x1ae0"  # Google's Vulkan vendor id: SwiftShader, not Mesa (0x10005)
    with DumpFile(fleet_runs["reference"]) as cpu:
        assert "gpu_driver" not in cpu.attrs and "vulkan_driver" not in cpu.provenance["raw_header"]["options"]


def test_driver_versions_decode_per_vendor():
    packed = (535 << 22) | (104 << 14) | (5 << 6) | 0  # NVIDIA 535.104.05
    assert decode_driver_version(0x10DE, packed) == "535.104.5.0"
    assert decode_driver_version(0x1AE0, (5 << 22) | (1 << 12) | 7) == "5.1.7"


def test_mapped_libraries_reads_the_path_column_of_proc_maps():
    maps = ("7f00-7f01 r-xp 00000000 08:01 42    /usr/lib/libvk_swiftshader.so\n"
            "7f01-7f02 r--p 00001000 08:01 42    /usr/lib/libvk_swiftshader.so\n"
            "7f02-7f03 rw-p 00000000 00:00 0 \n7f03-7f04 rw-p 00000000 00:00 0    [heap]\n")
    assert mapped_libraries(maps) == ["/usr/lib/libvk_swiftshader.so"]


def _output_error(run: Path, ref: Path) -> float:
    """The output's relative L2 error judged here with numpy, outside layerdiff."""
    with DumpFile(run) as a, DumpFile(ref) as b:
        x, y = a.tensor_by_key("prob:0").astype(np.float64), b.tensor_by_key("prob:0").astype(np.float64)
    return float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30))


def _worst_layer_error(run: Path, ref: Path) -> float:
    """The largest relative L2 error over every layer both dumps hold, with numpy, outside layerdiff."""
    with DumpFile(run) as a, DumpFile(ref) as b:
        errors = []
        for key in set(a.layers["key"]) & set(b.layers["key"]):
            x, y = a.tensor_by_key(key).astype(np.float64), b.tensor_by_key(key).astype(np.float64)
            if x.shape == y.shape:
                errors.append(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30))
    return float(max(errors))


def test_analyze_groups_the_runs_by_driver(fleet_runs, tmp_path):
    analysis = analyze_paths([fleet_runs["lavapipe"], fleet_runs["swiftshader"]], ref=fleet_runs["reference"])
    try:
        fleet = analysis.fleet
        assert len(fleet) == 2, fleet
        assert set(fleet["backend"]) == {"vulkan"} and set(fleet["precision"]) == {"low"}
        assert {name for _, (_, name) in DRIVERS.items() if fleet["driver"].str.contains(name, regex=False).any()} \
            == {"libvulkan_lvp.so", "libvk_swiftshader.so"}
        assert (fleet["runs"] == 1).all() and (fleet[["n_pass", "n_warn", "n_fail"]].sum(axis=1) == 1).all()
        verdicts = dict(zip(analysis.summary["run"], analysis.summary["verdict"]))
        for run in analysis.runs:
            if run.label in fleet["run_labels"].tolist():
                row = fleet[fleet["run_labels"] == run.label].iloc[0]
                assert row[f"n_{verdicts[run.label]}"] == 1
        for name in ("lavapipe", "swiftshader"):  # the low-precision error is real on both drivers
            assert _output_error(fleet_runs[name], fleet_runs["reference"]) > 1e-6
        document = json.loads(json.dumps(results_document(analysis), default=str))
        assert len(document["fleet"]) == 2
    finally:
        analysis.close()


def test_one_driver_identity_shows_no_fleet(local_runs):
    """CPU runs have no driver: vulkan/low and cpu/low judged against cpu/high are one GPU identity."""
    analysis = analyze_paths([local_runs("convnet.param", "vulkan", "low"), local_runs("convnet.param", "cpu", "low"),
                              local_runs("convnet.param", "cpu", "high")], ref=local_runs("convnet.param", "cpu", "high"))
    try:
        assert analysis.fleet.empty and "fleet" not in results_document(analysis)
    finally:
        analysis.close()


def test_a_configuration_judged_differently_per_driver_is_a_fleet_finding(fleet_runs, tmp_path):
    """With the layer threshold between the two drivers' worst layer errors (measured here), the driver
    with the larger error has failing layers and the other none: the finding names both libraries."""
    worst = {name: _worst_layer_error(fleet_runs[name], fleet_runs["reference"]) for name in DRIVERS}
    assert worst["lavapipe"] != worst["swiftshader"]
    cut = float(np.sqrt(worst["lavapipe"] * worst["swiftshader"]))
    worse = max(worst, key=worst.get)
    better = min(worst, key=worst.get)
    with layerdiff.api.analyze([fleet_runs["lavapipe"], fleet_runs["swiftshader"]], ref=fleet_runs["reference"],
                               atol=1.0, rtol=1.0, warn_rel_l2=cut, fail_rel_l2=cut) as result:
        assert result.fleet.equals(result.analysis.fleet) and len(result.fleet) == 2
        page = result.write_report(tmp_path / "report").read_text()
        assert "<h2>Fleet</h2>" in page and page.count("libvk_swiftshader.so") >= 2
    analysis = analyze_paths([fleet_runs["lavapipe"], fleet_runs["swiftshader"]], ref=fleet_runs["reference"],
                             thresholds=Thresholds(atol=1.0, rtol=1.0, warn_rel_l2=cut, fail_rel_l2=cut))
    try:
        fleet = analysis.fleet.set_index(analysis.fleet["driver"].str.extract(r"\((\S+)\)")[0])
        assert fleet.loc[DRIVERS[better][1], "n_pass"] == 1 and fleet.loc[DRIVERS[worse][1], "n_pass"] == 0
        found = [f for f in analysis.findings if f.kind == "fleet"]
        assert fleet.loc[DRIVERS[worse][1], ["n_warn", "n_fail"]].sum() == 1
        assert len(found) == 1 and found[0].numbers["groups"] == 2 and found[0].numbers["passing_drivers"] == 1
        sentence = found[0].sentence
        assert sentence.startswith("vulkan/low (ncnn ")
        assert sentence.index(DRIVERS[worse][1]) < sentence.index("but passes") < sentence.index(DRIVERS[better][1])
    finally:
        analysis.close()


@pytest.mark.slow
def test_the_cpp_harness_records_the_driver_it_mapped(tmp_path):
    """The phone harness's ncnn engine (built for this host, with Vulkan) records the same driver fields,
    and picks up the driver VK_ICD_FILENAMES chose, as a phone's HAL driver would be."""
    from tests.test_harness_support import dump_model, host_harness

    harness = [str(host_harness())]
    seen = {}
    with pytest.MonkeyPatch.context() as env:
        for name, (manifest, library) in DRIVERS.items():
            env.setenv("VK_ICD_FILENAMES", str(manifest))
            driver = dump_model(harness, "convnet", "vulkan", "low", tmp_path / name).dump().header["options"]["vulkan_driver"]
            assert [Path(lib["path"]).name for lib in driver["libraries"]] == [library]
            assert driver["libraries"][0]["size"] == Path(driver["libraries"][0]["path"]).stat().st_size
            assert driver["driver_version"] == decode_driver_version(int(driver["vendor_id"], 16), driver["driver_version_raw"])
            assert len(bytes.fromhex(driver["pipeline_cache_uuid"])) == 16
            seen[name] = driver
    assert seen["swiftshader"]["vendor_id"] == "0x1ae0" and seen["lavapipe"]["vendor_id"] == "0x10005"
    assert seen["lavapipe"]["pipeline_cache_uuid"] != seen["swiftshader"]["pipeline_cache_uuid"]


@pytest.mark.slow
def test_standin_phones_on_two_drivers_form_two_fleet_groups(standins, monkeypatch, tmp_path):
    """Two stand-in phones (each running the real C++ harness through adb, each with its own Vulkan
    driver and build fingerprint) and a CPU reference: the runs record each phone's driver and build,
    and analyze shows one fleet group per phone."""
    from layerdiff.collector.transport.adb import AdbDevice
    from tests.test_harness_support import host_harness

    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(host_harness()))
    files = resolve_model(MODELS / "convnet.param")
    inputs = InputSet("convnet", {"data": sample_input("convnet")}, "samples/inputs/convnet.npy")
    paths, fingerprints = {}, {}
    for name, (manifest, _) in DRIVERS.items():
        monkeypatch.setenv("VK_ICD_FILENAMES", str(manifest))  # the stand-in's shell (and harness) inherit it
        fingerprints[name] = f"layerdiff/standin/{name}:14/UP1A/1:user/release-keys"
        phone = standins.start(props={"ro.build.fingerprint": fingerprints[name], "ro.product.model": "Fleet phone"})
        outcome = collect_run(AdbDevice(phone.serial), RunSpec(files, "vulkan", "low", inputs, deadline_s=300),
                              tmp_path / name)
        assert outcome.status == "done", outcome.message
        paths[name] = outcome.paths[0]
    monkeypatch.delenv("VK_ICD_FILENAMES")
    reference = collect_run(LocalDevice(), RunSpec(files, "cpu", "high", inputs), tmp_path / "reference")
    for name, (_, library) in DRIVERS.items():
        with DumpFile(paths[name]) as dump:
            assert dump.attrs["build_fingerprint"] == fingerprints[name]
            assert dump.provenance["device"]["extra"]["fingerprint"] == fingerprints[name]
            assert f"({library})" in dump.attrs["gpu_driver"]
    with layerdiff.api.analyze([paths["lavapipe"], paths["swiftshader"]], ref=reference.paths[0]) as result:
        fleet = result.fleet
        assert len(fleet) == 2 and sorted(fleet["build_fingerprint"]) == sorted(fingerprints.values())
        assert (fleet["runs"] == 1).all()


def test_a_hostile_driver_name_is_escaped_in_the_report(fleet_runs, tmp_path):
    """A dump's driver text is untrusted: the Fleet table shows it as text, never as markup."""
    import shutil

    import h5py

    hostile = tmp_path / "hostile.h5"
    shutil.copy(fleet_runs["lavapipe"], hostile)
    with h5py.File(hostile, "r+") as f:
        f.attrs["gpu_driver"] = "<img src=x onerror=alert(1)> (libvulkan_lvp.so)"
    with layerdiff.api.analyze([hostile, fleet_runs["swiftshader"]], ref=fleet_runs["reference"]) as result:
        assert len(result.fleet) == 2
        page = result.write_report(tmp_path / "report").read_text()
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
