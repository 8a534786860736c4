#!/usr/bin/env python3
"""Fetch and unpack ncnn's source distribution from PyPI.

Why this exists: the ncnn sdist on PyPI carries the full C++ tree (with glslang), which is all
we need to build the harness, but `pip download --no-binary :all: ncnn` fails while generating
metadata. So we ask the package index's JSON API for the sdist URL (which may be relative to the
index: resolve it), download it, check its sha256 and unpack it.

Usage: fetch_ncnn_source.py DEST_DIR [--version V]   -> prints the unpacked source directory.
Stdlib only, so the build scripts can run it before anything is installed.
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

DEFAULT_VERSION = "1.0.20261020"
INDEX_JSON = os.environ.get("LAYERDIFF_PYPI_JSON", "https://pypi.org/pypi")


def sdist_url(version: str) -> tuple[str, str]:
    """Return (absolute URL, sha256) of ncnn's sdist for `version` from the JSON API.

    Uses the project endpoint (`/pypi/ncnn/json`, its `releases` table) because some index
    mirrors do not serve the per-version endpoint.
    """
    api = f"{INDEX_JSON}/ncnn/json"
    with urllib.request.urlopen(api, timeout=120) as reply:
        meta = json.load(reply)
    for entry in meta.get("releases", {}).get(version, []):
        if entry.get("packagetype") == "sdist":
            return urljoin(api, entry["url"]), entry["digests"]["sha256"]
    raise SystemExit(f"fetch_ncnn_source: PyPI lists no sdist for ncnn {version} ({api})")


def download(url: str, sha256: str, target: str) -> None:
    """Download to `target` and refuse a file whose sha256 differs from the index's."""
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=600) as reply, open(target, "wb") as out:
        while chunk := reply.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise SystemExit(f"fetch_ncnn_source: sha256 mismatch for {url}; retry or check the index")


def fetch(dest: str, version: str) -> str:
    """Unpack ncnn-<version> under `dest` (once; atomically via rename) and return its path."""
    final = os.path.join(dest, f"ncnn-{version}")
    if os.path.isfile(os.path.join(final, "CMakeLists.txt")):
        return final
    os.makedirs(dest, exist_ok=True)
    url, sha = sdist_url(version)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".fetch-") as tmp:
        archive = os.path.join(tmp, "ncnn.tar.gz")
        download(url, sha, archive)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        unpacked = os.path.join(tmp, f"ncnn-{version}")
        if not os.path.isfile(os.path.join(unpacked, "CMakeLists.txt")):
            raise SystemExit(f"fetch_ncnn_source: {url} holds no ncnn-{version}/CMakeLists.txt")
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
    parser.add_argument("--version", default=os.environ.get("NCNN_VERSION", DEFAULT_VERSION))
    args = parser.parse_args()
    try:
        print(fetch(args.dest, args.version))
    except OSError as err:
        sys.exit(f"fetch_ncnn_source: cannot fetch ncnn {args.version}: {err}")


if __name__ == "__main__":
    main()
