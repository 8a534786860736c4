"""The two device services the collector drives itself, over adbutils' connection to the adb server.

adbutils gives us the connection (`AdbDevice.open_transport`), but its `shell2` returns only when the
command ends and its `sync.pull` writes straight into the destination and pushes in 4 KiB pieces.
A run needs more: harness progress lines as they happen, a push that reports the device's reason
for failing, and a pull that never leaves a partial file behind. Wire formats: AOSP adb `SYNC.TXT`
and the shell v2 protocol (`shell_protocol.h`).
"""
from __future__ import annotations

import os
import socket
import stat
import struct
import time
from pathlib import Path
from typing import Callable

import adbutils

from layerdiff.errors import SyncFailed, TransferLost

SYNC_DATA_MAX = 64 * 1024
_REQ = struct.Struct("<4sI")
_STAT = struct.Struct("<III")
_DENT = struct.Struct("<IIII")
SHELL_STDOUT, SHELL_STDERR, SHELL_EXIT = 1, 2, 3


def _read_exact_into(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise TransferLost("connection closed")
        got += k


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _read_exact_into(sock, memoryview(buf))
    return bytes(buf)


class SyncSession:
    """One `sync:` connection; several requests may follow each other on it."""

    def __init__(self, device: adbutils.AdbDevice, timeout: float = 60.0) -> None:
        self._conn = device.open_transport(timeout=timeout)
        self._conn.send_command("sync:")
        self._conn.check_okay()
        self._sock = self._conn.conn

    def __enter__(self) -> "SyncSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._sock.sendall(_REQ.pack(b"QUIT", 0))
        except OSError:
            pass
        close_now(self._conn)

    def _request(self, kind: bytes, path: str) -> None:
        raw = path.encode()
        self._sock.sendall(_REQ.pack(kind, len(raw)) + raw)

    def _fail_message(self, length: int) -> str:
        return _read_exact(self._sock, length).decode("utf-8", "replace")

    def stat(self, path: str) -> tuple[int, int, int] | None:
        """(mode, size, mtime) of a path, None if it does not exist (v1 STAT: every device has it)."""
        self._request(b"STAT", path)
        kind = _read_exact(self._sock, 4)
        if kind != b"STAT":
            raise TransferLost(f"unexpected sync reply {kind!r}")
        mode, size, mtime = _STAT.unpack(_read_exact(self._sock, _STAT.size))
        return None if mode == 0 and size == 0 and mtime == 0 else (mode, size, mtime)

    def list(self, path: str) -> list[tuple[str, int, int]]:
        """(name, mode, size) of each entry of a directory, without `.` and `..`."""
        self._request(b"LIST", path)
        entries = []
        while True:
            kind = _read_exact(self._sock, 4)
            mode, size, _mtime, namelen = _DENT.unpack(_read_exact(self._sock, _DENT.size))
            if kind == b"DONE":
                return entries
            if kind != b"DENT":
                raise TransferLost(f"unexpected sync reply {kind!r}")
            name = _read_exact(self._sock, namelen).decode("utf-8", "surrogateescape")
            if name not in (".", ".."):
                entries.append((name, mode, size))

    def push(self, local: Path, remote: str, mode: int = 0o644) -> int:
        """Send one file; SyncFailed with the device's reason if it refuses (e.g. no space)."""
        self._request(b"SEND", f"{remote},{stat.S_IFREG | mode}")
        sent = 0
        with open(local, "rb") as f:
            while chunk := f.read(SYNC_DATA_MAX):
                self._sock.sendall(_REQ.pack(b"DATA", len(chunk)) + chunk)
                sent += len(chunk)
        self._sock.sendall(_REQ.pack(b"DONE", int(time.time())))
        kind, length = _REQ.unpack(_read_exact(self._sock, 8))
        if kind == b"FAIL":
            raise SyncFailed(self._fail_message(length))
        if kind != b"OKAY":
            raise TransferLost(f"unexpected sync reply {kind!r}")
        return sent

    def pull(self, remote: str, local: Path) -> int:
        """Receive one file into `local` (caller picks a temporary name); returns its size.

        The socket is read in large blocks and the DATA frames are cut out of the block, so a
        64 KiB frame costs no header-sized reads of its own: two small `recv` calls per frame made
        the pull markedly slower than `adb pull` through the same server.
        """
        self._request(b"RECV", remote)
        frames = _FrameReader(self._sock)
        size = 0
        with open(local, "wb", buffering=0) as f:
            while True:
                kind, length = _REQ.unpack(frames.take(8))
                if kind == b"DONE":
                    frames.check_drained()
                    return size
                if kind == b"FAIL":
                    raise SyncFailed(frames.take(length).decode("utf-8", "replace"))
                if kind != b"DATA" or length > SYNC_DATA_MAX:
                    raise TransferLost(f"unexpected sync reply {kind!r}")
                frames.copy_to(f, length)
                size += length


class _FrameReader:
    """Reads a socket in blocks of up to `BLOCK` bytes and hands out exact byte counts from them."""

    BLOCK = 1 << 20

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray(self.BLOCK)
        self._view = memoryview(self._buf)
        self._start = self._end = 0

    def _fill(self) -> None:
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf):  # keep the unread tail, move it to the front
            tail = self._end - self._start
            self._buf[:tail] = self._buf[self._start:self._end]
            self._start, self._end = 0, tail
        k = self._sock.recv_into(self._view[self._end:])
        if k == 0:
            raise TransferLost("connection closed")
        self._end += k

    def take(self, n: int) -> bytes:
        while self._end - self._start < n:
            self._fill()
        out = bytes(self._view[self._start:self._start + n])
        self._start += n
        return out

    def copy_to(self, f, n: int) -> None:
        while n:
            if self._start == self._end:
                self._fill()
            k = min(n, self._end - self._start)
            written = f.write(self._view[self._start:self._start + k])  # raw file: may write less
            self._start += written
            n -= written

    def check_drained(self) -> None:
        """Nothing may follow DONE before the next request; bytes here would belong to no reply."""
        if self._start != self._end:
            raise TransferLost("unexpected bytes after the end of a file")


