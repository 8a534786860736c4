"""Many inputs as one unit (the `dataset` finding, results.json's `datasets`, `Results.inputs`) and the
first op to vary across repeats (the `varying_op` finding, `repeat_ops`).

The data set is the sample's per-input zero collapse (samples/README.md, "4. All-zero output for some
inputs only"), collected for real on the local device: ncnn on the CPU (fp32) against ncnn on Vulkan at
low precision (Mesa lavapipe, fp16), on one image at three brightnesses. Every expectation is first
worked out from the dumps' tensors with numpy. Run-to-run variation comes from a real engine whose op
really varies (ONNX Runtime's RandomUniformLike without a seed, in fresh processes), from repeats that
are really bit-identical (ncnn and ONNX Runtime), and from HDF5 dumps written with the project's own
writer where one reduction's summation order differs between repeats.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import layerdiff
from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.inputs.inputset import resolve_inputs
from layerdiff.collector.inputs.modelfiles import input_shapes, resolve_model
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from layerdiff.collector.transport.devices import LocalDevice
from tests.analyze_dumps import LAYERS, reference_arrays, write_dump

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "samples" / "models"
INPUTS = REPO / "samples" / "inputs"
BRIGHTNESSES = ["underflow", "underflow_dim", "underflow_dark"]
FAIL_REL_L2 = 0.1  # the default fail threshold (findings/verdict.py)
COLLAPSE_SHARE = 0.1  # a zero collapse worth naming: over 10% of the reference's non-zero values at 0


def collect_local(out: Path, model: str, configs: list[tuple[str, str]], inputs: list[str], **spec) -> Path:
    files = resolve_model(MODELS / model)
    sets, errors = resolve_inputs([str(INPUTS / name) for name in inputs], input_shapes(files))
    assert not errors, errors
    for backend, precision in configs:
        for inputs_set in sets:
            outcome = collect_run(LocalDevice(), RunSpec(files, backend, precision, inputs_set, **spec), out)
            assert outcome.status == "done", outcome.message
    return out


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def rel_l2(reference: np.ndarray, other: np.ndarray) -> float:
    reference, other = reference.astype(np.float64), other.astype(np.float64)
    return float(np.linalg.norm(other - reference) / np.linalg.norm(reference))


def zero_share(reference: np.ndarray, other: np.ndarray) -> float:
    significant = reference != 0
    return float(((other == 0) & significant).sum() / max(int(significant.sum()), 1))


# ---------------------------------------------------------------- the sample data set: one image, three brightnesses
@pytest.fixture(scope="module")
def underflow_runs(tmp_path_factory) -> Path:
    return collect_local(tmp_path_factory.mktemp("underflow"), "underflow.param", [("cpu", "high"), ("vulkan", "low")],
                         [f"{name}.npy" for name in BRIGHTNESSES])


@pytest.fixture(scope="module")
def own_judgement(underflow_runs) -> dict:
    """Per input, per layer: rel L2 and zero share of vulkan/low against cpu/high, from the tensors."""
    out = {}
    for name in BRIGHTNESSES:
        with DumpFile(underflow_runs / f"ncnn_cpu_high_{name}.h5") as ref, \
                DumpFile(underflow_runs / f"ncnn_vulkan_low_{name}.h5") as run:
            keys = ref.layers["key"].tolist()
            out[name] = {key: (rel_l2(ref.tensor_by_key(key), run.tensor_by_key(key)),
                               zero_share(ref.tensor_by_key(key), run.tensor_by_key(key))) for key in keys}
    return out


@pytest.fixture(scope="module")
def underflow_results(underflow_runs):
    with layerdiff.analyze(underflow_runs) as results:
        yield results


def test_zero_collapse_on_some_inputs_reads_as_k_of_n_in_one_finding(underflow_results, own_judgement):
    collapsing = sorted(name for name, layers in own_judgement.items()
                        if any(share > COLLAPSE_SHARE for _, share in layers.values()))
    order = list(own_judgement["underflow"])
    first_zero = min((min(order.index(k) for k, (_, s) in own_judgement[n].items() if s > COLLAPSE_SHARE), n)
                     for n in collapsing)
    first_layer = order[first_zero[0]]
    assert collapsing == ["underflow_dark", "underflow_dim"] and first_layer == "gate/square:0"  # what numpy sees

    [finding] = underflow_results.findings.query("kind == 'dataset'").to_dict("records")
    assert finding["run"] == "vulkan/low"
    assert (f"zero collapse on 2 of 3 inputs ({', '.join(collapsing)}), first at layer {first_layer}"
            in finding["sentence"])
    assert finding["numbers"]["zero_collapse_inputs"] == collapsing
    [config] = underflow_results.datasets.to_dict("records")
    assert config["inputs"] == 3 and config["n_zero_collapse"] == 2
    assert config["n_pass"] + config["n_warn"] + config["n_fail"] == 3


def test_worst_input_and_layers_failing_on_most_inputs_match_numpy(underflow_results, own_judgement):
    output = "image:0"
    worst = max(BRIGHTNESSES, key=lambda n: own_judgement[n][output][0])
    failing = {key: sorted(n for n in BRIGHTNESSES if own_judgement[n][key][0] > FAIL_REL_L2)
               for key in own_judgement["underflow"]}
    failing = {key: names for key, names in failing.items() if names}
    assert worst == "underflow_dark" and failing["dec/conv:0"] == ["underflow_dark", "underflow_dim"]

    [config] = underflow_results.datasets.to_dict("records")
    assert config["worst_input"] == worst
    assert config["worst_output_rel_l2"] == pytest.approx(own_judgement[worst][output][0], rel=1e-6)
    layers = underflow_results.dataset_layers.set_index("layer")
    for key, names in failing.items():  # every layer numpy sees beyond 10% fails on exactly those inputs
        assert sorted(layers.loc[key, "failing_inputs"].split(", ")) == names, key
    assert set(layers.index[layers["n_fail"] > 0]) == set(failing)
    assert config["most_failing_inputs"] == max(len(v) for v in failing.values())


def test_notebook_inputs_table_has_one_row_per_input_with_its_own_numbers(underflow_results, own_judgement):
    inputs = underflow_results.inputs.set_index("input")
    assert sorted(inputs.index) == sorted(BRIGHTNESSES)
    assert (inputs["configuration"] == "vulkan/low").all()
    for name in BRIGHTNESSES:
        assert inputs.loc[name, "output_rel_l2"] == pytest.approx(own_judgement[name]["image:0"][0], rel=1e-6)
        numpy_fails = sum(rel > FAIL_REL_L2 for rel, _ in own_judgement[name].values())
        assert inputs.loc[name, "n_fail"] >= numpy_fails
    assert inputs.loc["underflow_dark", "zero_collapse_start"] == "gate/square:0"
    assert inputs.loc["underflow", "zero_collapse_start"] == ""
    assert inputs.loc["underflow_dark", "output_zero_collapse"] == pytest.approx(
        own_judgement["underflow_dark"]["image:0"][1], abs=1e-6)


def test_report_page_and_results_json_carry_the_data_set(underflow_results, tmp_path):
    page = underflow_results.write_report(tmp_path / "report")
    doc = json.loads((tmp_path / "report" / "results.json").read_text())
    assert [c["configuration"] for c in doc["datasets"]["configs"]] == ["vulkan/low"]
    assert sorted(r["input"] for r in doc["datasets"]["inputs"]) == sorted(BRIGHTNESSES)
    assert any(f["kind"] == "dataset" for f in doc["findings"])
    html = page.read_text()
    assert "<h2>Data set</h2>" in html and "zero collapse on 2 of 3 inputs" in html


def test_collect_input_dir_then_analyze_json_reads_the_data_set(tmp_path):
    folder = tmp_path / "inputs"
    folder.mkdir()
    for name in BRIGHTNESSES:
        (folder / f"{name}.npy").write_bytes((INPUTS / f"{name}.npy").read_bytes())
    done = cli("layerdiff.collector.cli", "--device", "local", "--model", str(MODELS / "underflow.param"),
               "--backend", "cpu,vulkan", "--precision", "high,low", "--input", str(folder), "-o", str(tmp_path / "runs"),
               "--no-report")
    assert done.returncode == 0, done.stderr[-1500:]
    analyzed = cli("layerdiff.analyzer.cli.app", str(tmp_path / "runs"), "-o", str(tmp_path / "report"), "--json")
    assert analyzed.returncode == 0, analyzed.stderr[-1500:]
    doc = json.loads(analyzed.stdout)
    configs = {c["configuration"]: c for c in doc["datasets"]["configs"]}
    assert set(configs) == {"cpu/low", "vulkan/high", "vulkan/low"}  # cpu/high is the reference
    assert all(c["inputs"] == 3 for c in configs.values())
    assert configs["vulkan/low"]["zero_collapse_inputs"] == "underflow_dark, underflow_dim"
    [sentence] = [f["sentence"] for f in doc["findings"] if f["kind"] == "dataset" and f["run"] == "vulkan/low"]
    assert "zero collapse on 2 of 3 inputs (underflow_dark, underflow_dim)" in sentence


# ---------------------------------------------------------------- data sets from written dumps: order, escaping
def _dataset_folder(folder: Path, labels: list[str], failing: set[str], repeats: int = 1) -> Path:
    """cpu/high and opencl/low (`repeats` times, identical) on each input; on the `failing` inputs
    opencl/low's `fc` and `prob` are far off."""
    folder.mkdir(parents=True, exist_ok=True)
    for k, label in enumerate(labels):
        ref = reference_arrays(seed=10 + k)
        run = {op: a.copy() for op, a in ref.items()}
        if label in failing:
            run["fc"] = run["fc"] * np.float32(-1.0)
            run["prob"] = run["prob"][:, ::-1].copy()
        sha = f"{k:02x}" * 32
        write_dump(folder / f"cpu_{k}.h5", ref, input_label=label, input_sha256=sha)
        for r in range(repeats):
            write_dump(folder / f"cl_{k}_r{r}.h5", run, backend="opencl", precision="low", input_label=label,
                       input_sha256=sha, repeat=r)
    return folder


