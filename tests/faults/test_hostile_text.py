"""Names and attributes are data wherever they are shown: layer names, op types, device models, input
labels and a phone's answers carrying HTML, Rich markup and terminal escapes are printed as plain text
(markup not read, control characters shown escaped), run no script in the report (checked in headless
Chromium), and are kept verbatim in the HDF5, CSV and JSON."""
from __future__ import annotations

import csv
import fcntl
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.formats.dumpwriter import DumpWriter
from tests.conftest import MODELS
from tests.faults.support import REPO, cli

ESC = "\x1b[2J"  # clears the screen when it reaches a terminal raw
SHOWN_ESC = "\\x1b[2J"
IMG = "<img src=z onerror=\"document.title='PWNED-img'\">"
SCRIPT = "</script><script>document.title='PWNED-script'</script>"
SVG = "<svg onload=\"document.title='PWNED-svg'\">"
BLOCK = "block[main]/conv"  # Rich would read [main] as a style and print block/conv
CLOSE = "[/x]out"  # Rich: closing tag [/x] doesn't match any open tag -> MarkupError
MODEL = f"[/x]Pixel{ESC}{IMG}"  # a device model carrying all three kinds
INPUT = "cat[main]<svg onload=\"document.title='PWNED-input'\">"  # an input label (same input: same sha256)

# name, op type: the first layer diverges, the last is the output
MATH = "cost $\\undefinedmacro{$"  # matplotlib would read it as math, and fail
LAYERS = [(BLOCK, "[bold]Conv"), (IMG, SVG), (SCRIPT, "Relu"), (f"esc{ESC}name", "Conv"), (MATH, "Mul"), (CLOSE, "Softmax")]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _dump(path: Path, scale: float, attrs: dict) -> Path:
    base = np.linspace(-1, 1, 64, dtype=np.float32)
    with DumpWriter(path, {"engine": "mnn", "precision_requested": "high", "input_label": "cat",
                           "input_sha256": "ab" * 32, **attrs}) as writer:
        for order, (name, op_type) in enumerate(LAYERS):
            writer.add_tensor({"order": order, "op": name, "op_type": op_type, "name": name,
                               "inputs": [LAYERS[order - 1][0]] if order else []}, base * (order + 1) * scale)
        writer.set_log("ok\n")
    return path


@pytest.fixture
def hostile_h5(tmp_path) -> list[Path]:
    """A reference and two runs whose layer names, op types and device model are hostile; the two runs
    have equal values, so the range chart's caption names both labels."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    return [_dump(folder / "ref.h5", 1.0, {"backend_requested": "cpu", "device_model": "Pixel 8"}),
            _dump(folder / "run1.h5", 1.5, {"backend_requested": "vulkan", "device_model": MODEL,
                                            "precision_requested": "low", "input_label": INPUT}),
            _dump(folder / "run2.h5", 1.5, {"backend_requested": "opencl", "device_model": "Pixel 8",
                                            "precision_requested": "low"})]


@pytest.fixture
def hostile_npz(tmp_path) -> list[Path]:
    """The reported repro: .npz member names carrying script, markup and escapes."""
    names = [name for name, _ in LAYERS]
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    np.savez(tmp_path / "a.npz", **{n: x * (k + 1) for k, n in enumerate(names)})
    np.savez(tmp_path / "b.npz", **{n: x * (k + 1) * 1.5 for k, n in enumerate(names)})
    return [tmp_path / "a.npz", tmp_path / "b.npz"]


def _assert_plain(text: str, *shown: str) -> None:
    """Printed as plain text: no traceback, no raw escape, each needle literally."""
    assert "Traceback" not in text and "MarkupError" not in text, text[-3000:]
    assert ESC not in text, "a raw ESC sequence reached the terminal"
    for needle in shown:
        assert needle in text, (needle, text[-3000:])


def _on_terminal(args: list[str], env: dict | None = None, timeout: float = 300) -> tuple[int, str]:
    """Run a command on a real pseudo-terminal (200 columns), as a person at a terminal sees it."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 200, 0, 0))
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1", "TERM": "xterm-256color",
                **(env or {})}
    for key in ("NO_COLOR", "COLUMNS", "LINES"):
        full_env.pop(key, None)
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=full_env, close_fds=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, b"".join(chunks).decode("utf-8", "replace")


def _module(tool: str) -> list[str]:
    return [sys.executable, "-m", {"collect": "layerdiff.collector.cli", "analyze": "layerdiff.analyzer.cli.app"}[tool]]


# --- the terminal -------------------------------------------------------------------------------


