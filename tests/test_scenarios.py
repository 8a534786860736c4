"""the five field reports, reproduced on the `local` device and pinpointed by `analyze`.

Every number here comes from the engines' own low-precision arithmetic (ncnn on this CPU: bf16
storage; ncnn Vulkan on Mesa lavapipe: fp16 storage + arithmetic) running the sample models of
samples/ (see samples/README.md, "The five field reports"). Nothing is injected. Runs are collected
once per module and shared; assertions are on names and kinds, numbers only within wide ranges.
Scenarios 1, 2 and 5 go through the command lines a user types (`collect`, `analyze --json`);
scenarios 3 and 4 through the library calls the command lines wrap.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.collector.inputs.inputset import resolve_inputs
from layerdiff.collector.inputs.modelfiles import input_shapes, resolve_model
from layerdiff.collector.run.pipeline import RunSpec, collect_run

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "samples" / "models"
INPUTS = REPO / "samples" / "inputs"
FP16_MAX = 65504.0
REFERENCE_AND_GPU_LOW = [("cpu", "high"), ("vulkan", "low")]


def collect_api(out: Path, stem: str, configs: list[tuple[str, str]], inputs: list[str]) -> Path:
    """Collect `stem` on the local device for each (backend, precision) x input, through layerdiff.collector.run.pipeline."""
    files = resolve_model(MODELS / f"{stem}.param")
    sets, errors = resolve_inputs([str(INPUTS / name) for name in inputs], input_shapes(files))
    assert not errors, errors
    device = LocalDevice()
    for backend, precision in configs:
        for inputs_set in sets:
            outcome = collect_run(device, RunSpec(files, backend, precision, inputs_set), out)
            assert outcome.status == "done", outcome.message
    return out


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def analyze_json(report: Path, *inputs: Path, ref: Path | None = None) -> dict:
    """`analyze INPUTS -o REPORT [--ref REF] --json`, as a user runs it; every input must be usable."""
    extra = ["--ref", str(ref)] if ref else []
    done = run_cli("layerdiff.analyzer.cli.app", *map(str, inputs), "-o", str(report), *extra, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def findings(doc: dict, kind: str, run: str | None = None) -> list[dict]:
    return [f for f in doc["findings"] if f["kind"] == kind and (run is None or f["run"] == run)]


def run_entry(doc: dict, file_name: str) -> dict:
    (entry,) = [r for r in doc["runs"] if Path(r["file"]).name == file_name]
    return entry


def label_of(analysis, backend: str, precision: str, input_label: str = "") -> str:
    """The label `analyze` gave the run of this configuration and input."""
    (label,) = [r.label for r in analysis.runs if r.backend == backend and r.precision == precision
                and (not input_label or r.attrs.get("input_label") == input_label)]
    return label


def kinds(analysis, kind: str, run: str | None = None) -> list:
    return [f for f in analysis.findings if f.kind == kind and (run is None or f.run == run)]


# ---------------------------------------------------------------- 1: ARM CPU vs GPU, layer by layer
@pytest.fixture(scope="module")
def deepnet_report(tmp_path_factory):
    runs = collect_api(tmp_path_factory.mktemp("deepnet"), "deepnet", REFERENCE_AND_GPU_LOW, ["deepnet.npy"])
    report = tmp_path_factory.mktemp("deepnet-report") / "report"
    return analyze_json(report, runs), report


def test_1_cpu_vs_gpu_error_curve_and_first_divergence(deepnet_report):
    doc, report = deepnet_report
    gpu = run_entry(doc, "ncnn_vulkan_low_deepnet.h5")
    assert doc["reference"]["run"] == "cpu/high" and gpu["run"] == "vulkan/low"
    # no change to the model: every one of its layers (ncnn Splits included) is dumped and aligned
    assert gpu["summary"]["layers_compared"] == 40
    assert not gpu["unmatched"]["only_in_reference"] and not gpu["unmatched"]["only_in_run"]
    assert gpu["verdict"] == "warn" and gpu["summary"]["n_fail"] == 0  # fp16 drift, nothing breaks
    (first,) = findings(doc, "first_divergence", "vulkan/low")
    assert first["layer"] in {"stem/conv:0", "stem/pool:0", "stage1/conv1:0"} and first["severity"] == "warn"
    (curve,) = findings(doc, "error_curve", "vulkan/low")
    numbers = curve["numbers"]
    assert numbers["first_layer"] == "stem/conv:0" and 1e-4 < numbers["first_rel_l2"] < 3e-3
    assert numbers["peak_layer"].startswith(("stage4/", "stage5/", "stage6/", "head/"))
    assert 3 < numbers["growth"] < 50 and 1e-3 < numbers["peak_rel_l2"] < 3e-2
    thirds = numbers["thirds_median_rel_l2"]
    assert thirds[0] < thirds[1] < thirds[2]  # the error builds up with depth
    assert numbers["output_layer"] == "prob:0" and numbers["top1"] == 1.0
    assert "stem/conv:0" in curve["sentence"] and numbers["peak_layer"] in curve["sentence"]
    html = (report / "index.html").read_text()
    assert 'id="error-chart"' in html and '"name":"first divergence"' in html and not list(report.glob("*.png"))


# ---------------------------------------------------------------- 2: fp16 weight storage drift
@pytest.fixture(scope="module")
def fp16w_report(tmp_path_factory):
    runs = tmp_path_factory.mktemp("fp16w")
    collect_api(runs, "convnet", [("cpu", "high")], ["convnet.npy"])
    collect_api(runs, "convnet_fp16w", [("cpu", "high")], ["convnet_fp16w.npy"])
    report = tmp_path_factory.mktemp("fp16w-report") / "report"
    return analyze_json(report, runs, ref=runs / "ncnn_cpu_high_convnet.h5")


def test_2_fp16_weight_storage_drift_per_layer_and_at_the_output(fp16w_report):
    doc = fp16w_report
    assert Path(doc["reference"]["file"]).name == "ncnn_cpu_high_convnet.h5" and "--ref" in doc["reference"]["reason"]
    run = run_entry(doc, "ncnn_cpu_high_convnet_fp16w.h5")
    assert run["verdict"] == "warn" and run["summary"]["n_fail"] == 0
    drift = {layer["key"]: layer["rel_l2"] for layer in run["layers"]}
    assert drift["data:0"] == 0.0  # same input: all the drift comes from the stored weights
    assert all(1e-5 < v < 1e-2 for k, v in drift.items() if k != "data:0")
    (curve,) = findings(doc, "error_curve", run["run"])
    numbers = curve["numbers"]
    assert numbers["first_layer"] == "stem/conv:0" and 1e-4 < numbers["first_rel_l2"] < 2e-3
    assert 1.5 < numbers["growth"] < 30 and numbers["peak_rel_l2"] < 1e-2
    assert numbers["output_layer"] == "prob:0" and numbers["top1"] == 1.0 and numbers["top5"] == 1.0
    assert run["summary"]["top1"] == 1.0 and run["summary"]["top5"] == 1.0
    assert "top-1 agreement 100%" in curve["sentence"]


# ---------------------------------------------------------------- 3: one op misbehaves on one setting
@pytest.fixture(scope="module")
def sepool_analysis(tmp_path_factory):
    runs = collect_api(tmp_path_factory.mktemp("sepool"), "sepool",
                       [("cpu", "high"), ("cpu", "low"), ("vulkan", "low")], ["sepool.npy"])
    analysis = analyze_paths([runs])
    yield analysis
    analysis.close()


def test_3_failure_source_is_the_one_op_and_its_inputs_pass(sepool_analysis):
    analysis = sepool_analysis
    gpu, cpu_low = label_of(analysis, "vulkan", "low"), label_of(analysis, "cpu", "low")
    # the gate damps the broken pool before the output, so the run's output keeps within tolerance: the op
    # is named (in yellow) as a divergence that does not reach the output, never as a failure source
    assert not kinds(analysis, "failure_source")
    (source,) = kinds(analysis, "layer_divergence")
    assert (source.run, source.layer, source.op_type) == (gpu, "se/pool:0", "Pooling")
    assert source.severity == "warn" and "does not reach the output" in source.sentence
    table = analysis.comparison.table
    rows = table[table["run"] == gpu].set_index("key")
    assert rows.loc["se/pool:0", "rel_l2"] > 0.2
    for feeder in ("stem/conv:0", "block/conv:0"):  # the layers before it only carry fp16 rounding
        assert rows.loc[feeder, "status"] in ("pass", "warn") and rows.loc[feeder, "rel_l2"] < 1e-2
    failing = set(rows.index[rows["status"] == "fail"]) - {"se/pool:0"}
    assert failing and set(source.numbers["downstream_failing"]) == failing  # the rest inherit it
    assert rows.loc["prob:0", "status"] in ("pass", "warn")  # the gate damps it before the output
    (first,) = kinds(analysis, "first_divergence", gpu)  # the first warn or fail; the first fail named apart
    first_diverging = rows[rows["status"].isin(["warn", "fail"])].sort_values("position").index[0]
    assert first.layer == first_diverging and first.numbers["first_fail"] == "se/pool:0"
    assert "se/pool:0" in first.sentence
    assert not kinds(analysis, "layer_divergence", cpu_low)  # bf16 storage with fp32 sums: no failure
    cpu_rows = table[table["run"] == cpu_low].set_index("key")
    assert cpu_rows.loc["se/pool:0", "status"] in ("pass", "warn")


# ---------------------------------------------------------------- 4: all-zero output for some inputs
@pytest.fixture(scope="module")
def underflow_analysis(tmp_path_factory):
    runs = collect_api(tmp_path_factory.mktemp("underflow"), "underflow", REFERENCE_AND_GPU_LOW,
                       ["underflow.npy", "underflow_dim.npy", "underflow_dark.npy"])
    analysis = analyze_paths([runs])
    yield analysis
    analysis.close()


def test_4_inputs_that_collapse_where_the_zeros_start_and_the_underflow_risk(underflow_analysis):
    analysis = underflow_analysis
    (dependence,) = kinds(analysis, "input_dependence")
    assert dependence.run == "vulkan/low" and dependence.severity == "fail"
    assert dependence.numbers["collapsed_inputs"] == ["underflow_dark"]
    assert "underflow_dark" in dependence.numbers["failing_inputs"]
    assert "underflow" not in dependence.numbers["failing_inputs"]  # the bright image survives fp16
    assert dependence.numbers["zero_start_by_input"]["underflow_dark"] == "gate/square:0"
    assert "underflow_dark collapses to zero" in dependence.sentence
    dark = label_of(analysis, "vulkan", "low", "underflow_dark")
    (zeros,) = kinds(analysis, "zero_collapse_origin", dark)
    assert (zeros.layer, zeros.op_type) == ("gate/square:0", "BinaryOp")
    assert zeros.numbers["reference_underflow_share"] > 0.5 and zeros.numbers["output_zero_collapse"] > 0.99
    assert "fp16 underflow" in zeros.sentence
    dark_ref = label_of(analysis, "cpu", "high", "underflow_dark")
    risks = [f for f in kinds(analysis, "fp16_risk", dark_ref) if "underflow" in f.sentence]
    assert risks and risks[0].layer == "gate/square:0" and risks[0].numbers["share"] > 0.5
    bright = label_of(analysis, "vulkan", "low", "underflow")
    assert not kinds(analysis, "zero_collapse_origin", bright)
    assert not [f for f in kinds(analysis, "fp16_risk", label_of(analysis, "cpu", "high", "underflow"))
                if "underflow" in f.sentence]


# ---------------------------------------------------------------- 5: NaN / huge values at large sizes
@pytest.fixture(scope="module")
def sizenet_large_report(tmp_path_factory):
    runs = tmp_path_factory.mktemp("sizenet_large")
    done = run_cli("layerdiff.collector.cli", "--device", "local", "--model", "samples/models/sizenet_large.param",
                   "--backend", "cpu,vulkan", "--precision", "high,low", "--input", "samples/inputs/sizenet_large.npy",
                   "-o", str(runs), "--no-report")
    assert done.returncode == 0, done.stderr
    report = tmp_path_factory.mktemp("sizenet-large-report") / "report"
    return analyze_json(report, runs), report


def test_5_large_input_overflows_fp16_at_the_reduction(sizenet_large_report):
    doc, report = sizenet_large_report
    (inf,) = findings(doc, "inf_origin", "vulkan/low")
    assert (inf["layer"], inf["op_type"]) == ("pool/sum:0", "Reduction")
    assert inf["numbers"]["reference_peak"] > FP16_MAX and "fp16 overflow" in inf["sentence"]
    (nan,) = findings(doc, "nan_origin", "vulkan/low")
    assert nan["layer"] == "head/fc1:0" and nan["numbers"]["inf_inputs"] == ["pool/sum:0"]
    (source,) = findings(doc, "failure_source", "vulkan/low")
    assert source["layer"] == "pool/sum:0"
    overflow = [f for f in findings(doc, "fp16_risk", "cpu/high") if "overflow" in f["sentence"]]
    assert overflow and overflow[0]["layer"] == "pool/sum:0" and FP16_MAX < overflow[0]["numbers"]["peak"] < 1e6
    assert run_entry(doc, "ncnn_vulkan_low_sizenet_large.h5")["summary"]["top1"] == 0.0
    for label in ("cpu/low", "vulkan/high"):  # bf16 keeps fp32's range; fp32 on Vulkan: no overflow
        assert not findings(doc, "inf_origin", label) and not findings(doc, "nan_origin", label)
        assert run_entry(doc, f"ncnn_{label.replace('/', '_')}_sizenet_large.h5")["verdict"] != "fail"
    html = (report / "index.html").read_text()
    assert 'id="range-chart"' in html and "fp16 max 65504" in html


def test_5_same_weights_at_32x32_stay_finite(tmp_path):
    runs = collect_api(tmp_path / "runs", "sizenet", REFERENCE_AND_GPU_LOW, ["sizenet.npy"])
    analysis = analyze_paths([runs])
    try:
        reference = analysis.comparison.plan.reference.layers.set_index("key")
        assert 1e3 < reference.loc["pool/sum:0", "max"] < FP16_MAX
        for kind in ("nan_origin", "inf_origin", "failure_source"):
            assert not kinds(analysis, kind), kind
        assert not [f for f in kinds(analysis, "fp16_risk") if "overflow" in f.sentence]
        summary = analysis.summary.set_index("run")
        assert summary.loc[label_of(analysis, "vulkan", "low"), "verdict"] in ("pass", "warn")
    finally:
        analysis.close()
