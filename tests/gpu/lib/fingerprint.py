"""A hash of the layerdiff sources the package is built from, the same here and on the GPU machine.

--here: the files git would send (tracked + untracked-not-ignored; what the device call copies);
--device: the files on disk in the travelled tree (no .git needed). Prints: <sha256> <file count>.
"""
import hashlib
import os
import subprocess
import sys

PARTS = ("collector", "analyzer", "layerdiff", "samples", "device_scripts", "pyproject.toml", "setup.py", "MANIFEST.in")
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".hypothesis", ".layerdiff-cache"}


def here() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *PARTS],
                         capture_output=True, check=True).stdout.decode()
    return sorted(p for p in set(out.split("\0")) if p and os.path.isfile(p))


def device() -> list[str]:
    files = []
    for part in PARTS:
        if os.path.isfile(part):
            files.append(part)
            continue
        for top, dirs, names in os.walk(part):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
            files += [os.path.join(top, n) for n in names if not n.endswith((".pyc", ".partial"))]
    return sorted(files)


def digest(files: list[str]) -> str:
    h = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            h.update(path.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


if __name__ == "__main__":
    files = here() if "--here" in sys.argv else device()
    if "--list" in sys.argv:
        print("\n".join(files))
    else:
        print(digest(files), len(files))
