"""A harness's `--probe` (what it can run on its device), asked once and kept while its answer cannot change.

A probe is a process: on the host a Python child that imports the engine and opens a Vulkan
instance (0.25-0.37 s CPU, a quarter of the one-process floor of a whole cpu/high + vulkan/low
`collect`, tests/bench/bench_collect_verdict.py), under qemu about 10 s. A device that can name what
its answer depends on offers `probe_cache(engine)`: a file whose name is a digest of exactly that. The
answer is read from it while it exists, and asked again as soon as anything in the digest changes.
- the emulated arm64 core: its runtime (immutable once built) and layerdiff's engine code;
- the host (`local_probe_path`): the interpreter, the engine's installed module, layerdiff's
  engine code, the host and its CPU, the GPU driver manifests (Vulkan ICDs, OpenCL vendors) with the
  libraries they name, the device nodes under /dev/dri, and every environment variable a GPU loader reads.
Phones over adb keep no answer: a phone's drivers cannot be watched from here. An engine whose harness
is a native program built here (ggml, Paddle-Lite) declares no module and is always asked.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
from pathlib import Path

from layerdiff.cache import user_cache_root
from layerdiff.errors import DeviceError, DumpFormatError
from layerdiff.analyzer.formats.limits import load_json
from layerdiff.driverlibs import named_library
from layerdiff.identity import file_stat, library_stat

# Where GPU loaders look for drivers (Vulkan: the loader's manifest folders; OpenCL: the ICD loader's).
DRIVER_DIRS = ("/usr/share/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/etc/vulkan/icd.d",
               "/etc/OpenCL/vendors", "/dev/dri")
KEEP_ANSWERS = 4  # per device and engine
PROBE_DEADLINE_S = 120.0  # a probe under qemu takes ~10 s; a phone's first Vulkan instance can take long
# Environment that changes which driver a loader picks or how it behaves.
DRIVER_ENV_PREFIXES = ("VK_", "MESA_", "LP_", "GALLIUM_", "OCL_", "OPENCL_", "LD_", "CUDA_", "ANV_", "RADV_")


def probe_document(device, engine: str, deadline_s: float = PROBE_DEADLINE_S) -> dict:
    """The harness's whole `--probe` JSON document (a kept one when the device keeps them);
    raises DeviceError naming the device and the harness's last line."""
    cache = device.probe_cache(engine) if hasattr(device, "probe_cache") else None
    if cache is not None:
        kept = _read(cache)
        if kept is not None:
            return kept
    document = _ask(device, engine, deadline_s)
    if cache is not None:
        _keep(cache, document)
    return document


def _ask(device, engine: str, deadline_s: float) -> dict:
    harness = device.prepare_harness(engine)
    lines: list[str] = []
    result = device.execute(harness.argv + ["--probe"], env=harness.env, deadline_s=deadline_s,
                            on_stdout_line=lines.append)
    text = next((ln for ln in reversed(lines) if ln.strip().startswith("{")), "")
    if result.exit_status != 0 or not text:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise DeviceError(f"{device.serial}: the {engine} harness --probe failed (status {result.exit_status}: {tail})")
    try:
        document = load_json(text, "probe")
    except DumpFormatError:  # not JSON, or nested past the bound: a phone's answer is untrusted
        document = None
    if not isinstance(document, dict):
        raise DeviceError(f"{device.serial}: the {engine} harness --probe printed no JSON document")
    return document


def _read(path: Path) -> dict | None:
    """A kept answer, or None (absent, unreadable, damaged, or written in an older form)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) and isinstance(document.get("engines"), dict) else None


def _keep(path: Path, document: dict) -> None:
    """Write an answer atomically; of one device and engine's answers only the `KEEP_ANSWERS` newest
    stay (a machine switched between a few driver settings keeps each one's answer). A cache that
    cannot be written only makes the next probe a process again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(document), encoding="utf-8")
        os.replace(partial, path)
        stem = path.name.rsplit("-", 1)[0]
        same = [p for p in path.parent.glob("*.json") if p.name.rsplit("-", 1)[0] == stem]
        for old in sorted(same, key=lambda p: p.stat().st_mtime_ns, reverse=True)[KEEP_ANSWERS:]:
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        pass


@functools.lru_cache(maxsize=1)
def engine_code_hash() -> str:
    """Digest of layerdiff's engine modules (collector/engines/): what a probe runs besides the engine."""
    from layerdiff.collector import engines

    digest = hashlib.sha256()
    root = Path(engines.__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def local_probe_path(engine: str) -> Path | None:
    """Where the host's answer for `engine` is kept, or None for an engine without a module to watch."""
    from layerdiff.collector.engines import ENGINES

    library = ENGINES[engine].library if engine in ENGINES else ""
    if not library:
        return None
    facts = [engine, engine_code_hash(), _stat(Path(sys.executable)), [library, library_stat(library)],
             platform.node(), platform.machine(), _cpu_model(), _driver_env(), _driver_files()]
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:20]
    return user_cache_root() / "probes" / f"local-{engine}-{digest}.json"


def _stat(path: Path) -> list:
    """A file by name and stat; a missing one is a fact too (a driver manifest that names no library)."""
    try:
        return [str(path), *file_stat(path)]
    except OSError:
        return [str(path), None]


def _cpu_model() -> str:
    """The CPU's model and feature flags (fp16 support decides a backend's precision)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    wanted = ("model name", "flags", "features", "hardware", "cpu part")
    return "\n".join(sorted({ln.strip() for ln in lines if ln.lower().startswith(wanted)}))


def _driver_env() -> list:
    return sorted((k, v) for k, v in os.environ.items() if k.startswith(DRIVER_ENV_PREFIXES))


def _driver_files() -> list:
    """Every driver manifest (and the library it names) and GPU device node, by stat."""
    dirs = list(DRIVER_DIRS)
    data_dirs = [os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local/share")]
    data_dirs += (os.environ.get("XDG_DATA_DIRS") or "").split(os.pathsep)
    dirs += [str(Path(d) / "vulkan" / "icd.d") for d in data_dirs if d]
    found = []
    for folder in dict.fromkeys(dirs):
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = Path(folder) / name
            found.append(_stat(path))
            library = named_library(path)
            if library:
                found.append(_stat(Path(library)))
    return found
