"""An ncnn model whose chosen layers carry a feature mask (param key 31): the fix `collect fix` writes.

Only the masked layers' lines change, and on them only the `31=` entry is added (or OR-ed into an
existing one); every other byte of the `.param` is kept, and the `.bin` is copied unchanged (masks
change how a layer computes, never its weights). Files are written under a temporary name and
renamed, so an interrupted fix never leaves a half-written model.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from layerdiff.errors import InputError
from layerdiff.collector.engines.featuremask import FeatureMaskModel
from layerdiff.collector.engines.ncnn.modelfile import MAGIC
from layerdiff.collector.engines.ncnn.options import CLOSED_UPSTREAM, FEATMASK_KEY, HIGH_PRECISION_MASK, describe


def layer_names(param: Path) -> list[str]:
    """The layer names of a text `.param`, in file order."""
    return [fields[1] for fields in _layer_lines(param.read_text(), param)]


def patched_param_text(text: str, masks: dict[str, int], source: Path) -> str:
    """`text` with `31=<mask>` set on each named layer; refuses names the model does not have."""
    lines = text.splitlines(keepends=True)
    found: set[str] = set()
    for index, line in enumerate(lines[2:], start=2):
        fields = line.split()
        if len(fields) >= 4 and fields[1] in masks:
            lines[index] = _with_mask(line, fields, masks[fields[1]])
            found.add(fields[1])
    missing = sorted(set(masks) - found)
    if missing:
        raise InputError(f"{source}: no layer named {', '.join(missing)}; the mask cannot be written")
    return "".join(lines)


def _with_mask(line: str, fields: list[str], mask: int) -> str:
    """The layer line with key 31 OR-ed with `mask` (other entries untouched, order kept)."""
    body, newline = (line[:-1], "\n") if line.endswith("\n") else (line, "")
    prefix = f"{FEATMASK_KEY}="
    old = next((f for f in fields[4:] if f.startswith(prefix)), None)
    if old is None:
        return f"{body} {prefix}{mask}{newline}"
    merged = int(old[len(prefix):]) | mask
    return body.replace(f" {old}", f" {prefix}{merged}", 1) + newline


def write_patched(files: list[Path], masks: dict[str, int], out_dir: Path, stem: str | None = None) -> list[Path]:
    """`OUT/<stem>.param` + `.bin`: the model with `masks` applied; returns the new model's files (.param first)."""
    param = next((f for f in files if f.suffix == ".param"), None)
    if param is None:
        raise InputError(f"{files[0]}: only ncnn text .param models can be patched with feature masks")
    weights = next((f for f in files if f.suffix == ".bin"), param.with_suffix(".bin"))
    stem = stem or param.stem
    out_dir.mkdir(parents=True, exist_ok=True)
    new_param, new_bin = out_dir / f"{stem}.param", out_dir / f"{stem}.bin"
    _atomic_write(new_param, patched_param_text(param.read_text(), masks, param).encode())
    if not new_bin.exists() or new_bin.stat().st_size != weights.stat().st_size:
        tmp = new_bin.with_name(new_bin.name + ".partial")
        shutil.copyfile(weights, tmp)
        os.replace(tmp, new_bin)
    return [new_param, new_bin]


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _layer_lines(text: str, source: Path) -> list[list[str]]:
    lines = text.splitlines()
    if not lines or lines[0].strip() != MAGIC:
        raise InputError(f"{source}: not a text ncnn .param file (first line is not {MAGIC})")
    return [f for f in (line.split() for line in lines[2:]) if len(f) >= 4]


# What `collect fix` and its feature-mask mechanism read from ncnn (Engine.feature_mask).
FEATURE_MASK = FeatureMaskModel(layer_names, write_patched, dict(CLOSED_UPSTREAM), {k: int(v) for k, v in HIGH_PRECISION_MASK.items()},
                                describe)
