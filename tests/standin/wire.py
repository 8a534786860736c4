"""The ADB transport's message framing (AOSP `protocol.txt`), device side.

Every message is a 24-byte header (command, arg0, arg1, payload length, payload checksum, magic =
command ^ 0xffffffff, all little-endian uint32) followed by the payload. We advertise protocol
version 0x01000001, which lets both sides skip the checksum, so we always send 0 there.
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

A_SYNC = 0x434E5953
A_CNXN = 0x4E584E43
A_AUTH = 0x48545541
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_CLSE = 0x45534C43
A_WRTE = 0x45545257
A_STLS = 0x534C5453

A_VERSION = 0x01000001
MAX_PAYLOAD = 1024 * 1024

AUTH_TOKEN = 1
AUTH_SIGNATURE = 2
AUTH_RSAPUBLICKEY = 3

_HEADER = struct.Struct("<6I")
NAMES = {A_SYNC: "SYNC", A_CNXN: "CNXN", A_AUTH: "AUTH", A_OPEN: "OPEN", A_OKAY: "OKAY",
         A_CLSE: "CLSE", A_WRTE: "WRTE", A_STLS: "STLS"}


class ConnectionGone(Exception):
    """The host side closed the TCP connection (or we did)."""


@dataclass
class Message:
    command: int
    arg0: int
    arg1: int
    payload: bytes = b""

    def __repr__(self) -> str:
        return f"Message({NAMES.get(self.command, hex(self.command))}, {self.arg0}, {self.arg1}, {len(self.payload)}B)"


def pack(command: int, arg0: int, arg1: int, payload: bytes = b"") -> bytes:
    """Header + payload ready for `sendall`; checksum 0 (skipped at our protocol version)."""
    return _HEADER.pack(command, arg0, arg1, len(payload), 0, command ^ 0xFFFFFFFF) + payload


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionGone("peer closed the connection")
        got += k
    return bytes(buf)


def read_message(sock: socket.socket) -> Message:
    """Read one message; raise ConnectionGone on EOF or a corrupt header."""
    command, arg0, arg1, length, _check, magic = _HEADER.unpack(_read_exact(sock, _HEADER.size))
    if magic != command ^ 0xFFFFFFFF:
        raise ConnectionGone(f"bad magic in message header {command:#x}")
    if length > MAX_PAYLOAD:
        raise ConnectionGone(f"payload of {length} bytes exceeds {MAX_PAYLOAD}")
    payload = _read_exact(sock, length) if length else b""
    return Message(command, arg0, arg1, payload)
