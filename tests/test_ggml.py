"""The ggml engine (device_scripts/ggml): a llama-architecture GGUF through llama.cpp's own graph builder,
every node dumped under the name llama.cpp gives it, judged against numpy computed from the GGUF's weights;
and seed 004 on ggml itself (ggml_conv_2d's f16 IM2COL at a large input), judged against numpy's own count.
The binary is built once into the cache from llama-cpp-python's sdist (CPU only: ggml-base, ggml-cpu, llama).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.ggml_support import (dump_arrays, f16_weight_matmul_error, ggml_binary, ggml_samples,  # noqa: F401
                                 gguf_weights, run_ggml)

LLAMA_NAMES = ["embd", "attn_norm-0", "Qcur-0", "Vcur-0", "Kcur-0", "kq_soft_max-0", "kqv_out-0", "attn_out-0",
               "ffn_inp-0", "ffn_norm-0", "ffn_gate-0", "ffn_up-0", "ffn_swiglu-0", "ffn_out-0", "l_out-0",
               "attn_norm-1", "l_out-1", "result_norm", "result_output"]


@pytest.fixture(scope="module")
def llama_high(ggml_binary, ggml_samples, tmp_path_factory):
    out = tmp_path_factory.mktemp("ggml-llama") / "high"
    proc = run_ggml(ggml_binary, out, ggml_samples["tinyllama"], f"prompt={ggml_samples['prompt']}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("@@ld ") == len(dump_arrays(out)[1])  # one progress line per node
    return dump_arrays(out)


def rms_norm(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=-1, keepdims=True) + eps)


def test_every_node_named_as_llama_cpp_names_it_in_execution_order(llama_high):
    header, arrays, records = llama_high
    names = list(arrays)
    assert [n for n in names if n in LLAMA_NAMES] == LLAMA_NAMES  # all there, in the builder's order
    assert len(names) == len(set(names)) and len(names) >= 70  # views/reshapes too; repeats get #1, #2
    assert records["Qcur-0"].op_type == "MUL_MAT" and records["kq_soft_max-0"].op_type == "SOFT_MAX"
    assert "attn_norm-0" in records["Qcur-0"].inputs and "blk.0.attn_q.weight" in records["Qcur-0"].inputs
    assert records["l_out-0"].inputs == ["ffn_out-0", "ffn_inp-0"]
    # the KV cache: what reads the cache is fed by the node that stored into it (data flow, not ggml's pointer)
    stores = [n for n, r in records.items() if r.op_type == "SET_ROWS"]
    assert len(stores) == 4 and all(any(n in r.inputs for r in records.values()) for n in stores)
    assert records["cache_k_l0 (view)#1"].inputs == ["cache_k_l0 (view)"]
    assert header["engine"] == "ggml" and header["backends_actual"] == ["cpu"]
    assert header["precision_effective"].endswith("kv f32") and header["options"]["input_kind"] == "prompt"
    assert header["options"]["tokens"][0] == 1 and header["inputs"][0]["dtype"] == "text"  # <s> + the prompt's pieces
    assert all(r.layout.rstrip(")").endswith("@CPU") for r in records.values())  # "[representation (]ggml/<type>@CPU[)]"


def test_dumped_values_are_the_nodes_outputs(llama_high, ggml_samples):
    """numpy from the GGUF's own weights and the dumped inputs of each node reproduces its output."""
    header, a, _ = llama_high
    w = gguf_weights(ggml_samples["tinyllama"])
    tokens = header["options"]["tokens"]
    np.testing.assert_array_equal(a["embd"], w["token_embd.weight"][tokens])
    np.testing.assert_allclose(a["attn_norm-0"], rms_norm(a["embd"]) * w["blk.0.attn_norm.weight"], rtol=1e-5, atol=1e-6)
    # f16 weights: the plain CPU kernel rounds the activations to f16 first (ggml's vec_dot_type); on a CPU with
    # AMX (in a build with ggml's AMX kernels) ggml keeps f16 weights in its AMX buffer, whose kernel keeps them
    # f32 (measured on this Xeon before the host build dropped them: 1.2e-7 against f32 activations, 2.5e-4 against f16)
    assert f16_weight_matmul_error(a["attn_norm-0"], w["blk.0.attn_q.weight"], a["Qcur-0"]) < 1e-5
    gate, up = a["ffn_gate-0"], a["ffn_up-0"]
    np.testing.assert_allclose(a["ffn_swiglu-0"], gate / (1 + np.exp(-gate)) * up, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(a["l_out-0"], a["ffn_out-0"] + a["ffn_inp-0"], rtol=1e-6, atol=1e-6)
    assert a["result_output"].shape == (len(w["token_embd.weight"]),)  # the last token's logits only (ne1 = 1)
    assert f16_weight_matmul_error(a["result_norm"][None], w["output.weight"], a["result_output"]) < 1e-5
    assert a["result_output"].std() > 0.1  # real logits, not a constant


def test_token_ids_give_the_same_graph_as_the_prompt(llama_high, ggml_binary, ggml_samples, tmp_path):
    header, arrays, _ = llama_high
    ids = tmp_path / "ids.npy"
    np.save(ids, np.asarray(header["options"]["tokens"], dtype=np.int64))
    proc = run_ggml(ggml_binary, tmp_path / "o", ggml_samples["tinyllama"], f"tokens={ids}")
    assert proc.returncode == 0, proc.stderr
    header2, arrays2, _ = dump_arrays(tmp_path / "o")
    assert header2["options"]["input_kind"] == "tokens" and header2["inputs"][0]["dtype"] == "int64"
    assert list(arrays2) == list(arrays)
    for name in arrays:
        np.testing.assert_array_equal(arrays2[name], arrays[name], err_msg=name)


def test_tokenize_gives_the_ids_a_prompt_run_records(llama_high, ggml_binary, ggml_samples, tmp_path, monkeypatch):
    """`collect` feeds ids: the tokenize helper turns a prompt into exactly the ids the harness ran."""
    from layerdiff.collector.engines.ggml.tokenize import main

    monkeypatch.setenv("LAYERDIFF_GGML_BINARY", str(ggml_binary))
    text = ggml_samples["prompt"].read_text(encoding="utf-8")
    assert main([str(ggml_samples["tinyllama"]), f"@{ggml_samples['prompt']}", "-o", str(tmp_path / "ids.npy")]) == 0
    assert np.load(tmp_path / "ids.npy").tolist() == llama_high[0]["options"]["tokens"] and text.startswith("the quick")
    assert main([str(tmp_path / "missing.gguf"), "x", "-o", str(tmp_path / "no.npy")]) == 1


def test_low_precision_is_a_q8_0_kv_cache_with_flash_attention(llama_high, ggml_binary, ggml_samples, tmp_path):
    proc = run_ggml(ggml_binary, tmp_path / "low", ggml_samples["tinyllama"], f"prompt={ggml_samples['prompt']}",
                    "cpu", "low")
    assert proc.returncode == 0, proc.stderr
    header, low, records = dump_arrays(tmp_path / "low")
    assert header["options"]["type_k"] == "q8_0" and header["options"]["flash_attn"] is True
    assert "flash-attn" in header["precision_effective"]
    assert any(r.op_type == "FLASH_ATTN_EXT" for r in records.values()) and "kq_soft_max-0" not in low
    high = llama_high[1]
    np.testing.assert_array_equal(low["attn_norm-0"], high["attn_norm-0"])  # before the cache: identical
    diff = np.abs(low["l_out-1"] - high["l_out-1"]).max() / np.abs(high["l_out-1"]).max()
    assert 1e-5 < diff < 0.05  # q8_0 keys and values: a small, real change


def test_bad_inputs_are_one_line(ggml_binary, ggml_samples, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    proc = run_ggml(ggml_binary, tmp_path / "a", bad, f"prompt={ggml_samples['prompt']}")
    assert proc.returncode == 3 and "bad.gguf" in proc.stderr.strip().splitlines()[-1]
    ids = tmp_path / "ids.npy"
    np.save(ids, np.asarray([1, 99999], dtype=np.int32))
    proc = run_ggml(ggml_binary, tmp_path / "b", ggml_samples["tinyllama"], f"tokens={ids}")
    assert proc.returncode == 5 and "99999" in proc.stderr and "vocabulary" in proc.stderr
    proc = run_ggml(ggml_binary, tmp_path / "c", ggml_samples["tinyllama"], f"prompt={ggml_samples['prompt']}", "vulkan")
    assert proc.returncode == 4 and "no Vulkan backend" in proc.stderr and "--backend cpu" in proc.stderr
    for text in (p.stderr for p in [proc]):
        assert "Traceback" not in text and text.strip().splitlines()[-1].startswith("layerdiff-harness: ")


def _conv_reference(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, int]:
    """numpy's convolution (padding 1) and the count of im2col values f16 cannot hold."""
    xp = np.pad(x[0].astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    size = x.shape[-1]
    cols = np.stack([xp[:, ky:ky + size, kx:kx + size] for ky in range(3) for kx in range(3)], axis=1)  # C,9,H,W
    out = np.einsum("ock,ckhw->ohw", w.reshape(w.shape[0], w.shape[1], 9), cols)
    with np.errstate(over="ignore"):
        overflow = int(np.isinf(cols.astype(np.float16)).sum())
    return out, overflow


@pytest.mark.parametrize("size", ["small", "large"])
def test_seed_004_im2col_on_ggml(ggml_binary, ggml_samples, tmp_path, size):
    """ggml_conv_2d builds an f16 IM2COL whatever the kernel's type: at x30000 it overflows (normal),
    an f32 IM2COL (high) does not; the small input passes both ways."""
    x = np.load(ggml_samples[f"conv_{size}"])
    w = gguf_weights(ggml_samples["conv2d"])["conv.weight"]
    reference, overflow = _conv_reference(x, w)
    results = {}
    for precision in ("high", "normal"):
        proc = run_ggml(ggml_binary, tmp_path / precision, ggml_samples["conv2d"], f"x={ggml_samples[f'conv_{size}']}",
                        "cpu", precision)
        assert proc.returncode == 0, proc.stderr
        header, arrays, records = dump_arrays(tmp_path / precision)
        assert records["conv.im2col"].op_type == "IM2COL" and records["conv.mul_mat"].op_type == "MUL_MAT"
        results[precision] = (header, arrays, records)
    high, normal = results["high"][1], results["normal"][1]
    assert results["high"][2]["conv.im2col"].layout == "ggml/f32@CPU"
    assert results["normal"][2]["conv.im2col"].layout == "ggml/f16@CPU"
    assert "im2col f16, kernel f32" == results["normal"][0]["precision_effective"]
    np.testing.assert_allclose(high["conv.out"], reference, rtol=1e-4, atol=1e-3 * np.abs(reference).max())
    bad = int((~np.isfinite(normal["conv.im2col"])).sum())
    assert bad == overflow  # exactly the values numpy says f16 cannot hold
    if size == "small":
        assert overflow == 0 and np.isfinite(normal["conv.out"]).all()
        assert np.abs(normal["conv.out"] - reference).max() < 1e-2 * np.abs(reference).max()
    else:
        assert overflow > 1000 and (~np.isfinite(normal["conv.mul_mat"])).sum() > 10000
        assert np.isfinite(high["conv.out"]).all()


def test_header_records_the_run(ggml_binary, ggml_samples, tmp_path):
    proc = run_ggml(ggml_binary, tmp_path / "o", ggml_samples["conv2d"], f"x={ggml_samples['conv_small']}")
    header = json.loads((tmp_path / "o" / "manifest.jsonl").read_text().splitlines()[0])
    assert proc.returncode == 0 and header["engine_version"].startswith("ggml 0.25.3 (llama-cpp-python 0.3.36")
    assert header["options"]["graph"].startswith("ggml_conv_2d's graph with an f32 IM2COL")


def test_a_vulkan_build_without_glslc_stops_at_once_naming_the_packages(tmp_path, monkeypatch):
    """ggml's Vulkan CMake needs glslc and spirv-headers (Debian packages): checked before anything is
    fetched or compiled, one line naming what to install; the check finds them where Debian puts them."""
    import os
    import subprocess
    import sys

    from layerdiff.collector.engines.ggml.build import missing_vulkan_packages

    (tmp_path / "bin").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "VULKAN_SDK"}
    env.update(PATH=str(tmp_path / "bin"), LAYERDIFF_CACHE=str(tmp_path / "cache"))  # no glslc, an empty cache
    proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.engines.ggml.build", "--vulkan"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "needs glslc" in proc.stderr and "apt-get install glslc" in proc.stderr and "--ggml-vulkan" in proc.stderr
    assert not (tmp_path / "cache" / "harness" / "src").exists()  # nothing fetched
    prefix = tmp_path / "usr"
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert missing_vulkan_packages((str(prefix),)) == ["glslc", "spirv-headers", "libvulkan-dev"]
    for path in ("share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake", "include/vulkan/vulkan.h"):
        (prefix / path).parent.mkdir(parents=True)
        (prefix / path).write_text("")
    (tmp_path / "bin" / "glslc").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "glslc").chmod(0o755)
    assert missing_vulkan_packages((str(prefix),)) == []
