"""The C++ harness's MNN engine, built against the MNN named by $MNN_ROOT (include/ + lib/).

MNN's C++ libraries are not on PyPI, so these tests run only where a developer (or a CI step
with an MNN build) sets MNN_ROOT; the reference is the pymnn engine of the `local` device.
They hold for both layouts of an MNN build: separate backend libraries (MNN_SEP_BUILD=ON:
libMNN_CL.so, libMNN_Vulkan.so, libMNN_Express.so beside libMNN.so) and one monolithic libMNN.so.
Whether OpenCL and Vulkan are usable depends on the machine (a GPU-type OpenCL device, a Vulkan
device such as lavapipe): each GPU test asks the harness's `--probe` and checks the run against
it, a real GPU run when the probe says ok, the recorded CPU fallback when it does not.
Op isolation (`--inject`) is checked against a pymnn reference HDF5, staged the way
`collect isolate` stages it (layerdiff.collector.run.isolate).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.formats.rawdump import RawDumpWriter, read_raw_dump
from layerdiff.collector.engines.mnn.harness import mnn_spec
from layerdiff.collector.harness.build import build_command, ensure_built
from layerdiff.collector.run.isolate import target_inputs, write_inject_dump
from tests.test_harness_support import INPUTS, MODELS, REPO, arrays_by_key, check_well_formed, max_scaled_diff, run_harness

MNN_ROOT = os.environ.get("MNN_ROOT", "")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.path.isfile(os.path.join(MNN_ROOT, "include", "MNN", "Interpreter.hpp")),
    reason=("C++ MNN engine: MNN's C++ library is not on PyPI. Build MNN 3.6.1 (git tag 3.6.1) outside the repo: "
            "cmake -G Ninja -DCMAKE_BUILD_TYPE=Release -DMNN_VULKAN=ON -DMNN_OPENCL=ON -DMNN_SEP_BUILD=ON "
            "-DMNN_BUILD_CONVERTER=OFF -DMNN_BUILD_TEST=OFF -DMNN_BUILD_TOOLS=OFF && ninja; put include/MNN and "
            "libMNN*.so in DIR/{include,lib}; then run: MNN_ROOT=DIR python -m pytest tests/test_harness_mnn.py "
            "(device_scripts/README.md, section MNN)"),
)]


GPU_LIBRARIES = {"opencl": "libMNN_CL.so", "vulkan": "libMNN_Vulkan.so"}


@pytest.fixture(scope="module")
def harness() -> list[str]:
    return [str(ensure_built(mnn_spec("host", MNN_ROOT)))]


@pytest.fixture(scope="module")
def probe(harness) -> dict:
    """The MNN engine's `--probe` backends on the host."""
    result = subprocess.run([*harness, "--probe"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["engines"]["mnn"]["backends"]


def separate_library(name: str) -> bool:
    """MNN_SEP_BUILD layout: the backend (or Express) is its own library beside libMNN.so."""
    return (Path(MNN_ROOT) / "lib" / name).is_file()


def mnn_args(stem: str, backend: str, precision: str) -> list[str]:
    return ["--engine", "mnn", "--model", str(MODELS / f"{stem}.mnn"), "--input", f"data={INPUTS / f'{stem}.npy'}",
            "--backend", backend, "--precision", precision]


def pymnn_dump(stem: str, backend: str, precision: str, out, *extra: str):
    cmd = [sys.executable, "-m", "layerdiff.collector.engines.mnn.engine", *mnn_args(stem, backend, precision), *extra,
           "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    return read_raw_dump(out)


def test_version_and_probe(harness, probe):
    version = subprocess.run([*harness, "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and "(mnn " in version.stdout
    assert probe["cpu"]["ok"] is True
    assert set(probe) == {"cpu", "opencl", "vulkan"}
    for backend, library in GPU_LIBRARIES.items():  # where the backend's code came from, per layout
        entry = probe[backend]
        if entry["ok"]:
            assert entry["backend_library"] == (library if separate_library(library) else "libMNN.so (built in)")
        else:
            assert entry["reason"] and "\n" not in entry["reason"]
    binary_dir = os.path.dirname(harness[0])  # MNN's libraries travel with the binary to the phone
    assert os.path.isfile(os.path.join(binary_dir, "libMNN.so"))


@pytest.mark.parametrize("stem", ["convnet", "overflow"])
def test_cpu_high_agrees_with_pymnn(harness, tmp_path, stem):
    run = run_harness(harness, mnn_args(stem, "cpu", "high"), tmp_path / "cxx")
    assert run.returncode == 0, run.stderr
    ours = check_well_formed(run)
    reference = pymnn_dump(stem, "cpu", "high", tmp_path / "py")
    assert [(t.op, t.op_type, t.output_index, t.shape) for t in ours.tensors] == \
        [(t.op, t.op_type, t.output_index, t.shape) for t in reference.tensors]
    assert [t.name for t in ours.tensors] == [t.name for t in reference.tensors]
    assert max_scaled_diff(arrays_by_key(ours), arrays_by_key(reference)) <= 1e-4
    assert ours.header["backends_actual"] == ["cpu"] and ours.header["precision_effective"] == "fp32"
    assert ours.header["threads"] == 1 and ours.header["options"]["num_thread"] == 1
    assert [t.inputs for t in ours.tensors] == [t.inputs for t in reference.tensors]  # same graph edges
    assert ours.tensors[0].op_type == "Raster" and ours.tensors[0].inputs == ["data"]  # layout conversion first


def test_graph_corrects_edges_that_addresses_miss(harness, tmp_path):
    """underflow's `dec/up` (Interp) and op `image` (a Convolution writing `image__before_tr`, which a
    layout conversion turns into the model output `image`) read buffers no dumped op is recorded at;
    the model's graph names their producers, and both engines key each op by the tensor it writes
    (read from the .mnn file) and dump the model output under its own name, exactly alike."""
    run = run_harness(harness, mnn_args("underflow", "cpu", "high"), tmp_path / "cxx")
    assert run.returncode == 0, run.stderr
    ours = check_well_formed(run)
    reference = pymnn_dump("underflow", "cpu", "high", tmp_path / "py")
    assert [(t.op, t.op_type, t.output_index, t.name) for t in ours.tensors] == \
        [(t.op, t.op_type, t.output_index, t.name) for t in reference.tensors]
    assert [t.inputs for t in ours.tensors] == [t.inputs for t in reference.tensors]
    inputs = {t.name: t.inputs for t in ours.tensors}
    assert inputs["dec/up"] == ["dec/conv"] and inputs["image__before_tr"] == ["dec/up"]
    assert inputs["image"] == ["image__before_tr_raster_0"] and ours.tensors[-1].op_type == "Output"
    assert inputs["gate/scale"] == ["enc/pool", "gate/conv"]  # both inputs, in the op's order
    assert not [n for t in ours.tensors for n in t.inputs if n.startswith("<")]


def test_cpu_threads_are_what_mnn_reports(harness, tmp_path):
    run = run_harness(harness, [*mnn_args("convnet", "cpu", "high"), "--threads", "2"], tmp_path / "d")
    assert run.returncode == 0, run.stderr
    header = check_well_formed(run).header
    assert header["threads"] == 2 and header["options"]["num_thread"] == 2


@pytest.mark.parametrize("backend", ["opencl", "vulkan"])
def test_gpu_request_runs_where_the_probe_says(harness, probe, tmp_path, backend):
    """A GPU run happens exactly where --probe says ok; elsewhere MNN's CPU fallback is recorded,
    with the reason, and runs the threads asked for (1), bit for bit the cpu run."""
    run = run_harness(harness, mnn_args("convnet", backend, "low"), tmp_path / "d")
    assert run.returncode == 0, run.stderr
    header = check_well_formed(run).header
    options = header["options"]
    assert header["backend_requested"] == backend
    if probe[backend]["ok"]:
        assert header["backends_actual"][0] == backend and "fallback" not in options
        assert options["backend_library"] == probe[backend]["backend_library"] and options["backend_library_loaded"] is True
        assert {t.memory for t in run.dump().tensors} >= {"device"}
        return
    assert header["backends_actual"] == ["cpu"] and options["fallback"] == f"cpu: {probe[backend]['reason']}"
    assert header["threads"] == 1 and options["num_thread"] == 1
    cpu = run_harness(harness, mnn_args("convnet", "cpu", "low"), tmp_path / "cpu")
    assert cpu.returncode == 0, cpu.stderr
    assert header["precision_effective"] == cpu.dump().header["precision_effective"]
    ours, reference = arrays_by_key(run.dump()), arrays_by_key(cpu.dump())
    assert ours.keys() == reference.keys() and all(np.array_equal(ours[k], reference[k]) for k in ours)


def test_vulkan_precision_is_what_mnn_stores(harness, probe, tmp_path):
    """MNN's Vulkan backend keeps fp16 images unless precision is high, so normal is low bit for
    bit and both say fp16-storage; high is fp32 and agrees with the CPU. Without a Vulkan device the
    three fall back to the CPU and say what the CPU did."""
    runs = {}
    for precision in ("low", "normal", "high"):
        run = run_harness(harness, mnn_args("convnet", "vulkan", precision), tmp_path / precision)
        assert run.returncode == 0, run.stderr
        runs[precision] = check_well_formed(run)
    cpu = run_harness(harness, mnn_args("convnet", "cpu", "high"), tmp_path / "cpu")
    assert cpu.returncode == 0, cpu.stderr
    cpu_high = arrays_by_key(cpu.dump())
    arrays = {p: arrays_by_key(d) for p, d in runs.items()}
    effective = [runs[p].header["precision_effective"] for p in ("low", "normal", "high")]
    if not probe["vulkan"]["ok"]:
        assert all(d.header["backends_actual"] == ["cpu"] for d in runs.values()) and effective[2] == "fp32"
        return
    assert effective == ["fp16-storage", "fp16-storage", "fp32"]
    assert all(np.array_equal(arrays["low"][k], arrays["normal"][k]) for k in arrays["low"])
    assert max_scaled_diff(arrays["high"], cpu_high) <= 1e-5
    assert max_scaled_diff(arrays["low"], cpu_high) > 1e-4  # fp16-sized errors


def test_abort_after_leaves_partial_dump(harness, tmp_path):
    run = run_harness(harness, [*mnn_args("convnet", "cpu", "high"), "--abort-after", "3"], tmp_path / "d")
    assert run.returncode == -signal.SIGABRT
    dump = read_raw_dump(tmp_path / "d")
    assert dump.footer is None and len(dump.tensors) == 3


REPLACED = "block3/clip"


def test_replace_overwrites_an_output_as_the_host_engine_does(harness, tmp_path):
    """--inject DIR --replace KEY (the what-if of `collect fix` on MNN): the op's output becomes the
    injected tensor right after it runs, every later op computes from it, exactly as on pymnn."""
    plain = arrays_by_key(pymnn_dump("convnet", "cpu", "high", tmp_path / "plain"))
    value = np.full_like(plain[f"{REPLACED}:0"], 0.5, dtype=np.float32)  # a value the op never computes
    writer = RawDumpWriter(tmp_path / "inject", {"engine": "mnn", "harness": "test"})
    writer.add(op=REPLACED, op_type="ReLU6", array=value, name=REPLACED)
    writer.close(infer_ms=0.0)
    what_if = ["--inject", str(tmp_path / "inject"), "--replace", f"{REPLACED}:0"]
    run = run_harness(harness, [*mnn_args("convnet", "cpu", "high"), *what_if], tmp_path / "cxx")
    assert run.returncode == 0, run.stderr
    ours = check_well_formed(run)
    assert ours.header["mode"] == "replace" and ours.header["replaced"] == [f"{REPLACED}:0"]
    arrays = arrays_by_key(ours)
    np.testing.assert_array_equal(arrays[f"{REPLACED}:0"], value)
    assert not np.allclose(arrays["prob:0"], plain["prob:0"], atol=1e-4)  # the outputs follow the replaced value
    reference = arrays_by_key(pymnn_dump("convnet", "cpu", "high", tmp_path / "py", *what_if))
    assert arrays.keys() == reference.keys() and max_scaled_diff(arrays, reference) <= 1e-4
    for key, says in [("nosuch:0", "the inject dump has no tensor nosuch"), (f"{REPLACED}:1", f"no tensor {REPLACED}:1")]:
        bad = run_harness(harness, [*mnn_args("convnet", "cpu", "high"), "--inject", str(tmp_path / "inject"),
                                    "--replace", key], tmp_path / f"bad{len(key)}")
        assert bad.returncode == 2 and says in bad.stderr.strip().splitlines()[-1], bad.stderr


# ---------------------------------------------------------------- op isolation (--inject/--target)

ISOLATED = ["block4/add:0", "block3/clip:0"]
RASTER_FED = "block2/hswish:0"  # its Concat became a Raster at run time: no reference value for its input


@pytest.fixture(scope="module")
def convnet_inject(local_runs, tmp_path_factory) -> tuple[Path, Path]:
    """(pymnn cpu/high reference HDF5, inject dump with what ISOLATED and RASTER_FED consume)."""
    ref = local_runs("convnet.mnn", "cpu", "high")
    with DumpFile(ref) as dump:
        inject = write_inject_dump(dump, target_inputs(dump, [*ISOLATED, RASTER_FED]), tmp_path_factory.mktemp("mnn-iso") / "inject")
    return ref, inject


def isolate_args(stem: str, inject: Path, backend: str, precision: str, *targets: str) -> list[str]:
    args = ["--engine", "mnn", "--model", str(MODELS / f"{stem}.mnn"), "--backend", backend, "--precision", precision,
            "--inject", str(inject)]
    return args + [a for target in targets for a in ("--target", target)]


def test_isolated_ops_at_cpu_high_reproduce_the_reference(harness, convnet_inject, tmp_path):
    ref_path, inject = convnet_inject
    run = run_harness(harness, isolate_args("convnet", inject, "cpu", "high", *ISOLATED), tmp_path / "iso")
    assert run.returncode == 0, run.stderr
    dump = check_well_formed(run)
    assert dump.header["mode"] == "isolate" and dump.header["targets"] == ISOLATED
    assert dump.header["backends_actual"] == ["cpu"] and dump.header["inject"] == "inject"
    assert [(t.op, t.output_index) for t in dump.tensors] == [("block4/add", 0), ("block3/clip", 0)]
    assert [t.inputs for t in dump.tensors] == [["block3/clip", "block4/tanh"], ["block3/mul"]]
    assert [p["n"] for p in run.progress()] == [2, 2]
    with DumpFile(ref_path) as ref:
        for tensor, array in dump.iter_arrays():
            expected = ref.tensor_by_key(f"{tensor.op}:{tensor.output_index}")
            assert array.shape == expected.shape
            assert np.max(np.abs(array - expected)) <= 1e-5 * max(1.0, float(np.max(np.abs(expected))))


@pytest.mark.parametrize(("target", "says"), [
    ("nosuch/op:0", "no graph tensor of op 'nosuch/op'"),
    (RASTER_FED, "the reference has no value for its input tensor 'block2/concat'"),
    ("data:0", "is a model input or constant, not an op"),
    ("block4/add:1", "has 1 output(s)"),
])
def test_targets_that_cannot_be_isolated_are_refused_in_one_line(harness, convnet_inject, tmp_path, target, says):
    run = run_harness(harness, isolate_args("convnet", convnet_inject[1], "cpu", "high", target), tmp_path / "iso")
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"layerdiff-harness: --target {target}: ") and says in line


def test_constant_inputs_stay_inside_the_cut_graph(harness, local_runs, tmp_path):
    """underflow's dec/up (Interp) reads a Const `dec/up/scales`; no dump holds constants, so only the
    activation is fed (graph tensor `dec/conv/relu`, found in the reference as op `dec/conv`)."""
    ref_path = local_runs("underflow.mnn", "cpu", "high")
    with DumpFile(ref_path) as ref:
        inject = write_inject_dump(ref, {"dec/up:0": ["dec/conv"]}, tmp_path / "inject")
        run = run_harness(harness, isolate_args("underflow", inject, "cpu", "high", "dec/up:0"), tmp_path / "iso")
        assert run.returncode == 0, run.stderr
        (tensor, array), = list(run.dump().iter_arrays())
        assert tensor.inputs == ["dec/conv/relu"]
        np.testing.assert_allclose(array, ref.tensor_by_key("dec/up:0"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["opencl", "vulkan"])
def test_isolation_on_a_gpu_request_records_what_ran(harness, probe, convnet_inject, tmp_path, backend):
    run = run_harness(harness, isolate_args("convnet", convnet_inject[1], backend, "high", ISOLATED[0]), tmp_path / "iso")
    assert run.returncode == 0, run.stderr
    dump = check_well_formed(run)
    header = dump.header
    actual = backend if probe[backend]["ok"] else "cpu"
    assert header["backend_requested"] == backend and header["backends_actual"] == [actual]
    assert header["precision_effective"] == "fp32" and header["threads"] == 1
    assert [t.memory for t in dump.tensors] == ["host" if actual == "cpu" else "device"]
    assert ("fallback" in header["options"]) is (actual == "cpu")
    with DumpFile(convnet_inject[0]) as ref:
        (tensor, array), = list(dump.iter_arrays())
        np.testing.assert_allclose(array, ref.tensor_by_key(ISOLATED[0]), rtol=1e-4, atol=1e-4)


def mnn_root_copy(root: Path, *, express_headers: bool) -> Path:
    """An MNN_ROOT with only libMNN.so of $MNN_ROOT, and its headers with or without include/MNN/expr."""
    (root / "lib").mkdir(parents=True)
    shutil.copy2(Path(MNN_ROOT) / "lib" / "libMNN.so", root / "lib" / "libMNN.so")
    shutil.copytree(Path(MNN_ROOT) / "include", root / "include",
                    ignore=None if express_headers else shutil.ignore_patterns("expr"))
    return root


def build_harness(mnn_root: Path, out: Path) -> list[str]:
    build = subprocess.run(build_command(mnn_spec("host", str(mnn_root)), out),
                           capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout + build.stderr
    return [str(out / "layerdiff-harness")]


def test_mnn_without_express_runs_models_but_refuses_isolation(convnet_inject, tmp_path):
    """An MNN_ROOT without Express (here: no include/MNN/expr headers, as in core-only packages):
    the build still succeeds, whole-model runs work, --inject exits 4 naming what is missing."""
    binary = build_harness(mnn_root_copy(tmp_path / "mnn", express_headers=False), tmp_path / "bin")
    assert run_harness(binary, mnn_args("convnet", "cpu", "high"), tmp_path / "whole").returncode == 0
    addresses_only = run_harness(binary, mnn_args("underflow", "cpu", "high"), tmp_path / "edges")
    assert addresses_only.returncode == 0, addresses_only.stderr  # no graph to correct edges with: as recorded
    assert {t.name: t.inputs for t in addresses_only.dump().tensors}["dec/up"] == ["<dec/up input 0>"]
    run = run_harness(binary, isolate_args("convnet", convnet_inject[1], "cpu", "high", ISOLATED[0]), tmp_path / "iso")
    assert run.returncode == 4
    assert run.stderr.strip().splitlines()[-1].startswith("layerdiff-harness: ") and "without Express" in run.stderr


def test_lone_libmnn_isolates_when_express_is_inside(convnet_inject, tmp_path):
    """libMNN.so alone: a monolithic build has Express inside (CMake's link probe finds it) and
    isolates; a MNN_SEP_BUILD libMNN.so needs libMNN_Express.so beside it and exits 4 on --inject."""
    binary = build_harness(mnn_root_copy(tmp_path / "mnn", express_headers=True), tmp_path / "bin")
    run = run_harness(binary, isolate_args("convnet", convnet_inject[1], "cpu", "high", ISOLATED[0]), tmp_path / "iso")
    if separate_library("libMNN_Express.so"):
        assert run.returncode == 4 and "without Express" in run.stderr
    else:
        assert run.returncode == 0, run.stderr
        assert [t.op for t in run.dump().tensors] == ["block4/add"]


def test_each_keeps_the_session_and_gives_every_input_its_own_run(harness, tmp_path):
    """`--each`: one MNN session for the process, resized for a smaller input in between (run or refused, the
    process goes on) and back; every other input's dump equal, bit for bit, to that input run by a process of
    its own. Paths in the cases file are relative to its directory."""
    base = np.load(INPUTS / "convnet.npy").astype("<f4")
    files = []
    for k, array in enumerate([base, base * 1.5 - 0.2, base[:, :, :16, :16].copy(), base * 0.25]):
        files.append(tmp_path / f"in{k}.npy")
        np.save(files[-1], array)
    listing = tmp_path / "cases.jsonl"
    listing.write_text("".join(json.dumps({"out": f"each{k}", "inputs": {"data": f.name}}) + "\n"
                               for k, f in enumerate(files)))
    common = ["--engine", "mnn", "--model", str(MODELS / "convnet.mnn"), "--backend", "cpu", "--precision", "high"]
    done = subprocess.run([*harness, *common, "--each", str(listing)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ends = [json.loads(line[5:]) for line in done.stdout.splitlines() if line.startswith("@@ld ") and '"case"' in line]
    ends = [(e["case"], e["state"]) for e in ends if e["state"] != "start"]
    assert ends[:2] == [(0, "done"), (1, "done")] and ends[3] == (3, "done")
    for k in (0, 1, 3):
        alone = run_harness(harness, [*common, "--input", f"data={files[k]}"], tmp_path / f"alone{k}")
        assert alone.returncode == 0, alone.stderr
        ours, theirs = read_raw_dump(tmp_path / f"each{k}"), read_raw_dump(tmp_path / f"alone{k}")
        assert ours.footer["status"] == "ok"
        a, b = arrays_by_key(ours), arrays_by_key(theirs)
        assert a.keys() == b.keys() and all(np.array_equal(a[key], b[key]) for key in a)
        assert ours.header["backends_actual"] == theirs.header["backends_actual"]
        assert ours.header["inputs"][0]["sha256"] == theirs.header["inputs"][0]["sha256"]
