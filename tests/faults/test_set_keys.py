"""`--set` takes the names users type (`backend`, `precision`, `engine`, ...) and refuses a key it does
not know: exit 2, one line naming it, nothing written (`--set backend=vulkan` was silently
ignored and `--set bogus_key=1` was stored)."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from tests.faults.support import assert_one_line_error, cli, write_dump


@pytest.fixture
def npz(tmp_path):
    path = tmp_path / "colleague.npz"
    np.savez(path, **{"/conv/Conv_output_0": np.ones((1, 4, 4), np.float32), "out": np.zeros(3, np.float32)})
    return path


def test_import_takes_the_names_users_type(tmp_path, npz):
    out = tmp_path / "run.h5"
    proc = cli("analyze", "import", str(npz), "-o", str(out), "--set", "backend=vulkan", "--set", "precision=low",
               "--set", "engine=mnn")
    assert proc.returncode == 0, proc.stderr
    with h5py.File(out, "r") as dump:
        assert (dump.attrs["backend_requested"], dump.attrs["precision_requested"], dump.attrs["engine"]) == \
            ("vulkan", "low", "mnn")


@pytest.mark.parametrize("command", ["import", "compare", "merge"])
def test_an_unknown_key_is_refused_with_nothing_written(tmp_path, npz, command):
    out = tmp_path / "out"
    if command == "import":
        args = ["import", str(npz), "-o", str(out)]
    elif command == "merge":
        args = ["merge", str(npz), "-o", str(out)]
    else:
        other = write_dump(tmp_path / "ref.h5", [np.ones(16, np.float32)])
        args = ["compare", str(npz), str(other), "-o", str(out)]
    proc = cli("analyze", *args, "--set", "bogus_key=1")
    assert_one_line_error(proc, "--set bogus_key", "unknown key", "backend (= backend_requested)", code=2)
    assert not out.exists()
