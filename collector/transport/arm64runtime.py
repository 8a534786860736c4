"""The arm64 runtime: Debian's arm64 Python with the engines' aarch64 wheels, run by qemu-user.

The `arm64` device (layerdiff.collector.transport.arm64) runs the very host engine modules the `local` device runs, but
inside an aarch64 Python, so MNN's and ncnn's ARM kernels (MNN's Arm82 fp16 backend, ncnn's
ARMv8.2 fp16 paths) do the arithmetic. Nothing is installed system-wide: the Debian packages are
fetched by an apt with a private state directory and unpacked with `dpkg -x` into a sysroot, the
wheels are installed with `pip --target`; both live in the cache under a key of what they contain.
Run `python -m layerdiff.collector.transport.arm64runtime` (setup_host.sh does) to prepare it ahead of the first run.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from layerdiff.errors import Arm64RuntimeError, LayerdiffError
from layerdiff.collector.engines import ENGINES
from layerdiff.collector.harness.build import _locked, cache_root

QEMU = "qemu-aarch64"
PYTHON_VERSION = "3.11"
# The arm64 Python and the shared libraries it and the wheels load (ELF NEEDED), nothing more.
DEBIAN_PACKAGES = (
    "python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "libc6", "libexpat1", "zlib1g",
    "libffi8", "libgcc-s1", "libstdc++6", "libssl3", "libbz2-1.0", "liblzma5",
)
# The engines' own aarch64 wheels (Engine.arm64_wheels: MNN pinned like the host's, PyPI's newest aarch64
# ncnn wheel), then numpy as the host engines need it.
WHEELS = (*(wheel for engine in ENGINES.values() for wheel in engine.arm64_wheels), "numpy==2.2.6")
DOWNLOAD_MB = 55  # apt index ~9 MB + debs ~9 MB + wheels ~35 MB: what the first run tells the user it fetches

# (description, completed steps, total steps): how the build tells a display where it is.
StepSink = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Arm64Runtime:
    """A built runtime: `sysroot/` (Debian arm64 files) and `site/` (aarch64 wheels)."""

    root: Path

    @property
    def sysroot(self) -> Path:
        return self.root / "sysroot"

    @property
    def site(self) -> Path:
        return self.root / "site"

    @property
    def python(self) -> Path:
        return self.sysroot / "usr" / "bin" / f"python{PYTHON_VERSION}"

    def argv(self, cpu: str) -> list[str]:
        """The command prefix that starts the arm64 Python on the emulated `cpu`."""
        return [QEMU, "-cpu", cpu, str(self.python)]

    def env(self, source_dir: Path) -> dict[str, str]:
        """qemu finds the arm64 loader and libraries under the sysroot; Python finds wheels, then our code.

        Empty PYTHONHOME means unset to Python, so a host setting cannot point it at x86 files.
        """
        return {"QEMU_LD_PREFIX": str(self.sysroot), "PYTHONPATH": f"{self.site}{os.pathsep}{source_dir}",
                "PYTHONHOME": "", "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1"}

    def ready(self) -> bool:
        return (self.root / "READY").is_file() and self.python.is_file()


def runtime_key() -> str:
    recipe = "\n".join([PYTHON_VERSION, *DEBIAN_PACKAGES, *WHEELS, "v1"])
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def runtime() -> Arm64Runtime:
    """Where the runtime for the current recipe lives (built or not)."""
    return Arm64Runtime(cache_root() / "arm64" / runtime_key())


def source_dir() -> Path:
    """A directory holding exactly this layerdiff's `layerdiff` package, as links to its folders.

    The arm64 Python must import our engine modules but nothing else of the host's site-packages
    (x86 extension modules); one directory per installed copy, so worktrees never see each other's.
    The package's stages live in folders of their own (collector/ is `layerdiff.collector`), so the
    link tree rebuilds the installed layout: layerdiff/<root files> and layerdiff/<stage> -> folder.
    """
    import layerdiff
    from layerdiff import analyzer, collector, samples

    root = Path(layerdiff.__file__).resolve().parent
    targets = {entry.name: entry for entry in root.iterdir() if entry.suffix == ".py"}
    targets.update({name: Path(module.__file__).resolve().parent
                    for name, module in (("collector", collector), ("analyzer", analyzer), ("samples", samples))})
    link_dir = cache_root() / "arm64" / "src" / hashlib.sha256(str(root).encode()).hexdigest()[:12]
    package_dir = link_dir / "layerdiff"
    package_dir.mkdir(parents=True, exist_ok=True)
    for name, target in targets.items():
        link = package_dir / name
        if not link.is_symlink() or link.resolve() != target:
            tmp = package_dir / f".{name}.{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(target, target_is_directory=target.is_dir())
            os.replace(tmp, link)
    return link_dir


def check_qemu() -> None:
    if shutil.which(QEMU) is None:
        raise Arm64RuntimeError(f"the arm64 device needs {QEMU} (Debian: apt-get install qemu-user); "
                            "or run: bash device_scripts/setup_host.sh")


def ensure_runtime(step: StepSink | None = None) -> Arm64Runtime:
    """The runtime, built on first use (once per recipe; concurrent callers wait for one builder)."""
    check_qemu()
    target = runtime()
    if target.ready():
        return target
    target.root.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.root.with_suffix(".lock")):
        if not target.ready():
            _build(target, step or _print_step)
    return target


def _print_step(description: str, done: int, total: int) -> None:
    print(f"arm64 runtime [{done}/{total}] {description}", file=sys.stderr, flush=True)


def _build(target: Arm64Runtime, step: StepSink) -> None:
    """Download and unpack into a temporary directory, then rename: a half-built runtime is never used."""
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise Arm64RuntimeError(f"building the arm64 runtime needs Debian's {tool}; run it on a Debian/Ubuntu host")
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=target.root.parent))
    try:
        staged = Arm64Runtime(work / "runtime")
        total = 4
        step("reading Debian's arm64 package index (apt, private state)", 0, total)
        apt_env = _private_apt(work / "apt")
        _run(["apt-get", "update", "-qq"], env=apt_env, what="apt-get update (arm64)", check=False)
        step(f"downloading {len(DEBIAN_PACKAGES)} Debian arm64 packages (Python {PYTHON_VERSION} + libraries)", 1, total)
        debs = work / "debs"
        debs.mkdir()
        _run(["apt-get", "download", "-qq", *DEBIAN_PACKAGES], env=apt_env, cwd=debs, what="apt-get download (arm64)")
        step("unpacking them into the sysroot (dpkg -x)", 2, total)
        staged.sysroot.mkdir(parents=True)
        for deb in sorted(debs.glob("*.deb")):
            _run(["dpkg", "-x", str(deb), str(staged.sysroot)], what=f"dpkg -x {deb.name}")
        step(f"installing the aarch64 wheels {', '.join(WHEELS)} (pip --target)", 3, total)
        _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
              "--target", str(staged.site), "--platform", "manylinux2014_aarch64", "--only-binary", ":all:",
              "--python-version", PYTHON_VERSION, "--implementation", "cp", *WHEELS], what="pip install (aarch64 wheels)")
        (staged.root / "READY").write_text("\n".join([*DEBIAN_PACKAGES, *WHEELS]) + "\n")
        if target.root.exists():
            shutil.rmtree(target.root)
        os.replace(staged.root, target.root)
        step(f"ready: {target.root}", total, total)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _private_apt(root: Path) -> dict[str, str]:
    """An apt whose native architecture is arm64 and whose state is ours: the system is not touched.

    The system's sources, keys and proxy settings still apply; no root is needed.
    """
    for sub in ("lists/partial", "cache/archives/partial"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "status").touch()
    lines = [f'Dir::State "{root}";', f'Dir::State::lists "{root}/lists";', f'Dir::State::status "{root}/status";',
             f'Dir::Cache "{root}/cache";', 'APT::Architecture "arm64";', 'APT::Architectures "arm64";',
             'Acquire::Languages "none";']
    if os.geteuid() == 0:
        lines.append('APT::Sandbox::User "root";')  # _apt could not write into a root-owned cache
    config = root / "apt.conf"
    config.write_text("\n".join(lines) + "\n")
    return {**os.environ, "APT_CONFIG": str(config)}


def _run(argv: list[str], *, what: str, env: dict[str, str] | None = None, cwd: Path | None = None,
         check: bool = True) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if check and proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
        raise Arm64RuntimeError(f"arm64 runtime: {what} failed ({tail}); check the network and re-run")


def main() -> int:
    """`python -m layerdiff.collector.transport.arm64runtime`: build the runtime now (setup_host.sh), print where it is."""
    try:
        print(ensure_runtime().root)
        return 0
    except LayerdiffError as err:
        print(f"layerdiff: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
