"""One engine process per configuration for a data set: `collect --input DIR` loads the model once and
runs every input in that process (the harness's `--each`), each input still its own run and HDF5 file
with its own provenance and input check, written as soon as the engine finishes it. An engine process
that dies on one input keeps the inputs before it, fails that one naming it, and a new process runs the rest.

Real runs of the seed-003 sample (`underflow`, ncnn, on the generated photos of samples/images/),
checked tensor for tensor against runs made one process per input."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.inputs.inputset import resolve_inputs
from layerdiff.collector.inputs.modelfiles import input_shapes, resolve_model
from layerdiff.collector.inputs.preprocess import parse_preprocess
from layerdiff.collector.run.each import Listener, collect_each
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from layerdiff.collector.sweep.index import read_index
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.samples.images import IMAGES_DIR, RECIPE

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "samples" / "models" / "underflow.param"


def _tensors(path: Path) -> dict[str, np.ndarray]:
    with DumpFile(path) as dump:
        return {str(row["key"]): np.array(dump.tensor(int(row["order"]))) for _, row in dump.layers.iterrows()}


def _provenance(path: Path) -> dict:
    with DumpFile(path) as dump:
        attrs = dict(dump.attrs)
    value = attrs["provenance"]
    return {**attrs, "provenance": json.loads(value) if isinstance(value, str) else value}


def _specs(model: Path = MODEL) -> list[RunSpec]:
    files = resolve_model(model)
    sets, errors = resolve_inputs([str(IMAGES_DIR)], input_shapes(files), parse_preprocess(RECIPE))
    assert not errors and len(sets) == 6
    return [RunSpec(files, "cpu", "high", inputs) for inputs in sets]


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("each") / "runs"
    done = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--model", str(MODEL), "--input",
                           str(IMAGES_DIR), "--preprocess", RECIPE, "-o", str(out), "--no-report"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    return out


def test_every_input_runs_in_one_engine_process_as_its_own_run(swept, tmp_path):
    rows = [row for row in read_index(swept).values()]
    assert len(rows) == 6 and all(row.status == "done" for row in rows)
    dumps = sorted(swept.glob("*.h5"))
    attrs = [_provenance(path) for path in dumps]
    processes = {a["provenance"]["engine_process"]["pid"] for a in attrs}
    assert len(processes) == 1  # one engine process for the configuration
    assert sorted(a["provenance"]["engine_process"]["position"] for a in attrs) == list(range(6))
    assert len({a["input_sha256"] for a in attrs}) == 6 and all(a["input_fed_check"] == "equal" for a in attrs)
    assert all(a["complete"] for a in attrs)
    # the same inputs, one process each (the single-run path): the same tensors, bit for bit
    for spec in _specs():
        alone = collect_run(LocalDevice(), spec, tmp_path / "alone")
        assert alone.status == "done", alone.message
        together = swept / alone.paths[0].name
        a, b = _tensors(alone.paths[0]), _tensors(together)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        assert _provenance(together)["input_sha256"] == _provenance(alone.paths[0])["input_sha256"]


def test_a_large_data_set_closes_with_its_done_runs_counted_not_listed(tmp_path):
    """Past 30 runs the closing table names the runs that did not end done and counts the rest in one row:
    every run is already named by its own line as it ends, and in index.csv."""
    import shutil

    from layerdiff.collector.sweep.progress import SUMMARY_ROWS

    photos = tmp_path / "photos"
    photos.mkdir()
    sources = sorted(IMAGES_DIR.glob("*.png"))
    count = SUMMARY_ROWS + 1
    for k in range(count):
        shutil.copyfile(sources[k % len(sources)], photos / f"shot{k:02d}.png")
    done = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--model", str(MODEL), "--input",
                           str(photos), "--preprocess", RECIPE, "-o", str(tmp_path / "runs"), "--no-report"],
                          capture_output=True, text=True, timeout=600, check=False, env={**os.environ, "COLUMNS": "160"})
    assert done.returncode == 0, done.stderr
    rows = read_index(tmp_path / "runs").values()
    assert len(rows) == count and all(row.status == "done" for row in rows)
    lines, table = done.stderr.split("collected into")
    assert f"{count} runs" in table and "each named above and in index.csv" in table, table
    assert "shot" not in table  # no row per run in the table ...
    assert all(f"shot{k:02d}" in lines for k in range(count))  # ... each has its own line


def test_an_input_that_ends_while_the_index_is_being_written_does_not_wait_for_it(tmp_path):
    """Replacing index.csv can wait on the disk for much of a second: a finished input's row is written in the
    background (the conversion of the next input goes on), and the sweep's closing save has every row."""
    import threading

    from layerdiff.collector.sweep.index import WRITE_EVERY_S, Index, IndexRow

    rows = [IndexRow("local", "ncnn", "cpu", "high", f"photo{k}") for k in range(3)]
    index = Index(tmp_path, rows)
    time.sleep(WRITE_EVERY_S)  # the next update_soon is due to write
    with index._file_lock:  # a write of the file under way, as long as this block lasts
        ended = threading.Event()
        caller = threading.Thread(target=lambda: (index.update_soon(rows[0], status="done"), ended.set()))
        caller.start()
        assert ended.wait(5), "update_soon waited for the write under way"
        index.update_soon(rows[1], status="failed", reason="a reason")
    index.save()
    assert [r.status for r in read_index(tmp_path).values()] == ["done", "failed", "planned"]
    assert index.write_error is None


