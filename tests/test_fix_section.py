"""The report's Fix section reads the engine's advice from fix.json: `engine_options`, or in files written before
that key, the key named after the file's engine (`<engine>_options`)."""
from __future__ import annotations

import json
from pathlib import Path

from layerdiff.analyzer.report.fixsection import fix_html


def _fix_json(folder: Path, **keys) -> Path:
    run = folder / "after" / "run.h5"
    run.parent.mkdir(parents=True)
    doc = {"status": "fixed", "engine": "mnn", "layers": [], "errors": {}, "search": {}, **keys}
    (folder / "fix.json").write_text(json.dumps(doc))
    return run


def test_advice_is_read_from_engine_options(tmp_path):
    html = "".join(fix_html([_fix_json(tmp_path, engine_options=["split the model"])]))
    assert "<li>split the model</li>" in html


def test_advice_of_a_file_written_before_engine_options_is_read_from_its_engines_key(tmp_path):
    html = "".join(fix_html([_fix_json(tmp_path, mnn_options=["per session precision"])]))
    assert "<li>per session precision</li>" in html


def test_another_engines_key_is_not_taken_as_advice(tmp_path):
    html = "".join(fix_html([_fix_json(tmp_path, ncnn_options=["not this file's engine"])]))
    assert "not this file" not in html
