"""A layer fusion removed (Paddle-Lite's conv+bn+act keeps only the last variable) is named as fused
into the layer that now holds its value; a layer the other run merely did not dump is not."""
from __future__ import annotations

from layerdiff.analyzer.align.byname import NameRules, align_layers
from layerdiff.analyzer.formats.dumpfile import DumpFile
from tests.analyze_dumps import LAYERS, reference_arrays, write_dump


def _layers(path):
    with DumpFile(path) as dump:
        return dump.layers


def _why(result) -> dict[str, str]:
    return dict(zip(result.only_base["key"], result.only_base["why"]))


def test_fused_layers_are_named_with_the_layer_that_holds_their_value(tmp_path):
    ref = reference_arrays()
    golden = write_dump(tmp_path / "golden.h5", ref)
    # conv1+relu1 fused (relu1 reads the model input), block/conv 2 fused into add:1 (reads relu1 only)
    fused_layers = [("relu1", "Convolution", ["data"], (1, 8, 6, 6)),
                    ("add:1", "BinaryOp", ["relu1"], (1, 8, 6, 6))] + LAYERS[4:]
    arrays = {k: v for k, v in ref.items() if k not in ("conv1", "block/conv 2")}
    lite = write_dump(tmp_path / "lite.h5", arrays, layers=fused_layers)
    why = _why(align_layers(_layers(golden), _layers(lite), NameRules()))
    assert why["conv1:0"].startswith("fused in the other run: its value is inside relu1:0")
    assert why["block/conv 2:0"].startswith("fused in the other run: its value is inside add:1:0")


def test_a_layer_left_out_of_the_dump_is_not_called_fused(tmp_path):
    ref = reference_arrays()
    golden = write_dump(tmp_path / "golden.h5", ref)
    arrays = {k: v for k, v in ref.items() if k != "pool"}  # fc still reads pool: it was not dumped
    partial = write_dump(tmp_path / "partial.h5", arrays)
    why = _why(align_layers(_layers(golden), _layers(partial), NameRules()))
    assert why["pool:0"].startswith("no layer of this name in the other run")
