"""A table's rows as plain Python dicts, built a column at a time.

`DataFrame.to_dict("records")` takes every column out through pandas' indexing and boxes it again per
cell; over a summary of some sixty columns, or a pair's measured rows, that was several milliseconds a
call, and a re-judged analysis makes a dozen such calls. `records` gives the same dicts (the same
Python values, in the same column order) from one `tolist` per column.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pandas as pd
from pandas.api.extensions import ExtensionDtype
from pandas.core.dtypes.cast import maybe_box_native


def records(frame: pd.DataFrame, columns: list[str] | None = None) -> list[dict]:
    """`frame[columns].to_dict("records")` (every column when `columns` is None), column-wise."""
    names = list(frame.columns) if columns is None else list(columns)
    values = [_column_values(frame[name]) for name in names]
    return [dict(zip(names, row)) for row in zip(*values)] if names else [{} for _ in range(len(frame))]


class KeyedRows(Mapping):
    """A table's rows as {key: the `records` dict of `columns`}, each dict made when it is first asked for:
    the judge's decisions read a handful of a pair's layers, and a dict for every layer was most of their cost."""

    def __init__(self, frame: pd.DataFrame, key_column: str, columns: list[str]) -> None:
        self._names = list(columns)
        self._values = [_column_values(frame[name]) for name in self._names]
        self._row_of = {str(key): i for i, key in enumerate(_column_values(frame[key_column]))}
        self._made: dict[str, dict] = {}

    def __getitem__(self, key: str) -> dict:
        made = self._made.get(key)
        if made is None:
            row = self._row_of[key]
            made = self._made[key] = {name: values[row] for name, values in zip(self._names, self._values)}
        return made

    def __contains__(self, key: object) -> bool:
        return key in self._row_of

    def __iter__(self) -> Iterator[str]:
        return iter(self._row_of)

    def __len__(self) -> int:
        return len(self._row_of)


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
