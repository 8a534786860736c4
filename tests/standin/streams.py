"""One service stream of the ADB transport, with the protocol's flow control.

After sending WRTE the sender must wait for the peer's OKAY before the next WRTE on that stream.
We apply the same rule to the host: its WRTE is acknowledged only when the service has taken the
data, so a slow service slows the host down instead of filling memory.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable

from .wire import A_CLSE, A_OKAY, A_WRTE, pack


class StreamClosed(Exception):
    """The host closed the stream, or the transport went away."""


class Stream:
    """Byte pipe between a service (device side) and one host socket."""

    def __init__(self, send: Callable[[bytes], None], local_id: int, remote_id: int, max_payload: int) -> None:
        self._send = send
        self.local_id = local_id
        self.remote_id = remote_id
        self.max_payload = max_payload
        self._inbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._buffer = bytearray()
        self._acked = threading.Event()
        self._acked.set()
        self._write_lock = threading.Lock()
        self._closed = threading.Event()
        self._eof = False

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # -- called by the transport's reader thread --------------------------------------------------
    def on_okay(self) -> None:
        self._acked.set()

    def on_data(self, data: bytes) -> None:
        self._inbox.put(data)

    def on_close(self) -> None:
        self._closed.set()
        self._acked.set()
        self._inbox.put(None)

    # -- called by the service ---------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Send bytes to the host in WRTE messages, waiting for each OKAY."""
        view = memoryview(data)
        with self._write_lock:
            for start in range(0, len(view), self.max_payload):
                while not self._acked.wait(0.5):
                    pass
                if self.closed:
                    raise StreamClosed("host closed the stream")
                self._acked.clear()
                self._send(pack(A_WRTE, self.local_id, self.remote_id, bytes(view[start:start + self.max_payload])))

    def read_some(self) -> bytes:
        """Next chunk the host wrote; b"" once the host has closed the stream."""
        if self._buffer:
            data = bytes(self._buffer)
            self._buffer.clear()
            return data
        if self._eof:
            return b""
        data = self._inbox.get()
        if data is None:
            self._eof = True
            return b""
        self._send(pack(A_OKAY, self.local_id, self.remote_id))
        return data

    def read_exact(self, n: int) -> bytes:
        """Exactly n bytes from the host; StreamClosed if it closes first."""
        while len(self._buffer) < n:
            if self._eof:
                raise StreamClosed("host closed the stream")
            data = self._inbox.get()
            if data is None:
                self._eof = True
                continue
            self._send(pack(A_OKAY, self.local_id, self.remote_id))
            self._buffer += data
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def close(self) -> None:
        """Tell the host we are done (CLSE), once."""
        self._inbox.put(None)  # wakes a service thread still waiting for host data
        if not self._closed.is_set():
            self._closed.set()
            try:
                self._send(pack(A_CLSE, self.local_id, self.remote_id))
            except OSError:
                pass
