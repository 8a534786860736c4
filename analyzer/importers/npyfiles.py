"""Directories of `.npy` files and single `.npz` archives (incl. ONNX Runtime-style name -> array).

Layer name = file / array name (`.npy` stripped). Order: an explicit `order_file`, else a sidecar
list beside the data (`order.txt` or `.order` in the directory; `<stem>.order.txt` beside an npz),
else file order (natural name order for a directory, archive order for an npz). An ONNX tensor
name becomes the op name with output index 0; `layerdiff.analyzer.align.naming` aligns it with MNN.
"""
from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.formats.limits import check_plain_file
from layerdiff.analyzer.importers.common import ForeignDump, Layer, apply_order, natural_key, read_order_file
from layerdiff.analyzer.importers.npyformat import read_npy

NPY_FORMAT = "npy-dir"
NPZ_FORMAT = "npz"
MAX_MEMBERS = 1_000_000
DIR_SIDECARS = ("order.txt", ".order", "order")


def detect_npy_dir(path: Path) -> bool:
    return path.is_dir() and any(p.suffix == ".npy" and p.is_file() for p in path.iterdir())


def detect_npz(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".npz"


def read_npy_dir(path: Path, order_file: Path | None = None) -> ForeignDump:
    files = {p.stem: p for p in path.iterdir() if p.suffix == ".npy" and (p.is_file() or p.is_symlink())}
    for file in files.values():
        check_plain_file(file)  # a symlink would put the file it points to in the output
    if not files:
        raise DumpFormatError(f"{path}: no .npy files in this directory")
    dump = ForeignDump(source=path, format=NPY_FORMAT)
    names = _ordered(sorted(files, key=natural_key), _sidecar(path, DIR_SIDECARS, order_file), dump)
    for name in names:
        dump.layers.append(Layer(op=name, output_index=0, name=name, load=_file_loader(files[name]), where=str(files[name])))
    return dump


def read_npz(path: Path, order_file: Path | None = None) -> ForeignDump:
    try:
        with zipfile.ZipFile(path) as archive:
            infos = [i for i in archive.infolist() if not i.is_dir()]
    except (zipfile.BadZipFile, zlib.error, OSError, ValueError, EOFError, NotImplementedError) as err:
        raise DumpFormatError(f"{path}: not a readable .npz archive ({err})") from None
    if len(infos) > MAX_MEMBERS:
        raise DumpFormatError(f"{path}: {len(infos)} members, more than any real dump")
    members = {_member_name(i.filename): i.filename for i in infos}
    dump = ForeignDump(source=path, format=NPZ_FORMAT)
    sidecars = (f"{path.stem}.order.txt", f"{path.name}.order.txt", f"{path.stem}.order")
    names = _ordered(list(members), _sidecar(path.parent, sidecars, order_file), dump)
    archive = _Archive(path)
    dump.closers.append(archive.close)
    for name in names:
        where = f"{path}:{members[name]}"
        dump.layers.append(Layer(op=name, output_index=0, name=name, load=archive.loader(members[name], where), where=where))
    return dump


def _ordered(names: list[str], order_path: Path | None, dump: ForeignDump) -> list[str]:
    if order_path is None:
        dump.provenance["order_source"] = "file order"
        return names
    order = [n[:-4] if n.endswith(".npy") else n for n in read_order_file(order_path)]
    dump.provenance["order_source"] = str(order_path)
    return apply_order(names, order, str(order_path), dump.problems)


def _sidecar(directory: Path, candidates: tuple[str, ...], explicit: Path | None) -> Path | None:
    if explicit is not None:
        if not Path(explicit).is_file():
            raise DumpFormatError(f"{explicit}: order file not found")
        return Path(explicit)
    for name in candidates:
        if (directory / name).is_file():
            check_plain_file(directory / name)
            return directory / name
    return None


def _member_name(filename: str) -> str:
    return filename[:-4] if filename.endswith(".npy") else filename


def _file_loader(path: Path):
    def load():
        try:
            with open(path, "rb") as fh:
                return read_npy(fh, path.stat().st_size, str(path))
        except OSError as err:
            raise DumpFormatError(f"{path}: cannot read ({err.strerror or err})") from None

    return load


class _Archive:
    """One `.npz` opened once for all its members' loaders: opening it reads the whole central
    directory, so opening it per member made an import quadratic (2,000 members: 22 s)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._zip: zipfile.ZipFile | None = None

    def loader(self, member: str, where: str):
        def load():
            try:
                if self._zip is None:
                    self._zip = zipfile.ZipFile(self.path)
                info = self._zip.getinfo(member)
                with self._zip.open(info) as fh:
                    return read_npy(fh, info.file_size, where)
            except (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError, NotImplementedError,
                    KeyError) as err:
                raise DumpFormatError(f"{where}: corrupt archive member ({err})") from None

        return load

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
            self._zip = None
