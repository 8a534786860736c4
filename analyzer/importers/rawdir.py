"""Our own raw dump directory (manifest.jsonl + tensors.bin), e.g. fetched by hand with `adb pull`.

Parsing and conversion are layerdiff.analyzer.formats.rawdump's; this adds what an untrusted copy needs first: a
bound on the manifest's size, a header whose fields have the types the converter expects, the
collector's `stderr.txt` / `exit_status` files when they came along, and one-line errors for
JSON nested too deeply to parse.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.formats.rawdump import MANIFEST, convert_raw_dump, read_raw_dump

RAW_FORMAT = "layerdiff-raw"
MAX_MANIFEST_BYTES = 512 << 20
MAX_STDERR_BYTES = 4 << 20
_STR_FIELDS = ("engine", "engine_version", "backend_requested", "precision_requested", "precision_effective", "harness")
_INT_FIELDS = ("threads", "repeat")


def detect_raw(path: Path) -> bool:
    return (path.is_dir() and (path / MANIFEST).is_file()) or (path.is_file() and path.name == MANIFEST)


def import_raw(path: Path, out: Path, attrs: dict[str, Any] | None = None) -> list[str]:
    root = path.parent if path.is_file() else path
    manifest = root / MANIFEST
    if manifest.is_symlink() or manifest.stat().st_size > MAX_MANIFEST_BYTES:
        raise DumpFormatError(f"{manifest}: not a plain manifest file under {MAX_MANIFEST_BYTES >> 20} MiB")
    try:
        dump = read_raw_dump(root)
    except RecursionError:
        raise DumpFormatError(f"{manifest}: a line is JSON nested too deeply to be a manifest") from None
    except ValueError as err:  # e.g. an integer literal with more digits than Python converts
        raise DumpFormatError(f"{manifest}: unreadable manifest ({str(err)[:120]})") from None
    check_header_types(manifest, dump.header)
    check_footer_types(manifest, dump.footer)
    if dump.truncated and not dump.tensors:
        raise DumpFormatError(f"{root / 'tensors.bin'}: cut before the first tensor ended; nothing to import "
                              f"({dump.problems[-1]})")
    stderr, exit_status = _collector_files(root)
    merged = dict(attrs or {})
    merged["provenance"] = {"import_format": RAW_FORMAT, "import_source": str(root), "import_user_attrs": dict(attrs or {})}
    convert_raw_dump(dump, out, attrs=merged, stderr=stderr, exit_status=exit_status)
    return list(dump.problems)


def check_header_types(manifest: Path, header: dict[str, Any]) -> None:
    """Refuse header fields of the wrong JSON type with a line naming the field."""
    for key in _STR_FIELDS:
        if key in header and not isinstance(header[key], str):
            raise DumpFormatError(f"{manifest}:1: header field {key!r} must be a string")
    for key in _INT_FIELDS:
        value = header.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise DumpFormatError(f"{manifest}:1: header field {key!r} must be an integer")
    actual = header.get("backends_actual")
    if actual is not None and not (isinstance(actual, str) or (isinstance(actual, list) and all(isinstance(a, str) for a in actual))):
        raise DumpFormatError(f"{manifest}:1: header field 'backends_actual' must be a list of strings")
    for key in ("model", "inputs"):
        entries = header.get(key)
        if entries is None:
            continue
        if not isinstance(entries, list) or not all(_string_fields(e) for e in entries):
            raise DumpFormatError(f"{manifest}:1: header field {key!r} must be a list of objects with string file/name/sha256")


def check_footer_types(manifest: Path, footer: dict[str, Any] | None) -> None:
    if footer is None:
        return
    infer = footer.get("infer_ms", 0.0)
    if isinstance(infer, bool) or not isinstance(infer, (int, float)) or abs(infer) > 1e15:
        raise DumpFormatError(f"{manifest}: footer field 'infer_ms' must be a number")
    if not isinstance(footer.get("status", "ok"), str):
        raise DumpFormatError(f"{manifest}: footer field 'status' must be a string")
    for key in ("tensors", "bytes"):
        if key in footer and (isinstance(footer[key], bool) or not isinstance(footer[key], int)):
            raise DumpFormatError(f"{manifest}: footer field {key!r} must be an integer")


def _string_fields(entry: Any) -> bool:
    return isinstance(entry, dict) and all(isinstance(entry.get(k, ""), str) for k in ("file", "name", "sha256"))


def _collector_files(root: Path) -> tuple[str, int]:
    stderr = ""
    path = root / "stderr.txt"
    if path.is_file() and not path.is_symlink():
        with open(path, "rb") as fh:
            stderr = fh.read(MAX_STDERR_BYTES).decode("utf-8", errors="replace")
    exit_status = 0
    path = root / "exit_status"
    if path.is_file() and not path.is_symlink():
        text = path.read_bytes()[:32].decode("ascii", errors="replace").strip()
        try:
            exit_status = int(text)
        except ValueError:
            raise DumpFormatError(f"{path}: expected a decimal exit status, found {text!r}") from None
    return stderr, exit_status
