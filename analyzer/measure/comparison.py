"""What a measurement is: the tidy table of every layer x run, with what alignment could not match.

Measuring (layerdiff.analyzer.measure.compare) makes one; a stored measurement
(layerdiff.analyzer.measure.resultcache) is read back into one; judging and the report read it. It lives
apart from the measuring code so a re-judged analysis imports no metric kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from layerdiff.analyzer.align.graph import run_graph

if TYPE_CHECKING:
    import pandas as pd

    from layerdiff.analyzer.align.byname import PairAlignment
    from layerdiff.analyzer.align.graph import LayerGraph
    from layerdiff.analyzer.measure.storage import StorageEvidence
    from layerdiff.analyzer.runs.reference import Plan
    from layerdiff.analyzer.runs.sources import Run

MEASURED = "measured"  # a row with every metric and no judgement yet


@dataclass
class Comparison:
    """Everything measured: the tidy table plus what alignment could not match."""

    plan: Plan
    table: pd.DataFrame
    alignments: list[PairAlignment]
    graphs: dict[str, LayerGraph] = field(default_factory=dict)  # run label -> its graph
    problems: list[str] = field(default_factory=list)
    storage: dict[str, StorageEvidence] = field(default_factory=dict)  # run label -> what its bytes were stored in
    # (run's file, order) -> a model output's values, or where the stored measurement keeps them (formats/jsontable.py
    # array_ref) until asked for
    outputs: dict[tuple[str, int], object] = field(default_factory=dict)

    def output_values(self, run: Run, order: int) -> np.ndarray:
        """A model output's values as the measurement kept them for the judge (a task decodes them: a changed
        `--task` re-judges without opening a tensor), else read from the run's dump (an output over
        layerdiff.analyzer.measure.compare.MAX_KEPT_OUTPUT_BYTES, or one that could not be read while measuring: reading it says why)."""
        kept = self.outputs.get((str(run.path), int(order)))
        if kept is not None and not isinstance(kept, np.ndarray):
            from layerdiff.analyzer.formats.jsontable import read_array_ref

            try:
                kept = self.outputs[(str(run.path), int(order))] = read_array_ref(kept)
            except (OSError, ValueError):  # the stored bytes went meanwhile: the dump still has them
                kept = None
        return run.dump.tensor(int(order)) if kept is None else kept

    def graph(self, run: Run) -> LayerGraph:
        """The run's layer graph, rebuilt if it was released (an analysis drops them once its findings
        are made: two graphs were ~40 MB at 50,000 layers, kept through the whole report)."""
        graph = self.graphs.get(run.label)
        if graph is None:
            graph = self.graphs[run.label] = run_graph(run)
        return graph

    def pair_rows(self, pair_index: int) -> pd.DataFrame:
        """The table's rows of one pair: the table itself when it holds no other pair (one compared run, the
        usual case: a filtered copy of every column was made a dozen times per analysis). Callers read it."""
        wanted = self.table["pair"] == pair_index
        return self.table if bool(wanted.all()) else self.table[wanted]
