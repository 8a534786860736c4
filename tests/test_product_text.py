"""Product text speaks to users about the product: README, docs, messages, comments, test names and
docstrings never speak of work sessions, tracker issue numbers or the machine the product was developed on."""
from __future__ import annotations

import re
import subprocess

from tests.conftest import REPO

# (spelled in pieces, so this file does not match itself)
FORBIDDEN = re.compile("|".join((r"\bsessions? ?\d+", r"\bissues? #?\d{1,4}\b", r"\bthis " + "machine\\b",
                                 r"\bdevelopment " + "machine\\b", r"\(" + "issue:")), re.IGNORECASE)
BINARY_SUFFIXES = (".png", ".h5", ".bin", ".mnn", ".npy", ".npz", ".gguf", ".tflite", ".onnx", ".zip")


def tracked_text_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [name for name in listed if not name.startswith(".ci/") and not name.endswith(BINARY_SUFFIXES)]


def test_no_product_text_speaks_of_sessions_issue_numbers_or_the_development_machine():
    hits = []
    for name in tracked_text_files():
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        hits += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in FORBIDDEN.finditer(text)]
    assert not hits, "product text speaks of development history:\n" + "\n".join(hits[:40])


def test_the_readme_is_for_users_and_short():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move reference material to docs/"
