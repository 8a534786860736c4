"""Build the exec shim (execshim.c) once per machine and cache it by the source's hash.

Without binfmt_misc (not available in containers) the host kernel cannot run an aarch64 ELF file;
the shim makes `exec` of one run it under qemu-aarch64, so a pushed static aarch64 harness runs
exactly as the phone's shell would start it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

_SOURCE = Path(__file__).with_name("execshim.c")


def build_exec_shim(state_dir: Path) -> Path:
    """Path of the compiled shim; raises RuntimeError with the compiler's message if it cannot build."""
    source = _SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    cached = Path(tempfile.gettempdir()) / f"layerdiff-standin-execshim-{digest}.so"
    if cached.exists():
        return cached
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("the arm64-v8a stand-in needs a C compiler (cc) to build its exec shim")
    partial = cached.with_name(f"{cached.name}.{os.getpid()}.partial")
    result = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(_SOURCE), "-ldl"],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"building the stand-in exec shim failed: {result.stderr.strip()}")
    os.replace(partial, cached)
    return cached
