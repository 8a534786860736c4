"""`shell,v2:`, `shell:` and `exec:` services: commands run by the host's /bin/sh in the sandbox.

shell v2 frames every chunk as [id:1][length:4 LE][data]: id 0 stdin, 1 stdout, 2 stderr, 3 exit
code (one byte), 4 close stdin, 5 window size. v1 `shell:` and `exec:` are raw byte streams with
stderr merged into stdout and no exit code (as adbd does without the shell protocol).
"""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import threading
from typing import TYPE_CHECKING, Callable

from .streams import Stream, StreamClosed

if TYPE_CHECKING:
    from .device import StandInDevice

ID_STDIN, ID_STDOUT, ID_STDERR, ID_EXIT, ID_CLOSE_STDIN = 0, 1, 2, 3, 4


def packet(kind: int, data: bytes) -> bytes:
    return struct.pack("<BI", kind, len(data)) + data


class _Unmapper:
    """Maps sandbox paths back to device paths, a whole line at a time (a path never splits)."""

    def __init__(self, device: "StandInDevice") -> None:
        self._device = device
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) < 65536:
            self._pending = data
            return b""
        cut = cut or len(data)
        self._pending = data[cut:]
        return self._device.sandbox.unmap_output(data[:cut])

    def flush(self) -> bytes:
        data, self._pending = self._pending, b""
        return self._device.sandbox.unmap_output(data)


def _pump_output(fd: int, emit: Callable[[bytes], None], unmapper: _Unmapper | None) -> None:
    try:
        while chunk := os.read(fd, 65536):
            out = unmapper.feed(chunk) if unmapper else chunk
            if out:
                emit(out)
        if unmapper and (rest := unmapper.flush()):
            emit(rest)
    except (StreamClosed, OSError):
        pass


def _hang_up(proc: subprocess.Popen) -> None:
    """The host went away: end the command's whole process group, as a lost adb session does."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGHUP)
        proc.wait(2)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def _feed_stdin_v2(stream: Stream, proc: subprocess.Popen) -> None:
    try:
        while True:
            kind, length = struct.unpack("<BI", stream.read_exact(5))
            data = stream.read_exact(length) if length else b""
            if kind == ID_STDIN and proc.stdin:
                proc.stdin.write(data)
                proc.stdin.flush()
            elif kind == ID_CLOSE_STDIN and proc.stdin:
                proc.stdin.close()
    except (StreamClosed, OSError, ValueError):
        pass
    if stream.closed:
        _hang_up(proc)


def _feed_stdin_raw(stream: Stream, proc: subprocess.Popen) -> None:
    try:
        while data := stream.read_some():
            if proc.stdin:
                proc.stdin.write(data)
                proc.stdin.flush()
    except (OSError, ValueError):
        pass
    if stream.closed:
        _hang_up(proc)


def _start(device: "StandInDevice", command: str, merge_stderr: bool) -> subprocess.Popen:
    device.watch_command(command)
    argv = ["/bin/sh", "-c", device.sandbox.translate_command(command)] if command.strip() else ["/bin/sh"]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        cwd=device.sandbox.root, env=device.shell_env(), start_new_session=True,
    )
    device.track(proc.pid)
    return proc


def _exit_code(returncode: int) -> int:
    """adbd reports a command killed by signal N as 128 + N."""
    return 128 - returncode if returncode < 0 else returncode & 0xFF


def shell_service(device: "StandInDevice", stream: Stream, command: str, *, v2: bool) -> None:
    """Run one shell command; v2 keeps stderr apart and reports the exit code."""
    proc = _start(device, command, merge_stderr=not v2)
    try:
        if v2:
            pumps = [
                threading.Thread(target=_pump_output, args=(proc.stdout.fileno(), lambda d: stream.write(packet(ID_STDOUT, d)), _Unmapper(device))),
                threading.Thread(target=_pump_output, args=(proc.stderr.fileno(), lambda d: stream.write(packet(ID_STDERR, d)), _Unmapper(device))),
            ]
            feeder = threading.Thread(target=_feed_stdin_v2, args=(stream, proc), daemon=True)
        else:
            pumps = [threading.Thread(target=_pump_output, args=(proc.stdout.fileno(), stream.write, _Unmapper(device)))]
            feeder = threading.Thread(target=_feed_stdin_raw, args=(stream, proc), daemon=True)
        feeder.start()
        for pump in pumps:
            pump.start()
        for pump in pumps:
            pump.join()
        returncode = proc.wait()
        if v2 and not stream.closed:
            stream.write(packet(ID_EXIT, bytes([_exit_code(returncode)])))
    finally:
        device.untrack(proc.pid)
        _hang_up(proc)


def exec_service(device: "StandInDevice", stream: Stream, command: str) -> None:
    """`exec:` is a raw pipe: bytes out exactly as the command wrote them (binary safe)."""
    proc = _start(device, command, merge_stderr=True)
    try:
        feeder = threading.Thread(target=_feed_stdin_raw, args=(stream, proc), daemon=True)
        feeder.start()
        _pump_output(proc.stdout.fileno(), stream.write, None)
        proc.wait()
    finally:
        device.untrack(proc.pid)
        _hang_up(proc)
