"""What a user installs: the wheel built from the sdist, in fresh venvs, used from an unrelated directory.

Why here and not only in a developer's checkout: a checkout hides undeclared imports (whatever the
machine's Python happens to have), files the wheel leaves out, and paths that only resolve next to
the sources. Each venv holds the declared dependencies and nothing else (no system site-packages),
every command runs from a temporary directory with PYTHONPATH unset, and the harness is compiled
from the installed package's own sources. Two installs, as two kinds of user make them: the core
(`pip install layerdiff`: the analyzer and the phone collector, no engine) and `layerdiff[local]`
(the engines the quick start runs on this host).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from layerdiff.collector.engines.ncnn.harness import NCNN_VERSION, ncnn_key, ncnn_spec
from layerdiff.collector.harness.build import HarnessSpec, cache_root, ensure_built
from tests.conftest import REPO

pytestmark = pytest.mark.slow

# import names of the optional extras' packages: a module may need them only if it is not part of the tool
OPTIONAL_IMPORTS = {"onnx", "google", "pytest", "hypothesis", "polygraphy", "build",
                    "MNN", "ncnn", "onnxruntime", "ai_edge_litert", "gguf", "paddle"}
EXTRAS = ("mnn", "ncnn", "onnx", "litert", "ggml", "paddle", "local")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def _run(cmd: list, cwd: Path, timeout: float = 900, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=_clean_env(**env))


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """sdist, and the wheel `python -m build` makes *from that sdist* (what pip does with a .tar.gz)."""
    out = tmp_path_factory.mktemp("dist")
    built = _run([sys.executable, "-m", "build", "--outdir", out, REPO], cwd=out)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return {"sdist": next(out.glob("layerdiff-*.tar.gz")), "wheel": next(out.glob("layerdiff-*.whl"))}


def _fresh_venv(root: Path, requirement: str) -> Path:
    """A venv (no system site-packages) with only `requirement` and what it declares."""
    made = _run([sys.executable, "-m", "venv", root], cwd=root.parent)
    assert made.returncode == 0, made.stderr
    pip = _run([root / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement],
               cwd=root.parent, timeout=1800)
    assert pip.returncode == 0, pip.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def venv(dists, tmp_path_factory) -> Path:
    """The core install: the wheel and its declared dependencies, no engine."""
    return _fresh_venv(tmp_path_factory.mktemp("venv") / "v", str(dists["wheel"]))


@pytest.fixture(scope="module")
def local_venv(dists, tmp_path_factory) -> Path:
    """`pip install 'layerdiff[local]'`: the core and the engines of the `local` device."""
    return _fresh_venv(tmp_path_factory.mktemp("venv-local") / "v", f"{dists['wheel']}[local]")


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """An unrelated working directory: nothing of the checkout can be found from here."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    return work


def test_the_wheel_carries_samples_and_everything_to_build_the_harness(dists):
    names = set(zipfile.ZipFile(dists["wheel"]).namelist())
    assert {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")} == {"layerdiff"}
    for needed in ("samples/models/convnet.param", "samples/models/convnet.bin", "samples/models/convnet.mnn",
                   "samples/inputs/convnet.npy", "device_scripts/harness/CMakeLists.txt",
                   "device_scripts/harness/src/main.cpp", "device_scripts/build_host.sh",
                   "device_scripts/build_aarch64.sh", "device_scripts/build_common.sh",
                   "device_scripts/cmake/aarch64-linux-gnu.toolchain.cmake", "device_scripts/fetch_ncnn_source.py",
                   "analyzer/FORMATS.md"):
        needed = f"layerdiff/{needed}"  # one top-level import package: every folder lives under layerdiff/
        assert needed in names, needed


def test_the_sdist_gives_the_same_package_as_the_checkout(dists, tmp_path):
    """pip install of the .tar.gz and of the checkout install the same files (the sdist drops nothing)."""
    direct = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path, REPO], cwd=tmp_path)
    assert direct.returncode == 0, direct.stderr[-2000:]
    from_checkout = set(zipfile.ZipFile(next(tmp_path.glob("layerdiff-*.whl"))).namelist())
    from_sdist = set(zipfile.ZipFile(dists["wheel"]).namelist())
    assert from_sdist == from_checkout, sorted(from_sdist ^ from_checkout)


