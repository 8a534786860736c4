"""What the repro tests share: a venv holding only an engine's wheel and numpy, and the bundle's runner run in it.

The runner is what an engine's maintainer runs, so it is run the way they would: a venv without system
site-packages and without layerdiff, from outside the worktree, with no PYTHON* variable pointing back.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import REPO


def pin(extra: str, dist: str) -> str:
    """`dist==version` as pyproject.toml's extra pins it, else the version installed here."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pinned = next((req for req in extras[extra] if req.startswith(f"{dist}==")), None)
    return pinned or f"{dist}=={importlib.metadata.version(dist)}"


def bare_venv(root: Path, *requirements: str) -> Path:
    """A venv without system site-packages holding only `requirements`; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, capture_output=True, timeout=300)
    python = root / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    lacks = subprocess.run([str(python), "-c", "import layerdiff"], capture_output=True, timeout=60, cwd="/", env=bare_env())
    assert lacks.returncode != 0  # the venv really lacks layerdiff
    return python


def bare_env() -> dict[str, str]:
    """The environment without anything that would put layerdiff on the path."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}


def run_bundle(python: Path, bundle: Path, *extra: str) -> dict:
    """The bundle's `run_repro.py --json` under `python`, from outside the bundle and the worktree."""
    done = subprocess.run([str(python), str(bundle / "run_repro.py"), "--json", *extra], capture_output=True, text=True,
                          timeout=600, cwd="/", env=bare_env())
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)
