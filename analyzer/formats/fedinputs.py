"""Was the engine fed what the user gave? The `input_fed` records of a raw dump checked against the inputs.

A harness reads each input back from the engine's own input tensor after feeding it (FORMATS.md §1
`input_fed`): the bytes the engine computes on, in the order it holds them, with `axes` saying how the
given array maps onto them (fed = given.transpose(axes)). An engine that reorders or converts an input
behind the user's back (an NHWC model fed as NCHW, a float input truncated to an integer type) shows
here, and nowhere else: the dump's `/inputs` keeps the arrays as given.
"""
from __future__ import annotations

import numpy as np

# Root attribute values of `input_fed_check` (FORMATS.md §2).
FED_EQUAL = "equal"
FED_UNKNOWN = ""  # the harness recorded no read-back (older harnesses, engines that cannot read it)
# The engine holds its input in a reduced type at this precision (MNN's Arm82 fp16 backend keeps an fp16
# input tensor): it received the given values, rounded as that type rounds them: not another input.
ROUNDED_TO = "equal as {kind} (the engine holds its input in {kind} at this precision)"


# The layout words of a read-back that holds the token ids an engine's own tokenizer made of a prompt (ggml):
# it is checked against the ids the run's header records for that prompt (`options.tokens`), not the prompt's bytes.
PROMPT_TOKENS = "token ids of the prompt"


def expected_inputs(given: dict[str, np.ndarray], fed_layouts: dict[str, str], header: dict) -> dict[str, np.ndarray]:
    """The arrays each read-back is held against: the inputs as given, except a prompt the engine tokenized,
    whose read-back is held against the token ids the run recorded for it."""
    expected = dict(given)
    options = header.get("options") if isinstance(header.get("options"), dict) else {}
    tokens = options.get("tokens")
    for name, layout in fed_layouts.items():
        if layout.startswith(PROMPT_TOKENS) and name in expected and isinstance(tokens, list):
            try:
                expected[name] = np.asarray(tokens, dtype=np.int64)
            except (TypeError, ValueError, OverflowError):
                expected[name] = np.asarray([], dtype=np.int64)  # unreadable ids: the check then says they differ
    return expected


def fed_ok(check: str) -> bool:
    """The `input_fed_check` of a run whose engine received the input given (exactly, or rounded to the
    reduced type it holds inputs in at this precision), or recorded no read-back."""
    return check in (FED_UNKNOWN, FED_EQUAL) or check.startswith(FED_EQUAL + " as ")


def rounded_kind(expected: np.ndarray, fed: np.ndarray) -> str:
    """'fp16' or 'bf16' when `fed` is `expected` rounded to that type, else ''."""
    if expected.dtype.kind != "f" or fed.dtype.kind != "f" or expected.shape != fed.shape:
        return ""
    values = expected.astype(np.float32)
    with np.errstate(over="ignore"):  # values past fp16's range become inf: then not an fp16 rounding
        halved = values.astype(np.float16).astype(np.float32)
    if np.array_equal(halved, fed.astype(np.float32), equal_nan=True):
        return "fp16"
    bits = values.view(np.uint32)
    nearest = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)  # round to nearest even
    truncated = (bits & 0xFFFF0000).view(np.float32)
    if any(np.array_equal(b, fed.astype(np.float32), equal_nan=True) for b in (nearest, truncated)):
        return "bf16"
    return ""


def fed_difference(name: str, given: np.ndarray, fed: np.ndarray, axes: tuple[int, ...], layout: str) -> str:
    """'' when the engine received exactly `given` (cast to its element type, axes permuted), else one line."""
    where = f"input {name!r}"
    if given.ndim != len(axes):
        return (f"{where}: the engine holds it with {len(axes)} dimensions {list(fed.shape)}, "
                f"the input given has {given.ndim} {list(given.shape)}")
    expected = np.transpose(np.asarray(given), axes) if given.ndim else np.asarray(given)
    if expected.shape != fed.shape:
        return (f"{where}: the engine holds shape {list(fed.shape)} ({layout or 'layout unknown'}), "
                f"the input given is {list(given.shape)}")
    try:
        expected = expected.astype(fed.dtype)
    except (TypeError, ValueError):
        return f"{where}: the engine holds {fed.dtype}, which the given {given.dtype} does not convert to"
    if np.array_equal(expected, fed, equal_nan=fed.dtype.kind == "f"):
        return ""
    kind = rounded_kind(expected, fed)
    if kind:
        return ROUNDED_TO.format(kind=kind)
    differ = int(np.count_nonzero(expected != fed))
    return (f"{where}: the engine computed on other values than the input given ({differ} of {fed.size} elements "
            f"differ as {layout or 'laid out'}{'' if list(axes) == sorted(axes) else f', axes {list(axes)}'}): "
            "its outputs are not the model's answer to this input")


def check_fed(given: dict[str, np.ndarray], fed: list[tuple[str, np.ndarray, tuple[int, ...], str]],
              precision: str = "") -> str:
    """The run's `input_fed_check`: `equal`, '' when nothing was read back, else the first difference
    (one line; further inputs that differ are counted)."""
    if not fed:
        return FED_UNKNOWN
    problems, rounded = [], ""
    for name, array, axes, layout in fed:
        if name not in given:
            problems.append(f"input {name!r}: the engine was fed an input the run was not given")
            continue
        line = fed_difference(name, given[name], array, axes, layout)
        if line.startswith(FED_EQUAL + " as ") and line.split()[2] in precision.lower():
            rounded = line  # the run's own reduced precision (`precision_effective`) explains the rounding
        elif line.startswith(FED_EQUAL + " as "):
            problems.append(f"input {name!r}: the engine holds it rounded to {line.split()[2]} although the run "
                            f"says it computes in {precision or 'full precision'}")
        elif line:
            problems.append(line)
    if not problems:
        return rounded or FED_EQUAL
    more = f" (and {len(problems) - 1} more input(s) differ)" if len(problems) > 1 else ""
    return problems[0] + more
