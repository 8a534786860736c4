"""Real inputs: images with the model's preprocessing, folders and globs, multi-input pairs."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import LayerdiffError
from layerdiff.collector.inputs.inputset import resolve_inputs
from layerdiff.collector.inputs.preprocess import load_image, parse_preprocess
from tests.conftest import MODELS

SHAPES = {"data": (1, 3, 32, 32)}


def _image(path, width=48, height=40, seed=0):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    return path


def test_recipe_matches_a_hand_computed_numpy_pipeline(tmp_path):
    path = _image(tmp_path / "a.png", 40, 40)
    recipe = parse_preprocess("resize=40x40,color=bgr,mean=0.485,0.456,0.406,std=0.229,0.224,0.225,scale=1/255,layout=nchw")
    got = load_image(path, recipe)
    pixels = np.asarray(Image.open(path).convert("RGB"), np.float32)[:, :, ::-1] / 255.0
    expected = ((pixels - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).transpose(2, 0, 1)[None]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    nhwc = load_image(path, parse_preprocess("resize=40x40,layout=nhwc"))
    assert nhwc.shape == (1, 40, 40, 3)


def test_center_crop_keeps_aspect_and_fits_the_model(tmp_path):
    path = _image(tmp_path / "wide.png", 96, 40)
    out = load_image(path, parse_preprocess("resize=32x32,crop=center"))
    assert out.shape == (1, 3, 32, 32)


def test_recipe_from_toml_and_json_files(tmp_path):
    (tmp_path / "p.toml").write_text('resize = "32x32"\nmean = [0.5, 0.5, 0.5]\nstd = [0.5, 0.5, 0.5]\n')
    (tmp_path / "p.json").write_text('{"resize": [32, 32], "color": "bgr"}')
    assert parse_preprocess(str(tmp_path / "p.toml")).mean == (0.5, 0.5, 0.5)
    assert parse_preprocess(str(tmp_path / "p.json")).color == "bgr"


def test_unknown_recipe_key_is_refused_by_name():
    with pytest.raises(LayerdiffError, match="unknown preprocessing key 'gamma'"):
        parse_preprocess("resize=32x32,gamma=2.2")


def test_directory_and_glob_give_one_input_per_file_and_report_bad_ones(tmp_path):
    for i in range(3):
        _image(tmp_path / f"img{i}.png", seed=i)
    (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
    np.save(tmp_path / "small.npy", np.zeros((1, 3, 8, 8), np.float32))
    sets, errors = resolve_inputs([str(tmp_path)], SHAPES)
    assert [s.label for s in sets] == ["img0", "img1", "img2"]
    assert len(errors) == 2 and any("broken.jpg: cannot read this image" in e for e in errors)
    assert any("small.npy" in e and "expects [1, 3, 32, 32]" in e for e in errors)
    assert all(s.arrays["data"].shape == (1, 3, 32, 32) and s.preprocess["resize"] == (32, 32) for s in sets)
    globbed, _ = resolve_inputs([str(tmp_path / "img*.png")], SHAPES)
    assert len(globbed) == 3


def test_name_file_pairs_feed_a_two_input_model(tmp_path):
    shapes = {"a": (1, 2, 4, 4), "b": (1, 2, 4, 4)}
    np.save(tmp_path / "x.npy", np.ones((1, 2, 4, 4), np.float32))
    np.save(tmp_path / "y.npy", np.full((1, 2, 4, 4), 2, np.float32))
    sets, errors = resolve_inputs([f"a={tmp_path / 'x.npy'}", f"b={tmp_path / 'y.npy'}"], shapes)
    assert errors == [] and len(sets) == 1 and sets[0].label == "x+y"
    assert sets[0].arrays["b"].mean() == 2


def test_collect_over_a_folder_runs_the_good_images_and_names_the_bad_one(tmp_path):
    for i in range(2):
        _image(tmp_path / f"photo{i}.png", seed=i)
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG broken")
    out = tmp_path / "runs"
    result = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--model", str(MODELS / "convnet.param"),
                             "--input", str(tmp_path), "--preprocess", "resize=32x32,mean=0.5,std=0.25", "-o", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "corrupt.png: cannot read this image" in result.stderr
    assert sorted(p.name for p in out.glob("*.h5")) == ["ncnn_cpu_high_photo0.h5", "ncnn_cpu_high_photo1.h5"]
    with DumpFile(out / "ncnn_cpu_high_photo0.h5") as dump:
        assert dump.provenance["input_preprocess"]["mean"] == [0.5]
        fed = dict(dump.inputs())["data"]
        expected = load_image(tmp_path / "photo0.png", parse_preprocess("resize=32x32,mean=0.5,std=0.25"))
        np.testing.assert_array_equal(fed, expected)


def test_sample_photos_reproduce_seed_003_only_the_dark_ones_collapse(tmp_path):
    """Generated photos on the underflow model: the night shots collapse to zeros on vulkan/low (fp16
    underflow), the daylight ones do not; the analyzer names them and where the zeros start."""
    from layerdiff.samples.images import IMAGES_DIR, RECIPE

    out = tmp_path / "runs"
    collect = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--model", str(MODELS / "underflow.param"),
                              "--input", str(IMAGES_DIR), "--preprocess", RECIPE, "--backend", "cpu,vulkan",
                              "--precision", "high,low", "--no-report", "-o", str(out)],
                             capture_output=True, text=True, timeout=600)
    assert collect.returncode == 0, collect.stderr
    analyzed = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", str(out), "-o", str(tmp_path / "report"), "--json"],
                              capture_output=True, text=True, timeout=600)
    doc = json.loads(analyzed.stdout)
    [dependence] = [f for f in doc["findings"] if f["kind"] == "input_dependence" and f["run"] == "vulkan/low"]
    numbers = dependence["numbers"]
    assert {"garden_night", "tunnel_night"} <= set(numbers["collapsed_inputs"])
    assert not {"street_day", "beach_noon"} & set(numbers["failing_inputs"])
    assert numbers["zero_start_by_input"]["garden_night"] == "gate/square:0"
    assert any(f["kind"] == "fp16_risk" and f["layer"].startswith("gate/") for f in doc["findings"])


@pytest.mark.parametrize("given, declared, fed", [
    ((3, 32, 32), (1, 3, 32, 32), (1, 3, 32, 32)),  # CHW, as ncnn users hold images
    ((1, 3, 32, 32), (3, 32, 32), (3, 32, 32)),      # the reverse, for an engine declared without batch
    ((1, 1, 3, 32, 32), (1, 3, 32, 32), (1, 3, 32, 32)),
    ((3, 8, 8), (1, 3, -1, -1), (1, 3, 8, 8)),       # free dims take the input's size
])
def test_shapes_that_differ_only_by_leading_ones_are_fed_in_the_models_rank(tmp_path, given, declared, fed):
    np.save(tmp_path / "x.npy", np.arange(np.prod(given), dtype=np.float32).reshape(given))
    sets, errors = resolve_inputs([str(tmp_path / "x.npy")], {"data": declared})
    assert errors == [] and sets[0].arrays["data"].shape == fed
    assert sets[0].sha256() == resolve_inputs([str(tmp_path / "x.npy")], {"data": given})[0][0].sha256()


@pytest.mark.parametrize("given", [(3, 32, 16), (2, 3, 32, 32), (32, 32)])
def test_any_other_shape_mismatch_stays_one_line(tmp_path, given):
    np.save(tmp_path / "x.npy", np.zeros(given, np.float32))
    sets, errors = resolve_inputs([str(tmp_path / "x.npy")], SHAPES)
    assert sets == [] and len(errors) == 1 and "the model expects [1, 3, 32, 32]" in errors[0]


def test_a_chw_npy_feeds_an_nchw_ncnn_model_and_the_run_records_the_fed_shape(tmp_path):
    chw = np.random.default_rng(1).random((3, 32, 32), dtype=np.float32)
    np.save(tmp_path / "chw.npy", chw)
    out = tmp_path / "runs"
    result = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--model", str(MODELS / "convnet.param"),
                             "--input", str(tmp_path / "chw.npy"), "-o", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    with DumpFile(out / "ncnn_cpu_high_chw.h5") as dump:
        fed = dict(dump.inputs())["data"]
    assert fed.shape == (1, 3, 32, 32)
    np.testing.assert_array_equal(fed[0], chw)


def test_dynamic_batch_and_spatial_dims_take_the_arrays_sizes():
    """An ONNX input declared [-1, 3, -1, -1] (dynamic batch, H, W) takes a [1, 3, 96, 160] array as it is."""
    from layerdiff.collector.inputs.inputset import fit_shape

    assert fit_shape((1, 3, 96, 160), (-1, 3, -1, -1)) == (1, 3, 96, 160)
    assert fit_shape((3, 96, 160), (1, 3, -1, -1)) == (1, 3, 96, 160)  # leading 1s still fitted
    assert fit_shape((1, 4, 96, 160), (-1, 3, -1, -1)) is None


def test_a_prompt_goes_to_the_engines_text_input_as_its_utf8_bytes(tmp_path):
    """`prompt=FILE.txt` (ggml): the UTF-8 bytes under `prompt`, the text recorded; bad files are one line each."""
    good = tmp_path / "hello.txt"
    good.write_text("Grüße, llama", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("Grüße".encode("latin-1"))
    (tmp_path / "blank.txt").write_text("  \n", encoding="utf-8")
    specs = [f"prompt={good}", f"prompt={tmp_path / 'latin1.txt'}", f"prompt={tmp_path / 'blank.txt'}",
             f"prompt={tmp_path / 'missing.txt'}"]
    sets, errors = resolve_inputs(specs, {"tokens": (-1,)}, prompt_input="prompt")
    assert [s.label for s in sets] == ["hello"]
    assert bytes(sets[0].arrays["prompt"]).decode("utf-8") == "Grüße, llama"
    assert sets[0].arrays["prompt"].dtype == np.uint8
    assert sets[0].preprocess == {"prompt": {"prompt": "Grüße, llama", "file": str(good)}}
    assert len(errors) == 3 and "not UTF-8" in errors[0] and "empty" in errors[1] and "no such file" in errors[2]
    # an engine without a text input: `prompt=` is no input name the model has
    _, errors = resolve_inputs([f"prompt={good}"], {"tokens": (-1,)})
    assert len(errors) == 1 and "prompt=" in errors[0]
