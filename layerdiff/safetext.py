"""Untrusted text where it leaves the program: one rule per destination.

Layer names, op types, run labels, provenance attributes (device model, input label, ...) and a phone's
answers come from files and devices nobody vouches for. They are stored verbatim (HDF5, CSV, JSON keep
every character); only where they are *shown* are they made inert for the medium that shows them:

- a terminal gets plain text: no Rich markup is read in data (`block[main]/conv` prints as is, `[/x]`
  is not a closing tag), and control characters (ESC, carriage return, bidirectional overrides, ...)
  are written as visible escapes such as `\\x1b`, so a name cannot clear the screen or hide text;
- an HTML page gets escaped text in every cell, heading and attribute (`html_text`), chart labels
  escaped for plotly's label markup (`chart_text`), and data embedded in a <script> as JSON in which
  no `<` appears (`json_in_script`), so a name can neither close the script nor start markup;
- Markdown (summary.md) gets its special characters backslash-escaped (`markdown_text`).

Every command that prints data and every report writer goes through these functions; nothing here
imports more than the standard library until a Rich cell is asked for.
"""
from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # rich is imported only when a cell is built
    from rich.text import Text

# C0 and C1 control characters, DEL, and the Unicode controls that reorder text on screen (direction
# marks, embeddings, overrides and isolates) or break lines (line and paragraph separators).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CHART_ESCAPES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("%", "&#37;"))
# the backslash first; `_` is left alone: inside a name (conv_1) CommonMark reads no emphasis
_MARKDOWN_SPECIALS = "\\`*[]<>|&~\r\n"
_MARKDOWN_ESCAPES = {**{c: "\\" + c for c in _MARKDOWN_SPECIALS[:-2]}, "\r": " ", "\n": " "}


def _visible(match: re.Match) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_text(value: object) -> str:
    """One value (a name, a label, an attribute) as a terminal shows it safely: every control
    character, newline included, written as a visible escape (`\\x1b`, `\\n`)."""
    text = value if isinstance(value, str) else str(value)
    return _CONTROL.sub(_visible, text)


def terminal_lines(text: object) -> str:
    """A whole message (which may quote names) for the terminal: like `terminal_text`, but the
    message's own newlines and tabs stay."""
    text = text if isinstance(text, str) else str(text)
    return _CONTROL_BUT_LINES.sub(_visible, text)


def terminal_cell(value: object, style: str = "") -> "Text":
    """A Rich table cell or printable holding `value` as plain text: Rich reads no markup in it."""
    from rich.text import Text

    return Text(terminal_text(value), style=style)


def html_text(value: object) -> str:
    """Text for any place in an HTML page (element content or a quoted attribute)."""
    return html.escape(value if isinstance(value, str) else str(value), quote=True)


_HTML_SPECIALS = frozenset("&<>\"'")  # what `html.escape(..., quote=True)` replaces


def html_texts(values: Iterable[str]) -> list[str]:
    """`html_text` of each string, a column at a time: a column with none of the characters HTML escapes
    (most columns of numbers and layer names) is looked at once, not cell by cell."""
    texts = list(values)
    if _HTML_SPECIALS.isdisjoint("".join(texts)):
        return texts
    return [html.escape(t, quote=True) for t in texts]


def chart_text(value: object) -> str:
    """Text for a plotly label, legend entry, axis tick, title or hover template.

    plotly draws labels from a small HTML dialect (`<b>`, `<br>`, `<a href>`) and fills `%{...}`
    templates; it decodes character references after both, so `&lt;`, `&amp;` and `&#37;` show as
    `<`, `&` and `%` while no tag or template is read from the data."""
    return chart_texts((value,))[0]


def chart_texts(values: Iterable[object]) -> list[str]:
    """`chart_text` of each value; a list without any special character is returned as strings
    untouched (tens of thousands of layer names are checked in one pass)."""
    texts = [v if isinstance(v, str) else str(v) for v in values]
    joined = "".join(texts)
    for char, escaped in _CHART_ESCAPES:  # `&` first: the escapes add ampersands
        if char in joined:
            texts = [t.replace(char, escaped) for t in texts]
    return texts


def markdown_text(value: object) -> str:
    """Text for a Markdown table cell or line (summary.md): the characters Markdown reads as
    emphasis, code, links, raw HTML or a cell border are backslash-escaped, newlines become spaces
    and other control characters visible escapes (the file is often `cat` to a terminal), so a
    name renders as the name it is."""
    text = _markdown_escaped(value if isinstance(value, str) else str(value))
    return _CONTROL.sub(_visible, text) if _CONTROL.search(text) else text


def markdown_texts(values: Iterable[str]) -> list[str]:
    """`markdown_text` of each string, a column at a time (a 50,000-layer table costs milliseconds:
    `str.replace` per special character, the control characters looked for once in the whole column)."""
    texts = list(values)
    joined = "".join(texts)
    for char in _MARKDOWN_SPECIALS:  # the backslash first: the escapes add backslashes
        if char in joined:
            escaped = _MARKDOWN_ESCAPES[char]
            texts = [t.replace(char, escaped) for t in texts]
    if not joined.isprintable() and _CONTROL.search(joined):  # isprintable: a quick "none here"
        texts = [_CONTROL.sub(_visible, t) for t in texts]
    return texts


def _markdown_escaped(text: str) -> str:
    for char in _MARKDOWN_SPECIALS:  # the backslash first: the escapes add backslashes
        if char in text:
            text = text.replace(char, _MARKDOWN_ESCAPES[char])
    return text


def json_in_script(data: bytes) -> bytes:
    """JSON bytes made safe inside an HTML <script> element: every `<` written as the JSON escape
    `\\u003c` (the same string to a JSON parser), so no `</script>` or `<!--` can appear."""
    return data.replace(b"<", b"\\u003c") if b"<" in data else data