def test_an_engine_process_that_crashes_on_one_input_keeps_the_others(tmp_path):
    """The harness's `--abort-after K` (under `--each`: the K-th tensor the process dumps) aborts the
    engine inside the fourth input's run: the three before it are complete files from that process, the
    fourth fails naming its input (what it dumped kept, incomplete), and a new process runs the last two."""
    specs = _specs()
    per_input = len(_tensors(collect_run(LocalDevice(), specs[0], tmp_path / "one").paths[0]))
    crashing = [RunSpec(s.model, s.backend, s.precision, s.inputs, extra_args=["--abort-after", str(3 * per_input + 2)])
                for s in specs]
    outcomes, started = [], []
    collect_each(LocalDevice(), crashing, tmp_path / "runs", Listener(lambda s: started.append(s.inputs.label),
                                                                        outcomes.append))
    labels = [s.inputs.label for s in specs]
    assert [o.spec.inputs.label for o in outcomes] == labels and started == labels
    failed = outcomes[3]
    assert failed.status == "failed" and f"ended on input {labels[3]}" in failed.message
    assert "killed by signal 6" in failed.message and "\n" not in failed.message
    with DumpFile(failed.paths[0]) as dump:  # the two tensors it dumped before the crash are kept
        assert not dump.attrs["complete"] and len(dump.layers) == 2
    others = outcomes[:3] + outcomes[4:]
    assert all(o.status == "done" for o in others)
    pids = [_provenance(o.paths[0])["provenance"]["engine_process"]["pid"] for o in others]
    assert len(set(pids[:3])) == 1 and len(set(pids[3:])) == 1 and pids[0] != pids[3]  # restarted for the rest
    for o in others:
        with DumpFile(o.paths[0]) as dump:
            assert dump.attrs["complete"] and dump.attrs["input_label"] == o.spec.inputs.label
            assert len(dump.layers) == per_input


def test_harness_each_fails_one_case_and_runs_the_next(tmp_path):
    """The host harness's `--each`: an unreadable input fails its case (exit code 2 and the line), the
    cases around it are complete dumps."""
    good = tmp_path / "x.npy"
    np.save(good, np.ones((1, 3, 32, 32), "<f4"))
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not an npy")
    cases = [{"out": str(tmp_path / f"d{k}"), "inputs": {"data": str(f)}} for k, f in enumerate((good, bad, good))]
    listing = tmp_path / "cases.jsonl"
    listing.write_text("\n".join(json.dumps(c) for c in cases) + "\n")
    done = subprocess.run([sys.executable, "-m", "layerdiff.collector.engines.ncnn.engine", "--model", str(MODEL),
                           "--model", str(MODEL.with_suffix(".bin")), "--out", str(tmp_path / "o"), "--each",
                           str(listing)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line[5:]) for line in done.stdout.splitlines()
              if line.startswith("@@ld ") and '"case"' in line]
    ends = [(e["case"], e["state"], e.get("code")) for e in events if e["state"] != "start"]
    assert ends == [(0, "done", None), (1, "failed", 2), (2, "done", None)]
    assert "not a readable .npy" in [e for e in events if e["state"] == "failed"][0]["message"]
    for k in (0, 2):
        footer = json.loads((tmp_path / f"d{k}" / "manifest.jsonl").read_text().splitlines()[-1])
        assert footer.get("status") == "ok"