def test_first_failing_input_is_in_input_order_and_counts_are_over_inputs(tmp_path):
    labels = ["a.png", "e.png", "d.png", "c.png", "b.png"]  # written as cl_0 .. cl_4: file order is not name order
    folder = _dataset_folder(tmp_path / "runs", labels, failing={"b.png", "d.png"})
    with layerdiff.analyze(folder) as results:
        [config] = results.datasets.to_dict("records")
        assert (config["inputs"], config["n_fail"], config["n_pass"]) == (5, 2, 3)
        assert config["first_failing_input"] == "b.png"
        assert config["worst_input"] in {"b.png", "d.png"}
        layers = results.dataset_layers.set_index("layer")
        assert layers.loc["fc:0", "n_fail"] == 2 and layers.loc["fc:0", "failing_inputs"] == "b.png, d.png"
        [sentence] = results.findings.query("kind == 'dataset'")["sentence"]
        assert "opencl/low over 5 inputs: run verdicts 2 fail, 0 warn, 3 pass" in sentence
        assert "layers fail on 2 of 5 inputs" in sentence and "first failing input b.png" in sentence
        assert "fc:0 (2 of 5)" in sentence


def test_repeats_on_each_input_count_each_input_once(tmp_path):
    folder = _dataset_folder(tmp_path / "runs", ["a", "b", "c"], failing={"c"}, repeats=2)
    with layerdiff.analyze(folder) as results:
        [config] = results.datasets.to_dict("records")
        assert (config["inputs"], config["n_fail"], config["first_failing_input"]) == (3, 1, "c")
        assert results.inputs["input"].tolist() == ["a", "b", "c"]
        verdicts = results.findings.query("kind == 'varying_op'")
        assert len(verdicts) == 3 and (verdicts["severity"] == "info").all()  # one per input, none varies


