"""How the op names of two runs are brought to one form: the rules their engines declare, plus engine-neutral ones.

Engines and their tools name one tensor differently: a converter renames the ops it rewrites, an engine's dump
tools write names with other characters and move a second output into a name of its own, an engine inserts
helper ops no other engine has. Each engine's folder declares these as data (`NameFacts`: `renames`,
`key_rules`, `helper_ops`), every dump records them in its header (`engine_facts`), and the rules of a pair are
those its two runs declare, applied to both runs' names, plus the engine-neutral `NEUTRAL_RENAMES` (ONNX's '/'
prefix, which exporters write and some converters drop). A pair whose runs declare nothing is aligned by the
neutral rules alone.

`PairNaming.renamed` and `PairNaming.canonical` give the normalised key of a `<op>:<output index>` key;
`byname.align_layers` uses them only for layers that did not match exactly, and only where the result is unique
on both sides.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from layerdiff.analyzer.formats.enginefacts import HelperOp, NameFacts, NameRule, facts_of

NEUTRAL_RENAMES: tuple[NameRule, ...] = (
    NameRule(r"^/+", "", "ONNX exporters prefix node names with '/', some converters drop it"),
)

_Compiled = tuple[tuple[re.Pattern, str, str], ...]


@dataclass(frozen=True)
class PairNaming:
    """The name rules of one pair of runs, compiled: what its runs' engines declare, then the neutral ones."""

    renames: _Compiled = ()
    key_rules: _Compiled = ()
    helper_ops: tuple[tuple[re.Pattern, str, str], ...] = ()  # (pattern, why, role)
    # Counted names (`NameFacts.counted`), when both runs declare them: such a name matched must match the op type.
    counted: _Compiled = ()

    def renamed(self, key: str) -> str:
        """The key with the renames applied to its op part (output index kept)."""
        op, _, index = key.rpartition(":")
        for pattern, replacement, _why in self.renames:
            op = pattern.sub(replacement, op)
        return f"{op}:{index}"

    def canonical(self, key: str) -> str:
        """The key as the declared dump tools would write it (a key without an output index is output 0)."""
        _op, sep, index = key.rpartition(":")
        if not sep or not index.isdigit():
            key = f"{key}:0"
        for pattern, replacement, _why in self.key_rules:
            key = pattern.sub(replacement, key)
        return key

    def helper_reason(self, op: str) -> str:
        """Why an op is expected to have no counterpart (an engine-inserted helper), '' when it is not one."""
        return next((why for pattern, why, _role in self.helper_ops if pattern.search(op)), "")

    def is_counted(self, op: str) -> bool:
        """Whether `op` is a counted repeat of a name (`Qcur-0#2`): a name that may name another node in another run."""
        return any(pattern.search(op) for pattern, _replacement, _why in self.counted)

    def is_helper(self, op: str) -> bool:
        return bool(self.helper_reason(op))

    def has_role(self, op: str, role: str) -> bool:
        """Whether `op` is a helper op of this role ("copy", "relayout": enginefacts.HelperOp)."""
        return any(pattern.search(op) for pattern, _why, helper_role in self.helper_ops if helper_role == role)


def naming_of(*attrs) -> PairNaming:
    """The name rules of the runs with these root attributes (a pair's two runs)."""
    return pair_naming(*(facts_of(a).names for a in attrs))


@functools.lru_cache(maxsize=64)
def pair_naming(*declared: NameFacts) -> PairNaming:
    """The rules the runs declare (each rule once, in the runs' order) and the neutral renames after them."""
    return PairNaming(_compiled([r for names in declared for r in names.renames] + list(NEUTRAL_RENAMES)),
                      _compiled([r for names in declared for r in names.key_rules]),
                      _helpers([h for names in declared for h in names.helper_ops]),
                      _compiled([r for names in declared for r in names.counted])
                      if len(declared) >= 2 and all(names.counted for names in declared) else ())


def _helpers(helpers: list[HelperOp]) -> tuple[tuple[re.Pattern, str, str], ...]:
    return tuple((re.compile(h.pattern), h.why, h.role) for h in dict.fromkeys(helpers))


def _compiled(rules: list[NameRule]) -> _Compiled:
    unique = dict.fromkeys(rules)
    return tuple((re.compile(r.pattern), r.replacement, r.why) for r in unique)


NEUTRAL = pair_naming()  # a pair whose runs declare no name rules
