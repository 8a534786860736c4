"""How MNN itself holds a tensor: its dimension format (NCHW, NHWC or NC4HW4), read from the tensor.

pymnn's `getDimensionType()` says CAFFE for both NCHW and MNN's packed NC4HW4 (MNN's
Tensor::getDimensionType only tells NHWC apart), so the format is read where MNN keeps it: the
first field of the tensor's describe (`Tensor::InsideDescribe::mContent->dimensionFormat`, MNN 3.x
source/core/TensorUtils.hpp), behind the `Tensor*` of the pymnn object. Nothing here is assumed:
the reader checks itself on tensors whose answer it knows (the host pointer where pymnn reports
it, the element type where Halide puts it, three host tensors made as NCHW, NC4HW4 and NHWC) and
reads nothing when any check fails, so a pymnn with another object layout records no format
rather than a wrong one.
"""
from __future__ import annotations

import ctypes
import functools
import sys

FORMATS = {0: "NCHW", 1: "NHWC", 2: "NC4HW4", 3: "NHWC4"}
_HEAD = 2  # words of PyObject_HEAD (refcount, type) before pymnn's `Tensor*`
_HOST_WORD = 2  # halide_buffer_t: device, device_interface, host, ...
_TYPE_OFFSET = 32  # halide_buffer_t.type, after the four 8-byte fields

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _word(address: int, index: int = 0) -> int:
    return ctypes.cast(address, ctypes.POINTER(ctypes.c_uint64))[index]


def _tensor_pointer(tensor) -> int:
    return _word(id(tensor), _HEAD)


def _describe_offset(MNN) -> int | None:
    """sizeof(halide_buffer_t) in this build (where `mDescribe` follows it), from a float tensor's
    type field: a 1-byte type code gives 56, a 4-byte enum 64; None when neither fits."""
    probe = MNN.Tensor((1, 2, 3, 4), MNN.Halide_Type_Float, MNN.Tensor_DimensionType_Caffe)
    pointer = _tensor_pointer(probe)
    if pointer == 0 or _word(pointer, _HOST_WORD) != (_capsule_pointer(probe.getHost(), None) or 0):
        return None
    raw = ctypes.string_at(pointer + _TYPE_OFFSET, 8)
    if raw[0] == 2 and raw[1] == 32 and raw[2:4] == b"\x01\x00":  # code, bits, lanes packed in 4 bytes
        return 56
    if raw[0:4] == b"\x02\x00\x00\x00" and raw[4] == 32 and raw[6:8] == b"\x01\x00":  # 4-byte enum code
        return 64
    return None


def _read_format(tensor, offset: int) -> int | None:
    pointer = _tensor_pointer(tensor)
    describe = _word(pointer + offset) if pointer else 0
    content = _word(describe) if describe else 0
    if not content:
        return None
    return ctypes.cast(content, ctypes.POINTER(ctypes.c_int32))[0]


@functools.lru_cache(maxsize=1)
def _checked_offset() -> int | None:
    """The describe offset, once the reader gives the known answer for three host tensors."""
    if sys.byteorder != "little" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    import MNN

    offset = _describe_offset(MNN)
    if offset is None:
        return None
    known = {MNN.Tensor_DimensionType_Caffe: 0, MNN.Tensor_DimensionType_Caffe_C4: 2,
             MNN.Tensor_DimensionType_Tensorflow: 1}
    for dim_type, expected in known.items():
        if _read_format(MNN.Tensor((1, 3, 4, 5), MNN.Halide_Type_Float, dim_type), offset) != expected:
            return None
    return offset


def dimension_format(tensor) -> str:
    """MNN's own format of a session tensor (`NC4HW4`, `NCHW`, ...); '' when it cannot be read."""
    offset = _checked_offset()
    if offset is None:
        return ""
    code = _read_format(tensor, offset)
    return FORMATS.get(code, "") if code is not None else ""
