"""A finished report kept in the user's cache (layerdiff.analyzer.report.stored): the same analysis asked
again is copied, never a report of something else. Real `analyze` processes, real HDF5 dumps."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from layerdiff.analyzer.report import stored
from tests.analyze_dumps import cpu_and_vulkan_runs, perturbed, reference_arrays, write_dump


@pytest.fixture()
def env(tmp_path) -> dict[str, str]:
    """The child's environment: a private cache of this test."""
    out = dict(os.environ)
    out["LAYERDIFF_CACHE_DIR"] = str(tmp_path / "cache")
    return out


@pytest.fixture()
def runs(tmp_path) -> Path:
    return cpu_and_vulkan_runs(tmp_path / "runs")


def analyze(env: dict, *args: str, importtime: bool = False) -> subprocess.CompletedProcess:
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "-m", "layerdiff.analyzer.cli.app", *map(str, args)],
                          capture_output=True, text=True, env=env)


def imported_pandas(proc: subprocess.CompletedProcess) -> bool:
    """Whether the child imported pandas (its -X importtime lines on stderr): any analysis does, a stored report not."""
    return any(line.split("|")[-1].strip() == "pandas" for line in proc.stderr.splitlines() if line.startswith("import time:"))


def without_created(path: Path) -> dict:
    doc = json.loads(path.read_text())
    doc.pop("created", None)
    return doc


def entries(env: dict) -> list[Path]:
    return sorted(Path(env["LAYERDIFF_CACHE_DIR"]).glob(f"{stored.PREFIX}*"))


def test_same_analysis_again_is_the_stored_report(runs, tmp_path, env):
    first = analyze(env, runs, "-o", tmp_path / "r1")
    assert first.returncode == 0, first.stderr
    assert len(entries(env)) == 1
    again = analyze(env, runs, "-o", tmp_path / "r2", importtime=True)
    assert again.returncode == 0
    assert not imported_pandas(again)  # answered from the stored report: no analysis ran
    assert first.stdout.replace("r1", "r2") == again.stdout
    for name in ("index.html", "summary.csv", "runs.csv", "summary.md"):
        assert (tmp_path / "r1" / name).read_bytes() == (tmp_path / "r2" / name).read_bytes(), name
    assert without_created(tmp_path / "r1" / "results.json") == without_created(tmp_path / "r2" / "results.json")


def test_a_rewritten_dump_is_analyzed_again_with_its_new_verdict(runs, tmp_path, env):
    first = analyze(env, runs, "-o", tmp_path / "r1")
    assert first.returncode == 0, first.stderr
    ref = reference_arrays(seed=1)
    write_dump(runs / "vk.h5", perturbed(ref, 0.5, seed=3), backend="vulkan", precision="low")  # really broken now
    again = analyze(env, runs, "-o", tmp_path / "r2", importtime=True)
    assert imported_pandas(again)
    doc = json.loads((tmp_path / "r2" / "results.json").read_text())
    verdicts = {run["run"]: run["verdict"] for run in doc["runs"] if run.get("role") == "compared"}
    assert verdicts and set(verdicts.values()) == {"fail"}, verdicts
    assert len(entries(env)) == 2


@pytest.mark.parametrize("option", [["--atol", "0.5"], ["--no-builtin-rules"], ["--png"], ["--task", "regression"]])
def test_another_option_is_another_analysis(runs, tmp_path, env, option):
    assert analyze(env, runs, "-o", tmp_path / "r1").returncode == 0
    again = analyze(env, runs, "-o", tmp_path / "r2", *option, importtime=True)
    assert again.returncode == 0, again.stderr
    assert imported_pandas(again)


def test_a_fix_json_beside_the_runs_is_a_new_report(runs, tmp_path, env):
    assert analyze(env, runs, "-o", tmp_path / "r1").returncode == 0
    (runs / "fix.json").write_text(json.dumps({"layers": ["conv1"], "errors": {}, "status": "fixed"}))
    again = analyze(env, runs, "-o", tmp_path / "r2", importtime=True)
    assert imported_pandas(again)


