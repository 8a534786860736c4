"""Bounds before allocation: decompression amplification, image bombs, overflowing shapes, and
numbers at the edge of float32 — each refused (or computed) without a traceback, memory bounded."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import DumpFormatError, LayerdiffError
from layerdiff.analyzer.measure.metrics import PairKernel, Tolerances
from layerdiff.analyzer.formats.tensorstats import tensor_stats
from layerdiff.collector.inputs.preprocess import image_pixel_limit, load_image, parse_preprocess
from tests.faults.support import REPO, assert_one_line_error, cli, write_dump

MODELS = REPO / "samples" / "models"


def _peak_rss_mib(code: str, env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """Run `code` in a fresh interpreter; its peak RSS in MiB (VmHWM: unlike ru_maxrss, it does not
    inherit the forking parent's peak)."""
    script = textwrap.dedent(code) + (
        "\nprint('RSS', [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **(env or {})}, timeout=300)
    rss = [line for line in proc.stdout.splitlines() if line.startswith("RSS ")]
    return (int(rss[-1].split()[1]) / 1024 if rss else float("nan")), proc


def _deflated_npz(path: Path, nbytes: int) -> Path:
    """A small .npz whose one member inflates to `nbytes` of zeros."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("big.npy", "w", force_zip64=True) as fh:
            header = {"descr": "<f4", "fortran_order": False, "shape": (nbytes // 4,)}
            np.lib.format.write_array_header_2_0(fh, header)
            block = bytes(1 << 20)
            for _ in range(nbytes // len(block)):
                fh.write(block)
    return path


def test_npz_bomb_over_limit_refused_before_inflating(tmp_path):
    npz = _deflated_npz(tmp_path / "bomb.npz", 256 << 20)
    assert npz.stat().st_size < 1 << 20  # under 1 MB on disk
    proc = cli("analyze", "import", str(npz), "-o", str(tmp_path / "out.h5"), env={"LAYERDIFF_MAX_TENSOR_BYTES": "64M"})
    assert_one_line_error(proc, "bomb.npz", "per-layer limit", "LAYERDIFF_MAX_TENSOR_BYTES")
    assert not (tmp_path / "out.h5").exists()


def test_npz_inflating_under_limit_costs_one_copy(tmp_path):
    """A 256 MiB tensor from a <1 MB npz: peak RSS stays near one copy of it (was 2.2x)."""
    npz = _deflated_npz(tmp_path / "big.npz", 256 << 20)
    rss, proc = _peak_rss_mib(f"""
        from layerdiff.analyzer.importers.npyfiles import read_npz
        layer = read_npz(__import__('pathlib').Path({str(npz)!r})).layers[0]
        assert layer.load().nbytes == 256 << 20
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    baseline, _ = _peak_rss_mib("import layerdiff.analyzer.importers.npyfiles")
    print(f"figure: 256 MiB tensor from a {npz.stat().st_size / 2**10:.0f} KiB npz at {rss - baseline:.0f} MiB over baseline")
    assert rss - baseline < 256 * 1.3, (rss, baseline)  # figure: RSS over baseline ≤ 1.3x the tensor


def test_json_over_limit_refused(tmp_path):
    doc = tmp_path / "run.json"
    doc.write_text(json.dumps({"lst": [["r", [{"outputs": {}}]]], "pad": "x" * (2 << 20)}))
    proc = cli("analyze", "import", str(doc), "-o", str(tmp_path / "o.h5"), env={"LAYERDIFF_MAX_JSON_BYTES": "1M"})
    assert_one_line_error(proc, "run.json", "LAYERDIFF_MAX_JSON_BYTES")


def test_default_limits_follow_this_machines_ram():
    from layerdiff.analyzer.formats import limits

    assert limits.MAX_TENSOR_BYTES == int(limits.total_ram() * 0.25) or "LAYERDIFF_MAX_TENSOR_BYTES" in __import__("os").environ
    assert limits.MAX_JSON_BYTES <= limits.MAX_TENSOR_BYTES


def test_zip_bomb_extraction_bounded_and_cleaned(tmp_path):
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("run/tensors.bin", "w", force_zip64=True) as fh:
            for _ in range(64):
                fh.write(bytes(1 << 20))
    cache = tmp_path / "cache"
    proc = cli("analyze", "import", str(bomb), "-o", str(tmp_path / "o.h5"),
               env={"LAYERDIFF_MAX_EXTRACT_BYTES": "16M", "XDG_CACHE_HOME": str(cache), "LAYERDIFF_CACHE_DIR": ""})
    assert_one_line_error(proc, "bomb.zip", "LAYERDIFF_MAX_EXTRACT_BYTES")
    leftover = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) if cache.exists() else 0
    assert leftover == 0  # figure: nothing of the refused archive is left in the cache


def test_layers_row_shape_overflow_is_one_line(tmp_path):
    path = write_dump(tmp_path / "d.h5", [np.ones(3, np.float32)])
    with h5py.File(path, "a") as fh:
        table = fh["layers"][()]
        table["shape"][0] = b"[1e400]"
        del fh["layers"]
        fh["layers"] = table
    with DumpFile(path) as dump, pytest.raises(DumpFormatError, match=r"/layers row 0: invalid shape \[inf\]"):
        _ = dump.layers
    proc = cli("analyze", "inspect", str(path))
    assert_one_line_error(proc, "d.h5", "invalid shape")


def test_huge_dataset_message_names_true_size_and_limit(tmp_path):
    """'(0.8 GiB), over the 8 GiB limit' came from a sparse-storage refusal printed as a limit one."""
    path = write_dump(tmp_path / "d.h5", [np.ones(3, np.float32)])
    with h5py.File(path, "a") as fh:
        del fh["tensors/0"]
        fh["tensors"].create_dataset("0", shape=(200 << 20,), dtype="f4", chunks=(1 << 16,))
    with DumpFile(path) as dump, pytest.raises(DumpFormatError) as err:
        dump.tensor(0)
    assert "800 MiB but stores only 0 bytes" in str(err.value) and "limit" not in str(err.value)


@pytest.mark.parametrize("spec, needle", [
    ("scale=1/0", "scale='1/0' is not a finite number"),
    ("mean=nan", "mean/std='nan' is not a finite number"),
    ("std=inf", "mean/std='inf' is not a finite number"),
    ("resize=axb", "resize='axb' is not WIDTHxHEIGHT"),
])
def test_preprocess_values_are_one_liners(spec, needle):
    with pytest.raises(LayerdiffError, match=needle.replace("/", "/").replace("(", r"\(")):
        parse_preprocess(spec)


def _png(path: Path, width: int, height: int) -> Path:
    Image.new("L", (width, height)).save(path, optimize=False)
    return path


def test_resize_beyond_the_model_is_refused_before_allocating(tmp_path):
    image = _png(tmp_path / "small.png", 64, 64)
    limit = image_pixel_limit((1, 3, 32, 32))
    for spec in ("resize=50000x50000", "resize=99999999x99999999"):
        with pytest.raises(LayerdiffError, match="over the .*-pixel limit derived from the model input"):
            load_image(image, parse_preprocess(spec), limit)


def test_extreme_aspect_center_crop_is_bounded(tmp_path):
    image = _png(tmp_path / "strip.png", 40000, 1)
    with pytest.raises(LayerdiffError, match="scaled image"):
        load_image(image, parse_preprocess("resize=4096x4096,crop=center"), image_pixel_limit((1, 3, 4096, 4096)))


def test_decompression_bomb_png_is_one_line_and_bounded(tmp_path):
    """A 40000x40000 PNG (a few hundred KB) through `collect`: one line, RSS far below its 1.6 GB."""
    bomb = tmp_path / "bomb.png"
    Image.new("1", (40000, 40000)).save(bomb)
    rss, proc = _peak_rss_mib(f"""
        from pathlib import Path
        from layerdiff.collector.inputs.preprocess import load_image, default_for, image_pixel_limit
        from layerdiff.errors import LayerdiffError
        try:
            load_image(Path({str(bomb)!r}), default_for((1, 3, 32, 32)), image_pixel_limit((1, 3, 32, 32)))
        except LayerdiffError as err:
            print('REFUSED', err)
    """)
    assert "REFUSED" in proc.stdout and "40000x40000" in proc.stdout or "decompression bomb" in proc.stdout, proc.stdout + proc.stderr
    assert rss < 400, rss  # figure: peak RSS in MiB, far below the 1.6 GB the bomb decodes to
    assert image_pixel_limit((1, 3, 32, 32)) == 64 << 20 and image_pixel_limit((1, 3, 2048, 2048)) == 256 * 2048 * 2048


def test_collect_with_huge_resize_is_one_line(tmp_path):
    image = _png(tmp_path / "img.png", 64, 64)
    model = MODELS / "convnet.mnn"
    proc = cli("collect", "--model", str(model), "--input", str(image), "--preprocess", "resize=99999999x99999999",
               "-o", str(tmp_path / "out"))
    assert_one_line_error(proc, "pixel limit")


@pytest.mark.parametrize("ref, run", [
    ([3e38, 1.0], [3e38, 2.0]),
    ([1.0, 2.0], [3e38, 3e38]),
    ([3e38, -3e38], [-3e38, 3e38]),
])
def test_sqnr_on_finite_values_near_float32_max(ref, run):
    x, y = np.array(ref, np.float32), np.array(run, np.float32)
    with np.errstate(all="ignore"):
        result = PairKernel(Tolerances()).compare(x, y, tensor_stats(x).as_dict(), tensor_stats(y).as_dict())
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    expected = 10 * np.log10(np.dot(x64, x64) / np.dot(y64 - x64, y64 - x64))
    assert result["sqnr_db"] == pytest.approx(expected, rel=1e-9)
    assert result["rel_l2"] == pytest.approx(np.linalg.norm(y64 - x64) / np.linalg.norm(x64), rel=1e-9)


def test_sqnr_unchanged_for_ordinary_values():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(10000).astype(np.float32)
    y = x + rng.standard_normal(10000).astype(np.float32) * 1e-3
    result = PairKernel(Tolerances()).compare(x, y, tensor_stats(x).as_dict(), tensor_stats(y).as_dict())
    d = (y - x).astype(np.float32)
    assert result["sqnr_db"] == pytest.approx(10 * np.log10(float(np.dot(x, x)) / float(np.dot(d, d))), rel=1e-6)


def test_polygraphy_json_peak_memory_is_bounded(tmp_path):
    """A 64 MB Polygraphy JSON: peak RSS over the interpreter's stays within 5x the file (the default
    JSON limit is a quarter of the per-layer limit, so the peak stays under 25% of RAM)."""
    from tests.test_import_polygraphy import run_results

    outputs = {f"t{k}": np.random.default_rng(k).random(1 << 21, dtype=np.float32) for k in range(6)}
    doc = tmp_path / "big.json"
    doc.write_text(json.dumps(run_results({"onnxrt-runner": [outputs]})))
    size_mib = doc.stat().st_size / 2**20
    rss, proc = _peak_rss_mib(f"""
        from pathlib import Path
        from layerdiff.analyzer.importers import import_any
        import_any(Path({str(doc)!r}), None, Path({str(tmp_path / 'o.h5')!r}))
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    baseline, _ = _peak_rss_mib("import layerdiff.analyzer.importers")
    print(f"figure: {size_mib:.0f} MiB Polygraphy JSON imported at {rss - baseline:.0f} MiB over baseline "
          f"({(rss - baseline) / size_mib:.1f}x the file)")
    assert rss - baseline < 5 * size_mib


def test_collect_input_npz_bomb_refused_before_inflating(tmp_path):
    """`collect --input x.npz` reads through the same checked reader as `analyze import`."""
    npz = _deflated_npz(tmp_path / "bomb.npz", 256 << 20)
    proc = cli("collect", "--model", str(REPO / "samples" / "models" / "convnet.param"), "--input", str(npz), "-o", str(tmp_path / "out"),
               env={"LAYERDIFF_MAX_TENSOR_BYTES": "64M"})
    assert_one_line_error(proc, "bomb.npz", "per-layer limit", "LAYERDIFF_MAX_TENSOR_BYTES")
    assert not list((tmp_path).glob("out/*.h5"))
