"""Engines as plug-ins: each registered folder declares its Engine and implements the host engine;
the registry is cheap to import; a new engine is its folder plus one registry name, nothing else."""
from __future__ import annotations

import importlib
import json
import os
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


def test_a_new_engine_is_its_folder_and_one_registry_name(tmp_path):
    """A toy engine in a folder of its own resolves models, declares inputs and gets a local harness
    through the registry alone (the interface; tests/test_local_engines.py runs the real ones).

    It runs in a child Python, as `collect` would: the model reader's own child must see the toy folder,
    and this test process may hold other threads (a harness build), where the reader starts a fresh Python
    that knows only the installed folders."""
    folder = tmp_path / "toy"
    folder.mkdir()
    (folder / "__init__.py").write_text(textwrap.dedent('''
        from layerdiff.collector.engines.base import Engine

        def _model_files(path):
            return [path, path.with_suffix(".weights")]

        ENGINE = Engine("toy", (".toy",), lambda path: {"x": ((1, 3), "float32")}, model_files=_model_files,
                        backends=("cpu",))
    '''))
    model = tmp_path / "net.toy"
    model.write_text("toy")
    script = textwrap.dedent(f'''
        import json, sys
        from layerdiff.collector import engines as registry
        registry.__path__.append({str(tmp_path)!r})
        registry.ENGINES["toy"] = registry._declared("toy")
        from layerdiff.collector.inputs.modelfiles import input_specs, resolve_model
        from layerdiff.collector.transport.devices import LocalDevice
        files = resolve_model({str(model)!r})
        print(json.dumps({{"engine": files.engine, "files": [str(f) for f in files.files],
                          "specs": {{k: [list(v[0]), v[1]] for k, v in input_specs(files).items()}},
                          "harness": LocalDevice().prepare_harness("toy").argv[-2:]}}))
    ''')
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LAYERDIFF_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout)
    assert answer["engine"] == "toy" and answer["files"] == [str(model), str(tmp_path / "net.weights")]
    assert answer["specs"] == {"x": [[1, 3], "float32"]}
    assert answer["harness"] == ["-m", "layerdiff.collector.engines.toy.engine"]


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