def test_ctrl_c_in_a_data_set_leaves_done_planned_and_one_interrupted_then_resumes(tmp_path):
    """Ctrl-C while one engine process works through 120 photos: the index says done for exactly the files
    written, one input interrupted, the rest planned; nothing half-written; the next collect runs the rest."""
    from PIL import Image

    from layerdiff.samples.images import scene

    photos = tmp_path / "photos"
    photos.mkdir()
    for k in range(120):
        Image.fromarray(scene(500 + k, (255, 3, 1)[k % 3])).save(photos / f"p{k:03d}.png")
    out = tmp_path / "runs"
    argv = [sys.executable, "-m", "layerdiff.collector.cli", "--model", str(MODEL), "--input", str(photos),
            "--preprocess", RECIPE, "-o", str(out), "--no-report"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(out.glob("*.h5"))) < 5 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    rows = list(read_index(out).values())
    statuses = [row.status for row in rows]
    if proc.returncode == 0:  # finished before the signal: nothing to check but the index
        assert statuses.count("done") == 120
        return
    assert proc.returncode == 130
    done = {name for row in rows if row.status == "done" for name in row.files}
    written = {path.name for path in out.glob("*.h5")}
    stopped = {f"ncnn_cpu_high_{row.input}.h5" for row in rows if row.status == "interrupted"}
    assert done <= written and len(done) >= 5
    assert written - done <= stopped  # the input in flight may have finished its file as the signal came
    assert statuses.count("interrupted") <= 1 and "running" not in statuses and "failed" not in statuses
    assert not [p for p in out.iterdir() if ".partial" in p.name or p.name.startswith(".layerdiff-fetch")]
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr
    rows = list(read_index(out).values())
    assert [row.status for row in rows].count("done") == 120
    assert sum(row.reason == "already collected" for row in rows) == len(written)


@pytest.mark.parametrize("suffix", [".mnn", ".onnx"])
def test_mnn_and_onnxruntime_give_each_input_what_one_process_per_input_gives(suffix, tmp_path):
    """MNN keeps its session for the process and ONNX Runtime its model: every input's tensors are the ones
    a process of its own computes, bit for bit, and its fed-input check holds."""
    specs = _specs(MODEL.with_suffix(suffix))
    outcomes = []
    collect_each(LocalDevice(), specs, tmp_path / "each", Listener(lambda s: None, outcomes.append))
    assert [o.status for o in outcomes] == ["done"] * len(specs), [o.message for o in outcomes]
    pids = {_provenance(o.paths[0])["provenance"]["engine_process"]["pid"] for o in outcomes}
    assert len(pids) == 1
    for spec, together in zip(specs, outcomes):
        alone = collect_run(LocalDevice(), spec, tmp_path / "alone")
        a, b = _tensors(alone.paths[0]), _tensors(together.paths[0])
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), spec.inputs.label
        assert _provenance(together.paths[0])["input_fed_check"] == "equal"


def test_a_run_that_finishes_while_the_sweep_stops_stays_done(tmp_path):
    """The Ctrl-C comes while an input's file is being finished: the worker records it done as the sweep
    stops, and the stop must not overwrite that with `interrupted` (its file is whole)."""
    import threading
    from types import SimpleNamespace

    from layerdiff.collector.sweep import execute
    from layerdiff.collector.sweep.index import Index, IndexRow, RunStatus

    finishing = IndexRow("local", "ncnn", "cpu", "high", "p001", status=RunStatus.RUNNING)
    stopped = IndexRow("local", "ncnn", "cpu", "high", "p002", status=RunStatus.RUNNING)
    index = Index(tmp_path, [finishing, stopped])

    def worker(row: IndexRow, finishes: bool):
        run = SimpleNamespace(row=row, out_dir=tmp_path, spec=SimpleNamespace(output_names=lambda: []))
        done = threading.Event()
        if finishes:  # records its outcome only once the stop has begun, as a worker converting the last tensors
            threading.Timer(0.2, lambda: (index.update(row, status=RunStatus.DONE, files=["f.h5"]), done.set())).start()
        else:
            done.set()
        return SimpleNamespace(current=run, done=done, finished=lambda: True)

    execute._interrupt([worker(finishing, True), worker(stopped, False)], index, threading.Event())
    assert (finishing.status, stopped.status) == (RunStatus.DONE, RunStatus.INTERRUPTED)
    assert {row.input: row.status for row in read_index(tmp_path).values()} == {"p001": "done", "p002": "interrupted"}
