"""`collect --model M.gguf` on the local device (the ggml engine) and `analyze` of its runs: llama.cpp's
nodes aligned by name with verdicts, and seed 004 told on ggml (IM2COL named as the Inf origin at x30000)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from layerdiff.analyzer.formats.enginefacts import parse_facts
from layerdiff.collector.engines import ENGINES
from tests.ggml_support import ggml_binary, ggml_samples  # noqa: F401


def _collect(binary, out, model, inp, precisions: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAYERDIFF_GGML_BINARY": str(binary)}  # the cached build the fixture made
    return subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--model", str(model),
                           "--input", str(inp), "--backend", "cpu", "--precision", precisions, "-o", str(out),
                           "--no-report"], capture_output=True, text=True, timeout=600, env=env)


def _analyze(folder) -> dict:
    proc = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", str(folder), "-o", str(folder / "rep"),
                           "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_collect_tinyllama_high_low_and_analyze_by_node_name(ggml_binary, ggml_samples, tmp_path):
    from layerdiff.analyzer.formats.dumpfile import DumpFile
    from layerdiff.collector.inputs.modelfiles import input_specs, resolve_model

    model = resolve_model(ggml_samples["tinyllama"])
    assert model.engine == "ggml" and input_specs(model) == {"tokens": ((-1,), "int32")}
    proc = _collect(ggml_binary, tmp_path / "c", ggml_samples["tinyllama"], ggml_samples["tokens"], "high,low")
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = sorted((tmp_path / "c").glob("ggml_cpu_*.h5"))
    assert [f.name.split("_")[2] for f in files] == ["high", "low"]
    with DumpFile(files[0]) as dump:
        keys = list(dump.layers["key"])
        assert dump.attrs["engine"] == "ggml" and dump.attrs["backend_actual"] == "cpu"
        # what separates high from normal, as the engine declares it: only these ops can differ
        assert json.loads(dump.attrs["precision_reach"]) == {"normal": ["IM2COL", "SET_ROWS"]}
        # what the analyzer reads about the engine travels in the header (analyzer/formats/enginefacts.py)
        assert parse_facts(dump.attrs["engine_facts"]) == ENGINES["ggml"].facts
        assert {"attn_norm-0:0", "Qcur-0:0", "ffn_out-1:0", "result_output:0"} <= set(keys)
    doc = _analyze(tmp_path / "c")
    low = next(r for r in doc["runs"] if r["run"] == "cpu/low")
    compared = [layer for layer in low["layers"] if layer.get("status") in ("pass", "warn", "fail")]
    assert len(compared) >= 50  # aligned by llama.cpp's node names
    first = low["first_divergence"]["layer"]
    assert first.startswith("cache_k_l0"), first  # the q8_0 K cache store is where low first departs
    before = {layer["key"]: layer for layer in low["layers"]}
    assert before["attn_norm-0:0"]["status"] == "pass" and before["attn_norm-0:0"]["max_abs"] == 0


def test_seed_004_on_ggml_im2col_is_the_inf_origin_at_large_size(ggml_binary, ggml_samples, tmp_path):
    verdicts = {}
    for size in ("small", "large"):
        out = tmp_path / size
        proc = _collect(ggml_binary, out, ggml_samples["conv2d"], ggml_samples[f"conv_{size}"], "high,normal")
        assert proc.returncode == 0, proc.stderr[-2000:]
        normal = next(r for r in _analyze(out)["runs"] if r["run"] == "cpu/normal")
        verdicts[size] = normal
    assert verdicts["small"]["verdict"] == "pass"
    assert not [f for f in verdicts["small"]["findings"] if f["kind"].endswith("_origin")]
    large = verdicts["large"]
    assert large["verdict"] == "fail"
    origin = next(f for f in large["findings"] if f["kind"] == "inf_origin")
    assert origin["layer"] == "conv.im2col:0" and origin["op_type"] == "IM2COL"
    assert "fp16 overflow" in origin["sentence"]
    # Inf/NaN in the run where the reference is finite: no layer shows the finite remainder's cosine
    # (0.99999996 on conv.mul_mat:0, 84% non-finite, before the fix), neither in JSON nor on the page
    broken = [layer for layer in large["layers"] if layer["n_nonfinite_mismatch"]]
    assert len(broken) == 6 and all(layer["cosine"] is None and layer["rel_l2"] == "inf" for layer in broken)
    page = (tmp_path / "large" / "rep" / "index.html").read_text()
    table = json.loads(page.split("id='layer-data'>")[1].split("</script>")[0].replace("<\\/", "</"))
    column, key = table["columns"].index("cosine"), table["columns"].index("key")
    shown = {row[key]: row[column] for row in table["rows"] if row[table["columns"].index("run")] == "cpu/normal"}
    assert shown["conv.mul_mat:0"] == "nan" and shown["conv.reshape#1:0"] == 1.0
    # numpy's judgement: the reference's largest im2col value is the input's largest (padding adds zeros)
    x = np.load(ggml_samples["conv_large"])
    assert origin["numbers"]["reference_peak"] == float(np.abs(x).max()) > 65504


def test_collect_a_prompt_runs_it_through_the_models_tokenizer(ggml_binary, ggml_samples, tmp_path, monkeypatch):
    """`collect --input prompt=FILE.txt`: the run records the prompt and the ids that ran, and its nodes are
    those of a run fed the ids the model's own tokenizer gives for that prompt (the tokenize helper)."""
    from layerdiff.analyzer.formats.dumpfile import DumpFile
    from layerdiff.collector.engines.ggml.tokenize import tokenize

    monkeypatch.setenv("LAYERDIFF_GGML_BINARY", str(ggml_binary))
    prompt = ggml_samples["prompt"]
    ids = tokenize(ggml_samples["tinyllama"], prompt.read_text(encoding="utf-8"))
    np.save(tmp_path / "ids.npy", np.asarray(ids, dtype=np.int32))
    for folder, inp in (("p", f"prompt={prompt}"), ("t", tmp_path / "ids.npy")):
        proc = _collect(ggml_binary, tmp_path / folder, ggml_samples["tinyllama"], inp, "high")
        assert proc.returncode == 0, proc.stderr[-2000:]
    with DumpFile(tmp_path / "p" / "ggml_cpu_high_tinyllama_prompt.h5") as dump:
        provenance = dump.provenance
        options = provenance["raw_header"]["options"]
        assert provenance["input_preprocess"]["prompt"]["prompt"] == prompt.read_text(encoding="utf-8")
        assert options["input_kind"] == "prompt" and options["tokens"] == ids and len(ids) > 5
        from_prompt = dump.tensor_by_key("result_output:0")
        # inp_tokens read back: the tokenizer's ids, checked against the ids the run records for the prompt
        assert dump.attrs["input_fed_check"] == "equal"
        assert [(n, a.tolist()) for n, a, _, _ in dump.inputs_fed()] == [("prompt", ids)]
    with DumpFile(tmp_path / "t" / "ggml_cpu_high_ids.h5") as dump:
        assert dump.provenance["raw_header"]["options"]["input_kind"] == "tokens"
        assert dump.attrs["input_fed_check"] == "equal"
        assert [(n, a.tolist()) for n, a, _, _ in dump.inputs_fed()] == [("tokens", ids)]
        np.testing.assert_array_equal(from_prompt, dump.tensor_by_key("result_output:0"))
