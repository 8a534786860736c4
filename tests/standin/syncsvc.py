"""The `sync:` service (AOSP `SYNC.TXT`): file transfer requests, each [id:4][length:4 LE][payload].

STAT/STA2/LST2 stat a path, LIST/LIS2 list a directory, SEND writes a file (DATA chunks then DONE
carrying the mtime, answered OKAY or FAIL), RECV reads one (DATA chunks then DONE, or FAIL), QUIT ends.
Faults: a quota turns SEND into "No space left on device"; die-after-bytes kills the device mid-transfer.
"""
from __future__ import annotations

import errno
import os
import stat
import struct
from typing import TYPE_CHECKING

from .streams import Stream

if TYPE_CHECKING:
    from .device import StandInDevice

SYNC_DATA_MAX = 64 * 1024
_REQ = struct.Struct("<4sI")
_STAT_V1 = struct.Struct("<4sIII")
_STAT_V2 = struct.Struct("<4sIQQIIIIQqqq")
_DENT_V1 = struct.Struct("<4sIIII")
_DENT_V2 = struct.Struct("<4sIQQIIIIQqqqI")


def _fail(stream: Stream, message: str) -> None:
    data = message.encode()
    stream.write(_REQ.pack(b"FAIL", len(data)) + data)


def _stat_v1(stream: Stream, path: str) -> bytes:
    try:
        st = os.lstat(path)
        return _STAT_V1.pack(b"STAT", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime) & 0xFFFFFFFF)
    except OSError:
        return _STAT_V1.pack(b"STAT", 0, 0, 0)


def _v2_fields(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_mode, st.st_nlink, st.st_uid, st.st_gid, st.st_size,
            int(st.st_atime), int(st.st_mtime), int(st.st_ctime))


def _stat_v2(kind: bytes, path: str, follow: bool) -> bytes:
    try:
        st = os.stat(path) if follow else os.lstat(path)
        return _STAT_V2.pack(kind, 0, *_v2_fields(st))
    except OSError as exc:
        return _STAT_V2.pack(kind, exc.errno or errno.EIO, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def _list(stream: Stream, path: str, v2: bool) -> None:
    try:
        names = [".", ".."] + sorted(os.listdir(path))
    except OSError:
        names = []
    out = bytearray()
    for name in names:
        try:
            st = os.lstat(os.path.join(path, name))
        except OSError:
            continue
        raw = name.encode()
        if v2:
            out += _DENT_V2.pack(b"DNT2", 0, *_v2_fields(st), len(raw)) + raw
        else:
            out += _DENT_V1.pack(b"DENT", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime) & 0xFFFFFFFF, len(raw)) + raw
    out += _DENT_V2.pack(b"DONE", *([0] * 12)) if v2 else _DENT_V1.pack(b"DONE", 0, 0, 0, 0)
    stream.write(bytes(out))


def _discard_until_done(stream: Stream) -> None:
    """adbd keeps reading after a FAIL so the host notices the error instead of a reset."""
    while True:
        kind, length = _REQ.unpack(stream.read_exact(8))
        if kind != b"DATA":
            return
        stream.read_exact(length)


def _send(device: "StandInDevice", stream: Stream, spec: str) -> bool:
    device_path, _, mode_text = spec.rpartition(",")
    if not device_path:
        device_path, mode_text = spec, "33188"
    target = device.sandbox.host_path(device_path)
    mode = int(mode_text or "33188")
    faults = device.current_faults()
    room = device.free_bytes()
    if room is not None and target.exists():
        room += target.stat().st_size
    written = 0
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.unlink()
        with open(target, "wb") as f:
            while True:
                kind, length = _REQ.unpack(stream.read_exact(8))
                if kind == b"DONE":
                    mtime = length
                    break
                if kind != b"DATA":
                    raise OSError(errno.EPROTO, f"unexpected {kind!r} during SEND")
                data = stream.read_exact(length)
                written += len(data)
                if room is not None and written > room:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                if faults.die_after_push_bytes is not None and written >= faults.die_after_push_bytes:
                    device.die(f"push of {device_path} at {written} bytes")
                f.write(data)
        os.chmod(target, stat.S_IMODE(mode) or 0o644)
        os.utime(target, (mtime, mtime))
    except OSError as exc:
        if target.is_file():
            target.unlink()  # adbd removes what it could not finish
        _fail(stream, f"{device_path}: {exc.strerror or exc}")
        if exc.errno != errno.EPROTO:
            _discard_until_done(stream)
        return False
    stream.write(_REQ.pack(b"OKAY", 0))
    return True


def _recv(device: "StandInDevice", stream: Stream, device_path: str) -> bool:
    path = device.sandbox.host_path(device_path)
    try:
        f = open(path, "rb")
    except OSError as exc:
        _fail(stream, f"open failed: {exc.strerror}")
        return False
    limit = device.current_faults().die_after_pull_bytes
    per_message = max(1, (stream.max_payload) // (SYNC_DATA_MAX + 8))
    buf = bytearray(per_message * (SYNC_DATA_MAX + 8))
    view = memoryview(buf)
    sent = 0
    with f:
        while True:
            pos = 0
            for _ in range(per_message):
                n = f.readinto(view[pos + 8:pos + 8 + SYNC_DATA_MAX])
                if not n:
                    break
                _REQ.pack_into(buf, pos, b"DATA", n)
                pos += 8 + n
                sent += n
            if pos == 0:
                break
            if limit is not None and sent >= limit:
                device.die(f"pull of {device_path} at {sent} bytes")
            stream.write(view[:pos])
    stream.write(_REQ.pack(b"DONE", 0))
    return True


def sync_service(device: "StandInDevice", stream: Stream) -> None:
    """Serve sync requests until QUIT, a failed transfer, or the host closing the stream."""
    while True:
        kind, length = _REQ.unpack(stream.read_exact(8))
        if kind == b"QUIT":
            return
        if length > 4096:
            _fail(stream, "path too long")
            return
        name = stream.read_exact(length).decode("utf-8", "surrogateescape")
        if kind == b"STAT":
            stream.write(_stat_v1(stream, str(device.sandbox.host_path(name))))
        elif kind in (b"STA2", b"LST2"):
            stream.write(_stat_v2(kind, str(device.sandbox.host_path(name)), follow=kind == b"STA2"))
        elif kind in (b"LIST", b"LIS2"):
            _list(stream, str(device.sandbox.host_path(name)), v2=kind == b"LIS2")
        elif kind == b"SEND":
            if not _send(device, stream, name):
                return
        elif kind == b"RECV":
            if not _recv(device, stream, name):
                return
        else:
            _fail(stream, f"unknown sync command {kind!r}")
            return