def test_every_module_imports_with_only_the_declared_dependencies(venv, elsewhere):
    script = r"""
import importlib, json, pkgutil
result = {}
for package in ("layerdiff", "layerdiff.collector", "layerdiff.analyzer", "layerdiff.samples", "layerdiff.device_scripts"):
    module = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(module.__path__, package + ".")
                         if not m.name.endswith(".__main__")]  # `python -m` entry points run their CLI
    for name in names:
        try:
            importlib.import_module(name)
            result[name] = None
        except ModuleNotFoundError as err:
            result[name] = err.name
print(json.dumps(result))
"""
    proc = _run([venv / "bin" / "python", "-c", script], cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    modules = json.loads(proc.stdout)
    assert "layerdiff.collector.cli" in modules and "layerdiff.analyzer.cli.app" in modules and "layerdiff.collector.engines.ncnn.engine" in modules
    missing = {name: dep for name, dep in modules.items() if dep}
    tool_modules = {n: d for n, d in missing.items() if n.split(".")[:2] in (["layerdiff", "collector"], ["layerdiff", "analyzer"])}
    assert tool_modules == {}, f"the tool imports undeclared packages: {tool_modules}"
    undeclared = {n: d for n, d in missing.items() if d.split(".")[0] not in OPTIONAL_IMPORTS}
    assert undeclared == {}, f"imports that no extra declares: {undeclared}"


def _command_paths(venv: Path, cwd: Path) -> list[list[str]]:
    script = r"""
import json, typer.main
import layerdiff.collector.cli, layerdiff.analyzer.cli.app
def walk(cmd, path):  # through the groups' own listing: a sub-command may be imported only when asked for
    yield path
    if hasattr(cmd, "list_commands"):
        ctx = typer.Context(cmd)
        for name in sorted(cmd.list_commands(ctx)):
            yield from walk(cmd.get_command(ctx, name), path + [name])
paths = list(walk(typer.main.get_command(layerdiff.collector.cli.app), ["collect"]))
paths += list(walk(typer.main.get_command(layerdiff.analyzer.cli.app.app), ["analyze"]))
print(json.dumps(paths))
"""
    proc = _run([venv / "bin" / "python", "-c", script], cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_help_of_every_command_and_subcommand(venv, elsewhere):
    paths = _command_paths(venv, elsewhere)
    assert ["collect", "isolate"] in paths and ["collect", "prepare"] in paths and ["analyze", "inspect"] in paths
    assert ["analyze", "merge"] in paths and ["analyze", "cache", "clean"] in paths  # imported when asked for
    for prog, *sub in paths:
        proc = _run([venv / "bin" / prog, *sub, "--help"], cwd=elsewhere)
        assert proc.returncode == 0 and proc.stdout.startswith("Usage:"), (prog, sub, proc.stderr)


@pytest.mark.parametrize("args", [["collect", "--bogus-flag"], ["collect", "--threads", "abc", "-o", "x"],
                                  ["analyze", "--bogus-flag"]])
def test_usage_errors_exit_2_without_a_traceback(venv, elsewhere, args):
    proc = _run([venv / "bin" / args[0], *args[1:]], cwd=elsewhere)
    assert proc.returncode == 2, proc.stderr
    assert re.search(r"^Usage: ", proc.stderr, re.M) and "Error:" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_the_wheel_metadata_declares_the_core_and_one_extra_per_engine(dists):
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    extras = re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M)
    assert set(EXTRAS) <= set(extras), extras
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
    core = {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0].lower() for r in requires if "extra ==" not in r}
    assert core >= {"adbutils", "numpy", "h5py", "pandas", "typer", "rich", "matplotlib"}
    assert not core & {"mnn", "ncnn", "onnxruntime", "onnx", "ai-edge-litert", "paddlepaddle", "gguf"}, core
    assert any(r.startswith("MNN") and 'extra == "mnn"' in r for r in requires), requires


def test_the_core_install_names_the_extra_a_local_engine_needs(venv, elsewhere):
    proc = _run([venv / "bin" / "collect", "--device", "local", "--backend", "cpu", "-o", "out"], cwd=elsewhere)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'layerdiff[ncnn]'" in lines[0], proc.stderr
    mnn = _run([venv / "bin" / "collect", "--device", "local", "--model",
                _site(venv) / "layerdiff" / "samples" / "models" / "convnet.mnn", "-o", "out"], cwd=elsewhere)
    assert mnn.returncode == 1 and "pip install 'layerdiff[mnn]'" in mnn.stderr, mnn.stderr
    assert "Traceback" not in proc.stderr + mnn.stderr


