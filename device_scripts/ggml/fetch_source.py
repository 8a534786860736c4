#!/usr/bin/env python3
"""Fetch llama.cpp (with ggml) from llama-cpp-python's source distribution on PyPI and unpack it.

Why this package: llama-cpp-python's sdist vendors llama.cpp and ggml whole (vendor/llama.cpp), and
PyPI is the one source of code we may fetch. ggml-python's sdist (3.4 MB) carries ggml only, without
llama.cpp's graph builders, so it cannot run a GGUF language model. Only the parts the build needs are
unpacked (CMake files, include/, src/, ggml/, vendor/): not the 75 MB of vocabularies, docs and tools.

Usage: fetch_source.py DEST_DIR --version V   -> prints the unpacked llama.cpp directory.
       fetch_source.py --list                  -> prints the releases with an sdist, one a line.
The release built by default is collector/engines/ggml/build.py's PINNED_RELEASE (its one source of truth).
Stdlib only, so the build script can run it before anything is installed.
"""
from __future__ import annotations

import argparse
import os
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fetch_sdist import fetch_unpacked, sdist_releases  # noqa: E402  (stdlib-only, device_scripts/fetch_sdist.py)

PROJECT = "llama-cpp-python"
KEEP = ("CMakeLists.txt", "LICENSE", "cmake/", "include/", "src/", "ggml/", "vendor/", "common/", "licenses/")


def _members(tar: tarfile.TarFile, prefix: str):
    """The archive members under vendor/llama.cpp/ that the build needs, renamed to llama.cpp/..."""
    for member in tar:
        if not member.name.startswith(prefix):
            continue
        rel = member.name[len(prefix):]
        if rel and rel.startswith(KEEP) and (member.isfile() or member.isdir()):
            member.name = "llama.cpp/" + rel
            yield member


def fetch(dest: str, version: str) -> str:
    """Unpack llama.cpp of llama-cpp-python <version> under `dest` (once, atomically) and return it."""
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    return fetch_unpacked(dest, f"llama.cpp-{version}", os.path.join("include", "llama.h"), PROJECT, version,
                          "fetch_source", unpacked_name="llama.cpp", members=lambda tar: _members(tar, prefix))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", nargs="?")
    parser.add_argument("--version")
    parser.add_argument("--list", action="store_true", help="print the releases with an sdist, one a line")
    args = parser.parse_args()
    if not args.list and not (args.dest and args.version):
        parser.error("give DEST_DIR and --version, or --list")
    try:
        print("\n".join(sdist_releases(PROJECT)) if args.list else fetch(args.dest, args.version))
    except OSError as err:
        sys.exit(f"fetch_source: cannot fetch {PROJECT} {args.version}: {err}")


if __name__ == "__main__":
    main()
