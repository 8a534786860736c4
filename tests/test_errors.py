"""The error tree: every exception layerdiff defines lives in layerdiff/errors.py under one root, each
failure is raised as its specific class, and the CLIs keep their exit codes. Finding kinds, severities
and run statuses are str enums whose values are what the files already carry."""
from __future__ import annotations

import ast
import csv
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import layerdiff.errors as errors
from layerdiff.errors import (InputError, Interrupted, LayerdiffError, NothingToCompareError, StorageError,
                              UsageError)
from tests.faults.support import REPO, assert_one_line_error, cli

SAMPLE_DUMPS = REPO / "samples" / "dumps"
PACKAGES = ("layerdiff", "layerdiff.collector", "layerdiff.analyzer", "layerdiff.samples", "layerdiff.device_scripts")


def _all_modules() -> list:
    found = []
    for top in PACKAGES:
        package = importlib.import_module(top)
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, top + "."):
            if not info.name.endswith("__main__"):
                found.append(importlib.import_module(info.name))
    return found


def test_every_exception_class_is_defined_in_errors_py_under_the_root():
    defined_elsewhere = []
    for module in _all_modules():
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__.startswith("layerdiff"):
                assert issubclass(value, LayerdiffError), f"{module.__name__}.{name} does not derive from LayerdiffError"
                if value.__module__ != "layerdiff.errors":
                    defined_elsewhere.append(f"{value.__module__}.{name}")
    assert not defined_elsewhere, defined_elsewhere


def test_no_source_raises_the_bare_root():
    """A caller tells bad input from a lost device by class: the root itself is never raised."""
    offenders = []
    for folder in ("collector", "analyzer", "samples", "layerdiff"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LayerdiffError":
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


def test_exit_codes_are_the_documented_ones():
    assert LayerdiffError("x").exit_code == 1
    for cls in (UsageError, InputError, errors.DumpFormatError, StorageError, errors.NoSpaceError, errors.DeviceError,
                NothingToCompareError, errors.HarnessError, errors.ConversionError):
        assert cls("x").exit_code == errors.EXIT_ERROR == 1
    assert Interrupted("x").exit_code == errors.EXIT_INTERRUPTED == 130
    assert errors.HarnessExit(4, "no backend").exit_code == 4
    assert issubclass(errors.NoSpaceError, OSError) and issubclass(errors.NotWritableError, OSError)
    assert issubclass(errors.ConversionError, RuntimeError)


def test_runs_without_a_reference_on_their_input_say_why_once(tmp_path):
    """Three runs on another input than the reference's: one reason, said once with the runs it holds for."""
    from layerdiff.analyzer.analysis import analyze_paths
    from tests.analyze_dumps import reference_arrays, write_dump

    arrays = reference_arrays(seed=1)
    write_dump(tmp_path / "ref.h5", arrays)
    for backend, precision in (("cpu", "low"), ("vulkan", "high"), ("vulkan", "low")):
        write_dump(tmp_path / f"{backend}_{precision}.h5", arrays, backend=backend, precision=precision,
                   input_label="y", input_sha256="ef" * 32)
    with pytest.raises(NothingToCompareError) as raised:
        analyze_paths([tmp_path / "ref.h5", tmp_path / "cpu_low.h5", tmp_path / "vulkan_high.h5",
                       tmp_path / "vulkan_low.h5"], ref=tmp_path / "ref.h5")
    message = str(raised.value)
    assert message.count("no run of the reference configuration") == 1, message
    assert all(label in message for label in ("cpu/low", "vulkan/high", "vulkan/low")), message


def test_library_failures_raise_their_specific_class(tmp_path):
    from layerdiff.analyzer.analysis import analyze_paths
    from layerdiff.collector.inputs.modelfiles import resolve_model
    from layerdiff.collector.run.pipeline import RunOptions

    with pytest.raises(NothingToCompareError, match="at least two runs"):
        analyze_paths([SAMPLE_DUMPS / "ncnn_cpu_high_overflow.h5"])
    with pytest.raises(NothingToCompareError, match="no readable dump"):
        analyze_paths([])
    with pytest.raises(InputError, match="does not exist"):
        resolve_model(tmp_path / "missing.mnn", "auto")
    with pytest.raises(UsageError, match="--threads 0"):
        RunOptions(threads=0)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    from layerdiff.analyzer.report.outdir import prepare_out_dir
    with pytest.raises(StorageError, match="not a directory"):
        prepare_out_dir(blocker)


def test_nothing_to_compare_still_exits_1_with_one_line(tmp_path):
    proc = cli("analyze", str(SAMPLE_DUMPS / "ncnn_cpu_high_overflow.h5"), "-o", str(tmp_path / "report"))
    assert_one_line_error(proc, "at least two runs", code=1)


def test_finding_kinds_and_severities_are_str_enums_with_the_file_values():
    from layerdiff.analyzer.findings.divergence import KIND_ORDER
    from layerdiff.analyzer.findings.finding import Finding, FindingKind, Severity

    assert KIND_ORDER[:5] == ["incomplete_run", "backend_fallback", "split_graph", "observation_changed", "output_unmatched"]
    assert KIND_ORDER == [k.value for k in FindingKind]
    finding = Finding("saturation", "run", "conv:0", "Conv", "sentence", severity="warn")
    assert finding.kind is FindingKind.SATURATION and finding.severity is Severity.WARN
    assert finding.as_dict()["kind"] == "saturation" and f"sev-{finding.severity}" == "sev-warn"
    with pytest.raises(ValueError):
        Finding("no_such_kind", "run", "", "", "")


def test_run_statuses_are_the_index_values(tmp_path):
    from layerdiff.collector.sweep.index import STATUSES, Index, IndexRow, read_index
    from layerdiff.vocabulary import RunStatus

    assert STATUSES == ("planned", "running", "done", "failed", "skipped", "interrupted")
    row = IndexRow("local", "mnn", "cpu", "high", "random")
    index = Index(tmp_path, [row])
    index.update(row, status=RunStatus.SKIPPED, reason="why")
    with open(tmp_path / "index.csv", newline="") as handle:
        assert [r["status"] for r in csv.DictReader(handle)] == ["skipped"]
    assert index.counts()["skipped"] == 1
    assert list(read_index(tmp_path).values())[0].status == RunStatus.SKIPPED


def test_every_finding_kind_written_in_the_source_is_a_finding_kind():
    """Finding() turns its kind into a FindingKind (and refuses others): a literal kind the enum lacks
    would fail only when that finding is made, so every literal is checked here."""
    from layerdiff.analyzer.findings.finding import FindingKind

    literals = []
    for path in (REPO / "analyzer").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding" and node.args \
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                literals.append((f"{path.relative_to(REPO)}:{node.lineno}", node.args[0].value))
    unknown = [f"{where}: {kind}" for where, kind in literals if kind not in FindingKind._value2member_map_]
    assert not unknown, unknown
