"""Reaching adb servers without ever starting one, and saying what a device's state means.

adbutils starts `adb start-server` whenever it cannot connect. On a build farm that means a stray
server on a port nobody asked for (and stolen USB devices), so every connection here first checks
that the server the user named is listening and fails with one line if not.
"""
from __future__ import annotations

import os
import shutil
import socket

import adbutils

from layerdiff.collector.transport.devices import DeviceError

DEFAULT_PORT = 5037
STATE_ADVICE = {
    "unauthorized": "accept the RSA prompt on the phone (\"Allow USB debugging?\"), then retry",
    "offline": "reconnect the cable (or `adb reconnect`); if it stays offline, toggle USB debugging on the phone",
    "no permissions": "the adb server cannot open the USB device: fix its udev rule, then `adb kill-server`",
    "authorizing": "wait a moment: the phone is still checking the key",
    "connecting": "wait a moment: the adb server is still connecting",
    "recovery": "boot the phone into Android",
    "sideload": "boot the phone into Android",
    "bootloader": "boot the phone into Android",
}


def parse_server(spec: str | None) -> tuple[str, int]:
    """`host:port`, `port` or None (the host's server: $ANDROID_ADB_SERVER_PORT or 5037)."""
    if not spec:
        host = os.environ.get("ANDROID_ADB_SERVER_HOST") or "127.0.0.1"
        return host, int(os.environ.get("ANDROID_ADB_SERVER_PORT") or DEFAULT_PORT)
    host, sep, port = spec.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", spec
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise DeviceError(f"--adb-server {spec!r}: expected host:port, e.g. 192.168.1.20:5037")
    return host or "127.0.0.1", int(port)


def server_reachable(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def no_server_error(host: str, port: int) -> DeviceError:
    local = host in ("127.0.0.1", "localhost", "::1")
    if local and shutil.which(os.environ.get("ADBUTILS_ADB_PATH") or "adb") is None:
        return DeviceError(f"no adb server at {host}:{port} and `adb` is not installed: install it "
                           f"(Debian/Ubuntu: apt install adb), then run `adb -P {port} start-server`")
    where = f"run `adb -P {port} start-server`" if local else f"run `adb -a -P {port} server nodaemon` on {host}"
    return DeviceError(f"no adb server at {host}:{port}: {where}")


class ServerClient(adbutils.AdbClient):
    """adbutils' client that refuses to start a server: a missing server is a DeviceError."""

    _version: int | None = None

    def make_connection(self, timeout: float | None = None) -> adbutils.AdbConnection:
        if not server_reachable(self.host, self.port):
            raise no_server_error(self.host, self.port)
        return super().make_connection(timeout=timeout)

    def server_version(self) -> int:
        """Asked once per client: adbutils asks before every device connection (one more round trip
        each), to pick the transport request; a server answering on this port keeps its version."""
        if self._version is None:
            self._version = super().server_version()
        return self._version


def connect_server(spec: str | None = None) -> ServerClient:
    """A client for the named server (default: the host's), checked to be listening."""
    host, port = parse_server(spec)
    if not server_reachable(host, port):
        raise no_server_error(host, port)
    return ServerClient(host, port)


def list_devices(client: adbutils.AdbClient) -> list[adbutils.AdbDeviceInfo]:
    """Every device the server knows, in any state (serial, state, tags like model:)."""
    try:
        return client.list(extended=True)
    except adbutils.AdbError as err:
        raise DeviceError(f"adb server {client.host}:{client.port} refused to list devices: {err}") from None
    except (OSError, ValueError, UnicodeDecodeError, IndexError) as err:  # the peer is not an adb server
        raise DeviceError(f"{client.host}:{client.port} does not answer as an adb server ({type(err).__name__}: "
                          f"{str(err)[:80]}); check that --adb-server names an adb server's host:port") from None


def state_error(serial: str, state: str) -> DeviceError:
    advice = STATE_ADVICE.get(state, "check the phone and the cable")
    return DeviceError(f"{serial} is {state}: {advice}")


def require_online(client: adbutils.AdbClient, serial: str) -> None:
    """DeviceError unless the server lists `serial` as "device" (names the serials it does have)."""
    known = {info.serial: info.state for info in list_devices(client)}
    if serial not in known:
        listing = ", ".join(f"{s} ({st})" for s, st in sorted(known.items())) or "none"
        raise DeviceError(f"no device {serial!r} on adb server {client.host}:{client.port}; devices there: {listing}")
    if known[serial] != "device":
        raise state_error(serial, known[serial])


def device_state(client: adbutils.AdbClient, serial: str) -> str:
    """The serial's state now, or "absent" (also when the server itself is gone)."""
    try:
        return {info.serial: info.state for info in client.list()}.get(serial, "absent")
    except (adbutils.AdbError, DeviceError, OSError):
        return "absent"
