"""What the analyzer knows about an engine comes from the dump's header, whatever the engine is called.

A run's `engine_facts` (analyzer/formats/enginefacts.py) says which nodes its engine computes on the CPU by
design in a GPU run, which output names give the task, and how its op names relate to other engines' names;
dumps that do not record them (written before the attribute existed, or imported from an engine's own tools)
are read with the facts the engine of their `engine` attribute declares in its folder.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.runs.reference import choose_reference
from layerdiff.analyzer.formats import declared
from layerdiff.analyzer.formats.dumpfile import DumpWriter
from layerdiff.analyzer.formats.enginefacts import (ATTRIBUTE, NO_FACTS, CpuByDesign, EngineFacts, NameRule,
                                                    facts_of, parse_facts)
from layerdiff.analyzer.importers import import_any
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


def test_a_recorded_header_wins_over_the_engines_declaration(tmp_path):
    """A dump that records facts is read by them, also when its engine's folder declares others."""
    declaring = next(name for name, engine in ENGINES.items() if engine.facts.cpu_by_design.nodes)
    _, kinds, _ = read(two_runs(tmp_path / "recorded", declaring, NO_FACTS.to_json()))
    assert "cpu_by_design" not in kinds and "backend_fallback" in kinds


def test_a_malformed_header_is_read_as_no_facts_and_the_analysis_completes(tmp_path):
    for case, text in {"text": "not json", "list": "[1, 2]", "types": json.dumps({"cpu_by_design": {"nodes": 3},
                                                                                  "output_tasks": {"x": 1}})}.items():
        assert parse_facts(text) == NO_FACTS
        runs, kinds, _ = read(two_runs(tmp_path / case, "someengine", text))
        assert "vulkan->vulkan+cpu/low" in runs and "cpu_by_design" not in kinds
    assert facts_of({ATTRIBUTE: json.dumps({"output_tasks": {"x": "classification"}})}).task_for_output("x")


def test_a_dump_without_the_attribute_reads_what_its_engine_folder_declares():
    """Every registered engine's declaration survives the header's round trip, and is what a dump without the
    attribute (or, for the name rules, one recorded before them) is read with; an unknown engine declares none."""
    for name, engine in ENGINES.items():
        assert parse_facts(engine.facts.to_json()) == engine.facts, name
        assert facts_of({"engine": name}) == engine.facts, name
        older = json.loads(engine.facts.to_json())
        del older["names"]
        assert facts_of({"engine": name, ATTRIBUTE: json.dumps(older)}) == engine.facts, name
    assert facts_of({"engine": "someengine"}) == NO_FACTS


def test_without_the_lookup_the_analyzer_knows_no_engine():
    """The analyzer holds only a hook; the program installs the lookup (layerdiff/__init__.py)."""
    installed, sources = declared.lookup, declared.sources
    assert installed is not None and installed("mnn") == ENGINES["mnn"].facts
    declared.install(None)
    try:
        assert facts_of({"engine": "mnn"}) == NO_FACTS
    finally:
        declared.install(installed, sources)


def test_stored_results_are_keyed_by_the_engine_declarations():
    """A stored measurement or report of a dump read with its engine folder's declaration is stale once the
    declaration changes: the analyzer's code fingerprint takes the declarations' text in."""
    from layerdiff.analyzer.formats.fingerprint import code_fingerprint
    from layerdiff.analyzer.report.stored import code_identity

    lookup, sources = declared.lookup, declared.sources
    assert sources is not None and ENGINES["mnn"].facts.names.renames[0].pattern.encode() in sources()
    before, report_before = code_fingerprint(), code_identity()
    declared.install(lookup, lambda: sources() + b"# one more declaration")
    try:  # installing them is enough: nothing remembered in the process answers for them
        assert code_fingerprint() != before and code_identity()["sources"] != report_before["sources"]
        declared.install(lookup, None)
        assert code_fingerprint() != before
    finally:
        declared.install(lookup, sources)
    assert code_fingerprint() == before and code_identity() == report_before


