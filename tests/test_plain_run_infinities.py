"""Two plain runs that hold the same infinities are the same result: seed 004's convolution at cpu/low overflows
to +-Inf (and NaN) identically on every run, and the observation check must call the runs reproducible, never
report the engine as nondeterministic. Real ggml runs through `collect`, read back from the HDF5 footer."""
from __future__ import annotations

import numpy as np

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.findings.finding import FindingKind
from tests.ggml_support import ggml_binary, ggml_samples  # noqa: F401
from tests.test_collect_cli import collect


def test_plain_runs_with_the_same_infinities_are_reproducible(ggml_binary, ggml_samples, tmp_path):
    out = tmp_path / "runs"
    done = collect("--model", ggml_samples["conv2d"], "--backend", "cpu", "--precision", "high", "--precision", "low",
                   "--input", f"x={ggml_samples['conv_large']}", "-o", out, "--no-report")
    assert done.returncode == 0, done.stderr
    low = out / "ggml_cpu_low_conv2d_large.h5"
    with DumpFile(low) as dump:
        footer = dump.provenance.get("raw_footer") or {}
    record = footer.get("plain_run") or {}
    assert record.get("outputs"), footer
    first = record["outputs"][0]
    assert first["vs_second_plain_run"]["identical"] is True
    assert first["vs_second_plain_run"]["rel_l2"] in (0, 0.0), first  # equal infinities are no difference
    with DumpFile(low) as dump:
        rows = dump.layers
        out_row = rows[rows["key"] == first["key"]].iloc[0]
        values = np.asarray(dump.tensor(int(out_row["order"])), dtype=np.float64)
    assert np.isinf(values).any(), "the scenario must overflow for this test to mean anything"
    analysis = analyze_paths([out])
    sentences = [f.sentence for f in analysis.findings]
    assert not any(str(f.kind) == str(FindingKind.NONDETERMINISM) for f in analysis.findings), sentences
