"""The house: one import package (`layerdiff`), rooms by stage, no bare stage imports anywhere."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGES = ("analyzer", "collector", "samples", "device_scripts")
BARE_IMPORT = re.compile(rf"^\s*(?:from|import)\s+(?:{'|'.join(STAGES)})(?:[.\s]|$)", re.M)
BARE_MODULE_ARG = re.compile(rf"""["']-m["'],\s*["'](?:{'|'.join(STAGES)})\.""")


def python_files() -> list[Path]:
    skip = {".git", "build", "dist", "__pycache__"}
    return [p for p in REPO.rglob("*.py") if not skip.intersection(p.relative_to(REPO).parts)]


def test_no_file_imports_a_stage_by_its_bare_name():
    offenders = [f"{p.relative_to(REPO)}: {m.group(0).strip()}"
                 for p in python_files() for m in BARE_IMPORT.finditer(p.read_text(errors="replace"))]
    offenders += [f"{p.relative_to(REPO)}: {m.group(0)}"
                  for p in python_files() for m in BARE_MODULE_ARG.finditer(p.read_text(errors="replace"))]
    assert not offenders, "import the stages through `layerdiff.` instead:\n" + "\n".join(offenders)


def test_each_stage_keeps_at_most_eight_modules_at_its_top():
    for stage in ("analyzer", "collector"):
        top = sorted(p.name for p in (REPO / stage).glob("*.py"))
        assert len(top) <= 8, f"{stage}/ has {len(top)} modules at its top: {top}; give them a room"


def test_every_room_is_a_package():
    for stage in ("analyzer", "collector"):
        for folder in (REPO / stage).rglob("*"):
            if folder.is_dir() and folder.name != "__pycache__" and any(folder.glob("*.py")):
                assert (folder / "__init__.py").is_file(), f"{folder.relative_to(REPO)} lacks __init__.py"
