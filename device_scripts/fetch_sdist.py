#!/usr/bin/env python3
"""Fetch a package's source distribution from PyPI and unpack part of it, once and atomically.

Why this exists: the C++ builds take their sources (ncnn; llama.cpp with ggml) from sdists on PyPI, the
one place code may come from, but `pip download --no-binary :all:` fails for them while generating
metadata. So the package index's JSON API names the sdist (its URL may be relative to the index:
resolved here), the download is checked against the index's sha256, and the wanted members are
unpacked into a temporary folder that is renamed into place only when complete.
Stdlib only, so the build scripts can run it before anything is installed.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from urllib.parse import urljoin

INDEX_JSON = os.environ.get("LAYERDIFF_PYPI_JSON", "https://pypi.org/pypi")


def sdist_url(project: str, version: str, who: str) -> tuple[str, str]:
    """(absolute URL, sha256) of `project`'s sdist for `version`, from the project's JSON.

    Uses the project endpoint (its `releases` table) because some index mirrors do not serve the
    per-version endpoint. `who` names the calling script in messages."""
    api = f"{INDEX_JSON}/{project}/json"
    with urllib.request.urlopen(api, timeout=120) as reply:
        meta = json.load(reply)
    for entry in meta.get("releases", {}).get(version, []):
        if entry.get("packagetype") == "sdist":
            return urljoin(api, entry["url"]), entry["digests"]["sha256"]
    raise SystemExit(f"{who}: PyPI lists no sdist for {project} {version} ({api})")


def sdist_releases(project: str) -> list[str]:
    """The releases of `project` the index holds an sdist for, in the index's order (oldest first on PyPI)."""
    with urllib.request.urlopen(f"{INDEX_JSON}/{project}/json", timeout=120) as reply:
        meta = json.load(reply)
    return [version for version, files in meta.get("releases", {}).items()
            if any(entry.get("packagetype") == "sdist" for entry in files)]


def download(url: str, sha256: str, target: str, who: str) -> None:
    """Download to `target`; refuse a file whose sha256 differs from the index's."""
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=600) as reply, open(target, "wb") as out:
        while chunk := reply.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise SystemExit(f"{who}: sha256 mismatch for {url}; retry or check the index")


def fetch_unpacked(dest: str, final_name: str, marker: str, project: str, version: str, who: str,
                   unpacked_name: str, members: Callable[[tarfile.TarFile], Iterator[tarfile.TarInfo]] | None = None) -> str:
    """`dest/final_name` holding the sdist's tree (once: an existing tree with `marker` is reused).

    `members(tar)` picks (and may rename) what to unpack, default everything; the unpacked tree is
    expected at `unpacked_name` inside the archive (after renaming) and must hold `marker`."""
    final = os.path.join(dest, final_name)
    if os.path.isfile(os.path.join(final, marker)):
        return final
    os.makedirs(dest, exist_ok=True)
    url, sha = sdist_url(project, version, who)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".fetch-") as tmp:
        archive = os.path.join(tmp, "sdist.tar.gz")
        download(url, sha, archive, who)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, members=members(tar) if members else None, filter="data")
        unpacked = os.path.join(tmp, unpacked_name)
        if not os.path.isfile(os.path.join(unpacked, marker)):
            raise SystemExit(f"{who}: {url} holds no {unpacked_name}/{marker}")
        try:
            os.rename(unpacked, final)
        except OSError:
            if not os.path.isdir(final):
                raise
            shutil.rmtree(unpacked, ignore_errors=True)
    return final