def test_json_output_is_the_same_document(runs, tmp_path, env):
    fresh = analyze(env, runs, "-o", tmp_path / "r1", "--json")
    replayed = analyze(env, runs, "-o", tmp_path / "r2", "--json", importtime=True)
    assert not imported_pandas(replayed)
    first, second = json.loads(fresh.stdout), json.loads(replayed.stdout)
    first.pop("created"), second.pop("created")
    assert first == second


def test_problems_and_exit_code_are_replayed(runs, tmp_path, env):
    (runs / "broken.h5").write_bytes(b"not an hdf5 file at all")
    first = analyze(env, runs, "-o", tmp_path / "r1")
    again = analyze(env, runs, "-o", tmp_path / "r2", importtime=True)
    assert first.returncode == again.returncode == 2
    assert not imported_pandas(again)
    problems = [line for line in first.stderr.splitlines() if line.startswith("analyze:")]
    assert problems and problems == [line for line in again.stderr.splitlines() if line.startswith("analyze:")]


def test_a_damaged_entry_is_ignored_and_replaced(runs, tmp_path, env):
    assert analyze(env, runs, "-o", tmp_path / "r1").returncode == 0
    (entry,) = entries(env)
    (entry / "index.html").unlink()
    again = analyze(env, runs, "-o", tmp_path / "r2", importtime=True)
    assert again.returncode == 0 and imported_pandas(again)
    assert (tmp_path / "r2" / "index.html").is_file() and (entry / "index.html").is_file()


def test_a_report_edited_in_place_is_never_replayed(runs, tmp_path, env):
    """The entry may keep the report's own files under a second name: a report file then changed in place
    (an editor, a script appending to it) changes the kept file too, and the entry is not used."""
    assert analyze(env, runs, "-o", tmp_path / "r1").returncode == 0
    page = tmp_path / "r1" / "index.html"
    written = page.read_bytes()
    with open(page, "ab") as edited:
        edited.write(b"<p>a note added by hand</p>")
    again = analyze(env, runs, "-o", tmp_path / "r2", importtime=True)
    assert again.returncode == 0 and imported_pandas(again)
    assert b"a note added by hand" not in (tmp_path / "r2" / "index.html").read_bytes()
    assert len((tmp_path / "r2" / "index.html").read_bytes()) == len(written)
    third = analyze(env, runs, "-o", tmp_path / "r3", importtime=True)  # the entry made again is used
    assert third.returncode == 0 and not imported_pandas(third)
    assert (tmp_path / "r3" / "index.html").read_bytes() == (tmp_path / "r2" / "index.html").read_bytes()


def test_a_sweep_report_then_analyze_shares_one_analysis(runs, tmp_path, env):
    """collect's own report (layerdiff.api.report_directory) and `analyze` of the same folder: one analysis."""
    code = ("import sys; from layerdiff.api import report_directory; "
            "report_directory(sys.argv[1], sys.argv[2])")
    sweep = subprocess.run([sys.executable, "-c", code, str(runs), str(runs / "report")],
                           capture_output=True, text=True, env=env)
    assert sweep.returncode == 0, sweep.stderr
    again = analyze(env, runs, "-o", tmp_path / "r2", importtime=True)
    assert again.returncode == 0 and not imported_pandas(again)
    assert (runs / "report" / "index.html").read_bytes() == (tmp_path / "r2" / "index.html").read_bytes()


def test_the_cli_and_the_library_key_the_same_defaults(runs):
    """The CLI keys from its options (no NameRules yet), report_paths from the objects: equal for the defaults."""
    from layerdiff.analyzer.align.byname import NameRules
    from layerdiff.analyzer.findings.verdict import Thresholds

    library = stored.report_key([runs], rules=NameRules(), thresholds=Thresholds())
    cli = stored.key_for([runs], png=False, ref=None, ref_input=None, set_attrs={}, task=None,
                         thresholds=Thresholds(atol=1e-3, rtol=1e-2, warn_rel_l2=1e-2, fail_rel_l2=1e-1,
                                               min_pass_fraction=0.99), builtin_rules=True)
    assert library == cli is not None
    assert stored.report_key([runs], rules=NameRules(name_map={"a": "b"})) is None
