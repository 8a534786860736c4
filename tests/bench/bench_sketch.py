"""Benchmark: sketch-first collection against a full pull over a link throttled to USB 2 speed.

Run by hand:  python -m tests.bench.bench_sketch [--size 1280] [--mbps 35]

Setup: PP-OCRv4 text detection (rapidocr's wheel, converted by pnnx at SIZE x SIZE: at 1280 its dump is
over 0.5 GB) run by pip ncnn at high precision (the local golden) and at low precision (bf16 on x86: the
"phone" run). The low run's raw dump is placed on a stand-in phone whose device-to-host link is throttled
to `--mbps` MB/s (a USB 2 cable moves ~35), behind the real adb server.
- full: `fetch_dir` of the whole dump, conversion to HDF5, the analysis against the golden;
- sketch: the first pass (manifest, summaries, outputs, small tensors), then the refine loop (analysis,
  byte-range pulls of what the judge names, until nothing new is named), the last analysis included.
Printed: bytes pulled and wall time of each, their ratios, and whether the verdict, first divergence and
failure sources agree. Goal: the same answers, <= 10% of the bytes, >= 5x less wall time.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.corpus import MODELS, _nchw, convert_with_pnnx, text_image, wheel_file  # noqa: E402
from tests.standin.launcher import AdbServer, StandIn  # noqa: E402

REMOTE = "/data/local/tmp/layerdiff/runs/bench/dump"
HEADLINE = ("first_divergence", "failure_source")


def make_dumps(work: Path, size: int) -> dict[str, Path]:
    onnx = work / "ocr_det.onnx"
    onnx.write_bytes(wheel_file(MODELS[0]).read_bytes())
    param = convert_with_pnnx(onnx, f"[1,3,{size},{size}]f32", work)
    image = _nchw(text_image(size, size, "sketch-first " * 4), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    np.save(work / "in0.npy", image)
    out = {}
    for precision in ("high", "low"):
        out[precision] = work / precision
        subprocess.run([sys.executable, "-m", "layerdiff.collector.engines.ncnn.engine", "--engine", "ncnn",
                        "--model", str(param), "--model", str(param.with_suffix(".bin")),
                        "--input", f"in0={work / 'in0.npy'}", "--backend", "cpu", "--precision", precision,
                        "--out", str(out[precision])], check=True, capture_output=True)
    return out


def _time_link(device) -> dict:
    """Wrap the device's pulls so the seconds spent moving bytes over the link add up in the dict returned."""
    spent = {"s": 0.0}
    for name in ("fetch_files", "read_ranges"):
        original = getattr(device, name)

        def timed(*args, _original=original, **kw):
            t = time.perf_counter()
            try:
                return _original(*args, **kw)
            finally:
                spent["s"] += time.perf_counter() - t
        setattr(device, name, timed)
    return spent


def answers(analysis) -> tuple:
    headline = sorted((str(f.kind), f.layer) for f in analysis.findings if str(f.kind) in HEADLINE)
    verdicts = sorted(zip(analysis.summary["role"].tolist(), analysis.summary["verdict"].tolist()))
    return tuple(verdicts), tuple(headline)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1280)
    parser.add_argument("--mbps", type=float, default=35.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="layerdiff-bench-sketch-"))
    try:
        run(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, args) -> None:
    dumps = make_dumps(work, args.size)
    dump_bytes = (dumps["low"] / "tensors.bin").stat().st_size
    print(f"dump: {dump_bytes / 1e6:.0f} MB in {sum(1 for _ in open(dumps['low'] / 'manifest.jsonl')) - 2} tensors")
    server = AdbServer(work / "home").start()
    os.environ["ANDROID_ADB_SERVER_PORT"], os.environ["ADBUTILS_ADB_PATH"] = str(server.port), server.adb
    standin = StandIn.create(work / "phone", link_bytes_per_s=args.mbps * 1e6).start()
    try:
        server.connect(standin.serial)
        shutil.copytree(dumps["low"], standin.host_path(REMOTE))
        from layerdiff.analyzer.analysis import analyze_paths
        from layerdiff.analyzer.formats.rawdump import convert_raw_dump
        from layerdiff.collector.run.sketchpull import refine, start_pull
        from layerdiff.collector.transport.adb import AdbDevice

        golden = convert_raw_dump(dumps["high"], work / "golden.h5")
        device = AdbDevice(standin.serial)
        link = _time_link(device)

        os.sync()
        t0 = time.perf_counter()
        local = device.fetch_dir(REMOTE, work / "full_raw")
        t_pull = time.perf_counter() - t0
        full_h5 = convert_raw_dump(local, work / "full.h5")
        analysis = analyze_paths([golden, full_h5], ref=golden)
        full_answers = answers(analysis)
        analysis.close()
        t_full = time.perf_counter() - t0
        full_bytes = sum(p.stat().st_size for p in Path(local).rglob("*") if p.is_file())

        os.sync()
        link["s"] = 0.0
        t0 = time.perf_counter()
        pull = start_pull(device, REMOTE, work / "sketch_raw")
        t_first = time.perf_counter() - t0
        first_bytes = pull.bytes_pulled
        target = work / "sketch_h5" / "low.h5"
        result = refine({target: pull}, [golden], golden, keep_analysis=True)  # its last analysis is the answer
        analysis = result.analysis
        sketch_answers = answers(analysis)
        analysis.close()
        t_sketch = time.perf_counter() - t0
        t_link = link["s"]
    finally:
        standin.kill()
        server.kill()

    print(f"full:   {full_bytes / 1e6:8.1f} MB pulled, pull {t_pull:6.1f} s, to the answer {t_full:6.1f} s")
    print(f"sketch: {pull.bytes_pulled / 1e6:8.1f} MB pulled ({first_bytes / 1e6:.1f} MB first pass, {t_first:.1f} s; "
          f"{result.named[target]} tensors named in {result.rounds} rounds, {result.reused} rows reused), to the answer {t_sketch:6.1f} s")
    print(f"transfer: full {t_pull:.1f} s, sketch-first {t_link:.1f} s over the link: {t_pull / t_link:.1f}x less")
    print(f"bytes: {pull.bytes_pulled / full_bytes:.1%} of the full pull (goal <= 10%)")
    print(f"wall time: {t_full / t_sketch:.1f}x faster to the answer (goal >= 5x); pull alone "
          f"{t_pull / t_first:.1f}x for the first pass")
    print(f"same verdict, first divergence and failure sources: {full_answers == sketch_answers}")
    print(f"  full:   {full_answers}")
    print(f"  sketch: {sketch_answers}")


if __name__ == "__main__":
    main()
