"""pytest fixtures: a private adb server per test session and stand-in phones connected to it.

    def test_x(standin):                      # one x86_64 stand-in, online
        dev = AdbDevice(standin.serial)       # adbutils finds our server via the environment
    def test_y(standins):
        a, b = standins(2)                    # two more, each on its own port
        arm = standins.start(abi="arm64-v8a") # options: tests/standin/config.py StandInConfig
        locked = standins.start(state="unauthorized")   # or state="offline"
        standins.unplug(a)                    # the phone vanishes (adb lists it offline)
        a.set_faults(die_after_pull_bytes=1 << 20)   # tests/standin/faults.py Faults fields
    session_standins: the same factory with session scope (a fleet shared by sweep tests).

Every stand-in started by a test is unplugged (killed and `adb disconnect`ed) when the test ends.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from .launcher import AdbServer, StandIn

FAKE_HARNESS = Path(__file__).with_name("fake_harness.py")


@pytest.fixture(scope="session")
def adb_server(tmp_path_factory) -> Iterator[AdbServer]:
    """The real adb server on a free port with its own HOME; the session's environment points at it.

    ANDROID_ADB_SERVER_PORT makes adbutils (and any `adb` we run) use this server;
    ADBUTILS_ADB_PATH pins the binary, so nothing ever starts a server on 5037.
    """
    if shutil.which("adb") is None:
        pytest.skip("the adb binary is not installed (Debian package `adb`)")
    server = AdbServer(tmp_path_factory.mktemp("adb-home")).start()
    saved = {k: os.environ.get(k) for k in ("ANDROID_ADB_SERVER_PORT", "ADBUTILS_ADB_PATH", "ANDROID_ADB_SERVER_HOST")}
    os.environ["ANDROID_ADB_SERVER_PORT"] = str(server.port)
    os.environ["ADBUTILS_ADB_PATH"] = server.adb
    os.environ.pop("ANDROID_ADB_SERVER_HOST", None)
    try:
        yield server
    finally:
        server.kill()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class StandInFactory:
    """Starts stand-ins for one test and unplugs them all at its end."""

    def __init__(self, server: AdbServer, workdir: Path) -> None:
        self.server = server
        self.workdir = workdir
        self.started: list[StandIn] = []

    def start(self, *, state: str = "device", connect: bool = True, **options) -> StandIn:
        """One stand-in; `state` is what adb should list it as once connected (device/unauthorized/offline)."""
        if state == "unauthorized":
            options.setdefault("auth", "reject")
        if state == "offline":
            options.setdefault("mode", "offline")
        standin = StandIn.create(self.workdir / f"standin{len(self.started)}", **options).start()
        self.started.append(standin)
        if connect:
            self.server.connect(standin.serial, state="device" if state == "offline" else state)
            if state == "offline":
                self.server.wait_state(standin.serial, "offline")
        return standin

    def __call__(self, n: int = 1, **options) -> list[StandIn]:
        return [self.start(**options) for _ in range(n)]

    def unplug(self, standin: StandIn) -> None:
        """The phone vanishes mid-whatever (the adb server will list it offline, then drop it)."""
        standin.kill()

    def close(self) -> None:
        for standin in self.started:
            standin.kill()
            self.server.disconnect(standin.serial)


@pytest.fixture
def standins(adb_server, tmp_path) -> Iterator[StandInFactory]:
    factory = StandInFactory(adb_server, tmp_path / "standins")
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="session")
def session_standins(adb_server, tmp_path_factory) -> Iterator[StandInFactory]:
    """Like `standins`, but the phones live for the whole session (sweep tests sharing a fleet)."""
    factory = StandInFactory(adb_server, tmp_path_factory.mktemp("session-standins"))
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def standin(standins) -> StandIn:
    """One online x86_64 stand-in."""
    return standins.start()


@pytest.fixture
def fake_harness() -> Path:
    """A harness stand-in program (Python, runs on an x86_64 stand-in) writing valid raw dumps."""
    return FAKE_HARNESS
