"""The ggml harness reads each input back from the graph's own input tensor (llama.cpp's `inp_tokens`, the
convolution graph's `x`) right after the node that consumes it ran, and the collector's check holds it
against the input given: token ids as given, a prompt's ids as its tokenizer made them, a float image bit
for bit. Given another input file, the same check names the input and how many elements differ."""
from __future__ import annotations

import numpy as np
import pytest

from layerdiff.analyzer.formats.fedinputs import FED_EQUAL, PROMPT_TOKENS
from layerdiff.analyzer.formats.rawdump import fed_check, read_raw_dump
from tests.ggml_support import ggml_binary, ggml_samples, run_ggml  # noqa: F401 (fixtures)


def read_back(out) -> tuple[object, dict[str, np.ndarray], dict[str, str]]:
    """(the raw dump, each read-back by input name, each read-back's layout)."""
    dump = read_raw_dump(out)
    assert dump.complete, dump.problems
    return dump, {f.name: dump.read_fed(f) for f in dump.fed}, {f.name: f.layout for f in dump.fed}


@pytest.mark.parametrize("given_dtype", [np.int32, np.int64])
def test_token_ids_read_back_from_inp_tokens_equal_the_ids_given(ggml_binary, ggml_samples, tmp_path, given_dtype):
    ids = np.load(ggml_samples["tokens"]).astype(given_dtype)
    np.save(tmp_path / "ids.npy", ids)
    proc = run_ggml(ggml_binary, tmp_path / "out", ggml_samples["tinyllama"], f"tokens={tmp_path / 'ids.npy'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dump, fed, layouts = read_back(tmp_path / "out")
    assert list(fed) == ["tokens"] and layouts["tokens"] == "ggml/i32@CPU"
    assert fed["tokens"].dtype == np.int32 and fed["tokens"].shape == ids.shape
    assert fed["tokens"].tolist() == ids.tolist()
    assert fed_check(dump, [("tokens", ids)]) == FED_EQUAL


def test_a_prompts_read_back_is_its_token_ids_and_checks_against_the_ids_the_run_records(ggml_binary, ggml_samples,
                                                                                       tmp_path):
    text = ggml_samples["prompt"].read_bytes()
    proc = run_ggml(ggml_binary, tmp_path / "out", ggml_samples["tinyllama"], f"prompt={ggml_samples['prompt']}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dump, fed, layouts = read_back(tmp_path / "out")
    assert layouts["prompt"] == f"{PROMPT_TOKENS} (ggml/i32@CPU)"
    assert fed["prompt"].tolist() == dump.header["options"]["tokens"]
    assert fed["prompt"][0] == 1 and fed["prompt"].size > len(text.split())  # BOS, then SPM's pieces of each word
    given = np.frombuffer(text, dtype=np.uint8)  # how the collector stages a prompt
    assert fed_check(dump, [("prompt", given)]) == FED_EQUAL


def test_the_convolution_input_read_back_equals_x_bit_for_bit(ggml_binary, ggml_samples, tmp_path):
    x = np.load(ggml_samples["conv_small"])
    proc = run_ggml(ggml_binary, tmp_path / "out", ggml_samples["conv2d"], f"x={ggml_samples['conv_small']}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dump, fed, layouts = read_back(tmp_path / "out")
    assert list(fed) == ["x"] and layouts["x"] == "ggml/f32@CPU"
    assert fed["x"].shape == x.shape and fed["x"].tobytes() == x.astype(np.float32).tobytes()
    assert fed_check(dump, [("x", x)]) == FED_EQUAL


def test_a_layer_filter_still_reads_the_input_back(ggml_binary, ggml_samples, tmp_path):
    """`--layers` that no node matches (how `tokenize` runs): the input's consumer is still asked for."""
    proc = run_ggml(ggml_binary, tmp_path / "out", ggml_samples["conv2d"], f"x={ggml_samples['conv_small']}", "cpu",
                    "high", "--layers", "(?!)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dump, fed, _ = read_back(tmp_path / "out")
    assert not dump.tensors and fed["x"].tobytes() == np.load(ggml_samples["conv_small"]).tobytes()


def test_the_check_given_another_input_names_it_and_counts_what_differs(ggml_binary, ggml_samples, tmp_path):
    """The real read-back of a run, held against another input file than the one the run was fed."""
    proc = run_ggml(ggml_binary, tmp_path / "conv", ggml_samples["conv2d"], f"x={ggml_samples['conv_small']}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dump, fed, _ = read_back(tmp_path / "conv")
    other = np.load(ggml_samples["conv_small"]).copy()
    other[0, 0, 0, :3] += 1.0
    assert fed_check(dump, [("x", other)]) == (
        f"input 'x': the engine computed on other values than the input given (3 of {other.size} elements differ as "
        "ggml/f32@CPU): its outputs are not the model's answer to this input")
    scaled = np.load(ggml_samples["conv_large"])  # the same shape, every value other
    assert fed_check(dump, [("x", scaled)]).startswith(f"input 'x': the engine computed on other values than the "
                                                       f"input given ({scaled.size} of {scaled.size} elements differ")

    proc = run_ggml(ggml_binary, tmp_path / "ids", ggml_samples["tinyllama"], f"tokens={ggml_samples['tokens']}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dump, fed, _ = read_back(tmp_path / "ids")
    ids = np.load(ggml_samples["tokens"])
    assert fed_check(dump, [("tokens", ids[::-1].copy())]).startswith("input 'tokens': the engine computed on other values")
    assert fed_check(dump, [("tokens", ids[:-1].copy())]) == (
        f"input 'tokens': the engine holds shape [{ids.size}] (ggml/i32@CPU), the input given is [{ids.size - 1}]")