def test_untrusted_name_rules_are_kept_only_when_safe_to_apply():
    good = {"pattern": "_copy_\\d+$", "replacement": "", "why": "copies"}
    bad = [{"pattern": "(a+)+$"}, {"pattern": "[unclosed"}, {"pattern": "(x)", "replacement": "\\2"},
           {"pattern": "a" * 500}, {"pattern": ".*.*.*x"}, {"pattern": "(ab|a)*c"}, {"pattern": 7}, "text"]
    facts = parse_facts(json.dumps({"names": {"renames": bad + [good], "key_rules": "no list",
                                              "helper_ops": [good] * 100}}))
    assert facts.names.renames == (NameRule("_copy_\\d+$", "", "copies"),)
    assert facts.names.key_rules == () and len(facts.names.helper_ops) == 16


# An ONNX Runtime golden and an MNN run of one model: MNN's dump tools write '/' as '_', a second ONNX output
# is output 1 of the op named after the first, its converter renames a MatMul, and it inserts a raster op.
GOLDEN = [("/blk/conv/Conv_output_0", 0, (2, 4)), ("/tk/TopK_output_0", 0, (2, 3)), ("/tk/TopK_output_1", 0, (2, 3)),
          ("fc", 0, (2, 5))]
CONVERTED = [("_blk_conv_Conv_output_0", 0, (2, 4)), ("_blk_conv_Conv_output_0_raster_0", 0, (2, 4)),
             ("_tk_TopK_output_0", 0, (2, 3)), ("_tk_TopK_output_0", 1, (2, 3)), ("fc__matmul_converted", 0, (2, 5))]
PARTNER = {"/blk/conv/Conv_output_0:0": "_blk_conv_Conv_output_0:0", "/tk/TopK_output_0:0": "_tk_TopK_output_0:0",
           "/tk/TopK_output_1:0": "_tk_TopK_output_0:1", "fc:0": "fc__matmul_converted:0"}

HELPER_WHY = ENGINES["mnn"].facts.names.helper_ops[0].why  # why the raster op has no counterpart


def write_pair(folder, engine: str, extra: dict):
    """The golden (recording its engine's facts) and the converted run as `engine` with `extra` header attrs."""
    folder.mkdir()
    rng = np.random.default_rng(5)
    values = {op: rng.normal(0, 1, size=shape).astype(np.float32) for op, _, shape in GOLDEN}
    values |= {"_blk_conv_Conv_output_0:0": values["/blk/conv/Conv_output_0"],
               "_blk_conv_Conv_output_0_raster_0:0": values["/blk/conv/Conv_output_0"],
               "_tk_TopK_output_0:0": values["/tk/TopK_output_0"], "_tk_TopK_output_0:1": values["/tk/TopK_output_1"],
               "fc__matmul_converted:0": values["fc"]}
    golden = {"engine": "onnxruntime", ATTRIBUTE: ENGINES["onnxruntime"].facts.to_json()}
    for name, layers, attrs in (("golden", GOLDEN, golden), ("run", CONVERTED, {"engine": engine, **extra})):
        header = {"engine_version": "1", "backend_requested": "cpu", "backend_actual": "cpu", "threads": 1,
                  "precision_requested": "high" if name == "golden" else "low",
                  "precision_effective": "fp32" if name == "golden" else "fp16", "model_name": "m.onnx", **attrs}
        with DumpWriter(folder / f"{name}.h5", header) as writer:
            for order, (op, index, _shape) in enumerate(layers):
                writer.add_tensor({"order": order, "op": op, "op_type": "", "output_index": index, "name": op,
                                   "inputs": []}, values.get(f"{op}:{index}", values.get(op)))
    return folder


