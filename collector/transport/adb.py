"""A phone reached through an adb server: the `Device` the run pipeline drives over ADB.

Everything goes through the real adb server via adbutils' connections, so the same code drives a
phone on USB, one on Wi-Fi, one on another machine's server (`--adb-server host:port`) and the
test stand-in. Files are staged content-addressed under /data/local/tmp/layerdiff/stage/ and
pushed only when size + `sha256sum` on the phone differ; runs get their own directory under
runs/; the harness runs under the phone's `timeout` because adbutils only times out idle sockets.
"""
from __future__ import annotations

import hashlib
import math
import os
import re
import secrets
import shlex
import shutil
import socket
import time
from pathlib import Path

import adbutils

from layerdiff.analyzer.formats.rawdump import PLAIN_DIR
from layerdiff.collector.transport.adbproto import SyncFailed, SyncSession, TransferLost, remove_quietly, run_shell_v2, shell_text
from layerdiff.collector.transport.adbserver import STATE_ADVICE, connect_server, device_state, list_devices, require_online
from layerdiff.collector.transport.endpoints import ENDPOINT_ADVICE, connect_endpoint, is_endpoint, reconnect_endpoint
from layerdiff.errors import LayerdiffError, UsageError
from layerdiff.collector.transport.devices import DeviceError, DeviceInfo, ExecResult, HarnessInvocation, LineSink

ROOT = "/data/local/tmp/layerdiff"
PID_MARK = "@@ld-pid "
GLES_MARK = "@@ld-gles"
TIMEOUT_EXIT = 124
SPACE_MARGIN = 1 << 20  # never fill the phone to the last byte
RANGE_BYTES = "bytes"  # dd iflag=skip_bytes,count_bytes: each range read exactly
RANGE_BLOCKS = "blocks"  # dd in whole RANGE_BLOCK blocks around each range, trimmed on the host
RANGE_BLOCK = 4096
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_Lost = (TransferLost, adbutils.AdbError, OSError, EOFError)


def harness_command(argv: list[str], env: dict[str, str], deadline_s: float) -> str:
    """The shell line that runs argv with env under the device's `timeout`, reporting its pid first.

    `sh -c 'echo pid; exec "$0" "$@"'` keeps the pid across exec, so logcat's crash lines for the
    harness can be found by pid. Every user-supplied piece is shlex.quote'd.
    """
    exports = ""
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise DeviceError(f"invalid environment variable name {name!r}")
        exports += f"export {name}={shlex.quote(value)}; "
    inner = f'echo "{PID_MARK}$$"; exec "$0" "$@"'
    seconds = max(1, math.ceil(deadline_s))
    return f"{exports}exec timeout -k 5 {seconds} sh -c {shlex.quote(inner)} {shlex.join(argv)}"


def _parse_df_available(output: str) -> int:
    """Available bytes from `df -k` (toybox and coreutils; a long device name may wrap a line)."""
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    tokens = " ".join(lines[1:]).split()
    if len(lines) < 2 or len(tokens) < 4 or not tokens[3].isdigit():
        raise ValueError(output.strip()[:200])
    return int(tokens[3]) * 1024


