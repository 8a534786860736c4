"""Phones handed out as `host:port` endpoints (device labs: DeviceFarmer/STF, Android Device Streaming).

A lab gives an address a user would `adb connect` to. layerdiff asks the adb server to connect it
(the server's `host:connect:HOST:PORT` service, what `adb connect` sends), waits until the server
lists it as `device`, and from then on it is a phone like any other whose serial is the endpoint.
A lab's network drops connections more often than a USB cable does, so an endpoint layerdiff
connected is reconnected when it drops mid-sweep (a few tries within a deadline) before its run
is marked failed.
"""
from __future__ import annotations

import re
import time

import adbutils

from layerdiff.collector.transport.adbserver import list_devices, state_error
from layerdiff.collector.transport.devices import DeviceError

CONNECT_TIMEOUT_S = 20.0  # how long one connect may take to reach `device` (a lab's first handshake is slow)
RECONNECT_DEADLINE_S = 30.0  # how long a dropped endpoint is tried again before its run is marked failed
RECONNECT_PAUSE_S = 1.0  # between tries: a lab proxy that just dropped usually needs a moment
ENDPOINT_ADVICE = ("the lab endpoint's connection dropped: check that the lab session is still open, then re-run "
                   "the same command (runs already collected are kept)")
_ENDPOINT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9])?):([0-9]{1,5})$")
_CONNECTED = ("connected to", "already connected to")
SETTLING_STATES = ("connecting", "authorizing", "offline", "absent")


def is_endpoint(name: str) -> bool:
    """`host:port` with a port adb can dial (a serial such as `R58M1234` or `arm64:a55` is not one)."""
    match = _ENDPOINT.match(name)
    return bool(match) and 0 < int(match.group(1)) < 65536


def _states(client: adbutils.AdbClient) -> dict[str, str]:
    return {info.serial: info.state for info in list_devices(client)}


def _by_hand(client: adbutils.AdbClient, endpoint: str) -> str:
    """The `adb connect` line a user would type for this server."""
    host = "" if client.host in ("127.0.0.1", "localhost") else f"-H {client.host} "
    port = "" if client.port == 5037 else f"-P {client.port} "
    return f"adb {host}{port}connect {endpoint}"


def _refused(endpoint: str, client: adbutils.AdbClient, answer: str) -> DeviceError:
    """One line: which endpoint, what the server said, what to do."""
    said = " ".join(answer.split())[:160] or "no answer"
    return DeviceError(f"endpoint {endpoint} could not be connected through adb server {client.host}:{client.port} "
                       f"({said}): check that the lab session is still open and the address is right, "
                       f"then retry (by hand: {_by_hand(client, endpoint)})")


def _unauthorized(endpoint: str, client: adbutils.AdbClient) -> DeviceError:
    return DeviceError(f"endpoint {endpoint} is unauthorized for adb server {client.host}:{client.port}: add that "
                       f"server's key (~/.android/adbkey.pub of the user running it) to the lab account's ADB keys "
                       f"(or accept the prompt on the phone), then retry")


def _ask_connect(client: adbutils.AdbClient, endpoint: str, timeout: float) -> str:
    try:
        return client.connect(endpoint, timeout=timeout)
    except (adbutils.AdbError, OSError, EOFError) as err:  # AdbTimeout is an AdbError
        return f"{type(err).__name__}: {err}"


def connect_endpoint(client: adbutils.AdbClient, endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Connect `endpoint` through `client`'s server and wait until it is listed as `device`.

    An endpoint already online is left as it is. A refusal, a timeout and a phone that stays
    unauthorized or offline are each one DeviceError naming the endpoint."""
    if _states(client).get(endpoint) == "device":
        return
    deadline = time.monotonic() + timeout
    answer = _ask_connect(client, endpoint, timeout)
    if "authenticate" in answer:
        raise _unauthorized(endpoint, client)
    if not answer.startswith(_CONNECTED):
        raise _refused(endpoint, client, answer)
    state = "absent"
    while time.monotonic() < deadline:
        state = _states(client).get(endpoint, "absent")
        if state == "device":
            return
        if state == "unauthorized":
            raise _unauthorized(endpoint, client)
        if state not in SETTLING_STATES:  # no permissions, recovery...: waiting will not help
            break
        time.sleep(0.1)
    if state in SETTLING_STATES:  # a lab proxy that accepted the TCP connection but no phone answers behind it
        raise _refused(endpoint, client, f"still {state} after {timeout:g} s")
    raise state_error(endpoint, state)


def reconnect_endpoint(client: adbutils.AdbClient, endpoint: str, deadline_s: float | None = None,
                       pause_s: float | None = None) -> bool:
    """Try to bring a dropped endpoint back until `deadline_s` passes; True once it is `device` again.

    The stale entry is disconnected first: an adb server keeps a dropped TCP device `offline` and
    would answer "already connected" to a plain connect."""
    deadline = time.monotonic() + (RECONNECT_DEADLINE_S if deadline_s is None else deadline_s)
    pause_s = RECONNECT_PAUSE_S if pause_s is None else pause_s
    while True:
        try:
            client.disconnect(endpoint)
        except (adbutils.AdbError, OSError, EOFError, DeviceError):
            pass
        left = deadline - time.monotonic()
        try:
            connect_endpoint(client, endpoint, timeout=max(1.0, min(CONNECT_TIMEOUT_S, left)))
            return True
        except DeviceError:
            pass
        if time.monotonic() + pause_s >= deadline:
            return False
        time.sleep(pause_s)