def aligned(folder, ref: str = "golden.h5", by_rules: bool = True) -> tuple[dict, dict]:
    """{reference key: run key} of the pair (`by_rules`: only the layers name rules paired), and {unmatched run
    key: why}."""
    analysis = analyze_paths([folder], ref=folder / ref)
    try:
        alignment = analysis.comparison.alignments[0]
        matched = alignment.matched[alignment.matched["match"] != "structure"] if by_rules else alignment.matched
        return (dict(zip(matched["key"], matched["other_key"])),
                dict(zip(alignment.only_other["key"], alignment.only_other["why"])))
    finally:
        analysis.close()


def test_a_dump_without_facts_aligns_by_its_engines_declared_name_rules(tmp_path):
    """A dump written before the header carried facts names only its engine: that folder's rules align it."""
    pairs, left = aligned(write_pair(tmp_path / "old", "mnn", {}))
    assert pairs == PARTNER
    assert left == {"_blk_conv_Conv_output_0_raster_0:0": HELPER_WHY}


def test_a_dump_aligns_by_the_name_rules_its_header_records_whatever_its_engine_is_called(tmp_path):
    """The rules a header records are the ones applied: MNN's facts under another engine name align alike, and a
    header that records no rules leaves the converted names to structural matching (only the neutral rules apply)."""
    write_pair(tmp_path / "declared", "someengine", {ATTRIBUTE: ENGINES["mnn"].facts.to_json()})
    assert aligned(tmp_path / "declared") == aligned(write_pair(tmp_path / "old", "mnn", {}))
    write_pair(tmp_path / "none", "mnn", {ATTRIBUTE: NO_FACTS.to_json()})
    pairs, left = aligned(tmp_path / "none")
    assert pairs == {}
    assert HELPER_WHY not in left.values()
    assert aligned(tmp_path / "declared", by_rules=False) == aligned(tmp_path / "declared")


def test_the_engine_registry_is_imported_only_for_a_dump_that_does_not_record_its_facts(tmp_path):
    """Reading dumps that record their facts costs no engine import; a dump that does not brings the registry in."""
    write_pair(tmp_path / "declared", "someengine", {ATTRIBUTE: ENGINES["mnn"].facts.to_json()})
    write_pair(tmp_path / "old", "mnn", {})
    code = ("import sys; from layerdiff.analyzer.analysis import analyze_paths; "
            "analyze_paths([sys.argv[1]]).close(); print('layerdiff.collector.engines' in sys.modules)")
    for case, imported in (("declared", "False"), ("old", "True")):
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path / case)], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0 and done.stdout.strip() == imported, (case, done.stdout, done.stderr)


def test_an_imported_mnn_dump_aligns_with_an_onnx_golden_by_mnns_rules(tmp_path):
    """A dump MNN's own tools wrote, imported: the import names its engine, the engine folder's rules align it."""
    from tests.test_import_mnn import sample_tensors, write_mnn_dump

    tensors = sample_tensors()
    folder = tmp_path / "runs"
    folder.mkdir()
    import_any(write_mnn_dump(tmp_path / "mnn", tensors, log=False), None, folder / "mnn.h5")
    golden = {"/blk/conv/Conv_output_0": tensors[0][2], "/tk/TopK_output_0": tensors[2][2],
              "/tk/TopK_output_1": tensors[3][2]}
    np.savez(tmp_path / "ort.npz", **golden)
    import_any(tmp_path / "ort.npz", None, folder / "ort.h5")
    with DumpFile(folder / "mnn.h5") as dump:
        assert ATTRIBUTE not in dump.attrs and str(dump.attrs["engine"]) == "mnn"
    pairs, left = aligned(folder, "ort.h5")
    assert pairs == {"/blk/conv/Conv_output_0:0": "_blk_conv_Conv_output_0:0",
                                                "/tk/TopK_output_0:0": "_tk_TopK_output_0:0",
                                                "/tk/TopK_output_1:0": "_tk_TopK_output_0:1"}
    assert left["_blk_conv_Conv_output_0_raster_0:0"] == HELPER_WHY


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
