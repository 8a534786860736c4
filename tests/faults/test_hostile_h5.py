"""HDF5 from others is data, never a pointer: external storage, external links and virtual datasets
are refused by every reader (analyze, import, export, isolate) with one line naming the dataset, and
no byte of the file they point at reaches any output."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.importers.hdf5dump import validate_h5
from layerdiff.collector.run.isolate import target_inputs, write_inject_dump
from tests.faults.support import assert_one_line_error, cli, write_dump

ARRAYS = [np.arange(1000, dtype=np.float32), np.ones(1000, np.float32)]


def _replace(path: Path, where: str, make) -> None:
    """Swap the dataset at `where` for a crafted one, keeping its attributes."""
    with h5py.File(path, "a") as fh:
        attrs = dict(fh[where].attrs)
        del fh[where]
        make(fh, where)
        if isinstance(fh.get(where), h5py.Dataset):
            fh[where].attrs.update(attrs)


def _external_storage(secret: Path):
    def make(fh, where):
        fh.create_dataset(where, shape=(1000,), dtype="f4", external=[(str(secret), 0, 4000)])
    return make


def _external_link(secret_h5: Path):
    def make(fh, where):
        fh[where] = h5py.ExternalLink(str(secret_h5), "/data")
    return make


def _virtual(secret_h5: Path):
    def make(fh, where):
        layout = h5py.VirtualLayout(shape=(1000,), dtype="f4")
        layout[:] = h5py.VirtualSource(str(secret_h5), "data", shape=(1000,))
        fh.create_virtual_dataset(where, layout)
    return make


@pytest.fixture
def secret_h5(tmp_path, secret) -> Path:
    path = tmp_path / "secret.h5"
    with h5py.File(path, "w") as fh:
        fh["data"] = np.frombuffer(secret.read_bytes(), dtype="f4")[:1000]
    return path


KINDS = ["external-storage", "external-link", "virtual"]


def _crafted(tmp_path: Path, kind: str, where: str, secret: Path, secret_h5: Path) -> Path:
    path = write_dump(tmp_path / f"{kind}.h5", ARRAYS, inputs={"data": np.zeros(1000, np.float32)})
    make = {"external-storage": _external_storage(secret), "external-link": _external_link(secret_h5),
            "virtual": _virtual(secret_h5)}[kind]
    _replace(path, where, make)
    return path


def _assert_no_secret(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file() and path.name not in {"secret.bin", "secret.h5"}:
            assert b"TOPSECRET" not in path.read_bytes(), path


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["tensors/1", "inputs/0", "log/stderr"])
def test_validate_refuses_pointer_anywhere(tmp_path, secret, secret_h5, kind, where):
    path = _crafted(tmp_path, kind, where, secret, secret_h5)
    with pytest.raises(DumpFormatError, match=f"/{where}"):
        validate_h5(path)


@pytest.mark.parametrize("kind", KINDS)
def test_dumpfile_refuses_pointer_tensor_on_read(tmp_path, secret, secret_h5, kind):
    path = _crafted(tmp_path, kind, "tensors/1", secret, secret_h5)
    with DumpFile(path) as dump:
        np.testing.assert_array_equal(dump.tensor(0), ARRAYS[0])
        with pytest.raises(DumpFormatError, match="/tensors/1 .*stored in the file itself"):
            dump.tensor(1)


@pytest.mark.parametrize("kind", KINDS)
def test_analyze_compare_refuses(tmp_path, secret, secret_h5, kind):
    good = write_dump(tmp_path / "good.h5", ARRAYS)
    bad = _crafted(tmp_path, kind, "tensors/1", secret, secret_h5)
    proc = cli("analyze", "compare", str(good), str(bad), "-o", str(tmp_path / "report"))
    assert_one_line_error(proc, str(bad), "/tensors/1", code=2)  # 2: the report covers the other runs
    _assert_no_secret(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_analyze_import_refuses(tmp_path, secret, secret_h5, kind):
    bad = _crafted(tmp_path, kind, "tensors/0", secret, secret_h5)
    proc = cli("analyze", "import", str(bad), "-o", str(tmp_path / "copy.h5"), "--set", "device_model=x")
    assert_one_line_error(proc, "/tensors/0")
    assert not (tmp_path / "copy.h5").exists()
    _assert_no_secret(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_analyze_export_polygraphy_refuses(tmp_path, secret, secret_h5, kind):
    bad = _crafted(tmp_path, kind, "tensors/0", secret, secret_h5)
    proc = cli("analyze", "export", str(bad), "--to", "polygraphy", "-o", str(tmp_path / "out.json"))
    assert_one_line_error(proc, "/tensors/0")
    _assert_no_secret(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["inputs/0", "tensors/0"])
def test_isolate_reference_refuses(tmp_path, secret, secret_h5, kind, where):
    """`collect isolate --ref` reads the reference's tensors and /inputs: both are checked."""
    bad = _crafted(tmp_path, kind, where, secret, secret_h5)
    with h5py.File(bad, "a") as fh:  # make op1 consume the model input as well, so /inputs is read
        table = fh["layers"][()]
        table["inputs"][1] = b'["op0", "data"]'
        del fh["layers"]
        fh["layers"] = table
    with DumpFile(bad) as ref:
        targets = target_inputs(ref, ["op1:0"])
        with pytest.raises(DumpFormatError, match=f"/{where}"):
            write_inject_dump(ref, targets, tmp_path / "inject")
    _assert_no_secret(tmp_path)


def test_soft_link_to_external_link_refused(tmp_path, secret_h5):
    path = write_dump(tmp_path / "soft.h5", ARRAYS)
    with h5py.File(path, "a") as fh:
        fh["elsewhere"] = h5py.ExternalLink(str(secret_h5), "/data")
        del fh["tensors/1"]
        fh["tensors/1"] = h5py.SoftLink("/elsewhere")
    with pytest.raises(DumpFormatError, match="external link"):
        validate_h5(path)
    with DumpFile(path) as dump, pytest.raises(DumpFormatError, match="/tensors/1 is a soft link"):
        dump.tensor(1)


def test_external_tensors_group_refused(tmp_path, secret_h5):
    path = write_dump(tmp_path / "group.h5", ARRAYS)
    other = write_dump(tmp_path / "other.h5", ARRAYS)
    with h5py.File(path, "a") as fh:
        del fh["tensors"]
        fh["tensors"] = h5py.ExternalLink(str(other), "/tensors")
    with pytest.raises(DumpFormatError, match="/tensors is an external link"):
        DumpFile(path)


def test_genuine_dump_still_reads(tmp_path):
    path = write_dump(tmp_path / "ok.h5", ARRAYS, inputs={"data": np.zeros(3, np.float32)})
    validate_h5(path)
    with DumpFile(path) as dump:
        np.testing.assert_array_equal(dump.tensor(1), ARRAYS[1])
        assert [name for name, _ in dump.inputs()] == ["data"]
        assert dump.stderr() == "ok\n"