def test_the_core_install_analyzes_dumps_colleagues_send(venv, elsewhere):
    """No engine installed: the bundled sample dumps (HDF5) and an .npz pair are analyzed into a report."""
    import numpy as np

    dumps = _site(venv) / "layerdiff" / "samples" / "dumps"
    proc = _run([venv / "bin" / "analyze", dumps, "-o", "rep"], cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (elsewhere / "rep" / "index.html").stat().st_size > 10_000
    rng = np.random.default_rng(0)
    layers = {"conv1": rng.standard_normal((1, 8, 4, 4)).astype(np.float32)}
    np.savez(elsewhere / "theirs_cpu.npz", **layers)
    np.savez(elsewhere / "theirs_gpu.npz", **{k: v + 0.5 for k, v in layers.items()})
    pair = _run([venv / "bin" / "analyze", "theirs_cpu.npz", "theirs_gpu.npz", "-o", "rep2"], cwd=elsewhere)
    assert pair.returncode == 0, pair.stderr[-3000:]
    assert "fail" in pair.stdout.lower()


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def test_quick_start_from_an_unrelated_directory(local_venv, elsewhere):
    """The README's main job: the bundled sample on the local device, high and low, then the report."""
    venv = local_venv
    collected = _run([venv / "bin" / "collect", "--device", "local", "--backend", "cpu", "--precision", "high,low",
                      "-o", "out", "--no-report"], cwd=elsewhere)
    assert collected.returncode == 0, collected.stderr
    assert sorted(p.name for p in (elsewhere / "out").glob("*.h5")) == ["ncnn_cpu_high_random0.h5",
                                                                       "ncnn_cpu_low_random0.h5"]
    analyzed = _run([venv / "bin" / "analyze", "out", "-o", "rep"], cwd=elsewhere)
    assert analyzed.returncode == 0, analyzed.stderr
    assert (elsewhere / "rep" / "index.html").stat().st_size > 10_000


def _cache_sharing_ncnn(tmp_path: Path, specs: list[HarnessSpec]) -> Path:
    """A harness cache with nothing but the ncnn builds (and source) of the main cache.

    The installed package then compiles the harness itself from its own sources (about a minute),
    without rebuilding ncnn, which the rest of the suite already built for these targets.
    """
    cache = tmp_path / "cache"
    (cache / "harness").mkdir(parents=True)
    main = cache_root() / "harness"
    for spec in specs:
        ensure_built(spec)  # the main cache's ncnn (and a harness) for this target, as the suite uses them
        name = f"ncnn-{spec.target}-{ncnn_key(spec.target, spec.vulkan, spec.test_build)}"
        (cache / "harness" / name).symlink_to(main / name)
    (cache / "harness" / "src").mkdir()
    (cache / "harness" / "src" / f"ncnn-{NCNN_VERSION}").symlink_to(main / "src" / f"ncnn-{NCNN_VERSION}")
    return cache


def test_collect_through_adb_builds_the_harness_from_the_installed_package(venv, elsewhere, standins, tmp_path):
    """x86_64 and arm64 stand-ins on the real adb server; harness builds (host, static aarch64) from the venv."""
    specs = [ncnn_spec("host", vulkan=True, test_build=True), ncnn_spec("aarch64", test_build=True)]
    cache = _cache_sharing_ncnn(tmp_path, specs)
    phones = [standins.start(), standins.start(abi="arm64-v8a")]
    for phone in phones:
        proc = _run([venv / "bin" / "collect", "--device", phone.serial, "--backend", "cpu", "--precision", "high",
                     "-o", f"out-{phone.serial.replace(':', '_')}"], cwd=elsewhere, timeout=1800,
                    LAYERDIFF_CACHE=str(cache), LAYERDIFF_HARNESS_TEST_BUILD="1")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "harness: building the" in proc.stderr and "harness: built after" in proc.stderr
        assert list((elsewhere / f"out-{phone.serial.replace(':', '_')}").glob("ncnn_cpu_high_random0.h5"))
    site = next((venv / "lib").glob("python3*/site-packages"))
    builds = sorted((cache / "harness").glob("*/builds.txt"))
    assert len(builds) == 2
    for log in builds:
        assert str(site / "layerdiff" / "device_scripts") in log.read_text()  # built from the installed sources
