#!/usr/bin/env python3
"""A small real program that speaks the harness command line (device_scripts/HARNESS_CLI.md) and
writes a valid raw dump (analyzer/FORMATS.md §1), for tests that push it to a stand-in and run it
the way a phone runs the C++ harness. Standard library only: it runs inside the stand-in's shell.

Test knobs beyond the harness CLI: --tensors N, --elems N (float32 values per tensor),
--sleep S (seconds after each tensor; default from $LAYERDIFF_FAKE_HARNESS_SLEEP), --exit CODE (fail with the harness's one-line stderr),
--abort-after K (the harness's own flag: SIGABRT after K tensors), --hang (sleep forever);
$LAYERDIFF_FAKE_HARNESS_NO_FOOTER: exit 0 without writing the footer (a dump cut short, reported as a success).
$LAYERDIFF_FAKE_HARNESS_OPS (a JSON list) names the ops in turn and $LAYERDIFF_FAKE_HARNESS_OP_TYPE
types them, as a hostile phone's harness could (default: layer<k>/conv, Convolution).
"""
import argparse
import hashlib
import json
import os
import signal
import struct
import sys
import time


def utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def parse(argv):
    p = argparse.ArgumentParser(prog="layerdiff-harness")
    p.add_argument("--engine", default="ncnn")
    p.add_argument("--model", action="append", default=[])
    p.add_argument("--input", action="append", default=[])
    p.add_argument("--backend", default="cpu")
    p.add_argument("--precision", default="normal")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out")
    p.add_argument("--tensors", type=int, default=3)
    p.add_argument("--elems", type=int, default=16)
    p.add_argument("--sleep", type=float, default=float(os.environ.get("LAYERDIFF_FAKE_HARNESS_SLEEP", "0")))
    p.add_argument("--exit", type=int, default=0)
    p.add_argument("--abort-after", type=int)
    p.add_argument("--hang", action="store_true")
    p.add_argument("--probe", action="store_true")
    p.add_argument("--version", action="store_true")
    args, _unknown = p.parse_known_args(argv)
    return args


def header(args):
    inputs = []
    for spec in args.input:
        name, _, path = spec.partition("=")
        inputs.append({"name": name, "file": path, "sha256": sha256(path), "shape": [1, 4], "dtype": "float32"})
    return {
        "record": "header", "format": "layerdiff-raw", "format_version": 1, "engine": args.engine,
        "engine_version": "fake-1", "backend_requested": args.backend, "backends_actual": [args.backend],
        "precision_requested": args.precision, "precision_effective": "fp32", "threads": args.threads,
        "model": [{"file": m, "sha256": sha256(m), "bytes": os.path.getsize(m)} for m in args.model],
        "inputs": inputs, "harness": "layerdiff-fake-harness 0.1.0", "started": utc_now(),
    }


def gpu_library(name):
    """Like the real harness's dlopen check: is the vendor's library on this (stand-in) phone?"""
    root = os.environ.get("LAYERDIFF_STANDIN_ROOT", "")
    dirs = ("/vendor/lib64", "/system/lib64", "/vendor/lib", "/system/lib")
    return any(os.path.exists(root + d + "/" + name) for d in dirs)


def probe():
    backends = {"cpu": {"ok": True}}
    for backend, lib in (("opencl", "libOpenCL.so"), ("vulkan", "libvulkan.so")):
        ok = gpu_library(lib)
        backends[backend] = {"ok": ok} if ok else {"ok": False, "reason": f"{lib} not found on the device"}
    return {"harness": "layerdiff-harness", "version": "0.1.0", "abi": "x86_64",
            "engines": {name: {"version": "fake-1", "backends": backends} for name in ("ncnn", "mnn")}}


def op_names(count):
    """The op names and type the dump reports (the environment's, else layer<k>/conv)."""
    names = json.loads(os.environ.get("LAYERDIFF_FAKE_HARNESS_OPS") or "[]")
    ops = [names[k % len(names)] + (f"#{k}" if k >= len(names) else "") if names else f"layer{k}/conv"
           for k in range(count)]
    return ops, os.environ.get("LAYERDIFF_FAKE_HARNESS_OP_TYPE") or "Convolution"


def main(argv):
    args = parse(argv)
    if args.version:
        print("layerdiff-harness 0.1.0 (fake)")
        return 0
    if args.probe:
        print(json.dumps(probe()))
        return 0
    if args.exit:
        print(f"layerdiff-harness: failing on request with status {args.exit}", file=sys.stderr)
        return args.exit
    if not args.out:
        print("layerdiff-harness: bad arguments: --out is required", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    manifest = open(os.path.join(args.out, "manifest.jsonl"), "w")
    data = open(os.path.join(args.out, "tensors.bin"), "wb")
    manifest.write(json.dumps(header(args)) + "\n")
    manifest.flush()
    offset, start, previous = 0, time.monotonic(), "data"
    ops, op_type = op_names(args.tensors)
    for k in range(args.tensors):
        values = [float(k) + i / 8.0 for i in range(args.elems)]
        raw = struct.pack(f"<{args.elems}f", *values)
        data.write(raw)
        data.flush()
        name = f"t{k}"
        manifest.write(json.dumps({
            "record": "tensor", "order": k, "op": ops[k], "op_type": op_type, "output_index": 0,
            "name": name, "inputs": [previous], "shape": [1, args.elems], "dtype": "float32", "layout": "NC",
            "offset": offset, "nbytes": len(raw), "memory": "host", "time_ms": 0.1}) + "\n")
        manifest.flush()
        offset, previous = offset + len(raw), name
        print("@@ld " + json.dumps({"event": "tensor", "k": k + 1, "n": args.tensors, "op": ops[k]}), flush=True)
        if args.abort_after is not None and k + 1 >= args.abort_after:
            print("about to abort", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGABRT)
        if args.sleep:
            time.sleep(args.sleep)
    while args.hang:
        time.sleep(1)
    if os.environ.get("LAYERDIFF_FAKE_HARNESS_NO_FOOTER"):  # a dump cut short by the phone, reported as a success
        manifest.close()
        data.close()
        return 0
    manifest.write(json.dumps({"record": "footer", "tensors": args.tensors, "bytes": offset,
                               "infer_ms": (time.monotonic() - start) * 1000, "finished": utc_now(), "status": "ok"}) + "\n")
    manifest.close()
    data.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
