"""What the analyzer must know about an engine, as data: declared by the engine's folder, recorded by each dump.

Why: a dump from a colleague arrives without the collector that wrote it, and the analyzer never imports
the collector; so the facts that change how a run is read (nodes an engine computes on the CPU by design
in a GPU run, an output name that says which task a model has, whether its cpu/high run is a golden) travel in the HDF5 header as the root
attribute `engine_facts` (JSON, analyzer/FORMATS.md). The collector writes it for every run from the
`facts` its engine declares (collector/engines/<engine>/__init__.py); nothing in the analyzer tests an
engine's name.

A dump written before the header carried the attribute, or by a producer that does not write it (a dump
imported from an engine's own tools), is read with the facts the engine named by its `engine` attribute
declares: the analyzer asks a lookup the program installs (`analyzer/formats/declared.py`), so it names
no engine itself and imports the engine registry only for such a dump.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import asdict, dataclass, field, replace

try:
    import re._parser as _regex_parser  # Python 3.11+
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _regex_parser

ATTRIBUTE = "engine_facts"
MAX_TEXT = 400  # characters of one declared sentence kept (the header is untrusted)
MAX_ITEMS = 64  # names kept per list
MAX_HEADER = 256 * 1024  # characters of the attribute read
MAX_RULES = 16  # name rules kept per list
MAX_PATTERN = 200  # characters of one name rule's pattern
MAX_REPEATS = 2  # repetitions (`*`, `+`, `{2,}`) in one pattern


@dataclass(frozen=True)
class NameRule:
    """One regular expression over names: `pattern` replaced by `replacement`; `why` says who writes names so
    (shown to the reader next to what it explains)."""

    pattern: str
    replacement: str = ""
    why: str = ""


HELPER_ROLES = ("", "copy", "relayout")


@dataclass(frozen=True)
class HelperOp:
    """Ops an engine inserts that no other engine has: an op name `pattern` finds is expected to stay unmatched,
    for the reason `why`. `role` says what it computes, for matching by structure: "copy" (it only copies
    another op's tensor: never paired by structure, it would take that op's partner), "relayout" (it writes
    another op's tensor in another layout: paired only when values confirm it), "" (neither)."""

    pattern: str
    why: str = ""
    role: str = ""


@dataclass(frozen=True)
class NameFacts:
    """How an engine and its tools name what they dump, so its runs align with other engines' runs.

    The aligner applies the rules the two runs of a pair declare to both runs' names, only to layers that did
    not match exactly, and only where the result is unique on both sides (analyzer/align/byname.py)."""

    # Renames of an op name its converter makes (`<name>__suffix`): each `pattern` replaced in the op name.
    renames: tuple[NameRule, ...] = ()
    # How its dump tools write a tensor's `<op>:<output index>` key (tried after `renames`, on the whole key,
    # so a rule may move a number from the name into the output index).
    key_rules: tuple[NameRule, ...] = ()
    # Ops the engine inserts that no other engine has (each a `HelperOp`).
    helper_ops: tuple[HelperOp, ...] = ()
    # Names its dumps count because the engine gives them to several nodes (`Qcur-0#1`, `Qcur-0#2`): each a
    # `pattern` over the op name (`replacement` unused). The count of a node may differ between two runs of the
    # engine (a release names one more node), so in a pair whose runs both declare them a counted name matched
    # whose op types differ is not the same node.
    counted: tuple[NameRule, ...] = ()


@dataclass(frozen=True)
class CpuByDesign:
    """Nodes a GPU run of this engine computes on the CPU whatever the backend: not a fallback.

    `nodes` are the node names (without output index or decorations); `what` names them for a reader
    ("the model's input layer"); `why` is the engine's reason, one clause. `tied_output` is an output
    computed with the same table when it reads `tied_table` (tied embeddings), '' when none."""

    nodes: tuple[str, ...] = ()
    what: str = ""
    why: str = ""
    tied_output: str = ""
    tied_table: str = ""


@dataclass(frozen=True)
class EngineFacts:
    """The facts one engine declares for the analyzer (all optional: an engine that declares none gets none)."""

    cpu_by_design: CpuByDesign = field(default_factory=CpuByDesign)
    # Output names that say the model's task without being told: {output name: task} (`--task` grammar).
    output_tasks: tuple[tuple[str, str], ...] = ()
    # Its cpu/high run is a golden: an fp32 framework reference the mobile engines are judged against, which
    # the analyzer takes as the reference (without --ref) before any other cpu/high run.
    golden: bool = False
    # How its op names relate to other engines' names.
    names: NameFacts = field(default_factory=NameFacts)

    def to_json(self) -> str:
        """The header attribute's text (sorted keys, so two runs of one engine record the same bytes)."""
        data = asdict(self)
        data["output_tasks"] = dict(self.output_tasks)
        return json.dumps(data, sort_keys=True)

    def task_for_output(self, name: str) -> str:
        """The task an output of this name declares, '' when it declares none."""
        return dict(self.output_tasks).get(name, "")


NO_FACTS = EngineFacts()


def _text(value: object) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def _names(value: object) -> tuple[str, ...]:
    return tuple(_text(v) for v in value[:MAX_ITEMS] if isinstance(v, str)) if isinstance(value, list) else ()


def parse_facts(text: object) -> EngineFacts:
    """The facts a header attribute records; NO_FACTS for anything malformed (an untrusted header never
    stops an analysis: a run without facts is read as an engine that declares none)."""
    return _recorded(text)[0]


def _recorded(text: object) -> tuple[EngineFacts, bool]:
    """The facts a header attribute records, and whether it records name rules (`names`)."""
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError:
            return NO_FACTS, False
    return _parsed(str(text)[:MAX_HEADER])


@functools.lru_cache(maxsize=64)
def _parsed(text: str) -> tuple[EngineFacts, bool]:
    """Parsed once per distinct header text (every step of an analysis asks for a run's facts)."""
    try:
        data = json.loads(text)
    except ValueError:
        return NO_FACTS, False
    if not isinstance(data, dict):
        return NO_FACTS, False
    cpu = data.get("cpu_by_design") if isinstance(data.get("cpu_by_design"), dict) else {}
    tasks = data.get("output_tasks") if isinstance(data.get("output_tasks"), dict) else {}
    names = data.get("names") if isinstance(data.get("names"), dict) else {}
    return EngineFacts(
        CpuByDesign(_names(cpu.get("nodes")), _text(cpu.get("what")), _text(cpu.get("why")),
                    _text(cpu.get("tied_output")), _text(cpu.get("tied_table"))),
        tuple((_text(k), _text(v)) for k, v in list(tasks.items())[:MAX_ITEMS] if isinstance(v, str)),
        data.get("golden") is True,
        NameFacts(_rules(names.get("renames")), _rules(names.get("key_rules")), _helpers(names.get("helper_ops")),
                  _rules(names.get("counted")))), \
        "names" in data


def _rules(value: object) -> tuple[NameRule, ...]:
    """The usable rules of a recorded list: at most MAX_RULES; a rule whose pattern or replacement is not
    `usable` is left out (its names then stay as written), never an error."""
    if not isinstance(value, list):
        return ()
    rules = (NameRule(_text(r.get("pattern")), _text(r.get("replacement")), _text(r.get("why")))
             for r in value[:MAX_RULES] if isinstance(r, dict) and isinstance(r.get("pattern"), str))
    return tuple(rule for rule in rules if usable(rule))


def _helpers(value: object) -> tuple[HelperOp, ...]:
    """The usable helper-op patterns of a recorded list (as `_rules`); an unknown role is read as none."""
    if not isinstance(value, list):
        return ()
    helpers = (HelperOp(_text(h.get("pattern")), _text(h.get("why")), _role(h.get("role")))
               for h in value[:MAX_RULES] if isinstance(h, dict) and isinstance(h.get("pattern"), str))
    return tuple(helper for helper in helpers if usable(NameRule(helper.pattern)))


def _role(value: object) -> str:
    return value if isinstance(value, str) and value in HELPER_ROLES else ""


def usable(rule: NameRule) -> bool:
    """Whether a rule from an untrusted header may be applied to every op name of a run: a pattern that
    compiles, at most MAX_PATTERN characters, with at most MAX_REPEATS repetitions and none inside another
    repetition or alternation (a pattern like `(a+)+` takes exponential time on a name made to defeat it),
    and a replacement that names only groups the pattern has."""
    if not rule.pattern or len(rule.pattern) > MAX_PATTERN:
        return False
    try:
        compiled = re.compile(rule.pattern)
        tree = _regex_parser.parse(rule.pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    repeats = _repeats(tree, inside=False)
    if repeats is None or repeats > MAX_REPEATS:
        return False
    names = {number: name for name, number in compiled.groupindex.items()}
    groups = "".join(f"(?P<{names[i]}>)" if i in names else "()" for i in range(1, compiled.groups + 1))
    try:
        re.compile(groups).match("").expand(rule.replacement)
    except (re.error, IndexError):
        return False
    return True


_REPEATS = {"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"}


def _repeats(tree, inside: bool) -> int | None:
    """How many repetitions (of more than one occurrence) a parsed pattern holds; None when one sits inside
    another, or an alternation sits inside one (the shapes that backtrack without bound)."""
    count = 0
    for op, value in tree:
        kind = getattr(op, "name", str(op))
        repeated = kind in _REPEATS and value[1] > 1
        if inside and (repeated or kind == "BRANCH"):
            return None
        for child in _children(value):
            found = _repeats(child, inside or repeated)
            if found is None:
                return None
            count += found
        count += repeated
    return count


def _children(value) -> list:
    """The sub-patterns inside one parsed item (groups, alternatives, repetitions, look-arounds)."""
    if isinstance(value, _regex_parser.SubPattern):
        return [value]
    if isinstance(value, (tuple, list)):
        return [child for item in value for child in _children(item)]
    return []


def facts_of(attrs) -> EngineFacts:
    """The engine facts a run's root attributes record; what the header leaves out (all of it in a dump written
    before the attribute existed, the name rules in one written before they were recorded) is what the engine
    named by the dump's `engine` attribute declares (`declared_facts`)."""
    engine = str(attrs.get("engine", "") or "")
    if ATTRIBUTE not in attrs:
        return declared_facts(engine)
    facts, names_recorded = _recorded(attrs.get(ATTRIBUTE))
    return facts if names_recorded else replace(facts, names=declared_facts(engine).names)


def declared_facts(engine: str) -> EngineFacts:
    """What the engine of this name declares today, through the lookup the program installed (the analyzer
    knows no engine: `layerdiff/__init__.py` installs one that reads the engine registry, and only when a dump
    needs it); NO_FACTS for an engine nobody declares, or without a lookup. A declaration a kept dump header
    brought (`remember_declared`) answers first."""
    from layerdiff.analyzer.formats import declared

    remembered = _REMEMBERED.get(engine)
    if remembered is not None and remembered[0] is declared.lookup:
        return remembered[1]
    found = declared.lookup(engine) if declared.lookup is not None and engine else None
    return found if isinstance(found, EngineFacts) else NO_FACTS


# engine name -> (the lookup installed then, its declared facts as a kept dump header recorded them:
# runs/dumpheaders.py); another lookup installed since (a program of its own, a test) is asked instead
_REMEMBERED: dict[str, tuple[object, EngineFacts]] = {}


def reads_declaration(attrs) -> bool:
    """Whether `facts_of` these attributes reads what their engine declares (all of it, or the name rules)."""
    return ATTRIBUTE not in attrs or not _recorded(attrs.get(ATTRIBUTE))[1]


def declared_text(engine: str) -> str | None:
    """The declared facts of `engine` as header text, for a kept dump header of a dump that records none
    (None when the text would not read back as the same facts, or when the program installed its lookup without
    saying what its declarations are made of: the header's key then does not hold them)."""
    from layerdiff.analyzer.formats import declared

    if declared.sources is None:
        return None
    facts = declared_facts(engine)
    text = facts.to_json()
    return text if _recorded(text) == (facts, True) else None


def remember_declared(engine: str, text: object) -> None:
    """Take `text` (`declared_text`, kept in a dump header made by this very code: the header's key holds the
    code fingerprint, which takes the declarations in) as what `engine` declares, so that reading such a dump
    again does not import the engine registry."""
    from layerdiff.analyzer.formats import declared

    facts, names_recorded = _recorded(text)
    if engine and names_recorded and declared.lookup is not None and declared.sources is not None:
        _REMEMBERED[engine] = (declared.lookup, facts)
