"""MNN's dump file names: `<op, '/' -> '_'>_<output index>`, as its debug tools write them."""
from __future__ import annotations

import re

_MNN_FILE = re.compile(r"^(?P<op>.+)_(?P<index>\d+)$")


def split_mnn_file_name(file_name: str) -> tuple[str, int]:
    """`conv1_0` -> (`conv1`, 0): MNN's dump file name is `<op, '/'->'_'>_<output index>`."""
    match = _MNN_FILE.match(file_name)
    if not match:
        return file_name, 0
    return match.group("op"), int(match.group("index"))


def mnn_file_stem(op: str, output_index: int) -> str:
    """The file name MNN's dump tools give output `output_index` of `op`."""
    return f"{op.replace('/', '_')}_{output_index}"
