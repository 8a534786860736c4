"""A table's rows as plain Python dicts, built a column at a time.

`DataFrame.to_dict("records")` takes every column out through pandas' indexing and boxes it again per
cell; over a summary of some sixty columns, or a pair's measured rows, that was several milliseconds a
call, and a re-judged analysis makes a dozen such calls. `records` gives the same dicts (the same
Python values, in the same column order) from one `tolist` per column.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from pandas.api.extensions import ExtensionDtype
from pandas.core.dtypes.cast import maybe_box_native


def records(frame: pd.DataFrame, columns: list[str] | None = None) -> list[dict]:
    """`frame[columns].to_dict("records")` (every column when `columns` is None), column-wise."""
    names = list(frame.columns) if columns is None else list(columns)
    values = [_column_values(frame[name]) for name in names]
    return [dict(zip(names, row)) for row in zip(*values)] if names else [{} for _ in range(len(frame))]


def _column_values(series: pd.Series) -> list:
    """The column's cells as `to_dict` gives them: Python scalars, also those an object column holds."""
    values = series.tolist()
    dtype = series.dtype
    if dtype == np.dtype(object) or isinstance(dtype, ExtensionDtype):
        values = list(map(maybe_box_native, values))
    return values


def by_position(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows in execution order (`position`): the frame itself when its positions already increase strictly,
    as a pair's rows do (sorting copied every column of the table, several times per analysis); the caller
    only reads it."""
    positions = frame["position"].to_numpy()
    if positions.dtype.kind in "iu" and (len(positions) < 2 or bool((positions[1:] > positions[:-1]).all())):
        return frame
    return frame.sort_values("position")
