#!/usr/bin/env python3
"""The phone's own tools that a Linux host lacks or that must see the stand-in's state.

`install_tools(state)` writes small launchers into `<state>/bin` (first on the PATH of every
command the stand-in runs); each runs this file as a script: `tools.py <name> <args>`.
- getprop [KEY [DEFAULT]]   properties from `<state>/props`
- logcat [-d] [-t N] [--pid=P] [-b BUF] [-v FMT]   lines from `<state>/logcat.txt`
- df [-k] [PATH]            the host's df, or the quota from faults.json when one is set
- timeout [-s SIG] [-k DUR] DUR CMD...   like toybox timeout; a child killed by a crash signal
                            leaves a debuggerd-style "Fatal signal" line in logcat, as on Android
- dumpsys SurfaceFlinger    a "GLES:" line when the stand-in was given one
sha256sum, stat, ls, rm, mkdir, cat, sh come from the host.
Standard library only; runs with `python -S` to start fast.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TOOLS = ("getprop", "logcat", "df", "timeout", "dumpsys")
CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP,
                 signal.SIGSYS}


def install_tools(state: Path) -> Path:
    """Write the launchers; returns the bin directory to put first on PATH."""
    bin_dir = Path(state) / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).resolve()
    for name in TOOLS:
        launcher = bin_dir / name
        launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{script}" {name} "$@"\n')
        launcher.chmod(0o755)
    return bin_dir


def _state() -> Path:
    return Path(os.environ["LAYERDIFF_STANDIN_STATE"])


def getprop(args: list[str]) -> int:
    props = {}
    for line in (_state() / "props").read_text().splitlines():
        key, _, value = line.partition("=")
        props[key] = value
    if not args:
        for key in sorted(props):
            print(f"[{key}]: [{props[key]}]")
    else:
        print(props.get(args[0], args[1] if len(args) > 1 else ""))
    return 0


def logcat(args: list[str]) -> int:
    pid, tail, i = None, None, 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--pid="):
            pid = int(arg.split("=", 1)[1])
        elif arg in ("--pid", "-t", "-T", "-b", "-v") and i + 1 < len(args):
            if arg == "--pid":
                pid = int(args[i + 1])
            elif arg in ("-t", "-T"):
                tail = int(args[i + 1]) if args[i + 1].isdigit() else None
            i += 1
        elif arg == "-c":
            (_state() / "logcat.txt").write_text("")
            return 0
        i += 1
    path = _state() / "logcat.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    if pid is not None:
        lines = [ln for ln in lines if len(ln.split()) > 2 and ln.split()[2] == str(pid)]
    for line in lines[-tail:] if tail else lines:
        print(line)
    return 0


def _quota() -> int | None:
    path = _state() / "faults.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("quota_bytes")


def used_bytes(root: str) -> int:
    """Bytes stored under a sandbox (what the quota fault counts)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def df(args: list[str]) -> int:
    quota = _quota()
    if quota is None:
        return subprocess.call(["df", *args], env={**os.environ, "PATH": _host_path()})
    used = used_bytes(os.environ["LAYERDIFF_STANDIN_ROOT"])
    total_k, used_k = quota // 1024, used // 1024
    avail_k = max(0, total_k - used_k)
    pct = (100 * used_k // total_k) if total_k else 100
    print("Filesystem     1K-blocks    Used Available Use% Mounted on")
    print(f"/dev/block/dm-0 {total_k} {used_k} {avail_k} {pct}% /data")
    return 0


def _host_path() -> str:
    ours = str(_state() / "bin")
    return ":".join(p for p in os.environ.get("PATH", "").split(":") if p != ours)


def _parse_duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text)


def _parse_signal(text: str) -> int:
    text = text.upper().removeprefix("SIG")
    return int(text) if text.isdigit() else int(getattr(signal, "SIG" + text))


def _log_crash(pid: int, sig: int, name: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S") + ".000"
    signame = signal.Signals(sig).name
    with open(_state() / "logcat.txt", "a") as f:
        f.write(f"{stamp} {pid} {pid} F libc    : Fatal signal {sig} ({signame}), code -6 (SI_TKILL) "
                f"in tid {pid} ({name}), pid {pid} ({name})\n")
        f.write(f"{stamp} {pid} {pid} F DEBUG   : pid: {pid}, tid: {pid}, name: {name}  >>> {name} <<<\n")


def timeout(args: list[str]) -> int:
    sig, kill_after = signal.SIGTERM, None
    while args and args[0].startswith("-") and args[0] != "--":
        opt = args.pop(0)
        if opt in ("-s", "--signal"):
            sig = _parse_signal(args.pop(0))
        elif opt.startswith("--signal="):
            sig = _parse_signal(opt.split("=", 1)[1])
        elif opt in ("-k", "--kill-after"):
            kill_after = _parse_duration(args.pop(0))
        elif opt.startswith("--kill-after="):
            kill_after = _parse_duration(opt.split("=", 1)[1])
    if args and args[0] == "--":
        args.pop(0)
    if len(args) < 2:
        print("timeout: usage: timeout [-s SIG] [-k DUR] DURATION COMMAND...", file=sys.stderr)
        return 125
    duration, command = _parse_duration(args[0]), args[1:]
    try:
        child = subprocess.Popen(command)
    except FileNotFoundError:
        print(f"timeout: {command[0]}: No such file or directory", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"timeout: {command[0]}: Permission denied", file=sys.stderr)
        return 126
    for forwarded in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(forwarded, lambda s, _f: child.send_signal(s))
    if not _wait_unreaped(child.pid, duration):
        child.send_signal(sig)
        try:
            child.wait(kill_after)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        return 124
    name = _comm(child.pid)
    status = child.wait()
    if status < 0:
        if -status in CRASH_SIGNALS:
            _log_crash(child.pid, -status, name)
        return 128 - status
    return status


def _wait_unreaped(pid: int, duration: float) -> bool:
    """Wait for the child to end without reaping it (its /proc entry still names it); False at the deadline."""
    deadline = time.monotonic() + duration
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if duration > 0 and time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def dumpsys(args: list[str]) -> int:
    gles = (_state() / "gles").read_text().strip() if (_state() / "gles").exists() else ""
    if args and args[0] == "SurfaceFlinger" and gles:
        print(f"GLES: {gles}")
    return 0


def main(argv: list[str]) -> int:
    tool = {"getprop": getprop, "logcat": logcat, "df": df, "timeout": timeout, "dumpsys": dumpsys}
    return tool[argv[0]](argv[1:])


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:
        sys.exit(141)
