"""The C++ harness's `--each FILE` (HARNESS_CLI.md): one process, the model loaded once, every input its own
raw dump, and the collector using it on phones (`collect --input DIR` on an ADB device).

Real binaries (the host build and the static aarch64 build under qemu), real ncnn models of samples/, a real
adb server talking to a stand-in phone at the wire. Every input's tensors are checked against the run the
same binary makes of that input alone, bit for bit; inputs the engine refuses, and a process that crashes,
fail by name while the other inputs run."""
from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.formats.rawdump import read_raw_dump
from layerdiff.collector.inputs.inputset import InputSet, resolve_inputs
from layerdiff.collector.inputs.modelfiles import input_shapes, resolve_model
from layerdiff.collector.inputs.preprocess import parse_preprocess
from layerdiff.collector.run.each import Listener, collect_each, runs_in_one_process
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from layerdiff.collector.sweep.index import read_index
from layerdiff.samples.images import IMAGES_DIR, RECIPE
from tests.test_harness_support import INPUTS, MODELS, aarch64_harness, host_harness

pytestmark = pytest.mark.slow  # builds the harness (cached) on first use

UNDERFLOW = MODELS / "underflow.param"
QEMU_READY = bool(shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-g++"))


def _model_args(stem: str) -> list[str]:
    return ["--engine", "ncnn", "--model", str(MODELS / f"{stem}.param"), "--model", str(MODELS / f"{stem}.bin"),
            "--backend", "cpu", "--precision", "high"]


def _arrays(directory: Path) -> dict[str, np.ndarray]:
    return {f"{t.op}:{t.output_index}": a for t, a in read_raw_dump(directory).iter_arrays()}


def _case_events(stdout: str) -> list[dict]:
    return [json.loads(line[5:]) for line in stdout.splitlines() if line.startswith("@@ld ") and '"case"' in line]


def _inputs(tmp_path: Path, n: int) -> list[Path]:
    """n inputs of the convnet sample: its own input, then scaled and shifted copies."""
    base = np.load(INPUTS / "convnet.npy").astype("<f4")
    files = []
    for k in range(n):
        path = tmp_path / f"in{k}.npy"
        np.save(path, (base * (1.0 + 0.5 * k) - 0.1 * k).astype("<f4"))
        files.append(path)
    return files


def _each_then_alone(prefix: list[str], tmp_path: Path) -> None:
    """Four cases, the third an unreadable input: the others' dumps equal each input run by a process of its
    own; the third fails with the exit code and line a run of it alone gives; one process ran them all."""
    files = _inputs(tmp_path, 4)
    files[2] = tmp_path / "broken.npy"
    files[2].write_bytes(b"not an npy file")
    cases = [{"out": str(tmp_path / f"each{k}"), "inputs": {"data": str(f)}} for k, f in enumerate(files)]
    listing = tmp_path / "cases.jsonl"
    listing.write_text("".join(json.dumps(c) + "\n" for c in cases))
    done = subprocess.run([*prefix, *_model_args("convnet"), "--each", str(listing)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    events = _case_events(done.stdout)
    assert [(e["case"], e["state"]) for e in events] == [(k, s) for k in range(4) for s in ("start", "done" if k != 2
                                                                                               else "failed")]
    assert len({e["pid"] for e in events}) == 1
    alone_bad = subprocess.run([*prefix, *_model_args("convnet"), "--input", f"data={files[2]}", "--out",
                                str(tmp_path / "alone2")], capture_output=True, text=True, timeout=600)
    failed = events[5]
    assert failed["code"] == alone_bad.returncode == 2
    assert f"layerdiff-harness: {failed['message']}" == alone_bad.stderr.strip()
    assert str(files[2]) in failed["message"] and not (tmp_path / "each2").exists()
    for k in (0, 1, 3):
        alone = tmp_path / f"alone{k}"
        run = subprocess.run([*prefix, *_model_args("convnet"), "--input", f"data={files[k]}", "--out", str(alone)],
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr
        ours, theirs = read_raw_dump(tmp_path / f"each{k}"), read_raw_dump(alone)
        assert ours.footer is not None and ours.footer["status"] == "ok"
        a, b = _arrays(tmp_path / f"each{k}"), _arrays(alone)
        assert a.keys() == b.keys() and all(np.array_equal(a[key], b[key]) for key in a)
        digest = hashlib.sha256(files[k].read_bytes()).hexdigest()
        assert ours.header["inputs"][0]["sha256"] == theirs.header["inputs"][0]["sha256"] == digest
        assert [f.shape for f in ours.fed] == [f.shape for f in theirs.fed]
        assert ours.footer["plain_run"]["identical"] is True


def test_host_harness_each_equals_one_process_per_input(tmp_path):
    _each_then_alone([str(host_harness())], tmp_path)


@pytest.mark.skipif(not QEMU_READY, reason="needs qemu-user and g++-aarch64-linux-gnu (apt) for the aarch64 harness")
def test_aarch64_harness_each_under_qemu_equals_one_process_per_input(tmp_path):
    _each_then_alone(["qemu-aarch64", "-cpu", "max", str(aarch64_harness())], tmp_path)


def test_a_crash_inside_one_input_keeps_the_inputs_before_it(tmp_path):
    """`--abort-after K` counts the process's tensors over its runs: the abort lands inside the second
    input; the first is a whole dump, the second's tensors before the abort are kept without a footer."""
    files = _inputs(tmp_path, 3)
    per_input = len(read_raw_dump(_alone(tmp_path, files[0])).tensors)
    listing = tmp_path / "cases.jsonl"
    listing.write_text("".join(json.dumps({"out": str(tmp_path / f"d{k}"), "inputs": {"data": str(f)}}) + "\n"
                               for k, f in enumerate(files)))
    done = subprocess.run([str(host_harness()), *_model_args("convnet"), "--each", str(listing), "--abort-after",
                           str(per_input + 2)], capture_output=True, text=True, timeout=600)
    assert done.returncode < 0 and "aborting on purpose" in done.stderr
    assert [(e["case"], e["state"]) for e in _case_events(done.stdout)] == [(0, "start"), (0, "done"), (1, "start")]
    assert read_raw_dump(tmp_path / "d0").footer["status"] == "ok"
    second = read_raw_dump(tmp_path / "d1")
    assert second.footer is None and len(second.tensors) == 2 and not (tmp_path / "d2").exists()


def _alone(tmp_path: Path, file: Path) -> Path:
    out = tmp_path / "alone"
    run = subprocess.run([str(host_harness()), *_model_args("convnet"), "--input", f"data={file}", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return out


@pytest.mark.parametrize("text, says", [
    ("not json\n", "line 2: invalid JSON"),
    ('["out", "inputs"]\n', "line 2: not an {\"out\", \"inputs\"} object"),
    ('{"out": "D"}\n', "both are required"),
    ('{"out": "D", "inputs": {"data": 7}}\n', "input 'data' is not a string"),
    ('{"out": "D", "inputs": {"data": "a\\u0000b"}}\n', "holds a NUL character"),
    ('{"out": "D", "inputs": {"data": "A", "data": "B"}}\n', "input 'data' is named twice"),
    ('{"out": "D", "inputs": {}}\n', "names no input"),
    ('{"out": "D", "inputs": {"data": "' + "x" * 70000 + '"}}\n', "longer than 65536 bytes"),
    ('{"out": "' + "d" * 5000 + '", "inputs": {"data": "A"}}\n', "\"out\" is longer than 4096 bytes"),
    ("[" * 100 + "]" * 100 + "\n", "nesting too deep|not an {\"out\", \"inputs\"} object"),
    ("\n\n", "names no run"),
])
@pytest.mark.parametrize("harness", ["C++", "Python"])
def test_a_bad_cases_file_is_one_line_naming_it_and_nothing_runs(tmp_path, text, says, harness):
    """The cases file is untrusted text: anything but one bounded {out, inputs} object a line stops the
    process before the model loads, exit 2, one line naming the file and line; the C++ harness and the
    Python host engines hold the same bounds (deep nesting: the C++ parser's own limit, or not an object)."""
    listing = tmp_path / "cases.jsonl"
    first = json.dumps({"out": str(tmp_path / "first"), "inputs": {"data": str(INPUTS / "convnet.npy")}}) + "\n"
    listing.write_text(text if "names no run" in says else first + text)
    program = ([str(host_harness())] if harness == "C++"
               else [sys.executable, "-m", "layerdiff.collector.engines.ncnn.engine"])
    done = subprocess.run([*program, *_model_args("convnet"), "--each", str(listing)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and not _case_events(done.stdout)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"layerdiff-harness: --each {listing}")
    assert any(part in lines[0] for part in says.split("|")), lines[0]
    if "names no run" not in says:
        assert "line 2" in lines[0]
    assert not (tmp_path / "first").exists()


@pytest.mark.parametrize("extra", [["--input", "data=x.npy"], ["--repeat", "2"], ["--inject", "D", "--target", "k"]])
def test_each_refuses_options_that_name_one_run(tmp_path, extra):
    listing = tmp_path / "cases.jsonl"
    listing.write_text(json.dumps({"out": str(tmp_path / "d"), "inputs": {"data": str(INPUTS / "convnet.npy")}}) + "\n")
    done = subprocess.run([str(host_harness()), *_model_args("convnet"), "--each", str(listing), *extra],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--each takes each run's inputs from its file" in done.stderr


# -- phones: the collector's --each over adb ---------------------------------------------------------------

def _underflow_specs() -> list[RunSpec]:
    files = resolve_model(UNDERFLOW)
    sets, errors = resolve_inputs([str(IMAGES_DIR)], input_shapes(files), parse_preprocess(RECIPE))
    assert not errors and len(sets) == 6
    return [RunSpec(files, "cpu", "high", inputs, deadline_s=300) for inputs in sets]


def _tensors(path: Path) -> dict[str, np.ndarray]:
    with DumpFile(path) as dump:
        return {str(row["key"]): np.array(dump.tensor(int(row["order"]))) for _, row in dump.layers.iterrows()}


def _attrs(path: Path) -> dict:
    with DumpFile(path) as dump:
        return {**dict(dump.attrs), "provenance": dump.provenance}


def _one_process_equals_one_each(device, specs: list[RunSpec], tmp_path: Path) -> list[tuple[dict, dict]]:
    """Runs `specs` as one data set (one engine process) and each alone on `device`: every input done, one
    process for all, tensors equal bit for bit; each input's root attributes (together, alone), for further checks."""
    assert runs_in_one_process(device, specs[0])
    outcomes = []
    collect_each(device, specs, tmp_path / "each", Listener(lambda s: None, outcomes.append))
    assert [o.status for o in outcomes] == ["done"] * len(specs), [o.message for o in outcomes]
    assert len({_attrs(o.paths[0])["provenance"]["engine_process"]["pid"] for o in outcomes}) == 1
    pairs = []
    for spec, together in zip(specs, outcomes):
        alone = collect_run(device, spec, tmp_path / "alone")
        assert alone.status == "done", alone.message
        a, b = _tensors(alone.paths[0]), _tensors(together.paths[0])
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), spec.inputs.label
        pairs.append((_attrs(together.paths[0]), _attrs(alone.paths[0])))
    return pairs


def test_a_phone_runs_a_data_set_in_one_harness_process(standin, monkeypatch, tmp_path):
    """On a (stand-in) phone the C++ harness takes every input of a configuration in one process: the model and
    inputs pushed once, each input's dump pulled and converted as it finishes, its tensors those of a run of its
    own, a refused input failed by name with the rest run."""
    from layerdiff.collector.transport.adb import AdbDevice

    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(host_harness()))
    device = AdbDevice(standin.serial)
    specs = _underflow_specs()
    assert runs_in_one_process(device, specs[0])
    refused = RunSpec(specs[0].model, "cpu", "high", InputSet("wrong_name", {"image": specs[0].inputs.arrays["data"]},
                                                               "wrong_name.npy"), deadline_s=300)
    together = specs[:3] + [refused] + specs[3:]
    outcomes, started = [], []
    collect_each(device, together, tmp_path / "each", Listener(lambda s: started.append(s.inputs.label),
                                                               outcomes.append))
    labels = [s.inputs.label for s in together]
    assert started == labels and [o.spec.inputs.label for o in outcomes] == labels
    assert [o.status for o in outcomes] == ["done"] * 3 + ["failed"] + ["done"] * 3, [o.message for o in outcomes]
    assert "model has no input blob 'image'" in outcomes[3].message and "\n" not in outcomes[3].message
    done = [o for o in outcomes if o.status == "done"]
    assert len({_attrs(o.paths[0])["provenance"]["engine_process"]["pid"] for o in done}) == 1
    model_pushes = [p for p in device.pushed if p.endswith((".param", ".bin"))]
    assert len(model_pushes) == 2  # the model once for the seven inputs
    for spec, outcome in zip(specs, done):
        alone = collect_run(device, spec, tmp_path / "alone")
        assert alone.status == "done", alone.message
        a, b = _tensors(alone.paths[0]), _tensors(outcome.paths[0])
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), spec.inputs.label
        attrs = _attrs(outcome.paths[0])
        assert attrs["input_fed_check"] == "equal" and attrs["complete"]
        assert attrs["input_sha256"] == _attrs(alone.paths[0])["input_sha256"]
        assert attrs["device_serial"] == standin.serial
    assert not list(standin.host_path("/data/local/tmp/layerdiff/runs").iterdir())  # every case's dump removed


def test_a_phone_harness_that_crashes_keeps_the_inputs_before_and_runs_the_rest(standin, monkeypatch, tmp_path):
    from layerdiff.collector.transport.adb import AdbDevice

    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(host_harness()))
    device = AdbDevice(standin.serial)
    specs = _underflow_specs()[:4]
    per_input = len(_tensors(collect_run(device, specs[0], tmp_path / "one").paths[0]))
    crashing = [RunSpec(s.model, s.backend, s.precision, s.inputs, deadline_s=300,
                        extra_args=["--abort-after", str(per_input + 2)]) for s in specs]
    outcomes = []
    collect_each(device, crashing, tmp_path / "runs", Listener(lambda s: None, outcomes.append))
    assert [o.status for o in outcomes] == ["done", "failed", "done", "failed"], [o.message for o in outcomes]
    assert f"ended on input {specs[1].inputs.label}" in outcomes[1].message and "signal 6" in outcomes[1].message
    with DumpFile(outcomes[1].paths[0]) as dump:  # what it dumped before the crash came over adb
        assert not dump.attrs["complete"] and len(dump.layers) == 2
    assert _attrs(outcomes[0].paths[0])["complete"] and _attrs(outcomes[2].paths[0])["complete"]


def test_collect_input_dir_on_a_phone_uses_one_process_per_configuration(standin, monkeypatch, tmp_path):
    """`collect --device SERIAL --input DIR` end to end: the index says done for every input, all written by
    one harness process on the phone."""
    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(host_harness()))
    out = tmp_path / "runs"
    done = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--model", str(UNDERFLOW), "--device",
                           standin.serial, "--input", str(IMAGES_DIR), "--preprocess", RECIPE, "--precision", "high",
                           "-o", str(out), "--no-report"], capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr
    rows = list(read_index(out).values())
    assert len(rows) == 6 and all(row.status == "done" for row in rows)
    pids = {_attrs(path)["provenance"]["engine_process"]["pid"] for path in out.glob("*.h5")}
    assert len(pids) == 1


# -- the emulated `arm64` device: its aarch64 Python engines under qemu take --each as on the host ----------

@pytest.mark.skipif(not shutil.which("qemu-aarch64"), reason="needs qemu-user (apt) for the arm64 device")
@pytest.mark.parametrize("suffix", [".param", ".mnn"])
def test_the_arm64_device_runs_a_data_set_in_one_emulated_engine_process(suffix, tmp_path):
    """qemu and the aarch64 engine start once for the configuration (the model loaded once); each input's
    tensors are those a process of its own gives, bit for bit."""
    from layerdiff.collector.transport.arm64 import Arm64Device

    device = Arm64Device("cortex-a76")
    files = resolve_model(UNDERFLOW.with_suffix(suffix))
    sets, errors = resolve_inputs([str(IMAGES_DIR)], input_shapes(files), parse_preprocess(RECIPE))
    assert not errors
    specs = [RunSpec(files, "cpu", "low", inputs, deadline_s=600) for inputs in sets[:3]]
    for attrs, alone in _one_process_equals_one_each(device, specs, tmp_path):
        assert attrs["abi"] == "arm64-v8a" and attrs["input_fed_check"].startswith("equal")
        for fact in ("precision_effective", "input_fed_check", "input_sha256"):
            assert attrs[fact] == alone[fact], fact


def test_ctrl_c_in_a_phone_data_set_then_resume(standin, monkeypatch, tmp_path):
    """Ctrl-C while the phone's harness works through 40 photos: the index says done for exactly the files
    written, at most one input interrupted, nothing half-written; the next collect runs the rest."""
    from PIL import Image

    from layerdiff.samples.images import scene

    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(host_harness()))
    photos = tmp_path / "photos"
    photos.mkdir()
    for k in range(40):
        Image.fromarray(scene(700 + k, (255, 3, 1)[k % 3])).save(photos / f"p{k:03d}.png")
    out = tmp_path / "runs"
    argv = [sys.executable, "-m", "layerdiff.collector.cli", "--model", str(UNDERFLOW), "--device", standin.serial,
            "--input", str(photos), "--preprocess", RECIPE, "--precision", "high", "-o", str(out), "--no-report"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while len(list(out.glob("*.h5"))) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=300)
    rows = list(read_index(out).values())
    statuses = [row.status for row in rows]
    if proc.returncode == 0:  # finished before the signal: nothing to check but the index
        assert statuses.count("done") == 40
        return
    assert proc.returncode == 130
    done = {name for row in rows if row.status == "done" for name in row.files}
    written = {path.name for path in out.glob("*.h5")}
    stopped = {f"ncnn_cpu_high_{row.input}.h5" for row in rows if row.status == "interrupted"}
    assert done <= written and len(done) >= 2  # 3 files were written: at most one was in flight
    assert written - done <= stopped  # the input in flight may have finished its file as the signal came
    assert statuses.count("interrupted") <= 1 and "running" not in statuses and "failed" not in statuses
    assert not [p for p in out.iterdir() if ".partial" in p.name or p.name.startswith(".layerdiff-fetch")]
    again = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert again.returncode == 0, again.stderr
    rows = list(read_index(out).values())
    assert [row.status for row in rows].count("done") == 40
    pids = {_attrs(path)["provenance"]["engine_process"]["pid"] for path in out.glob("*.h5")}
    assert len(pids) == 2  # the interrupted process and the resuming one


@pytest.mark.skipif(not QEMU_READY, reason="needs qemu-user and g++-aarch64-linux-gnu (apt) for the aarch64 harness")
def test_an_arm64_phone_runs_a_data_set_in_one_aarch64_harness_process(standins, monkeypatch, tmp_path):
    """The static aarch64 harness on an arm64-v8a stand-in (qemu-aarch64): three photos in one process, each
    equal to a process of its own on the same phone."""
    from layerdiff.collector.transport.adb import AdbDevice

    monkeypatch.setenv("LAYERDIFF_HARNESS_ARM64_V8A", str(aarch64_harness()))
    device = AdbDevice(standins.start(abi="arm64-v8a").serial)
    specs = _underflow_specs()[:3]
    for attrs, _ in _one_process_equals_one_each(device, specs, tmp_path):
        assert attrs["abi"] == "arm64-v8a"
