"""What `collect bisect` needs from an engine's folder: how a single layer is moved back to the reference
configuration while the others run the failing one.

Why a recipe per engine: moving a layer is the engine's own switch (a flag in its model file, an argument of its
harness, a model cut into pieces), so it is knowledge of the engine. The engine's folder declares a `BisectRecipe`
(its `Engine.bisect` hook returns it); collector/fix/bisect.py runs the search the same way from it and names no
engine. Two kinds of recipe run through a device: the model file is rewritten per trial (`layers` reads it), or
the graph exists only in the harness's code and a harness argument keeps the layers (`keep_args`), the harness then
listing the layers it can keep in the header of every such run (`options.keep.movable`). A third kind runs its
trials in the collect process (`in_process`: the engine's wheel is the engine).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class BisectLayer:
    """One layer of the model file, read without running it."""

    name: str
    op_type: str
    bottoms: tuple[str, ...]
    tops: tuple[str, ...]


def never(backend: str) -> bool:
    """A kept layer reads whatever its producers wrote, on every backend."""
    return False


def nothing_recorded(backend: str) -> dict:
    return {}


@dataclass(frozen=True)
class BisectRecipe:
    """An engine's part of `collect bisect` (see the module docstring)."""

    name: str  # bisect.json's `mechanism`
    how: str  # one sentence for bisect.json and the docs
    # the model's files -> every layer, in execution order ([] when the harness lists them)
    layers: Callable[[object], list[BisectLayer]]
    fixed: frozenset[str] = frozenset()  # op types that compute nothing and never move (model inputs, blob copies)
    # ... of which these move after all where a kept layer needs kept producers (they must hand on the high type)
    moved_when_closed: frozenset[str] = frozenset()
    kept_needs_producers: Callable[[str], bool] = never  # backend -> a kept layer must be fed by kept layers
    # Trials run in the collect process, not through a device: (model, (backend, precision) failing, reference
    # configuration, inputs) -> an object with `run(kept) -> (errors by input label, failures by input label)`,
    # `runs` (plain runs so far) and `output_names`.
    in_process: Callable | None = None
    keep_args: Callable[[tuple[str, ...]], list[str]] | None = None  # kept layers -> harness arguments
    outputs: Callable[[object], list[str]] | None = None  # the model outputs, when `layers` cannot tell
    refusal: Callable[[object, str], str] | None = None  # (model, backend) -> one line, "" when it can run
    # backend -> what bisect.json records about how a kept layer is kept (e.g. the flag value written into it)
    kept_record: Callable[[str], dict] = nothing_recorded

    def movable(self, layers: list[BisectLayer], backend: str) -> list[str]:
        fixed = self.fixed - self.moved_when_closed if self.kept_needs_producers(backend) else self.fixed
        return [layer.name for layer in layers if layer.op_type not in fixed]