def test_analyze_prints_hostile_names_and_labels_as_plain_text(hostile_h5, tmp_path):
    proc = cli("analyze", *map(str, hostile_h5), "-o", str(tmp_path / "rep"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_plain(proc.stdout + proc.stderr, BLOCK, "[/x]Pixel", SHOWN_ESC, "[bold]Conv")
    assert (tmp_path / "rep" / "index.html").exists()


def test_analyze_of_hostile_npz_names_prints_them_as_plain_text(hostile_npz, tmp_path):
    proc = cli("analyze", *map(str, hostile_npz), "-o", str(tmp_path / "rep"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_plain(proc.stdout + proc.stderr, BLOCK, CLOSE)


def test_analyze_on_a_terminal_shows_names_literally(hostile_h5, tmp_path):
    """Progress bars and the verdict table on a real terminal (Rich draws there) read no markup from data."""
    code, text = _on_terminal([*_module("analyze"), *map(str, hostile_h5), "-o", str(tmp_path / "rep")])
    assert code == 0, text[-3000:]
    _assert_plain(text, BLOCK, "[/x]Pixel", SHOWN_ESC)


def test_a_stored_report_prints_the_same_plain_text(hostile_h5, tmp_path):
    first = cli("analyze", *map(str, hostile_h5), "-o", str(tmp_path / "rep1"))
    again = cli("analyze", *map(str, hostile_h5), "-o", str(tmp_path / "rep2"))
    assert first.returncode == again.returncode == 0, again.stderr[-3000:]
    _assert_plain(again.stdout + again.stderr, BLOCK, "[/x]Pixel", SHOWN_ESC)


def test_inspect_prints_hostile_layers_and_provenance_as_plain_text(hostile_h5):
    run = str(hostile_h5[1])
    table = cli("analyze", "inspect", run)
    assert table.returncode == 0, table.stderr[-3000:]
    _assert_plain(table.stdout + table.stderr, BLOCK, "[/x]Pixel", CLOSE, "[bold]Conv", SHOWN_ESC, "cat[main]<svg")
    one = cli("analyze", "inspect", run, "--layer", "esc")
    assert one.returncode == 0, one.stderr[-3000:]
    _assert_plain(one.stdout + one.stderr, SHOWN_ESC, MATH)
    code, text = _on_terminal([*_module("analyze"), "inspect", run])
    assert code == 0, text[-3000:]
    _assert_plain(text, BLOCK, CLOSE, SHOWN_ESC)


def test_an_error_line_naming_a_hostile_layer_shows_it_escaped(hostile_h5):
    proc = cli("analyze", "inspect", str(hostile_h5[1]), "--layer", "e")  # ambiguous: the line names 3 layers
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "esc" in proc.stderr, proc.stderr
    assert ESC not in proc.stderr and SHOWN_ESC in proc.stderr


# --- the HTML report in a real browser ------------------------------------------------------------


def _rendered(page: Path, tmp_path: Path) -> str:
    """The page's DOM after its scripts ran (headless Chromium, no network, a throw-away profile)."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (device_scripts/setup_host.sh --test installs it)")
    profile = tmp_path / "chromium-profile"
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={profile}", "--virtual-time-budget=8000", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "</html>" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


def _assert_inert(dom: str) -> None:
    title = re.search(r"<title>(.*?)</title>", dom, re.S)
    assert title and title.group(1) == "layerdiff report", f"a script from the data ran: title {title and title.group(1)!r}"
    assert "PWNED" not in (title.group(1) if title else "")
    assert not re.search(r"<img[^>]*onerror", dom), "an <img> element was made from the data"
    assert not re.search(r"<svg[^>]*onload", dom), "an <svg> element was made from the data"


def test_the_report_runs_no_script_from_hdf5_names_shows_them_as_text_and_keeps_them_verbatim(hostile_h5, tmp_path):
    out = tmp_path / "rep"
    assert cli("analyze", *map(str, hostile_h5), "-o", str(out), "--json").returncode == 0
    dom = _rendered(out / "index.html", tmp_path)
    _assert_inert(dom)
    # the interactive layer table drew its rows with the names as text
    assert re.search(r"<td[^>]*>&lt;img src=z onerror=\"document.title='PWNED-img'\"&gt;:0</td>", dom), dom[-3000:]
    assert re.search(r"<td[^>]*>&lt;svg onload=\"document.title='PWNED-svg'\"&gt;</td>", dom)
    assert "&lt;/script&gt;&lt;script&gt;document.title='PWNED-script'&lt;/script&gt;:0" in dom
    # plotly drew the hostile run label as text (legend, caption)
    assert "[/x]Pixel" in dom and "&lt;img src=z onerror=" in dom
    # the data files keep every character
    with open(out / "summary.csv", newline="", encoding="utf-8") as fh:
        keys = {row["key"] for row in csv.DictReader(fh)}
    assert {f"{name}:0" for name, _ in LAYERS} <= keys
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert MODEL in {run["provenance"].get("device_model") for run in doc["runs"]}
    # summary.md: Markdown reads nothing in a name (no raw HTML, no link or style brackets)
    markdown = (out / "summary.md").read_text(encoding="utf-8")
    assert not re.search(r"(?<!\\)<(img|script|svg)", markdown) and "block[main]" not in markdown
    assert "block\\[main\\]/conv" in markdown and "\\<img src=z onerror=" in markdown
    assert ESC not in markdown and "\\x1b" in markdown


def test_static_figures_draw_names_as_text(hostile_h5, tmp_path):
    """`--png`: matplotlib draws a name with `$` signs as it is, not as (broken) math."""
    proc = cli("analyze", *map(str, hostile_h5), "-o", str(tmp_path / "rep"), "--png", "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (tmp_path / "rep" / "error_by_layer.png").stat().st_size > 0


def test_the_report_runs_no_script_from_npz_member_names(hostile_npz, tmp_path):
    out = tmp_path / "rep"
    assert cli("analyze", *map(str, hostile_npz), "-o", str(out), "--json").returncode == 0
    dom = _rendered(out / "index.html", tmp_path)
    _assert_inert(dom)
    assert re.search(r"<td[^>]*>&lt;img src=z onerror=\"document.title='PWNED-img'\"&gt;:0</td>", dom)


# --- a phone that lies: its model name and its harness's op names ---------------------------------

HOSTILE_OPS = [BLOCK, IMG, f"{ESC}[/x]{SCRIPT}"]  # the fake harness dumps 3 ops: the last is the output


@pytest.fixture
def hostile_phone(standins, fake_harness, monkeypatch):
    """A stand-in phone whose model name is hostile, running a harness that names its ops hostilely."""
    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(fake_harness))
    monkeypatch.setenv("LAYERDIFF_FAKE_HARNESS_OPS", json.dumps(HOSTILE_OPS))
    monkeypatch.setenv("LAYERDIFF_FAKE_HARNESS_OP_TYPE", SVG)
    return standins.start(props={"ro.product.model": MODEL})


def test_collect_devices_shows_a_hostile_phone_model_as_plain_text(hostile_phone):
    proc = cli("collect", "devices", "--no-probe")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_plain(proc.stdout + proc.stderr, hostile_phone.serial, "[/x]Pixel", SHOWN_ESC)
    code, text = _on_terminal([*_module("collect"), "devices", "--no-probe"])
    assert code == 0, text[-3000:]
    _assert_plain(text, "[/x]Pixel", SHOWN_ESC)


def test_a_phone_sweep_with_hostile_names_prints_plain_text_and_reports_safely(hostile_phone, tmp_path):
    """collect on a terminal: the progress bar names ops as they run, the summary table names inputs,
    the sweep's report names layers and the phone; none of it is read as markup or script."""
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    np.save(inputs / "[red]cat[main].npy", np.zeros((1, 3, 32, 32), np.float32))
    out = tmp_path / "sweep"
    code, text = _on_terminal([*_module("collect"), "--device", hostile_phone.serial, "--model",
                               str(MODELS / "convnet.param"), "--backend", "cpu", "--precision", "high,low",
                               "--input", str(inputs / "[red]cat[main].npy"), "-o", str(out)])
    assert code == 0, text[-4000:]
    _assert_plain(text, f"{SHOWN_ESC}[/x]{SCRIPT}")  # the report's verdict table names the output
    runs = sorted(out.rglob("*.h5"))
    assert len(runs) == 2
    with DumpFile(runs[0]) as dump:  # verbatim in the HDF5
        assert dump.attrs["device_model"] == MODEL
        assert set(dump.layers["op"]) == set(HOSTILE_OPS) and set(dump.layers["op_type"]) == {SVG}
    _assert_inert(_rendered(out / "report" / "index.html", tmp_path))


# --- the rule itself -----------------------------------------------------------------------------


def test_the_rule_per_medium():
    from layerdiff.safetext import (chart_text, html_text, json_in_script, markdown_text, terminal_lines,
                                    terminal_text)

    assert terminal_text(f"a{ESC}b\n\u202ec\x9b") == "a\\x1b[2Jb\\n\\u202ec\\x9b"
    assert terminal_text(BLOCK) == BLOCK and terminal_text("naïve 层") == "naïve 层"  # printable text untouched
    assert terminal_lines(f"line one\nline{ESC} two") == "line one\nline\\x1b[2J two"
    assert html_text(IMG) == "&lt;img src=z onerror=&quot;document.title=&#x27;PWNED-img&#x27;&quot;&gt;"
    assert chart_text("<b>%{x}</b> & co") == "&lt;b&gt;&#37;{x}&lt;/b&gt; &amp; co"
    assert markdown_text("a|b *c* [d](e) <f>\nnext") == "a\\|b \\*c\\* \\[d\\](e) \\<f\\> next"
    document = json.dumps({"name": SCRIPT, "other": "<!--"}).encode()
    embedded = json_in_script(document)
    assert b"<" not in embedded and json.loads(embedded) == json.loads(document)


def test_a_column_of_cells_is_escaped_as_each_cell_would_be():
    """The column-at-a-time escaping of the page's tables gives each cell's own escaping, whether one cell
    of the column holds markup or none does."""
    from layerdiff.safetext import html_text, html_texts

    for column in (["conv1", "relu_2", "3.5e-05"], ["conv1", "<img src=x onerror=alert(1)>", "a&b", "it's \"x\""],
                   ["'"], [""], []):
        assert html_texts(column) == [html_text(cell) for cell in column]
    assert html_texts(["<b>"]) == ["&lt;b&gt;"]
