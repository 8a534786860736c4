"""Small seeded GGUF models for the ggml engine: a llama-architecture language model and a convolution.

Why written here: PyPI carries no small GGUF of a real architecture (gemma3-270m comes in four 60 MB
parts), and hub downloads are off limits. So `tinyllama` is a llama model as llama.cpp reads it
(its keys, its tensor names, an SPM tokenizer with byte fallback) with seeded weights: llama.cpp's
own graph builder runs it, so every node carries the names llama.cpp prints (attn_norm-0, Qcur-0,
ffn_out-1, result_output). `conv2d` is layerdiff's one-op graph (general.architecture
"layerdiff.conv2d"): the harness runs it as ggml_conv_2d, which ggml builds as IM2COL + MUL_MAT,
the op pair of seed 004.

`python -m layerdiff.samples.ggml_models --out DIR` writes, byte-identical from run to run:
    DIR/tinyllama.gguf, DIR/tinyllama_prompt.txt, DIR/tinyllama_tokens.npy
    DIR/conv2d.gguf, DIR/conv2d_small.npy (randn), DIR/conv2d_large.npy (the same x 30000)
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

LLAMA_SEED = 20261125
CONV_SEED = 4  # seed 004
PROMPT = "the quick brown fox jumps over the lazy dog"
# llama.cpp's token types (gguf.TokenType): normal, unknown, control, byte
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
LARGE_SCALE = 30000.0  # the field report's "large" input: fp16 (max 65504) overflows inside im2col


def _vocab() -> tuple[list[str], list[float], list[int]]:
    """An SPM vocabulary: <unk> <s> </s>, the 256 byte-fallback tokens, letters and a few words."""
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [UNKNOWN, CONTROL, CONTROL]
    for byte in range(256):
        tokens.append(f"<0x{byte:02X}>")
        scores.append(0.0)
        types.append(BYTE)
    pieces = ["\u2581"] + list("abcdefghijklmnopqrstuvwxyz") + [f"\u2581{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    pieces += [f"\u2581{w}" for w in PROMPT.split()] + ["he", "th", "er", "ow", "ump", "azy"]
    for rank, piece in enumerate(dict.fromkeys(pieces)):
        tokens.append(piece)
        scores.append(-float(rank) - (10.0 if len(piece) <= 2 else 0.0))  # longer pieces win the merge
        types.append(NORMAL)
    return tokens, scores, types


def _write(writer, path: Path) -> None:
    """Write a GGUFWriter's file under a temporary name, then rename (never a half-written model)."""
    tmp = path.with_name(f".{path.name}.partial")
    writer.path = tmp
    writer.write_header_to_file(tmp)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)


def write_tinyllama(path: Path, *, n_embd: int = 128, n_layer: int = 2, n_head: int = 4, n_head_kv: int = 2,
                    n_ff: int = 128, weight_type: str = "f16", seed: int = LLAMA_SEED) -> Path:
    """A llama model llama.cpp loads as is (grouped-query attention, SwiGLU FFN, RMSNorm, RoPE)."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab()
    w = gguf.GGUFWriter(None, "llama")
    w.add_name("layerdiff-tinyllama")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(1 if weight_type == "f16" else 0)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    dtype = np.float16 if weight_type == "f16" else np.float32

    def matrix(name: str, rows: int, cols: int) -> None:  # numpy (rows, cols) = ggml ne (cols, rows)
        w.add_tensor(name, (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(dtype))

    def norm(name: str) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32))

    head_dim = n_embd // n_head
    w.add_tensor("token_embd.weight", rng.standard_normal((len(tokens), n_embd)).astype(dtype))
    for i in range(n_layer):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", n_embd, n_embd)
        matrix(f"blk.{i}.attn_k.weight", n_head_kv * head_dim, n_embd)
        matrix(f"blk.{i}.attn_v.weight", n_head_kv * head_dim, n_embd)
        matrix(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        matrix(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        matrix(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    norm("output_norm.weight")
    matrix("output.weight", len(tokens), n_embd)
    _write(w, path)
    return path


def write_conv2d(path: Path, *, in_ch: int = 8, out_ch: int = 16, kernel: int = 3, padding: int = 1,
                 seed: int = CONV_SEED) -> Path:
    """layerdiff's one-op GGUF graph: conv.weight [out, in, kh, kw] (f32) and its stride/padding/dilation."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(None, "layerdiff.conv2d")
    w.add_name("layerdiff-conv2d")
    w.add_int32("layerdiff.conv2d.stride", 1)
    w.add_int32("layerdiff.conv2d.padding", padding)
    w.add_int32("layerdiff.conv2d.dilation", 1)
    fan_in = in_ch * kernel * kernel
    w.add_tensor("conv.weight", (rng.standard_normal((out_ch, in_ch, kernel, kernel)) / np.sqrt(fan_in)).astype(np.float32))
    _write(w, path)
    return path


def conv_input(size: int = 32, in_ch: int = 8, scale: float = 1.0, seed: int = CONV_SEED) -> np.ndarray:
    """x [1, in_ch, size, size]: randn, times `scale` (LARGE_SCALE for the large case)."""
    rng = np.random.default_rng(seed + 1)
    return (rng.standard_normal((1, in_ch, size, size)) * scale).astype(np.float32)


def prompt_tokens() -> np.ndarray:
    """Token ids of <s> + the prompt's whole-word pieces, for runs that feed ids rather than text (llama.cpp's
    SPM tokenizer splits the prompt text finer: a `prompt=` run feeds other ids, which its header records)."""
    tokens, _, _ = _vocab()
    index = {piece: i for i, piece in enumerate(tokens)}
    ids = [1] + [index[f"\u2581{word}"] for word in PROMPT.split()]
    return np.asarray(ids, dtype=np.int32)


def write_all(out_dir: Path) -> dict[str, Path]:
    """Every ggml sample file under `out_dir` (created); returns them by role."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "tinyllama": write_tinyllama(out_dir / "tinyllama.gguf"),
        "conv2d": write_conv2d(out_dir / "conv2d.gguf"),
        "prompt": out_dir / "tinyllama_prompt.txt",
        "tokens": out_dir / "tinyllama_tokens.npy",
        "conv_small": out_dir / "conv2d_small.npy",
        "conv_large": out_dir / "conv2d_large.npy",
    }
    files["prompt"].write_text(PROMPT + "\n", encoding="utf-8")
    np.save(files["tokens"], prompt_tokens())
    np.save(files["conv_small"], conv_input())
    np.save(files["conv_large"], conv_input(scale=LARGE_SCALE))
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m layerdiff.samples.ggml_models", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    for role, path in write_all(args.out).items():
        print(f"{role}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
