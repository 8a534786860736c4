"""What the analyzer must know about an engine, as data: declared by the engine's folder, recorded by each dump.

Why: a dump from a colleague arrives without the collector that wrote it, and the analyzer never imports
the collector; so the facts that change how a run is read (nodes an engine computes on the CPU by design
in a GPU run, an output name that says which task a model has, whether its cpu/high run is a golden) travel in the HDF5 header as the root
attribute `engine_facts` (JSON, analyzer/FORMATS.md). The collector writes it for every run from the
`facts` its engine declares (collector/engines/<engine>/__init__.py); nothing in the analyzer tests an
engine's name.

A dump written before the header carried the attribute (or by a producer that does not write it) is read
with the facts its engine declared when such dumps were written: `RECORDED_BEFORE` below, a frozen table
keyed by the dump's `engine` attribute. It never grows: dumps written from now on carry their own facts.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

ATTRIBUTE = "engine_facts"
MAX_TEXT = 400  # characters of one declared sentence kept (the header is untrusted)
MAX_ITEMS = 64  # names kept per list


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
    try:
        data = json.loads(text.decode() if isinstance(text, bytes) else str(text))
    except (ValueError, UnicodeDecodeError):
        return NO_FACTS
    if not isinstance(data, dict):
        return NO_FACTS
    cpu = data.get("cpu_by_design") if isinstance(data.get("cpu_by_design"), dict) else {}
    tasks = data.get("output_tasks") if isinstance(data.get("output_tasks"), dict) else {}
    return EngineFacts(
        CpuByDesign(_names(cpu.get("nodes")), _text(cpu.get("what")), _text(cpu.get("why")),
                    _text(cpu.get("tied_output")), _text(cpu.get("tied_table"))),
        tuple((_text(k), _text(v)) for k, v in list(tasks.items())[:MAX_ITEMS] if isinstance(v, str)),
        data.get("golden") is True)


# The facts dumps recorded implicitly before the header carried `engine_facts`, by the dump's `engine`
# attribute (frozen: the engine folder's declaration is the truth for new dumps; tests/test_engine_facts.py
# checks the two agree).
RECORDED_BEFORE: dict[str, EngineFacts] = {
    "ggml": EngineFacts(
        CpuByDesign(("embd", "inp_embd"), "llama.cpp's input layer",
                    "llama.cpp keeps the token-embedding table in CPU memory and computes what reads it there",
                    "result_output", "token_embd.weight"),
        (("result_output", "language-model"),)),
    "onnxruntime": EngineFacts(golden=True),
    "paddle": EngineFacts(golden=True),
}


def facts_of(attrs) -> EngineFacts:
    """The engine facts a run's root attributes record, else those of dumps written before the attribute."""
    if ATTRIBUTE in attrs:
        return parse_facts(attrs.get(ATTRIBUTE))
    return RECORDED_BEFORE.get(str(attrs.get("engine", "")), NO_FACTS)
