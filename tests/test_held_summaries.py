"""The summaries of tensors held whole, packed in `/summaries/held_*` (analyzer/FORMATS.md §2, minor 1): what
the harness wrote comes back exactly, files that keep them as `/summaries/<order>` groups read the same, and a
damaged pack is one line naming the file.

Real dumps of a real pretrained network (PP-OCRv4 text detection from the rapidocr wheel, converted by pnnx):
the C++ harness built for the host (float32 samples) and pip ncnn, converted as `collect` converts them.
"""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from layerdiff.analyzer.formats import sketchformat as sf
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.formats.dumpwriter import DumpWriter
from layerdiff.analyzer.formats.rawdump import convert_raw_dump, read_raw_dump
from layerdiff.errors import DumpFormatError
from tests.sketch_support import det_model, dumps  # noqa: F401 (fixtures; they run host_harness)

pytestmark = pytest.mark.slow  # builds the host harness (cached) on first use


@pytest.mark.parametrize("which", ["cpp", "high"])
def test_a_whole_run_packs_its_summaries_and_each_reads_back_exactly(dumps, tmp_path, which):
    """Every tensor's summary in five datasets (no group per tensor); read back, each sample holds the tensor's
    own values at the sample positions (numpy indexing of the stored tensor) and each sketch is the one the
    harness wrote, bit for bit."""
    path = convert_raw_dump(dumps[which], tmp_path / "run.h5")
    written = sf.read_summaries(dumps[which]).tensors
    with h5py.File(path) as f:
        assert sorted(f["summaries"]) == ["held_orders", "held_sample_dtypes", "held_sample_offsets",
                                          "held_samples", "held_sketches"]
        assert f.attrs["format_minor"] >= 1  # the held summaries arrived in minor 1
    raw = read_raw_dump(dumps[which])
    with DumpFile(path) as dump:
        assert dump.estimated_orders == frozenset()
        for tensor, array in raw.iter_arrays():
            summary = dump.summary(tensor.order)
            flat = array.reshape(-1)
            assert summary.sample.dtype == flat.dtype
            assert summary.sample.tobytes() == flat[sf.sample_positions(flat.size)].tobytes(), tensor.name
            assert summary.sketch.tobytes() == written[tensor.order].sketch.tobytes(), tensor.name
            assert summary.name == tensor.name and summary.stats["numel"] == flat.size


def test_summaries_kept_as_groups_read_the_same_as_packed_ones(dumps, tmp_path):
    """A file of minor 0 (a `/summaries/<order>` group per held tensor) gives the same summaries."""
    packed = convert_raw_dump(dumps["high"], tmp_path / "packed.h5")
    written = sf.read_summaries(dumps["high"]).tensors
    raw = read_raw_dump(dumps["high"])
    grouped = tmp_path / "grouped.h5"
    with DumpWriter(grouped, {"engine": "ncnn"}) as writer:
        for tensor, array in raw.iter_arrays():
            writer.add_tensor({**tensor.meta(), "op": tensor.op, "shape": list(tensor.shape)}, array)
            writer.add_summary(tensor.order, written[tensor.order])
    with h5py.File(grouped) as f:
        assert "held_orders" not in f["summaries"] and str(raw.tensors[0].order) in f["summaries"]
    with DumpFile(packed) as a, DumpFile(grouped) as b:
        for tensor in raw.tensors:
            one, other = a.summary(tensor.order), b.summary(tensor.order)
            assert one.sketch.tobytes() == other.sketch.tobytes() and one.sample.tobytes() == other.sample.tobytes()
            assert one.dtype == other.dtype


@pytest.mark.parametrize("damage, says", [
    (lambda s: s.__setitem__("held_sample_offsets", s["held_sample_offsets"][()] * 7), "sample of tensor"),
    (lambda s: s.__setitem__("held_sample_dtypes", np.array(["object"] * len(s["held_orders"]),
                                                            dtype=h5py.string_dtype())), "sample of tensor"),
    (lambda s: s.__setitem__("held_sketches", s["held_sketches"][:, :10]), "sketches of 1024"),
    (lambda s: s.__setitem__("held_orders", np.zeros((2, 2))), "held_orders"),
])
def test_a_damaged_pack_is_one_line_naming_the_file(dumps, tmp_path, damage, says):
    path = convert_raw_dump(dumps["high"], tmp_path / "run.h5")
    with h5py.File(path, "r+") as f:
        order = int(f["summaries/held_orders"][-1])  # the last tensor the pack holds
        damage(_Writable(f["summaries"]))
    with DumpFile(path) as dump, pytest.raises(DumpFormatError) as err:
        dump.summary(order)
    assert str(path) in str(err.value) and says in str(err.value) and "\n" not in str(err.value)


class _Writable:
    """A group whose datasets can be replaced by assignment (delete, then write the new value)."""

    def __init__(self, group: h5py.Group) -> None:
        self.group = group

    def __getitem__(self, name: str) -> h5py.Dataset:
        return self.group[name]

    def __setitem__(self, name: str, value) -> None:
        del self.group[name]
        self.group[name] = value


def test_small_tensors_keep_no_summary_and_read_the_same_as_the_harness_wrote(tmp_path):
    """The sample model's layers of at most 65536 elements have no stored summary: read back, each is sketched from
    its stored tensor, bit for bit the summary the engine wrote; the larger layers come from the pack."""
    from layerdiff.analyzer.formats.rawdump import HELD_MIN_ELEMENTS

    import subprocess
    import sys

    from tests.test_harness_support import REPO

    model = REPO / "samples" / "models" / "underflow.param"
    image = np.random.default_rng(5).random((1, 3, 96, 96), dtype=np.float32)  # 8 x 96 x 96 > 65536 > 8 x 48 x 48
    np.save(tmp_path / "in0.npy", image)
    done = subprocess.run([sys.executable, "-m", "layerdiff.collector.engines.ncnn.engine", "--engine", "ncnn",
                           "--model", str(model), "--model", str(model.with_suffix(".bin")),
                           "--input", f"data={tmp_path / 'in0.npy'}", "--backend", "cpu", "--precision", "high",
                           "--out", str(tmp_path / "raw")], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    path = convert_raw_dump(tmp_path / "raw", tmp_path / "run.h5")
    written = sf.read_summaries(tmp_path / "raw").tensors
    raw = read_raw_dump(tmp_path / "raw")
    small = {t.order for t in raw.tensors if int(np.prod(t.shape)) <= HELD_MIN_ELEMENTS}
    assert small and len(small) < len(raw.tensors)
    with h5py.File(path) as f:
        assert set(f["summaries/held_orders"][()].tolist()) == {t.order for t in raw.tensors} - small
    with DumpFile(path) as dump:
        for tensor in raw.tensors:
            summary, theirs = dump.summary(tensor.order), written[tensor.order]
            assert summary.sketch.tobytes() == theirs.sketch.tobytes(), tensor.name
            assert summary.sample.tobytes() == theirs.sample.tobytes() and summary.dtype == theirs.dtype, tensor.name
