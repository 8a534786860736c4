"""Engine releases as an axis: `collect --engine mnn==3.5.0` runs MNN 3.5.0 from its own cached
environment beside the installed MNN, the dump records the release the engine reports, the two runs
are two configurations, and the report says where the releases part (or that they agree).

The older release is the real wheel from the package index (installed once into the layerdiff cache;
later runs reuse it); verdicts are checked against numpy on the dumps."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import layerdiff
from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.engines import ENGINES
from layerdiff.collector.engines.versions import env_path, pip_failure, same_release, split_engine
from layerdiff.errors import EngineVersionError
from tests.analyze_dumps import ORDER, reference_arrays, write_dump

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "samples" / "models" / "convnet.mnn"
OLDER = "3.5.0"  # an MNN release with a wheel for every Python the installed MNN has one for
INSTALLED = ENGINES["mnn"]


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", *args], capture_output=True, text=True,
                          timeout=1800, env={**os.environ, **env}, check=False)  # a release's first build included


def nonblank_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _tensors(path: Path) -> dict[str, np.ndarray]:
    with DumpFile(path) as dump:
        return {str(row["key"]): dump.tensor(int(row["order"])) for _, row in dump.layers.iterrows()}


@pytest.fixture(scope="module")
def two_releases(tmp_path_factory) -> dict:
    """The sample convnet on MNN 3.5.0 (its cached environment) and on the installed MNN, one input, one folder."""
    import MNN

    if same_release(OLDER, MNN.version()):
        pytest.fail(f"the installed MNN is {OLDER}: pick another release for OLDER")
    out = tmp_path_factory.mktemp("releases") / "runs"
    older = layerdiff.collect(SAMPLE, engine=f"mnn=={OLDER}", inputs=["random:3"], out=out)
    newer = layerdiff.collect(SAMPLE, engine="mnn", inputs=["random:3"], out=out)
    assert older.exit_code == 0 and newer.exit_code == 0
    return {"out": out, "older": older.paths[0], "newer": newer.paths[0], "installed": MNN.version()}


def test_older_release_runs_from_its_cached_environment_and_records_its_version(two_releases):
    env = env_path("mnn", OLDER)
    assert (env / "MNN").is_dir()
    reported = subprocess.run([sys.executable, "-c", "import MNN; print(MNN.version())"], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(env)}, check=True).stdout.split()[-1]
    assert reported == OLDER
    with DumpFile(two_releases["older"]) as dump:
        assert dump.attrs["engine_version"] == OLDER and dump.attrs["engine_requested"] == f"mnn=={OLDER}"
    with DumpFile(two_releases["newer"]) as dump:
        assert dump.attrs["engine_version"] == two_releases["installed"] and "engine_requested" not in dump.attrs
    assert two_releases["older"].name.startswith(f"mnn-{OLDER}_cpu_high_")
    rows = (two_releases["out"] / "index.csv").read_text().splitlines()
    assert any(line.startswith(f"local,mnn=={OLDER},cpu,high,") for line in rows)
    assert any(line.startswith("local,mnn,cpu,high,") for line in rows)


def test_report_names_the_two_releases_and_says_whether_they_part(two_releases):
    older, newer = _tensors(two_releases["older"]), _tensors(two_releases["newer"])
    common = sorted(set(older) & set(newer))
    assert len(common) > 5
    rel = {k: float(np.linalg.norm(newer[k] - older[k]) / max(np.linalg.norm(older[k]), 1e-30)) for k in common}
    analysis = analyze_paths([two_releases["older"], two_releases["newer"]])
    try:
        labels = sorted(run.label for run in analysis.runs)
        assert labels == sorted([f"mnn {OLDER}", f"mnn {two_releases['installed']}"])
        [finding] = [f for f in analysis.findings if f.kind == "release_parting"]
        assert finding.numbers["older"] == OLDER and finding.numbers["newer"] == two_releases["installed"]
        if max(rel.values()) < 1e-6:  # numpy says every layer agrees: so must the report
            assert finding.severity == "info" and "agree" in finding.sentence and finding.layer == ""
        else:
            assert "regressed between" in finding.sentence
    finally:
        analysis.close()


def test_two_releases_are_two_configurations_of_a_data_set(tmp_path):
    """Dumps written with the project's writer: one engine at two releases on three inputs; the newer
    release's `fc` is far off on every input. The release finding names `fc` as where they part, and
    the data-set view keeps the releases apart."""
    folder = tmp_path / "runs"
    folder.mkdir()
    for k in range(3):
        ref = reference_arrays(seed=20 + k)
        new = {op: a.copy() for op, a in ref.items()}
        new["fc"] = (new["fc"] * np.float32(-1.0)).astype(np.float32)
        new["prob"] = new["prob"][:, ::-1].copy()
        sha = f"{k:02x}" * 32
        write_dump(folder / f"old_{k}.h5", ref, engine="mnn", engine_version="3.4.1", input_label=f"in{k}", input_sha256=sha)
        write_dump(folder / f"new_{k}.h5", new, engine="mnn", engine_version="3.10.0", input_label=f"in{k}",
                   input_sha256=sha, engine_requested="mnn==3.10.0")
    ref, new = reference_arrays(seed=20), {}
    new = {op: (a * np.float32(-1.0) if op == "fc" else a[:, ::-1] if op == "prob" else a) for op, a in ref.items()}
    first_off = next(op for op in ORDER if np.linalg.norm(new[op] - ref[op]) > 0.1 * np.linalg.norm(ref[op]))
    analysis = analyze_paths([folder], ref=str(folder / "old_0.h5"))
    try:
        found = [f for f in analysis.findings if f.kind == "release_parting"]
        assert len(found) == 3 and {f.layer for f in found} == {f"{first_off}:0"}
        assert all(f.sentence.startswith(f"mnn regressed between 3.4.1 and 3.10.0 at layer {first_off}") for f in found)
        assert {r.config for r in analysis.runs if r.attrs["engine_version"] == "3.10.0"} != \
            {r.config for r in analysis.runs if r.attrs["engine_version"] == "3.4.1"}
        [dataset] = [f for f in analysis.findings if f.kind == "dataset"]
        assert dataset.numbers["inputs"] == 3 and dataset.numbers["n_fail"] == 3
        assert dataset.run == "mnn 3.10.0 cpu/high"
    finally:
        analysis.close()


def test_a_release_the_index_lacks_is_one_line_naming_the_ones_it_has(tmp_path):
    done = cli("--model", str(SAMPLE), "--engine", "mnn==3.5.99", "--input", "random", "-o", str(tmp_path / "r"))
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr and lines[0].startswith("mnn==3.5.99 environment")  # the step, then why
    assert len(lines) == 2 and "no MNN 3.5.99 wheel for Python" in lines[1] and OLDER in lines[1]
    assert not list((tmp_path / "r").glob("*.h5"))


def test_refusals_are_one_line_each(tmp_path):
    with pytest.raises(EngineVersionError, match="release number"):
        split_engine("mnn==../x")
    assert split_engine("mnn==3.5.0") == ("mnn", "3.5.0") and split_engine("ncnn") == ("ncnn", "")
    bad = cli("--model", str(SAMPLE), "--engine", "mnn==3.5.0;rm", "-o", str(tmp_path / "a"))
    assert bad.returncode == 2 and "release number" in bad.stderr
    nb = tmp_path / "m.nb"
    nb.write_bytes(b"\0")
    native = cli("--model", str(nb), "--engine", "paddle-lite==2.14", "-o", str(tmp_path / "b"))
    assert native.returncode == 1 and "no Paddle-Lite source distribution" in native.stderr
    assert len([line for line in native.stderr.splitlines() if line.strip()]) == 1
    phone = cli("--model", str(SAMPLE), "--engine", "mnn==3.5.0", "--device", "arm64", "-o", str(tmp_path / "c"))
    assert phone.returncode == 1 and "runs on the local device only" in phone.stderr
    assert "no MNN source distribution" in phone.stderr


def test_pip_failures_read_as_one_line():
    text = ("ERROR: Could not find a version that satisfies the requirement MNN==9.9 (from versions: 3.0.0, 3.5.0)\n"
            "ERROR: No matching distribution found for MNN==9.9\n")
    line = pip_failure(INSTALLED, "9.9", text)
    assert "no MNN 9.9 wheel" in line and "3.0.0, 3.5.0" in line and "\n" not in line
    none = pip_failure(INSTALLED, "9.9", "ERROR: ... (from versions: none)\n")
    assert "no release of MNN has a wheel for it" in none
    assert same_release("3.5", "3.5.0") and not same_release("3.5.0", "3.6.1")