LineSink = Callable[[bytes], None]


def run_shell_v2(device: adbutils.AdbDevice, command: str, *, on_stdout: LineSink, on_stderr: LineSink,
                 idle_timeout: float) -> int:
    """Run `command` with the shell v2 protocol, handing output to the sinks as it arrives.

    Returns the exit code; TransferLost if the connection ends before the exit packet, socket.timeout
    after `idle_timeout` seconds without any byte from the device.
    """
    conn = device.open_transport(timeout=idle_timeout)
    try:
        conn.send_command("shell,v2,raw:" + command)
        conn.check_okay()
        sock = conn.conn
        while True:
            kind, length = struct.unpack("<BI", _read_exact(sock, 5))
            data = _read_exact(sock, length) if length else b""
            if kind == SHELL_STDOUT:
                on_stdout(data)
            elif kind == SHELL_STDERR:
                on_stderr(data)
            elif kind == SHELL_EXIT:
                return data[0] if data else 255
    finally:
        close_now(conn)


def close_now(conn: adbutils.AdbConnection) -> None:
    """Close a connection whose protocol has ended (shell exit packet, sync QUIT) without the 10 ms
    pause adbutils' own close() takes after a half-close: runs make about twenty connections each.
    The closed socket makes adbutils' close() skip its shutdown and pause, and it still marks the
    connection closed."""
    try:
        conn.conn.close()
    except adbutils.AdbError:  # already closed
        return
    conn.close()


def shell_text(device: adbutils.AdbDevice, command: str, idle_timeout: float = 60.0) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a short command."""
    out, err = bytearray(), bytearray()
    code = run_shell_v2(device, command, on_stdout=out.extend, on_stderr=err.extend, idle_timeout=idle_timeout)
    return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def remove_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