class AdbDevice:
    """One phone on one adb server (see `layerdiff.collector.transport.devices.Device`)."""

    def __init__(self, serial: str, *, server: str | None = None, client: adbutils.AdbClient | None = None,
                 root: str = ROOT, endpoint: bool = False) -> None:
        self.serial = serial
        self.client = client if client is not None else connect_server(server)
        self.endpoint = endpoint  # a host:port layerdiff connected (`--connect`): reconnected when it drops
        if endpoint:
            connect_endpoint(self.client, serial)
        require_online(self.client, serial)
        self._dev = adbutils.AdbDevice(self.client, serial=serial)
        self.root = root.rstrip("/")
        self._info: DeviceInfo | None = None
        self._sha_cache: dict[tuple[str, int, int], str] = {}
        self._present: set[tuple[str, str]] = set()  # (device path, sha256) checked or pushed by this object
        self.pushed: list[str] = []  # device paths pushed by this object (staging skips are absent)
        self._fresh_free: tuple[str, int] | None = None  # (new run dir, its free bytes), read once
        self._range_style: str | None = None  # how this phone's dd reads byte ranges, asked once (range_style)
        self._takes_each: dict[str, bool] = {}  # harness path on the phone -> whether it takes --each

    # -- errors ---------------------------------------------------------------------------------------
    def _lost(self, doing: str, err: BaseException | None = None) -> DeviceError:
        """The error for an operation cut off: which one, and the device's state now (with advice)."""
        state = device_state(self.client, self.serial)
        detail = f" ({err})" if err and str(err) else ""
        if state == "device":
            return DeviceError(f"{self.serial}: {doing} failed{detail}")
        advice = ENDPOINT_ADVICE if self.endpoint else STATE_ADVICE.get(state, "check the phone and the cable")
        return DeviceError(f"{self.serial}: device lost during {doing} (now {state}: {advice})")

    def shell(self, command: str, doing: str = "a shell command", timeout: float = 60.0) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of a short command; `doing` names it in errors. Quote arguments!"""
        try:
            return shell_text(self._dev, command, idle_timeout=timeout)
        except _Lost as err:
            raise self._lost(doing, err) from None

    def _sync(self) -> SyncSession:
        try:
            return SyncSession(self._dev)
        except _Lost as err:
            raise self._lost("opening a file transfer", err) from None

    def reconnect(self) -> bool:
        """Bring a dropped endpoint back (bounded tries, see layerdiff.collector.transport.endpoints);
        False for a phone layerdiff did not connect itself, or one that stays away."""
        return self.endpoint and reconnect_endpoint(self.client, self.serial)

    # -- facts ----------------------------------------------------------------------------------------
    def properties(self) -> tuple[dict[str, str], str]:
        """All of `getprop`, and SurfaceFlinger's `GLES:` line (the GPU), in one round trip."""
        command = f"getprop; echo {GLES_MARK}; dumpsys SurfaceFlinger 2>/dev/null | grep -m1 '^GLES:'"
        _code, out, _err = self.shell(command, "reading properties")
        listing, _mark, gles = out.partition(GLES_MARK)
        props = {}
        for line in listing.splitlines():
            m = re.match(r"^\[(.*?)\]: \[(.*)\]$", line.strip())
            if m:
                props[m.group(1)] = m.group(2)
        return props, gles.strip()

    @staticmethod
    def gpu_name(props: dict[str, str], gles: str) -> str:
        """The GLES renderer SurfaceFlinger reports, else the vendor's EGL/Vulkan driver names."""
        if gles.startswith("GLES:"):
            return gles[len("GLES:"):].strip()
        names = [props.get(k, "") for k in ("ro.hardware.egl", "ro.hardware.vulkan")]
        return " / ".join(n for n in names if n)

    def info(self) -> DeviceInfo:
        if self._info is None:
            p, gles = self.properties()
            abis = [a for a in p.get("ro.product.cpu.abilist", "").split(",") if a]
            self._info = DeviceInfo(
                serial=self.serial, kind="adb", model=p.get("ro.product.model", ""),
                manufacturer=p.get("ro.product.manufacturer", ""),
                soc=p.get("ro.soc.model") or p.get("ro.board.platform") or p.get("ro.hardware", ""),
                board=p.get("ro.board.platform") or p.get("ro.product.board", ""),
                abi=p.get("ro.product.cpu.abi") or (abis[0] if abis else ""), abis=abis,
                android_release=p.get("ro.build.version.release", ""), sdk=p.get("ro.build.version.sdk", ""),
                gpu=self.gpu_name(p, gles),
                extra={"adb_server": f"{self.client.host}:{self.client.port}",
                       "soc_manufacturer": p.get("ro.soc.manufacturer", ""),
                       "fingerprint": p.get("ro.build.fingerprint", ""), "hardware": p.get("ro.hardware", "")},
            )
        return self._info

    def free_bytes(self, remote_dir: str) -> int:
        fresh, self._fresh_free = self._fresh_free, None
        if fresh is not None and fresh[0] == remote_dir:
            return fresh[1]
        q = shlex.quote(remote_dir)
        code, out, err = self.shell(f"mkdir -p {q} && df -k {q}", f"checking free space in {remote_dir}")
        try:
            if code != 0:
                raise ValueError(err.strip())
            return _parse_df_available(out)
        except ValueError as bad:
            raise DeviceError(f"{self.serial}: cannot read free space of {remote_dir} ({bad})") from None

    # -- files ----------------------------------------------------------------------------------------
    def _local_sha256(self, local: Path) -> str:
        st = local.stat()
        key = (str(local.resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._sha_cache:
            h = hashlib.sha256()
            with open(local, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            self._sha_cache[key] = h.hexdigest()
        return self._sha_cache[key]

    def same_file(self, local: Path, remote: str, digest: str) -> bool:
        """True when `remote` has local's size and sha256 (sha256sum runs on the phone).

        Asked once per file and object: a sweep's later runs reuse the answer instead of hashing
        the harness and MNN's libraries on the phone again (a stage/ or bin/ file, named by its
        content, only goes away when someone deletes it by hand)."""
        if (remote, digest) in self._present:
            return True
        try:
            with self._sync() as sync:
                st = sync.stat(remote)
        except _Lost as err:
            raise self._lost(f"checking {remote}", err) from None
        if st is None or st[1] != local.stat().st_size & 0xFFFFFFFF:
            return False
        code, out, _err = self.shell(f"sha256sum {shlex.quote(remote)}", f"hashing {remote}")
        if code == 0 and out.split()[:1] == [digest]:
            self._present.add((remote, digest))
            return True
        return False

    def push_file(self, local: Path, remote: str, *, mode: int = 0o644) -> None:
        """Push under a temporary name, then rename: a cut push never looks like the real file."""
        size = local.stat().st_size
        parent = remote.rsplit("/", 1)[0] or "/"
        free = self.free_bytes(parent)
        if size + SPACE_MARGIN > free:
            raise DeviceError(f"{self.serial}: not enough space in {parent} for {local.name}: needs {size} bytes, "
                              f"{free} free; free some space on the phone")
        partial = f"{remote}.partial"
        try:
            with self._sync() as sync:
                sync.push(local, partial, mode)
        except SyncFailed as err:
            raise DeviceError(f"{self.serial}: push of {local.name} to {remote} failed: {err}") from None
        except _Lost as err:
            raise self._lost(f"the push of {local.name}", err) from None
        code, _out, err = self.shell(f"mv -f {shlex.quote(partial)} {shlex.quote(remote)}", f"placing {remote}")
        if code != 0:
            raise DeviceError(f"{self.serial}: push of {local.name} to {remote} failed: {err.strip()}")
        self.pushed.append(remote)

    def stage(self, local: Path, remote_dir: str) -> str:
        """Content-addressed staging: the same bytes are pushed once per phone, whatever the run.

        `remote_dir` is where the caller would put the file; we keep one copy per content under
        stage/ instead, so runs (and sweeps) share it and cleaning a run never deletes it.
        """
        local = Path(local)
        if not local.is_file():
            raise DeviceError(f"{local}: no such file to push to {self.serial}")
        digest = self._local_sha256(local)
        remote = f"{self.root}/stage/{digest[:16]}/{local.name}"
        if not self.same_file(local, remote, digest):
            self.push_file(local, remote, mode=0o755 if os.access(local, os.X_OK) else 0o644)
            self._present.add((remote, digest))
        return remote

    def put(self, local: Path, remote_path: str) -> None:
        """Push to an exact path (not content-addressed): for files a harness finds by directory."""
        self.push_file(Path(local), remote_path)

    def new_run_dir(self, tag: str) -> str:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in tag)[:60]
        path = f"{self.root}/runs/{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        q = shlex.quote(path)
        code, out, err = self.shell(f"mkdir -p {q} && {{ df -k {q} || true; }}", f"creating {path}")
        if code != 0:
            raise DeviceError(f"{self.serial}: cannot create {path}: {err.strip()}")
        try:  # the run's free-space check comes next: answered from this round trip
            self._fresh_free = (path, _parse_df_available(out))
        except ValueError:
            self._fresh_free = None
        return path

    def remove(self, remote_path: str) -> None:
        if not remote_path.startswith(self.root + "/"):
            raise DeviceError(f"{self.serial}: refusing to delete {remote_path} (outside {self.root})")
        self.shell(f"rm -rf -- {shlex.quote(remote_path)}", f"removing {remote_path}")

    def fetch_dir(self, remote_dir: str, local_dir: Path) -> Path:
        """Pull every file of a dump directory; a file cut short is deleted, complete ones are kept."""
        local_dir = Path(local_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        try:
            with self._sync() as sync:
                if sync.stat(remote_dir) is None:
                    return local_dir
                listing = list(sync.list(remote_dir))
                files = sorted((name, size) for name, mode, size in listing if mode & 0o170000 == 0o100000)
                if any(name == PLAIN_DIR and mode & 0o170000 == 0o040000 for name, mode, _size in listing):
                    # the plain run's outputs (docs/fidelity.md): a raw dump of their own, one level down
                    files += sorted((f"{PLAIN_DIR}/{name}", size) for name, mode, size in sync.list(f"{remote_dir}/{PLAIN_DIR}")
                                    if mode & 0o170000 == 0o100000)
                    (local_dir / PLAIN_DIR).mkdir(exist_ok=True)
                need = sum(size for _name, size in files)
                if shutil.disk_usage(local_dir).free < need + SPACE_MARGIN:
                    raise DeviceError(f"not enough space in {local_dir} for the dump from {self.serial}: "
                                      f"needs {need} bytes, {shutil.disk_usage(local_dir).free} free")
                for name, _size in files:
                    self._pull_one(sync, f"{remote_dir}/{name}", local_dir / name)
        except _Lost as err:
            raise self._lost(f"listing {remote_dir}", err) from None
        return local_dir

    def fetch_files(self, remote_dir: str, names: list[str], local_dir: Path) -> list[str]:
        """Pull the named files of a dump directory (those present; `plain/...` names included): a sketch-first
        collection's first pass. Returns the names pulled."""
        local_dir = Path(local_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        pulled = []
        try:
            with self._sync() as sync:
                for name in names:
                    if sync.stat(f"{remote_dir}/{name}") is None:
                        continue
                    (local_dir / name).parent.mkdir(parents=True, exist_ok=True)
                    self._pull_one(sync, f"{remote_dir}/{name}", local_dir / name)
                    pulled.append(name)
        except _Lost as err:
            raise self._lost(f"pulling from {remote_dir}", err) from None
        return pulled

    def read_ranges(self, remote_path: str, ranges: list[tuple[int, int]]) -> bytes:
        """The bytes of (offset, length) ranges of one device file, back to back, in one round trip: one `dd` per
        range streamed over one shell. A `dd` that takes `iflag=skip_bytes,count_bytes` (today's toybox, coreutils)
        reads each range exactly; an older one (toybox's earlier `dd` knew no `iflag=`; old Androids' toolbox)
        reads the 4 KiB blocks around each range, which the host trims (`range_style`)."""
        if not ranges:
            return b""
        if self.range_style() == RANGE_BYTES:
            return self._read_exact_ranges(remote_path, ranges)
        return self._read_block_ranges(remote_path, ranges)

    def range_style(self) -> str:
        """How this phone's `dd` reads a byte range: RANGE_BYTES or RANGE_BLOCKS, asked of the phone once (a `dd`
        of 5 bytes at offset 3 of /dev/zero with the byte flags gives exactly 5 bytes only where they work)."""
        if self._range_style is None:
            out = bytearray()
            probe = "dd if=/dev/zero bs=1M iflag=skip_bytes,count_bytes skip=3 count=5 2>/dev/null"
            try:
                code = run_shell_v2(self._dev, probe, on_stdout=out.extend, on_stderr=lambda _data: None,
                                    idle_timeout=30.0)
            except _Lost as lost:
                raise self._lost("asking how dd reads byte ranges", lost) from None
            self._range_style = RANGE_BYTES if code == 0 and len(out) == 5 else RANGE_BLOCKS
        return self._range_style

    def _read_exact_ranges(self, remote_path: str, ranges: list[tuple[int, int]]) -> bytes:
        quoted = shlex.quote(remote_path)
        script = ";".join(f"dd if={quoted} bs=1M iflag=skip_bytes,count_bytes skip={int(offset)} count={int(length)} "
                          "2>/dev/null" for offset, length in ranges)
        out, code, err = self._run_range_script(remote_path, script, len(ranges))
        self._check_range_bytes(remote_path, ranges, len(out), sum(length for _offset, length in ranges), code, err)
        return bytes(out)

    def _read_block_ranges(self, remote_path: str, ranges: list[tuple[int, int]]) -> bytes:
        """Whole 4 KiB blocks around each range (plain `skip=`/`count=` in blocks: every `dd` has them), cut to
        the range here. The file's size (one sync STAT) says how short the block holding its end reads."""
        size = self._remote_size(remote_path)
        if any(offset < 0 or offset + length > size for offset, length in ranges):
            raise DeviceError(f"{self.serial}: a byte range asked of {remote_path} ends past its {size} bytes; "
                              "the dump on the phone may be gone: collect again with --full")
        quoted = shlex.quote(remote_path)
        spans = [block_span(offset, length, size) for offset, length in ranges]
        script = ";".join(f"dd if={quoted} bs={RANGE_BLOCK} skip={first} count={count} 2>/dev/null"
                          for first, count, _got in spans)
        out, code, err = self._run_range_script(remote_path, script, len(ranges))
        self._check_range_bytes(remote_path, ranges, len(out), sum(got for _first, _count, got in spans), code, err)
        pieces, at = [], 0
        for (offset, length), (first, _count, got) in zip(ranges, spans):
            start = at + offset - first * RANGE_BLOCK
            pieces.append(bytes(out[start:start + length]))
            at += got
        return b"".join(pieces)

    def _remote_size(self, remote_path: str) -> int:
        try:
            with self._sync() as sync:
                found = sync.stat(remote_path)
        except _Lost as lost:
            raise self._lost(f"reading the size of {remote_path}", lost) from None
        if found is None:
            raise DeviceError(f"{self.serial}: {remote_path} is gone from the phone: collect again with --full")
        return found[1]

    def _run_range_script(self, remote_path: str, script: str, n_ranges: int) -> tuple[bytearray, int, str]:
        """Stdout, exit status and the start of stderr of one shell running the `dd` lines."""
        out, err = bytearray(), bytearray()
        try:
            code = run_shell_v2(self._dev, script, on_stdout=out.extend, on_stderr=err.extend, idle_timeout=60.0)
        except _Lost as lost:
            raise self._lost(f"reading {n_ranges} tensors of {remote_path}", lost) from None
        return out, code, err.decode(errors="replace").strip()[:200]

    def _check_range_bytes(self, remote_path: str, ranges: list[tuple[int, int]], got: int, expected: int,
                           code: int, err: str) -> None:
        if code != 0 or got != expected:
            raise DeviceError(f"{self.serial}: reading {len(ranges)} byte ranges of {remote_path} gave {got} of "
                              f"{expected} bytes (exit {code}{': ' + err if err else ''}); "
                              "the dump on the phone may be gone: collect again with --full")

    def _pull_one(self, sync: SyncSession, remote: str, target: Path) -> None:
        partial = target.with_name(f".{target.name}.partial")
        try:
            sync.pull(remote, partial)
        except (SyncFailed, *_Lost) as err:
            remove_quietly(partial)
            state = device_state(self.client, self.serial)
            raise DeviceError(f"{self.serial}: device lost mid-pull of {remote} (now {state}; partial file "
                              f"removed, files pulled before it kept): {err}") from None
        os.replace(partial, target)

    # -- running --------------------------------------------------------------------------------------
    def prepare_harness(self, engine: str, backend: str = "cpu") -> HarnessInvocation:
        """Stage the harness built for this phone's ABI (and any engine libraries beside it)."""
        from layerdiff.collector.harness.build import HarnessError
        from layerdiff.collector.engines.phoneharness import harness_for

        abi = self.info().abi
        try:
            binary = Path(harness_for(abi, engine, backend))
        except HarnessError as err:
            raise DeviceError(f"{self.serial} ({abi}): {err}") from None
        return self.stage_program(binary)

    def stage_program(self, binary: Path) -> HarnessInvocation:
        """Stage a native program built for this phone's ABI (and the libraries beside it) under a folder named by
        its content, so two builds (two releases of an engine) live side by side on the phone."""
        abi = self.info().abi
        digest = self._local_sha256(binary)
        remote_dir = f"{self.root}/bin/{digest[:16]}"
        for lib in sorted(binary.parent.glob("*.so")):
            self._stage_at(lib, f"{remote_dir}/{lib.name}", 0o644)
        remote = self._stage_at(binary, f"{remote_dir}/layerdiff-harness", 0o755)
        return HarnessInvocation(argv=[remote], env={"LD_LIBRARY_PATH": remote_dir},
                                 description=f"{binary} on {self.serial} ({abi})")

    def takes_each(self, engine: str, backend: str = "cpu") -> bool:
        """Whether the harness staged for `engine` takes `--each`: asked of the binary itself (its `--help`
        names it), once per binary, since a harness named by $LAYERDIFF_HARNESS_<ABI> may be an older build."""
        try:
            harness = self.prepare_harness(engine, backend)
        except LayerdiffError:
            return False  # the run itself says why, one input at a time
        binary = harness.argv[0]
        if binary not in self._takes_each:
            exports = "".join(f"export {name}={shlex.quote(value)}; " for name, value in harness.env.items()
                              if _ENV_NAME.match(name))
            try:
                code, out, _err = self.shell(f"{exports}{shlex.join([*harness.argv, '--help'])}",
                                             "asking the harness what it takes", timeout=60.0)
            except LayerdiffError:
                return False
            self._takes_each[binary] = code == 0 and "--each FILE" in out
        return self._takes_each[binary]

    def _stage_at(self, local: Path, remote: str, mode: int) -> str:
        digest = self._local_sha256(local)
        if not self.same_file(local, remote, digest):
            self.push_file(local, remote, mode=mode)
            self._present.add((remote, digest))
        return remote

    def execute(self, argv: list[str], *, env: dict[str, str], deadline_s: float,
                on_stdout_line: LineSink | None = None) -> ExecResult:
        """Run under the phone's `timeout`; stream stdout lines; a crash adds logcat's lines for its pid."""
        command = harness_command(argv, env, deadline_s)
        lines = _LineSplitter(on_stdout_line)
        stderr = _TailBytes(MAX_STDERR_BYTES)
        start = time.monotonic()
        try:
            code = run_shell_v2(self._dev, command, on_stdout=lines.feed, on_stderr=stderr.feed,
                                idle_timeout=deadline_s + 60)
        except socket.timeout:
            raise DeviceError(f"{self.serial}: deadline of {deadline_s:.0f}s exceeded and the phone did not stop "
                              f"the harness; check it with `adb -s {self.serial} shell ps`") from None
        except _Lost as err:
            raise self._lost("the harness run", err) from None
        lines.flush()
        elapsed = time.monotonic() - start
        timed_out = code == TIMEOUT_EXIT or (code == 128 + 9 and elapsed >= deadline_s)
        status = -15 if timed_out else (-(code - 128) if 128 < code < 128 + 65 else code)
        result = ExecResult(exit_status=status, stderr=stderr.text(), duration_s=elapsed,
                               timed_out=timed_out, pid=lines.pid)
        if status != 0 and not timed_out and lines.pid is not None:
            result.device_log = self.logcat_for_pid(lines.pid)
        return result

    def logcat_for_pid(self, pid: int, lines: int = 200) -> str:
        try:
            _code, out, _err = self.shell(f"logcat -d -t {int(lines)} --pid={int(pid)}", "reading logcat")
        except DeviceError:
            return ""
        return out


MAX_LINE_BYTES = 1 << 20  # one stdout line of the harness (its progress events are ~100 bytes)
MAX_STDERR_BYTES = 4 << 20  # the harness's stderr kept with the run: its end, where a crash says why


class _TailBytes:
    """The last `limit` bytes of a stream (amortised linear), and how many came before them."""

    def __init__(self, limit: int) -> None:
        self._limit, self._buf, self.dropped = limit, bytearray(), 0

    def feed(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) > 2 * self._limit:
            cut = len(self._buf) - self._limit
            del self._buf[:cut]
            self.dropped += cut

    def text(self) -> str:
        cut = max(0, len(self._buf) - self._limit)
        body = bytes(self._buf[cut:]).decode("utf-8", "replace")
        dropped = self.dropped + cut
        return f"[... {dropped} earlier bytes of stderr not kept]\n{body}" if dropped else body



class _LineSplitter:
    """Cuts streamed stdout into lines; keeps our pid marker for itself.

    Linear in the bytes received: a chunk is searched for newlines once, and a line longer than
    MAX_LINE_BYTES keeps its first MAX_LINE_BYTES (the rest is counted, not held). A phone writing
    100 MB without a newline was buffered quadratically before (108 s, 409 MB)."""

    def __init__(self, sink: LineSink | None) -> None:
        self._sink = sink
        self._pending = bytearray()
        self._cut = 0  # bytes of the current line dropped past MAX_LINE_BYTES
        self.pid: int | None = None

    def feed(self, data: bytes) -> None:
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._keep(data, start, len(data))
                return
            self._keep(data, start, end)
            self._emit()
            start = end + 1

    def _keep(self, data: bytes, start: int, end: int) -> None:
        room = max(0, MAX_LINE_BYTES - len(self._pending))
        self._pending += data[start:min(end, start + room)]
        self._cut += max(0, end - start - room)

    def _emit(self) -> None:
        line = self._pending.decode("utf-8", "replace").rstrip("\r")
        if self._cut:
            line += f" [... {self._cut} more bytes of this line not kept]"
        self._pending, self._cut = bytearray(), 0
        self._line(line)

    def flush(self) -> None:
        if self._pending or self._cut:
            self._emit()

    def _line(self, line: str) -> None:
        if self.pid is None and line.startswith(PID_MARK) and line[len(PID_MARK):].isdigit():
            self.pid = int(line[len(PID_MARK):])
        elif self._sink is not None:
            self._sink(line)


def adb_devices(names: list[str], adb_servers: list[str] | None = None,
                connect: list[str] | None = None) -> list[AdbDevice]:
    """`all` (every online device of every server), serials and endpoints → AdbDevice objects.

    `connect` endpoints (host:port) are connected through the first server before anything is
    listed, so `all` includes them, and each is one of the devices. A name on no server that is a
    host:port is connected the same way; any other serial not on a server is an error naming the
    devices that are there.
    """
    bad = next((endpoint for endpoint in connect or [] if not is_endpoint(endpoint)), None)
    if bad is not None:
        raise UsageError(f"--connect {bad!r}: expected the HOST:PORT a lab gives for `adb connect`, "
                         f"e.g. stf.example.com:7401")
    clients = [connect_server(spec) for spec in (adb_servers or [None])]
    found: list[AdbDevice] = [AdbDevice(endpoint, client=clients[0], endpoint=True)
                              for endpoint in dict.fromkeys(connect or [])]
    for name in names:
        if name == "all":
            for client in clients:
                found += [AdbDevice(i.serial, client=client) for i in list_devices(client) if i.state == "device"]
            continue
        owner = next((c for c in clients if any(i.serial == name for i in list_devices(c))), None)
        if owner is None and is_endpoint(name):
            found.append(AdbDevice(name, client=clients[0], endpoint=True))
            continue
        found.append(AdbDevice(name, client=owner or clients[0]))
    return _unique(found)


def _unique(devices: list[AdbDevice]) -> list[AdbDevice]:
    """One object per (server, serial): an endpoint named by --connect and listed by `all` runs once."""
    seen: dict[tuple[str, int, str], AdbDevice] = {}
    for device in devices:
        seen.setdefault((device.client.host, device.client.port, device.serial), device)
    return list(seen.values())


def block_span(offset: int, length: int, size: int) -> tuple[int, int, int]:
    """(first block, block count, bytes that read gives) of the RANGE_BLOCK blocks holding [offset, offset+length)
    of a file of `size` bytes: the last block of the file reads short."""
    first = offset // RANGE_BLOCK
    end = -(-(offset + length) // RANGE_BLOCK)
    count = end - first
    return first, count, min(end * RANGE_BLOCK, size) - first * RANGE_BLOCK
