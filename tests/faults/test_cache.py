"""The conversion cache: in the user's cache dir (XDG), private, owned, bounded (LRU), reported and
emptied by `analyze cache`; a zip bomb's extraction is bounded and leaves nothing behind."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.importers import convcache
from layerdiff.errors import LayerdiffError
from layerdiff.analyzer.importers import import_any
from tests.faults.support import assert_one_line_error, cli


@pytest.fixture
def xdg(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("LAYERDIFF_CACHE_DIR", raising=False)
    monkeypatch.delenv("LAYERDIFF_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "layerdiff" / "conversions"


def _npz(path: Path, seed: int, n: int = 1 << 16) -> Path:
    np.savez(path, a=np.random.default_rng(seed).random(n, dtype=np.float32))
    return path


def test_cache_is_private_and_in_the_users_cache_dir(xdg, tmp_path):
    converted = import_any(_npz(tmp_path / "r.npz", 0))
    assert converted.parent == xdg and not str(converted).startswith("/tmp/layerdiff-cache")
    assert stat.S_IMODE(xdg.stat().st_mode) == 0o700
    again = import_any(tmp_path / "r.npz")
    assert again == converted  # converted once, reused


def test_one_cache_root_for_harness_builds_and_conversions(xdg, monkeypatch, tmp_path):
    from layerdiff.collector.harness.build import cache_root
    assert cache_root() == xdg.parent  # harness builds and arm64 runtime beside conversions/
    monkeypatch.setenv("LAYERDIFF_CACHE", str(tmp_path / "elsewhere"))
    assert cache_root() == tmp_path / "elsewhere" and convcache.cache_dir(create=False) == tmp_path / "elsewhere" / "conversions"


def test_cache_opened_by_others_is_closed_and_foreign_owner_refused(xdg, tmp_path):
    xdg.mkdir(parents=True)
    xdg.chmod(0o777)
    convcache.cache_dir()
    assert stat.S_IMODE(xdg.stat().st_mode) == 0o700
    if os.geteuid() != 0:
        pytest.skip("changing a directory's owner needs root")
    os.chown(xdg, 12345, 12345)
    with pytest.raises(LayerdiffError, match="belongs to uid 12345, not you"):
        convcache.cache_dir()
    os.chown(xdg, 0, 0)


def test_cache_is_bounded_least_recently_used_first(xdg, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERDIFF_CACHE_MAX_BYTES", str(700 << 10))  # room for about two 260 KiB conversions
    first = import_any(_npz(tmp_path / "a.npz", 1))
    second = import_any(_npz(tmp_path / "b.npz", 2))
    import_any(tmp_path / "a.npz")  # a used again: b is now the least recently used
    third = import_any(_npz(tmp_path / "c.npz", 3))
    count, size = convcache.usage()
    assert size <= 700 << 10 and first.exists() and third.exists() and not second.exists()
    print(f"figure: cache bounded at 700 KiB holds {count} entries, {size} bytes")


def test_analyze_cache_reports_and_cleans(xdg, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "LAYERDIFF_CACHE_DIR": ""}
    assert cli("analyze", "import", str(_npz(tmp_path / "a.npz", 1)), "-o", str(tmp_path / "a.h5"), env=env).returncode == 0
    assert cli("analyze", "compare", str(tmp_path / "a.npz"), str(_npz(tmp_path / "b.npz", 2)), "-o",
               str(tmp_path / "rep"), env=env).returncode == 0
    count, size = convcache.usage()
    assert count >= 3 and size > 2 * (1 << 18)  # the two conversions and the stored measurement
    assert len(list(xdg.glob("results-*.json"))) == 1  # layerdiff.analyzer.measure.resultcache: one cache, one place
    info = cli("analyze", "cache", env=env)
    assert info.returncode == 0 and f"{xdg}: {count} entries" in info.stdout, info.stdout + info.stderr
    cleaned = cli("analyze", "cache", "clean", env=env)
    assert cleaned.returncode == 0 and f"removed {count} entries" in cleaned.stdout, cleaned.stdout + cleaned.stderr
    assert convcache.usage() == (0, 0)


def test_zip_bomb_is_bounded_and_cleaned(xdg, tmp_path):
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("dump/a.npy", "w", force_zip64=True) as fh:
            for _ in range(64):
                fh.write(bytes(1 << 20))
    assert bomb.stat().st_size < 1 << 20
    proc = cli("analyze", "import", str(bomb), "-o", str(tmp_path / "o.h5"),
               env={"XDG_CACHE_HOME": str(tmp_path / "xdg"), "LAYERDIFF_CACHE_DIR": "", "LAYERDIFF_MAX_EXTRACT_BYTES": "8M"})
    assert_one_line_error(proc, "bomb.zip", "LAYERDIFF_MAX_EXTRACT_BYTES")
    assert convcache.usage() == (0, 0)  # figure: 0 bytes of the refused archive left in the cache


def test_directory_sizes_are_counted_once_and_follow_their_directory(xdg, tmp_path):
    """A stored report or extracted zip never changes once in place: its size is recorded beside it
    (the name of an empty hidden file), so a trim after every analysis does not walk every report."""
    root = convcache.cache_dir()
    report = root / "report-abc"
    report.mkdir()
    (report / "index.html").write_bytes(bytes(3000))
    (report / "view.json").write_bytes(bytes(500))
    assert convcache.usage() == (1, 3500)
    (record,) = [p for p in root.iterdir() if p.name.startswith(".")]
    assert record.name == f".report-abc.3500.{report.stat().st_ino}.bytes" and record.stat().st_size == 0
    (report / "extra").write_bytes(bytes(100))  # not how entries change; shows the count comes from the record
    assert convcache.usage() == (1, 3500)
    replaced = root / "report-abc.partial1"
    replaced.mkdir()
    (replaced / "index.html").write_bytes(bytes(10))
    assert convcache.usage() == (2, 3510)  # a half-written entry is counted, never recorded
    assert len([p for p in root.iterdir() if p.name.startswith(".")]) == 1
    shutil.rmtree(report)
    os.replace(replaced, report)  # the same name, a new directory: its old record no longer counts
    assert convcache.usage() == (1, 10)
    (record,) = [p for p in root.iterdir() if p.name.startswith(".")]
    assert record.name == f".report-abc.10.{report.stat().st_ino}.bytes"
    assert convcache.trim(limit=0) == 10 and convcache.usage() == (0, 0)
    assert [p.name for p in root.iterdir()] == [convcache.LEDGER]  # the record went with its directory
    (root / ".report-gone.5.1.bytes").touch()
    assert convcache.usage() == (0, 0) and [p.name for p in root.iterdir()] == [convcache.LEDGER]  # an orphaned record is removed


def _entry(root: Path, name: str, size: int, used: float) -> Path:
    """A cache entry of `size` bytes last used at `used` (seconds since the epoch)."""
    path = root / name
    path.write_bytes(bytes(size))
    os.utime(path, (used, used))
    return path


def _ledger(root: Path) -> tuple[int, float]:
    total, counted = (root / convcache.LEDGER).read_text().split()
    return int(total), float(counted)


def test_an_addition_within_the_limit_is_counted_from_the_ledger_alone(xdg):
    """After one full count the cache's bytes come from the ledger: an entry that appeared by other means
    is not seen until the next full count (an hour later, or an addition over the limit), which then
    finds it and trims what is over."""
    root = convcache.cache_dir()
    _entry(root, "results-a.json", 300, 1000)
    assert convcache.trim(keep=_entry(root, "results-b.json", 300, 2000), limit=1000) == 0  # no ledger: counted
    assert _ledger(root)[0] == 600
    _entry(root, "results-outside.json", 900, 500)  # not added through the cache: the ledger does not know it
    assert convcache.trim(keep=_entry(root, "results-c.json", 100, 3000), limit=1000) == 0
    assert _ledger(root)[0] == 700 and (root / "results-outside.json").exists()
    total, _ = _ledger(root)
    (root / convcache.LEDGER).write_text(f"{total} {time.time() - convcache.RECOUNT_AFTER_S - 1}\n")  # an old count
    assert convcache.trim(keep=_entry(root, "results-d.json", 100, 4000), limit=1000) == 900  # 1,700 > 1,000
    assert sorted(p.name for p in root.glob("results-*")) == [f"results-{k}.json" for k in "abcd"]
    assert _ledger(root)[0] == 800 == convcache.usage()[1]


def test_a_full_cache_is_trimmed_below_its_limit_least_recently_used_first(xdg):
    """An addition over the limit removes the least recently used entries until the cache is under 90% of
    the limit, so that the next additions fit without counting the whole cache again."""
    root = convcache.cache_dir()
    for i in range(10):
        convcache.trim(keep=_entry(root, f"results-{i}.json", 100, 1000 + i), limit=1000)
    assert convcache.usage() == (10, 1000) and _ledger(root)[0] == 1000
    assert convcache.trim(keep=_entry(root, "results-new.json", 100, 5000), limit=1000) == 200
    assert not (root / "results-0.json").exists() and not (root / "results-1.json").exists()
    assert convcache.usage() == (9, 900) == (9, _ledger(root)[0])
    assert convcache.trim(keep=_entry(root, "results-next.json", 100, 6000), limit=1000) == 0  # room left
    assert convcache.usage()[1] == _ledger(root)[0] == 1000


def test_what_was_just_added_is_never_trimmed(xdg):
    root = convcache.cache_dir()
    old = _entry(root, "results-old.json", 100, 1000)
    side = _entry(root, "results-new.outputs", 600, 900)  # written first: older than the entry that points into it
    entry = _entry(root, "results-new.json", 100, 2000)
    assert convcache.trim(keep=entry, added=[side, entry], limit=700) == 100
    assert side.exists() and entry.exists() and not old.exists()


@pytest.mark.parametrize("ledger", ["", "garbage", "12 nan", "-5 1.0", "10 99999999999", b"\xff\xfe"])
def test_an_unreadable_ledger_means_a_full_count(xdg, ledger):
    root = convcache.cache_dir()
    _entry(root, "results-a.json", 400, 1000)
    path = root / convcache.LEDGER
    path.write_bytes(ledger if isinstance(ledger, bytes) else ledger.encode())
    assert convcache.trim(keep=_entry(root, "results-b.json", 100, 2000), limit=1000) == 0
    assert _ledger(root)[0] == 500


def test_concurrent_additions_are_all_counted(xdg, tmp_path):
    """Processes adding entries at the same time update the ledger one at a time: none of their bytes is lost."""
    script = tmp_path / "add.py"
    script.write_text(
        "import sys\n"
        "from layerdiff.analyzer.importers import convcache\n"
        "root = convcache.cache_dir()\n"
        "for i in range(40):\n"
        "    path = root / f'results-{sys.argv[1]}-{i}.json'\n"
        "    path.write_bytes(bytes(100 + i))\n"
        "    convcache.trim(keep=path, limit=1 << 30)\n")
    convcache.trim(limit=1 << 30)  # the ledger exists: every addition below goes through it
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    procs = [subprocess.Popen([sys.executable, str(script), str(k)], env=env) for k in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert _ledger(root := convcache.cache_dir())[0] == convcache.usage()[1] == 3 * sum(100 + i for i in range(40))
    assert len(list(root.glob("results-*"))) == 120


def test_cleaning_the_cache_resets_its_ledger(xdg):
    root = convcache.cache_dir()
    convcache.trim(keep=_entry(root, "results-a.json", 300, 1000))
    assert convcache.clean() == (1, 300)
    assert _ledger(root)[0] == 0 and convcache.usage() == (0, 0)
