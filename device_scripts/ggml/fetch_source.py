#!/usr/bin/env python3
"""Fetch llama.cpp (with ggml) from llama-cpp-python's source distribution on PyPI and unpack it.

Why this package: llama-cpp-python's sdist vendors llama.cpp and ggml whole (vendor/llama.cpp), and
PyPI is the one source of code we may fetch. ggml-python's sdist (3.4 MB) carries ggml only, without
llama.cpp's graph builders, so it cannot run a GGUF language model. Only the parts the build needs are
unpacked (CMake files, include/, src/, ggml/, vendor/): not the 75 MB of vocabularies, docs and tools.

Usage: fetch_source.py DEST_DIR [--version V]   -> prints the unpacked llama.cpp directory.
Stdlib only, so the build script can run it before anything is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from urllib.parse import urljoin

PROJECT = "llama-cpp-python"
DEFAULT_VERSION = "0.3.36"
INDEX_JSON = os.environ.get("LAYERDIFF_PYPI_JSON", "https://pypi.org/pypi")
KEEP = ("CMakeLists.txt", "LICENSE", "cmake/", "include/", "src/", "ggml/", "vendor/", "common/", "licenses/")


def sdist_url(version: str) -> tuple[str, str]:
    """(absolute URL, sha256) of the sdist for `version`, from the project's JSON (`releases` table)."""
    api = f"{INDEX_JSON}/{PROJECT}/json"
    with urllib.request.urlopen(api, timeout=120) as reply:
        meta = json.load(reply)
    for entry in meta.get("releases", {}).get(version, []):
        if entry.get("packagetype") == "sdist":
            return urljoin(api, entry["url"]), entry["digests"]["sha256"]
    raise SystemExit(f"fetch_source: PyPI lists no sdist for {PROJECT} {version} ({api})")


def download(url: str, sha256: str, target: str) -> None:
    """Download to `target`; refuse a file whose sha256 differs from the index's."""
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=600) as reply, open(target, "wb") as out:
        while chunk := reply.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise SystemExit(f"fetch_source: sha256 mismatch for {url}; retry or check the index")


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
    final = os.path.join(dest, f"llama.cpp-{version}")
    if os.path.isfile(os.path.join(final, "include", "llama.h")):
        return final
    os.makedirs(dest, exist_ok=True)
    url, sha = sdist_url(version)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".fetch-") as tmp:
        archive = os.path.join(tmp, "sdist.tar.gz")
        download(url, sha, archive)
        prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, members=_members(tar, prefix), filter="data")
        unpacked = os.path.join(tmp, "llama.cpp")
        if not os.path.isfile(os.path.join(unpacked, "include", "llama.h")):
            raise SystemExit(f"fetch_source: {url} holds no {prefix}include/llama.h")
        try:
            os.rename(unpacked, final)
        except OSError:
            if not os.path.isdir(final):
                raise
            shutil.rmtree(unpacked, ignore_errors=True)
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest")
    parser.add_argument("--version", default=os.environ.get("LLAMA_CPP_PYTHON_VERSION", DEFAULT_VERSION))
    args = parser.parse_args()
    try:
        print(fetch(args.dest, args.version))
    except OSError as err:
        sys.exit(f"fetch_source: cannot fetch {PROJECT} {args.version}: {err}")


if __name__ == "__main__":
    main()
