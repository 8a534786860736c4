"""A stand-in Android phone for tests: speaks the device side of the ADB transport over TCP.

The real `adb` server connects to it (`adb connect 127.0.0.1:PORT`) as it would to a phone over
Wi-Fi; everything above the wire (adb server, adbutils, our collector) is the real thing.
See `launcher.py` (start/stop stand-ins and a private adb server) and `fixtures.py` (pytest).
"""
