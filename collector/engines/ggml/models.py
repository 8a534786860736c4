"""What a GGUF file asks for as input, read from its metadata (gguf package, no weights loaded)."""
from __future__ import annotations

from pathlib import Path

from layerdiff.errors import ModelFormatError

CONV_ARCH = "layerdiff.conv2d"


def architecture(path: Path) -> tuple[str, object]:
    """general.architecture and the reader (for further keys); one clear error for a file that is no GGUF."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
        field = reader.fields["general.architecture"]
        return field.contents(), reader
    except (KeyError, ValueError, OSError, IndexError) as err:
        raise ModelFormatError(f"{path}: not a readable GGUF model ({type(err).__name__}: {err})") from None


def input_specs(path: Path) -> dict[str, tuple[tuple[int, ...] | None, str]]:
    """A language model takes token ids (`tokens`, int32, any length); the convolution graph takes
    `x` [1, in_channels, H, W] float32. A prompt goes straight to the harness (`--input prompt=FILE.txt`)."""
    arch, reader = architecture(path)
    if arch == CONV_ARCH:
        for tensor in reader.tensors:
            if tensor.name == "conv.weight":
                in_channels = int(tensor.shape[2])  # gguf lists ne: kw, kh, in, out
                return {"x": ((1, in_channels, -1, -1), "float32")}
        raise ModelFormatError(f"{path}: a {CONV_ARCH} GGUF without conv.weight")
    return {"tokens": ((-1,), "int32")}
