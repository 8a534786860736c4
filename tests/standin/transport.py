"""One TCP connection from the adb server: the handshake, then streams multiplexed over it."""
from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Callable

from .streams import Stream
from .wire import (
    A_AUTH, A_CLSE, A_CNXN, A_OKAY, A_OPEN, A_VERSION, A_WRTE, AUTH_SIGNATURE, AUTH_TOKEN, MAX_PAYLOAD,
    ConnectionGone, Message, pack, read_message,
)

if TYPE_CHECKING:
    from .device import StandInDevice

Service = Callable[[Stream], None]


class Transport:
    """Speaks the device side of one adb transport until the host or the device goes away."""

    def __init__(self, sock: socket.socket, device: "StandInDevice") -> None:
        self.sock = sock
        self.device = device
        self.max_payload = MAX_PAYLOAD
        self._send_lock = threading.Lock()
        self._streams: dict[int, Stream] = {}
        self._ids = itertools.count(1)
        self._online = False
        self._link_start = self._link_last = 0.0
        self._link_sent = 0

    def send(self, data: bytes) -> None:
        with self._send_lock:
            self.sock.sendall(data)
            self._throttle(len(data))

    def _throttle(self, size: int) -> None:
        """Hold the link to `link_bytes_per_s` (a USB 2 cable moves ~35 MB/s): wait until the bytes sent so
        far could have crossed it. The counter restarts after an idle second, as a cable would."""
        rate = self.device.config.link_bytes_per_s
        if rate <= 0:
            return
        now = time.monotonic()
        if now - self._link_last > 1.0:
            self._link_start, self._link_sent = now, 0
        self._link_sent += size
        ahead = self._link_start + self._link_sent / rate - now
        if ahead > 0:
            time.sleep(ahead)
        self._link_last = time.monotonic()

    def run(self) -> None:
        """Serve until the connection ends; then every open stream sees a close."""
        try:
            while True:
                self._dispatch(read_message(self.sock))
        except (ConnectionGone, OSError):
            pass
        finally:
            for stream in list(self._streams.values()):
                stream.on_close()
            self._streams.clear()
            try:
                self.sock.close()
            except OSError:
                pass

    def _dispatch(self, msg: Message) -> None:
        if msg.command == A_CNXN:
            self._on_connect(msg)
        elif msg.command == A_AUTH:
            self._on_auth(msg)
        elif not self._online:
            return
        elif msg.command == A_OPEN:
            self._on_open(msg)
        elif msg.command == A_OKAY:
            stream = self._streams.get(msg.arg1)
            if stream is not None:
                stream.on_okay()
        elif msg.command == A_WRTE:
            stream = self._streams.get(msg.arg1)
            if stream is not None:
                stream.on_data(msg.payload)
        elif msg.command == A_CLSE:
            stream = self._streams.pop(msg.arg1, None)
            if stream is not None:
                stream.on_close()

    def _on_connect(self, msg: Message) -> None:
        self.max_payload = max(4096, min(MAX_PAYLOAD, msg.arg1))
        if self.device.config.mode == "offline" and not self.device.first_connection():
            return  # never finish the handshake again: the server keeps listing us as offline
        if self.device.config.auth == "reject":
            self.send(pack(A_AUTH, AUTH_TOKEN, 0, os.urandom(20)))
            return
        self._online = True
        self.send(pack(A_CNXN, A_VERSION, self.max_payload, self.device.banner().encode()))
        if self.device.config.mode == "offline":  # online just long enough for `adb connect`, then drop
            threading.Timer(0.5, self._drop).start()

    def _drop(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _on_auth(self, msg: Message) -> None:
        """Reject every signature; on the public key a phone would show its prompt and wait."""
        if self.device.config.auth == "reject" and msg.arg0 == AUTH_SIGNATURE:
            self.send(pack(A_AUTH, AUTH_TOKEN, 0, os.urandom(20)))

    def _on_open(self, msg: Message) -> None:
        destination = msg.payload.rstrip(b"\0").decode("utf-8", "replace")
        service = self.device.service_for(destination)
        if service is None:
            self.send(pack(A_CLSE, 0, msg.arg0))
            return
        local_id = next(self._ids)
        stream = Stream(self.send, local_id, msg.arg0, self.max_payload)
        self._streams[local_id] = stream
        self.send(pack(A_OKAY, local_id, msg.arg0))
        threading.Thread(target=self._serve, args=(service, stream), daemon=True, name=destination[:40]).start()

    def _serve(self, service: Service, stream: Stream) -> None:
        try:
            service(stream)
        except Exception as exc:  # a broken service must not take the transport down
            self.device.log(f"service error: {exc!r}")
        finally:
            stream.close()
            self._streams.pop(stream.local_id, None)
