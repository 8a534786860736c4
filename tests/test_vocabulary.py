"""One table per concept (layerdiff/vocabulary.py): the C++ harness's copies are read from its source
and checked against the tables; the Python engines and the sample runners set exactly the table."""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from layerdiff import vocabulary as v
from layerdiff.analyzer.importers import mnncodes
from layerdiff.collector.engines.ncnn import options as ncnn_options
from tests.faults.support import REPO

HARNESS_SRC = REPO / "device_scripts" / "harness" / "src"


def _function_body(source: str, signature: str) -> str:
    """The text between the braces of the C++ function whose definition starts with `signature`."""
    start = source.index(signature)
    depth, begin = 0, source.index("{", start)
    for i in range(begin, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[begin + 1:i]
    raise AssertionError(f"unbalanced braces after {signature}")


def _python_expr(cpp: str) -> str:
    """A C++ boolean expression over our facts as Python (`!a && b()` -> `not a and b`)."""
    expr = cpp.replace("&&", " and ").replace("||", " or ").replace("()", "")
    expr = re.sub(r"!(?!=)", " not ", expr)
    return expr.replace("true", "True").replace("false", "False")


def cpp_ncnn_flags(precision: str, vulkan: bool, fp16_arith: bool, fp16_storage_only: bool) -> dict[str, bool]:
    """Run the C++ `apply_precision` of ncnn_engine.cpp by reading it: each assignment, in order."""
    source = (HARNESS_SRC / "ncnn_engine.cpp").read_text()
    params = re.search(r"void set_fp16\(ncnn::Option& opt, ([^)]*)\)", source).group(1)
    names = [p.split()[-1] for p in params.split(",")]
    setter = {flag: names.index(arg) for flag, arg in
              re.findall(r"opt\.(\w+) = (\w+);", _function_body(source, "void set_fp16("))}
    body = _function_body(source, "void apply_precision(")
    branches = dict(re.findall(r'precision == "(\w+)"\) \{(.*?)\n    \}', body, re.S))
    scope = {"vulkan": vulkan, "cpu_has_fp16_arith": fp16_arith, "cpu_has_fp16_storage_only": fp16_storage_only}
    flags: dict[str, bool] = {}
    for statement in (s.strip() for s in branches.get(precision, "").split(";") if s.strip()):
        if m := re.fullmatch(r"bool (\w+) = (.*)", statement, re.S):
            scope[m.group(1)] = eval(_python_expr(m.group(2)), {}, dict(scope))  # noqa: S307 - our own source
        elif m := re.fullmatch(r"set_fp16\(opt, (.*)\)", statement, re.S):
            values = [eval(_python_expr(a), {}, dict(scope)) for a in m.group(1).split(",")]  # noqa: S307
            flags.update({flag: values[index] for flag, index in setter.items()})
        elif m := re.fullmatch(r"set_bf16\(opt, (.*)\)", statement, re.S):  # every flag its body sets to `on`
            value = eval(_python_expr(m.group(1)), {}, dict(scope))  # noqa: S307
            flags.update({flag: value for flag in re.findall(r"opt\.(\w+) = on;", _function_body(source, "void set_bf16("))})
        elif m := re.fullmatch(r"opt\.(\w+) = (.*)", statement, re.S):
            flags[m.group(1)] = eval(_python_expr(m.group(2)), {}, dict(scope))  # noqa: S307
        else:
            raise AssertionError(f"ncnn_engine.cpp apply_precision: a statement this test cannot read: {statement!r}")
    return flags


@pytest.mark.parametrize("precision", v.PRECISIONS)
def test_the_cpp_harness_sets_the_ncnn_table(precision):
    for vulkan, arith, storage_only in itertools.product((False, True), repeat=3):
        fp16 = vulkan or arith or storage_only
        assert cpp_ncnn_flags(precision, vulkan, arith, storage_only) == ncnn_options.ncnn_precision_flags(precision, fp16=fp16), \
            (precision, vulkan, arith, storage_only)


def test_the_host_engine_and_the_sample_runners_set_the_ncnn_table():
    ncnn = pytest.importorskip("ncnn")
    from layerdiff.collector.engines.harness_cli import HarnessArgs
    from layerdiff.collector.engines.ncnn.engine import configure
    from layerdiff.samples.runners import _ncnn_options

    fp16_cpu = ncnn_options.ncnn_cpu_has_fp16(ncnn)
    for backend, precision in itertools.product(("cpu", "vulkan"), v.PRECISIONS):
        expected = {**{f: getattr(ncnn.Option(), f) for f in ncnn_options.NCNN_FP16_FLAGS + ncnn_options.NCNN_BF16_FLAGS
                       if hasattr(ncnn.Option(), f)},
                    **ncnn_options.ncnn_precision_flags(precision, fp16=backend == "vulkan" or fp16_cpu)}
        for set_options in (lambda opt: configure(opt, HarnessArgs(engine="ncnn", models=[], inputs={}, out=Path("."), backend=backend,
                                                                   precision=precision)),
                            lambda opt: _ncnn_options(opt, backend, precision)):
            opt = ncnn.Option()
            set_options(opt)
            got = {f: getattr(opt, f) for f in expected if hasattr(opt, f)}
            assert got == {f: value for f, value in expected.items() if hasattr(opt, f)}, (backend, precision)


def test_the_cpp_harness_knows_the_precisions_in_order():
    source = (HARNESS_SRC / "engine.cpp").read_text()
    body = _function_body(source, "bool known_precision(")
    assert tuple(re.findall(r'precision == "(\w+)"', body)) == v.PRECISIONS


def test_mnn_forward_types_agree_with_the_cpp_harness_and_mnn():
    cases = re.findall(r'case (MNN_FORWARD_\w+): return "(\w+)";',
                       _function_body((HARNESS_SRC / "mnn_backend.cpp").read_text(), "std::string mnn_backend_name("))
    assert len(cases) >= 6
    for enum_name, backend in cases:
        assert mnncodes.MNN_FORWARD_TYPES[mnncodes.MNN_FORWARD_CODES[enum_name]] == backend, enum_name
    assert set(mnncodes.MNN_FORWARD_CODES.values()) == set(mnncodes.MNN_FORWARD_TYPES)
    from layerdiff.analyzer.importers import mnn_log
    from layerdiff.collector.engines.mnn import session

    assert mnn_log.FORWARD_TYPES is mnncodes.MNN_FORWARD_TYPES and session.FORWARD_TYPES is mnncodes.MNN_FORWARD_TYPES
    for line, backend in (("Use extra forward type: 13", "cpu"), ("Use extra forward type: 5", "nn"),
                          ("Use extra forward type: 4", "auto")):
        log = mnn_log.MnnLog()
        mnn_log._parse_attr_line(line, log)
        assert log.attrs["backend_requested"] == backend


def test_one_host_abi_map():
    assert v.host_abi("x86_64") == v.host_abi("AMD64") == "x86_64"
    assert v.host_abi("aarch64") == v.host_abi("arm64") == "arm64-v8a"
    offenders = [str(p.relative_to(REPO)) for folder in ("collector", "analyzer", "samples")
                 for p in (REPO / folder).rglob("*.py") if '"aarch64": "arm64-v8a"' in p.read_text()]
    assert not offenders, offenders


def test_cli_backends_are_the_vocabulary_in_order():
    from layerdiff.collector import cli

    assert cli.BACKENDS == tuple(b for b in v.BACKENDS if b in cli.BACKENDS) and "cpu" in cli.BACKENDS
    assert cli.PRECISIONS == v.PRECISIONS


def test_the_cpp_harness_knows_the_harness_backends_in_order():
    body = _function_body((HARNESS_SRC / "engine.cpp").read_text(), "bool known_backend(")
    assert tuple(re.findall(r'backend == "(\w+)"', body)) == v.HARNESS_BACKENDS
    usage = (HARNESS_SRC / "options.cpp").read_text()
    assert f"--backend {'|'.join(v.HARNESS_BACKENDS)} --precision {'|'.join(v.PRECISIONS)}" in usage
