"""The two readers of MNN op/tensor names (collector/engines/mnn/model.py for the `local` device,
device_scripts/harness/src/mnn_model.cpp for phones) read the same MNN.fbs field slots and key
ops by the same rule. CI has no MNN C++ build, so the C++ engine's keys are compared with the
Python engine's in tests/test_harness_mnn.py only where MNN_ROOT is set; this cheap check keeps
the slot tables from drifting apart everywhere."""
from __future__ import annotations

import re

from layerdiff.collector.engines.mnn import model as mnn_model
from layerdiff.collector.engines.mnn.model import MnnOps, read_mnn_ops
from tests.test_harness_support import MODELS, REPO

CPP = REPO / "device_scripts" / "harness" / "src" / "mnn_model.cpp"
SLOTS = {"kNetOplists": "NET_OPLISTS", "kNetOutputName": "NET_OUTPUT_NAME", "kNetTensorName": "NET_TENSOR_NAME",
         "kOpName": "OP_NAME", "kOpOutputIndexes": "OP_OUTPUT_INDEXES"}


def test_cpp_and_python_read_the_same_schema_slots():
    cpp = dict(re.findall(r"\b(k[A-Za-z]+) = (\d+)", CPP.read_text()))
    assert {name: int(cpp[name]) for name in SLOTS} == {name: getattr(mnn_model, py) for name, py in SLOTS.items()}


def test_ops_are_keyed_by_the_tensor_they_write():
    ops = read_mnn_ops(MODELS / "underflow.mnn")
    assert ops.outputs == ["image"]
    assert ops.key("image", 0) == ("image__before_tr", "image__before_tr")  # the conv writes the pre-transpose tensor
    assert ops.key("stem/conv", 0) == ("stem/conv", "stem/conv")  # fused activation in the op's scope: op name
    assert ops.key("stem/conv_raster_0", 0) is None  # runtime-only ops are not in the file
    assert ops.key("stem/conv", 1) is None


def test_an_unreadable_model_keys_nothing(tmp_path):
    truncated = tmp_path / "cut.mnn"
    truncated.write_bytes((MODELS / "underflow.mnn").read_bytes()[:200])
    assert read_mnn_ops(truncated) == MnnOps({}, [])
