"""Run one stand-in phone: `python -m standin --config config.json [--port N]`.

Prints `READY <port>` on stdout once it listens; SIGTERM makes it vanish like an unplugged phone.
Launched by `launcher.StandIn` (tests); runnable by hand to poke it with `adb connect`.
"""
from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
from pathlib import Path

from .config import StandInConfig
from .device import StandInDevice
from .transport import Transport

ADB_SCANNED_PORTS = range(5555, 5586)  # every adb server probes these at start


def _listen(port: int) -> socket.socket:
    for _ in range(50):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        if sock.getsockname()[1] not in ADB_SCANNED_PORTS:
            sock.listen(16)
            return sock
        sock.close()
    raise SystemExit("stand-in: could not find a port outside 5555-5585")


def serve(config: StandInConfig, port: int) -> None:
    listener = _listen(port)
    device = StandInDevice(config, listener.getsockname()[1])
    signal.signal(signal.SIGTERM, lambda _s, _f: device.die("SIGTERM"))
    print(f"READY {device.port}", flush=True)
    while True:
        conn, _addr = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=Transport(conn, device).run, daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(prog="standin", description=__doc__)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    try:
        serve(StandInConfig.from_json(args.config.read_text()), args.port)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
