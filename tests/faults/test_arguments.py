"""Every numeric argument of `collect` is checked before any device or engine is touched: one line,
exit 1, nothing written to OUTDIR."""
from __future__ import annotations

import time

import pytest

from layerdiff.errors import LayerdiffError
from layerdiff.collector.run.pipeline import RunOptions
from tests.faults.support import REPO, assert_one_line_error, cli

MODEL = REPO / "samples" / "models" / "convnet.mnn"


@pytest.mark.parametrize("args, needle", [
    (["--repeat", "0"], "--repeat 0"),
    (["--max-bytes", "-5"], "--max-bytes -5"),
    (["--max-bytes", "0"], "--max-bytes 0"),
    (["--threads", "-1"], "--threads -1"),
    (["--threads", "0"], "--threads 0"),
    (["--layers", "("], "--layers '('"),
    (["--deadline", "0"], "--deadline 0"),
    (["--deadline", "nan"], "--deadline nan"),
    (["--deadline", "-3"], "--deadline -3"),
])
def test_collect_refuses_before_any_engine(tmp_path, args, needle):
    out = tmp_path / "out"
    started = time.monotonic()
    # a device that does not exist: had the check come after device resolution, the message would name it
    proc = cli("collect", "--model", str(MODEL), "--device", "no-such-serial", "--input", "random", "-o", str(out), *args)
    elapsed = time.monotonic() - started
    assert_one_line_error(proc, needle)
    assert not out.exists()  # nothing planned, nothing written
    assert elapsed < 30, elapsed  # figure: time to refuse (interpreter start-up only)


def test_isolate_refuses_bad_deadline(tmp_path):
    proc = cli("collect", "isolate", "--model", str(MODEL), "-b", "cpu", "-p", "low", "--ref", str(tmp_path / "none.h5"),
               "--layer", "x", "--deadline", "0", "-o", str(tmp_path / "out"))
    assert_one_line_error(proc, "--deadline 0")


def test_run_options_validate_when_built_from_python():
    with pytest.raises(LayerdiffError, match="--repeat 0"):
        RunOptions(repeat=0)
    assert RunOptions(threads=4, repeat=2, deadline_s=1.5, layers="conv.*", max_bytes=1).threads == 4
