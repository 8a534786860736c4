"""What the analyzer knows about an engine comes from the dump's header, whatever the engine is called.

A run's `engine_facts` (analyzer/formats/enginefacts.py) says which nodes its engine computes on the CPU by
design in a GPU run and which output names give the task; dumps written before the attribute existed are read
with the facts their engine declared then.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.runs.reference import choose_reference
from layerdiff.analyzer.formats.enginefacts import (ATTRIBUTE, NO_FACTS, RECORDED_BEFORE, CpuByDesign, EngineFacts,
                                                    facts_of, parse_facts)
from layerdiff.collector.engines import ENGINES
from tests.analyze_dumps import write_dump
from tests.conftest import MODELS, SAMPLES

LAYERS = [("tok_lookup", "GET_ROWS", [], (4, 8)), ("mix", "MUL_MAT", ["tok_lookup"], (4, 8)),
          ("logits_out", "MUL_MAT", ["mix"], (4, 16))]
FACTS = EngineFacts(CpuByDesign(("tok_lookup",), "the lookup layer", "the lookup table stays in host memory"),
                    (("logits_out", "language-model"),))


def two_runs(folder, engine: str, facts: str | None):
    """A cpu run and a vulkan run of `engine` whose lookup node lived in host memory; `facts` recorded or not."""
    folder.mkdir()
    rng = np.random.default_rng(3)
    ref = {op: rng.normal(0, 1, size=shape).astype(np.float32) for op, _, _, shape in LAYERS}
    ref["logits_out"][np.arange(4), rng.integers(0, 16, 4)] += 20.0  # a clear next token per position
    run = {op: (a * (1 + 1e-4)).astype(np.float32) for op, a in ref.items()}
    extra = {} if facts is None else {ATTRIBUTE: facts}
    write_dump(folder / "cpu.h5", ref, layers=LAYERS, engine=engine, extra_attrs=extra,
               layouts={op: "eng/f32@CPU" for op in ref})
    write_dump(folder / "vk.h5", run, layers=LAYERS, engine=engine, extra_attrs=extra, backend="vulkan",
               precision="low", backend_actual="vulkan+cpu",
               layouts={"tok_lookup": "eng/f32@Vulkan_Host", "mix": "eng/f32@Vulkan0", "logits_out": "eng/f32@Vulkan0"})
    return folder


def read(folder):
    analysis = analyze_paths([folder])
    try:
        kinds = {f.kind: f for f in analysis.findings}
        return set(analysis.summary["run"]), kinds, [f.sentence for f in analysis.findings]
    finally:
        analysis.close()


def test_facts_a_dump_records_apply_to_an_engine_of_any_name(tmp_path):
    runs, kinds, sentences = read(two_runs(tmp_path / "declared", "someengine", FACTS.to_json()))
    assert runs == {"cpu/high", "vulkan/low"} and "backend_fallback" not in kinds
    info = kinds["cpu_by_design"]
    assert info.severity == "info" and info.numbers["cpu_nodes"] == ["tok_lookup:0"]
    assert "the lookup layer (tok_lookup" in info.sentence and "host memory" in info.sentence
    assert any("language-model" in s for s in sentences)  # logits_out told the task


def test_without_facts_the_same_runs_are_a_fallback_and_name_no_task(tmp_path):
    runs, kinds, sentences = read(two_runs(tmp_path / "none", "someengine", NO_FACTS.to_json()))
    assert runs == {"cpu/high", "vulkan->vulkan+cpu/low"} and "cpu_by_design" not in kinds
    assert kinds["backend_fallback"].severity == "warn"
    assert not any("language-model" in s for s in sentences)


def test_a_recorded_header_wins_over_the_engines_older_facts(tmp_path):
    """A dump that records facts is read by them, also when its engine's older dumps implied others."""
    older = next(iter(RECORDED_BEFORE))
    _, kinds, _ = read(two_runs(tmp_path / "recorded", older, NO_FACTS.to_json()))
    assert "cpu_by_design" not in kinds and "backend_fallback" in kinds


def test_a_malformed_header_is_read_as_no_facts_and_the_analysis_completes(tmp_path):
    for case, text in {"text": "not json", "list": "[1, 2]", "types": json.dumps({"cpu_by_design": {"nodes": 3},
                                                                                  "output_tasks": {"x": 1}})}.items():
        assert parse_facts(text) == NO_FACTS
        runs, kinds, _ = read(two_runs(tmp_path / case, "someengine", text))
        assert "vulkan->vulkan+cpu/low" in runs and "cpu_by_design" not in kinds
    assert facts_of({ATTRIBUTE: json.dumps({"output_tasks": {"x": "classification"}})}).task_for_output("x")


def test_the_facts_of_older_dumps_are_what_their_engine_declares():
    """The frozen table for dumps without the attribute says what the engine's folder says today."""
    for name, facts in RECORDED_BEFORE.items():
        assert ENGINES[name].facts == facts
        assert facts_of({"engine": name}) == facts and parse_facts(facts.to_json()) == facts
    assert facts_of({"engine": "someengine"}) == NO_FACTS


def test_a_collected_run_records_its_engines_facts(tmp_path):
    out = tmp_path / "runs"
    result = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--model",
                             MODELS / "convnet.param", "--config", "cpu/high", "--input",
                             SAMPLES / "inputs" / "convnet.npy", "-o", out], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    with DumpFile(out / "ncnn_cpu_high_convnet.h5") as dump:
        assert dump.attrs[ATTRIBUTE] == ENGINES["ncnn"].facts.to_json()


def test_a_run_whose_engine_declares_a_golden_is_the_reference(tmp_path):
    """Without --ref the cpu/high run of an engine whose facts say `golden` is the reference, whatever its
    name and wherever it sorts; without the fact the first cpu/high run is."""
    rng = np.random.default_rng(4)
    ref = {op: rng.normal(0, 1, size=shape).astype(np.float32) for op, _, _, shape in LAYERS}
    for case, facts in {"golden": EngineFacts(golden=True), "plain": NO_FACTS}.items():
        folder = tmp_path / case
        folder.mkdir()
        write_dump(folder / "a_mobile.h5", ref, layers=LAYERS, engine="mobileengine", extra_attrs={ATTRIBUTE: "{}"})
        write_dump(folder / "b_framework.h5", ref, layers=LAYERS, engine="frameworkengine",
                   extra_attrs={ATTRIBUTE: facts.to_json()})
        analysis = analyze_paths([folder])
        try:
            reference, reason = choose_reference(analysis.runs, None)
            assert str(reference.attrs["engine"]) == ("frameworkengine" if case == "golden" else "mobileengine"), case
            assert ("golden" in reason) == (case == "golden")
        finally:
            analysis.close()
