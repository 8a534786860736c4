"""A real OpenCL for the MNN OpenCL tests: Debian's PoCL (a CPU OpenCL) made visible to MNN by a loader shim.

MNN's OpenCL backend asks the ICD loader for GPU-type devices only, and PoCL's device is a CPU, so MNN
alone finds none and runs on its CPU. tests/fixtures/opencl_shim/gpu_to_all.c is a `libOpenCL.so` that
forwards everything to the system's ICD loader (ocl-icd's libOpenCL.so.1) and answers a GPU request
that finds nothing with every device. Put its folder first on LD_LIBRARY_PATH (or beside the harness on a
stand-in phone, whose staged folder is the harness's LD_LIBRARY_PATH) and MNN's dlopen("libOpenCL.so")
loads it. This module builds it with gcc at test time (nothing compiled is committed) and says in one
line what is missing when it cannot.
"""
from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

SHIM_SOURCE = Path(__file__).resolve().parent / "fixtures" / "opencl_shim" / "gpu_to_all.c"
ICD_VENDORS = Path("/etc/OpenCL/vendors")


def pocl_missing() -> str:
    """Why PoCL cannot serve here ("" when it can): the ICD loader, PoCL's ICD entry, gcc."""
    if not glob.glob("/usr/lib/*/libOpenCL.so.1") and not glob.glob("/usr/lib/libOpenCL.so.1"):
        return "no OpenCL ICD loader (libOpenCL.so.1): apt-get install ocl-icd-libopencl1 pocl-opencl-icd"
    if not any("pocl" in p.read_text(errors="replace") for p in ICD_VENDORS.glob("*.icd")):
        return "PoCL is not installed (no pocl entry in /etc/OpenCL/vendors): apt-get install pocl-opencl-icd"
    if shutil.which("gcc") is None:
        return "gcc is needed to build the OpenCL loader shim: apt-get install gcc"
    return ""


def build_shim(cache: Path) -> Path:
    """The folder holding the shim's libOpenCL.so, built once per source version under `cache`."""
    digest = hashlib.sha256(SHIM_SOURCE.read_bytes()).hexdigest()[:16]
    folder = Path(cache) / f"opencl-shim-{digest}"
    library = folder / "libOpenCL.so"
    if library.is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / ".libOpenCL.so.partial"
    cmd = ["gcc", "-O2", "-Wall", "-shared", "-fPIC", "-o", str(partial), "-Wl,-soname,libOpenCL.so", str(SHIM_SOURCE),
           "-Wl,--no-as-needed", "-l:libOpenCL.so.1", "-ldl"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"building the OpenCL loader shim failed: {result.stderr.strip()[-500:]}")
    os.replace(partial, library)
    return folder


def shim_env(shim: Path, **extra: str) -> dict[str, str]:
    """This process's environment with the shim first on the library path (MNN's dlopen then finds it)."""
    paths = [str(shim), *(p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p)]
    return {**os.environ, "LD_LIBRARY_PATH": ":".join(paths), **extra}
