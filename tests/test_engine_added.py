"""Adding a local Python engine is its folder and one registration line: nothing else in layerdiff changes.

The product's folders are copied as the installed package lays them out (layerdiff/, with collector/ and
analyzer/ inside), a new engine folder is added beside the others, and its folder name is added to
`ENGINE_FOLDERS`. The engine is a real one: ONNX Runtime as an app's session runs it (every graph optimisation
on), made of the ort folder's code. `collect` and `analyze` then run from the copy in their own processes.
"""
from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from layerdiff.analyzer.formats.dumpfile import DumpFile
from tests.conftest import MODELS, SAMPLES

REPO = Path(__file__).resolve().parent.parent
ROOMS = {"layerdiff": "layerdiff", "collector": "layerdiff/collector", "analyzer": "layerdiff/analyzer"}
FOLDER = "ortapp"
NAME = "ortapp"

INIT = f'''"""collector/engines/{FOLDER}: ONNX Runtime as an app's session runs it (graph optimisations on)."""
from __future__ import annotations

from layerdiff.collector.engines.base import Engine
from layerdiff.collector.engines.ort import _input_specs

ENGINE = Engine("{NAME}", (".onnx",), _input_specs, distribution="onnxruntime", library="onnxruntime", extra="onnx",
                model_help=".onnx (ONNX Runtime with every graph optimisation, as apps run it)")
'''

ENGINE_PY = f'''"""The ort folder's host engine with ONNX Runtime's graph optimisations all on."""
from __future__ import annotations

import os
import sys

from layerdiff.collector.engines.harness_cli import harness_main
from layerdiff.collector.engines.ort import engine as ort


def probe() -> dict:
    found = ort.probe()
    found["engines"] = {{"{NAME}": next(iter(found["engines"].values()))}}
    return found


def main() -> int:
    os.environ[ort.OPTIMIZATION_ENV] = "all"
    return harness_main("{NAME}", ort.run, probe, ort.engine_version)


if __name__ == "__main__":
    sys.exit(main())
'''


def copy_product(root: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for source, target in ROOMS.items():
        shutil.copytree(REPO / source, root / target, ignore=ignore, dirs_exist_ok=True)


def add_engine(root: Path) -> None:
    folder = root / "layerdiff" / "collector" / "engines" / FOLDER
    folder.mkdir()
    (folder / "__init__.py").write_text(INIT)
    (folder / "engine.py").write_text(ENGINE_PY)
    registry = root / "layerdiff" / "collector" / "engines" / "__init__.py"
    text = registry.read_text()
    line = next(line for line in text.splitlines() if line.startswith("ENGINE_FOLDERS = ("))
    registry.write_text(text.replace(line, line.replace('"ggml")', f'"ggml", "{FOLDER}")'), 1))


def changed_files(root: Path) -> list[str]:
    """Files of the copy that differ from the product's, or are new, relative to the copy."""
    found = []
    nested = [root / target for target in ROOMS.values() if target != "layerdiff"]
    for source, target in ROOMS.items():
        for path in sorted((root / target).rglob("*")):
            inside_another = source == "layerdiff" and any(room in path.parents for room in nested)
            if path.is_file() and "__pycache__" not in path.parts and not inside_another:
                original = REPO / source / path.relative_to(root / target)
                if not original.is_file() or not filecmp.cmp(path, original, shallow=False):
                    found.append(str(path.relative_to(root)))
    return found


def run(root: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, env=env, cwd=root)


def lines_changed(path: Path, original: Path) -> int:
    new, old = path.read_text().splitlines(), original.read_text().splitlines()
    return sum(a != b for a, b in zip(new, old)) + abs(len(new) - len(old))


def test_a_local_engine_added_as_its_folder_and_one_line_collects_and_is_analyzed(tmp_path):
    root = tmp_path / "installed"
    copy_product(root)
    add_engine(root)
    registry = "layerdiff/collector/engines/__init__.py"
    assert changed_files(root) == [registry, f"layerdiff/collector/engines/{FOLDER}/__init__.py",
                                   f"layerdiff/collector/engines/{FOLDER}/engine.py"]
    assert lines_changed(root / registry, REPO / "collector" / "engines" / "__init__.py") == 1

    found = run(root, "-c", "import layerdiff.collector.engines as e; print(e.__file__, list(e.ENGINES))")
    assert found.returncode == 0 and str(root) in found.stdout and NAME in found.stdout, found.stdout + found.stderr
    out = tmp_path / "runs"
    for engine in ("onnxruntime", NAME):
        collected = run(root, "-m", "layerdiff.collector.cli", "--device", "local", "--engine", engine, "--model",
                        str(MODELS / "convnet.onnx"), "--config", "cpu/high", "--input",
                        str(SAMPLES / "inputs" / "convnet.npy"), "-o", str(out))
        assert collected.returncode == 0, collected.stderr
    dumps = {DumpFile(path).attrs["engine"]: path for path in out.glob("*.h5")}
    assert set(dumps) == {"onnxruntime", NAME}, sorted(out.iterdir())
    with DumpFile(dumps[NAME]) as dump:
        assert len(dump.layers) > 3 and dump.attrs["complete"]

    report = tmp_path / "report"
    analyzed = run(root, "-m", "layerdiff.analyzer.cli.app", str(out), "-o", str(report), "--json")
    assert analyzed.returncode in (0, 1), analyzed.stderr
    summary = json.loads(analyzed.stdout)
    assert NAME in json.dumps(summary) and (report / "index.html").is_file()
