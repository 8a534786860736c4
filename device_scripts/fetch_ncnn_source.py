#!/usr/bin/env python3
"""Fetch and unpack ncnn's source distribution from PyPI.

Why this exists: the ncnn sdist on PyPI carries the full C++ tree (with glslang), which is all
we need to build the harness, but `pip download --no-binary :all: ncnn` fails while generating
metadata. So we ask the package index's JSON API for the sdist URL (which may be relative to the
index: resolve it), download it, check its sha256 and unpack it.

Usage: fetch_ncnn_source.py DEST_DIR [--version V]   -> prints the unpacked source directory.
       fetch_ncnn_source.py --list                    -> prints the releases with an sdist, one a line.
Stdlib only, so the build scripts can run it before anything is installed.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fetch_sdist import fetch_unpacked, sdist_releases, sdist_url as _sdist_url  # noqa: E402  (stdlib-only sibling)

DEFAULT_VERSION = "1.0.20261020"


def sdist_url(version: str) -> tuple[str, str]:
    """(absolute URL, sha256) of ncnn's sdist for `version` from the JSON API."""
    return _sdist_url("ncnn", version, "fetch_ncnn_source")


def fetch(dest: str, version: str) -> str:
    """Unpack ncnn-<version> under `dest` (once; atomically via rename) and return its path."""
    return fetch_unpacked(dest, f"ncnn-{version}", "CMakeLists.txt", "ncnn", version, "fetch_ncnn_source",
                          unpacked_name=f"ncnn-{version}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", nargs="?")
    parser.add_argument("--version", default=os.environ.get("NCNN_VERSION", DEFAULT_VERSION))
    parser.add_argument("--list", action="store_true", help="print the releases with an sdist, one a line")
    args = parser.parse_args()
    if not args.list and not args.dest:
        parser.error("give DEST_DIR, or --list")
    try:
        print("\n".join(sdist_releases("ncnn")) if args.list else fetch(args.dest, args.version))
    except OSError as err:
        sys.exit(f"fetch_ncnn_source: cannot fetch ncnn {args.version}: {err}")


if __name__ == "__main__":
    main()
