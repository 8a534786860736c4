"""`python -m layerdiff.collector.engines.ggml.tokenize MODEL.gguf TEXT -o ids.npy`: a prompt as token ids.

Why: `collect --input prompt=TEXT.txt` runs a prompt directly; this writes the ids the model's own
tokenizer (llama.cpp's, inside layerdiff-ggml) gives it, to feed or edit ids (`collect --input ids.npy`). It runs the harness once on the prompt with nothing dumped (`--layers` that
no node matches) and reads the ids from the dump header, where every ggml run records them.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

NOTHING = "(?!)"  # a regex no node name matches: the run dumps no tensor


def tokenize(model: Path, text: str) -> list[int]:
    """Token ids of `text` under `model`'s tokenizer (with the BOS token when the model adds one)."""
    from layerdiff.collector.engines.ggml.build import ensure_built
    from layerdiff.collector.harness.buildprogress import PlainReporter
    from layerdiff.errors import InputError

    binary = ensure_built(reporter=PlainReporter(sys.stderr))
    with tempfile.TemporaryDirectory(prefix="ggml-tokenize-") as tmp:
        prompt = Path(tmp) / "prompt.txt"
        prompt.write_text(text, encoding="utf-8")
        proc = subprocess.run([str(binary), "--model", str(model), "--input", f"prompt={prompt}", "--layers", NOTHING,
                               "--out", str(Path(tmp) / "dump")], capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise InputError(last.removeprefix("layerdiff-harness: "))
        header = json.loads((Path(tmp) / "dump" / "manifest.jsonl").read_text(encoding="utf-8").splitlines()[0])
    return [int(i) for i in header["options"]["tokens"]]


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    from layerdiff.errors import LayerdiffError

    parser = argparse.ArgumentParser(prog="python -m layerdiff.collector.engines.ggml.tokenize",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("text", help="the prompt (or @FILE to read it from a UTF-8 file)")
    parser.add_argument("-o", "--out", type=Path, required=True, help="the .npy of int32 token ids to write")
    args = parser.parse_args(argv)
    text = Path(args.text[1:]).read_text(encoding="utf-8") if args.text.startswith("@") else args.text
    try:
        ids = tokenize(args.model, text)
    except (LayerdiffError, OSError) as err:
        print(f"tokenize: {err}", file=sys.stderr)
        return 1
    np.save(args.out, np.asarray(ids, dtype=np.int32))
    print(f"{len(ids)} tokens -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
