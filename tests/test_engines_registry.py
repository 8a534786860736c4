"""Engines as plug-ins: each registered folder declares its Engine and implements the host engine;
the registry is cheap to import; a new engine is its folder plus one registry name, nothing else."""
from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest

from layerdiff.collector import engines as registry
from layerdiff.collector.engines import ENGINE_FOLDERS, ENGINES
from layerdiff.collector.engines.base import Engine
from layerdiff.vocabulary import BACKENDS
from tests.faults.support import REPO

HEAVY = ("numpy", "MNN", "ncnn", "onnx", "onnxruntime", "paddle", "ai_edge_litert", "h5py")


def test_every_folder_declares_an_engine_and_its_host_engine():
    assert len(ENGINES) == len(ENGINE_FOLDERS)
    for folder in ENGINE_FOLDERS:
        engine = ENGINES[importlib.import_module(f"layerdiff.collector.engines.{folder}").ENGINE.name]
        assert engine.package == f"layerdiff.collector.engines.{folder}"
        host = importlib.import_module(engine.host_module)  # engine libraries themselves load lazily
        for function in ("probe", "run", "engine_version", "main"):
            assert callable(getattr(host, function, None)), f"{folder}/engine.py lacks {function}()"
        assert "harness_main(" in (REPO / "collector" / "engines" / folder / "engine.py").read_text()
        assert engine.suffixes and all(s.startswith(".") for s in engine.suffixes)
        assert set(engine.backends) <= set(BACKENDS) and "cpu" in engine.backends
    suffixes = [s for e in ENGINES.values() for s in e.suffixes]
    assert len(suffixes) == len(set(suffixes)), "two engines claim one suffix"


def test_the_registry_imports_no_engine_library():
    """`collect --help` and model resolution read the registry: it must not load numpy or an engine."""
    code = ("import sys, layerdiff.collector.engines as r; r.ENGINES; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "", loaded


def test_suffixes_and_companion_files_come_from_the_engines(tmp_path):
    from layerdiff.collector.inputs.modelfiles import resolve_model

    samples = REPO / "samples" / "models"
    ncnn = resolve_model(samples / "convnet.bin")
    assert (ncnn.engine, [f.name for f in ncnn.files]) == ("ncnn", ["convnet.param", "convnet.bin"])
    assert resolve_model(samples / "convnet.mnn").engine == "mnn"
    assert resolve_model(samples / "convnet.onnx").engine == "onnxruntime"


def test_a_new_engine_is_its_folder_and_one_registry_name(tmp_path, monkeypatch):
    """A toy engine in a folder of its own resolves models, declares inputs and gets a local harness
    through the registry alone (the interface; tests/test_local_engines.py runs the real ones)."""
    folder = tmp_path / "toy"
    folder.mkdir()
    (folder / "__init__.py").write_text(textwrap.dedent('''
        from layerdiff.collector.engines.base import Engine

        def _model_files(path):
            return [path, path.with_suffix(".weights")]

        ENGINE = Engine("toy", (".toy",), lambda path: {"x": ((1, 3), "float32")}, model_files=_model_files,
                        backends=("cpu",))
    '''))
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(tmp_path)])
    toy = registry._declared("toy")
    monkeypatch.setitem(ENGINES, "toy", toy)
    model = tmp_path / "net.toy"
    model.write_text("toy")

    from layerdiff.collector.inputs.modelfiles import input_specs, resolve_model
    from layerdiff.collector.transport.devices import LocalDevice

    files = resolve_model(model)
    assert files.engine == "toy" and files.files == [model, tmp_path / "net.weights"]
    assert input_specs(files) == {"x": ((1, 3), "float32")}
    harness = LocalDevice().prepare_harness("toy")
    assert harness.argv[-2:] == ["-m", "layerdiff.collector.engines.toy.engine"]
    sys.modules.pop("layerdiff.collector.engines.toy", None)


def test_an_unknown_backend_name_is_refused_at_registration(tmp_path, monkeypatch):
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "__init__.py").write_text("from layerdiff.collector.engines.base import Engine\n"
                                        "ENGINE = Engine('odd', ('.odd',), dict, backends=('cpu', 'metal'))\n")
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(tmp_path)])
    with pytest.raises(RuntimeError, match="metal"):
        registry._declared("odd")
    sys.modules.pop("layerdiff.collector.engines.odd", None)


def test_engine_is_frozen_and_host_module_follows_the_folder():
    engine = Engine("x", (".x",), dict, package="layerdiff.collector.engines.x")
    assert engine.host_module == "layerdiff.collector.engines.x.engine" and not engine.on_arm64
    assert ENGINES["mnn"].on_arm64 and ENGINES["ncnn"].on_phones and not ENGINES["onnxruntime"].on_phones
