"""A table's rows built a column at a time read exactly as pandas' own `to_dict("records")` and
`format_number` per cell: the report's text must not change with how fast it is made."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.measure.rows import records
from layerdiff.analyzer.report.numbers import format_number
from layerdiff.analyzer.report.tables import _formatted_column

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "dumps"


def _typed(rows: list[dict]) -> list[list[tuple[str, str, str]]]:
    return [[(k, type(v).__name__, repr(v)) for k, v in row.items()] for row in rows]


def test_records_of_a_real_analysis_equal_pandas_records(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERDIFF_CACHE_DIR", str(tmp_path / "cache"))
    analysis = analyze_paths([SAMPLES])
    try:
        frames = {"summary": analysis.summary, "table": analysis.comparison.table, "layers": analysis.runs[0].layers}
        for name, frame in frames.items():
            assert len(frame), name
            assert _typed(records(frame)) == _typed(frame.to_dict("records")), name
        columns = ["key", "status", "rel_l2"]
        assert _typed(records(analysis.comparison.table, columns)) == \
            _typed(analysis.comparison.table[columns].to_dict("records"))
    finally:
        analysis.close()


def test_records_box_numpy_scalars_held_in_object_columns():
    frame = pd.DataFrame({"x": pd.Series([np.float32(1.5), np.int64(3), None, "a"], dtype=object),
                          "y": pd.array([1, None, 3, 4], dtype="Int64"), "z": [0.5, math.nan, math.inf, -0.0]})
    assert _typed(records(frame)) == _typed(frame.to_dict("records"))


def test_formatted_columns_read_as_format_number_per_cell():
    columns = [pd.Series([0.0, -0.0, 1.23456789, math.nan, math.inf, -math.inf, 1e-300, 123456.0]),
               pd.Series(np.array([1.5, math.nan], dtype=np.float32)),
               pd.Series([1, -2, 3]), pd.Series([True, False]),
               pd.Series([1.5, None], dtype="Float64"), pd.Series(["a", None, "c"]),
               pd.Series([3.0, math.nan], name="position")]
    for series in columns:
        values = series.tolist()
        if series.name == "position":
            values = [v + 1 if v == v else v for v in values]
        assert _formatted_column(series) == [format_number(v) for v in values], series.tolist()


def test_summary_csv_written_column_wise_equals_pandas_to_csv(tmp_path, monkeypatch):
    """summary.csv's own writer gives pandas' `to_csv` text byte for byte: awkward floats, integers,
    booleans, texts the CSV must quote, missing texts, and a real analysis's table."""
    from layerdiff.analyzer.report.tables import _plain_csv, _plain_csv_columns, csv_chunks

    floats = [0.0, -0.0, 0.1, 1e-5, 1e16, 5e-324, 1.7976931348623157e308, math.nan, math.inf, -math.inf,
              0.30000000000000004, 123456789012345.6]
    n = len(floats)
    texts = ["plain", "a,b", 'say "hi"', "two\nlines", "", None, "carriage\rreturn", " lead", "ünï", "x;y", "'q'", "#"]
    frame = pd.DataFrame({"f": floats, "i": np.arange(n, dtype=np.int64) - 5, "u": np.arange(n, dtype=np.uint8),
                          "b": [k % 2 == 0 for k in range(n)], "s": pd.array(texts, dtype="str"),
                          "with,comma": pd.array(texts[::-1], dtype="string")})
    assert _plain_csv_columns(frame)
    for header in (True, False):
        assert _plain_csv(frame, header) == frame.to_csv(index=False, header=header)
        assert _plain_csv(frame[["s"]], header) == frame[["s"]].to_csv(index=False, header=header)  # `""` rows
    assert not _plain_csv_columns(frame.assign(o=pd.Series([(1, 2)] * n, dtype=object)))

    monkeypatch.setenv("LAYERDIFF_CACHE_DIR", str(tmp_path / "cache"))
    analysis = analyze_paths([SAMPLES])
    try:
        table = analysis.comparison.table
        assert _plain_csv_columns(table)
        assert b"".join(csv_chunks(table, rows=7)) == table.to_csv(index=False).encode("utf-8")
    finally:
        analysis.close()