def test_input_names_from_dumps_are_escaped_on_the_page(tmp_path):
    hostile = "<img src=x onerror=alert(1)>"
    folder = _dataset_folder(tmp_path / "runs", ["plain", hostile], failing={hostile})
    with layerdiff.analyze(folder) as results:
        assert results.datasets.iloc[0]["first_failing_input"] == hostile
        html = results.write_report(tmp_path / "report").read_text()
    section = html[html.index("<h2>Data set</h2>"):]
    assert hostile not in section and "&lt;img src=x onerror=alert(1)&gt;" in section


def test_one_input_per_configuration_is_no_data_set(tmp_path):
    folder = _dataset_folder(tmp_path / "runs", ["only"], failing=set())
    with layerdiff.analyze(folder) as results:
        assert results.datasets.empty and results.inputs.empty
        assert not (results.findings["kind"] == "dataset").any()
        results.write_report(tmp_path / "report")
    doc = json.loads((tmp_path / "report" / "results.json").read_text())
    assert "datasets" not in doc and "repeat_ops" not in doc


# ---------------------------------------------------------------- which op first varies across repeats
def _summed(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """A channel sum whose summation order is `order`: fp32 rounding differs with the order, as a
    GPU reduction's does with its work-group schedule."""
    acc = np.zeros(values.shape[:2], np.float32)
    for index in order:
        acc += values.reshape(values.shape[0], values.shape[1], -1)[:, :, index]
    return acc


def _repeat_dumps(folder: Path) -> tuple[Path, dict]:
    """cpu/high once and opencl/low three times; `pool` is a summation whose order changes from repeat to
    repeat (not at all in the second), everything before it is bit-identical, the rest inherits."""
    folder.mkdir(parents=True, exist_ok=True)
    base = reference_arrays(seed=3)
    base["add:1"] = (base["add:1"] * np.float32(1000.0) + np.float32(0.1)).astype(np.float32)
    rng = np.random.default_rng(7)
    repeats = {}
    write_dump(folder / "cpu.h5", {**base, "pool": _pooled(base, np.arange(36))}, repeat=0)
    orders = [np.arange(36), np.arange(36), rng.permutation(36)]
    for k, order in enumerate(orders):
        arrays = {op: a.copy() for op, a in base.items()}
        arrays["pool"] = _pooled(base, order)
        arrays["fc"] = (base["fc"] + arrays["pool"].mean() * np.float32(1e-3)).astype(np.float32)
        repeats[k] = arrays
        write_dump(folder / f"cl_r{k}.h5", arrays, backend="opencl", precision="low", repeat=k, fresh_process=True)
    return folder, repeats


def _pooled(arrays: dict, order: np.ndarray) -> np.ndarray:
    total = _summed(arrays["add:1"], order)
    return np.broadcast_to(total[:, :, None, None], (1, 8, 3, 3)).astype(np.float32).copy()


def test_first_varying_op_is_the_reduction_whose_order_changes(tmp_path):
    folder, repeats = _repeat_dumps(tmp_path / "runs")
    differing = {op: [k for k in (1, 2) if not np.array_equal(repeats[k][op], repeats[0][op])] for op in repeats[0]}
    first = next(op for op, *_ in LAYERS if differing[op])
    spread = max(rel_l2(repeats[0][first], repeats[k][first]) for k in differing[first])
    assert first == "pool" and differing[first] == [2] and spread > 0  # what numpy sees
    with layerdiff.analyze(folder) as results:
        [finding] = results.findings.query("kind == 'varying_op'").to_dict("records")
        assert finding["layer"] == "pool:0" and finding["severity"] == "warn"
        assert finding["numbers"]["n_differing"] == 1 and finding["numbers"]["repeats"] == 3
        assert finding["numbers"]["spread_rel_l2"] == pytest.approx(spread, rel=1e-6)
        assert finding["numbers"]["identical_before"] == LAYERS.index(next(l for l in LAYERS if l[0] == "pool"))
        assert "First op to vary across 3 repeats" in finding["sentence"]
        assert "pool:0 (Pooling), differs from the first repeat in 1 of 2 repeat(s)" in finding["sentence"]
        assert "each in a fresh process" in finding["sentence"] and finding["numbers"]["fresh_process"] is True
        ops = results.repeat_ops.set_index("op")
        assert ops.loc["conv1:0", "n_differing"] == 0 and ops.loc["fc:0", "n_differing"] == len(differing["fc"])
        page = results.write_report(tmp_path / "report").read_text()
    assert "<h2>Run-to-run variation per op</h2>" in page
    doc = json.loads((tmp_path / "report" / "results.json").read_text())
    assert [r["op"] for r in doc["repeat_ops"] if r["n_differing"]][0] == "pool:0"


def _random_op_model(path: Path) -> Path:
    """Conv -> ReLU -> RandomUniformLike (no seed: a new draw in each process) -> Mul -> Add -> Sigmoid."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((4, 4, 3, 3)).astype(np.float32) * np.float32(0.3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("RandomUniformLike", ["r"], ["noise"], name="noise", low=0.0, high=1.0),
             helper.make_node("Mul", ["noise", "scale"], ["small"], name="mul"),
             helper.make_node("Add", ["r", "small"], ["b"], name="add"),
             helper.make_node("Sigmoid", ["b"], ["y"], name="sigmoid")]
    graph = helper.make_graph(nodes, "noisy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [numpy_helper.from_array(weight, "w"),
                               numpy_helper.from_array(np.array(1e-3, np.float32), "scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _collect_repeats(tmp_path: Path, model: Path, *options: str) -> list[Path]:
    done = cli("layerdiff.collector.cli", "--device", "local", "--model", str(model), "--repeat", "3", *options,
               "-o", str(tmp_path / "runs"), "--no-report")
    assert done.returncode == 0, done.stderr[-1500:]
    return sorted((tmp_path / "runs").glob("*_r*.h5"))


def test_onnxruntime_random_op_repeats_its_draw_within_one_process(tmp_path):
    """ONNX Runtime draws an unseeded random op's seed once per process, so each new session in that
    process repeats the same draws: repeats in one process agree bit for bit, and only fresh processes
    show the op (the next test)."""
    files = _collect_repeats(tmp_path, _random_op_model(tmp_path / "noisy.onnx"))
    with DumpFile(files[0]) as first:
        draw = first.tensor_by_key("noise:0")
    for path in files[1:]:
        with DumpFile(path) as dump:
            assert np.array_equal(dump.tensor_by_key("noise:0"), draw)
    with layerdiff.analyze(files) as results:
        [finding] = results.findings.query("kind == 'varying_op'").to_dict("records")
        assert finding["sentence"].startswith("No op varies across 3 repeats") and "(in one process)" in finding["sentence"]


def test_onnxruntime_random_op_is_named_across_fresh_processes(tmp_path):
    files = _collect_repeats(tmp_path, _random_op_model(tmp_path / "noisy.onnx"), "--fresh-process")
    tensors = []
    for path in files:
        with DumpFile(path) as dump:
            tensors.append({k: dump.tensor_by_key(k) for k in dump.layers["key"]})
    varying = [k for k in tensors[0] if any(not np.array_equal(t[k], tensors[0][k]) for t in tensors[1:])]
    assert varying[0] == "noise:0"  # a fresh seed per process: numpy sees the draw differ
    spread = max(rel_l2(tensors[0]["noise:0"], t["noise:0"]) for t in tensors[1:])
    analysis = analyze_paths(files)
    try:
        [finding] = [f for f in analysis.findings if f.kind == "varying_op"]
        assert (finding.layer, finding.op_type) == ("noise:0", "RandomUniformLike")
        assert finding.numbers["n_differing"] == 2 and finding.numbers["identical_before"] == 2
        assert finding.numbers["spread_rel_l2"] == pytest.approx(spread, rel=1e-6)
        assert finding.numbers["varying_ops"] == varying
    finally:
        analysis.close()


@pytest.mark.parametrize("model", ["convnet.param", "convnet.onnx"])
def test_bit_identical_repeats_say_no_op_varies(tmp_path, model):
    runs = collect_local(tmp_path / "runs", model, [("cpu", "high")], ["convnet.npy"], repeat=3)
    files = sorted(runs.glob("*_r*.h5"))
    assert len(files) == 3
    with DumpFile(files[0]) as first:
        keys = first.layers["key"].tolist()
        expected = {k: first.tensor_by_key(k) for k in keys}
    for path in files[1:]:
        with DumpFile(path) as dump:
            assert all(np.array_equal(dump.tensor_by_key(k), expected[k]) for k in keys)  # numpy: identical
    with layerdiff.analyze(files) as results:
        [finding] = results.findings.query("kind == 'varying_op'").to_dict("records")
        assert finding["severity"] == "info" and finding["layer"] == ""
        assert finding["sentence"].startswith("No op varies across 3 repeats")
        assert f"all {len(keys)} ops give bit-identical outputs" in finding["sentence"]
        assert (results.repeat_ops["n_differing"] == 0).all() and len(results.repeat_ops) == len(keys)
