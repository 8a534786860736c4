"""HDF5 from others is data, never a pointer.

HDF5 can make a dataset read bytes from elsewhere: external storage (`external=[('/etc/passwd', ...)]`),
external links to objects in other files, and virtual datasets mapping other files. Reading such a
"dump" would copy local files into reports and exports. Every object a reader touches is reached
through `local_dataset` / `local_group`, which refuse anything not stored in the file itself, and
`check_whole_file` walks every link of a file received from elsewhere before it is used.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from layerdiff.errors import NotLocalError

if TYPE_CHECKING:  # each function imports h5py itself: it is handed an object of a file already open
    import h5py


def _link_problem(link: object) -> str | None:
    import h5py

    if isinstance(link, h5py.ExternalLink):
        return f"is an external link to {link.filename}:{link.path}"
    if isinstance(link, h5py.SoftLink):
        return f"is a soft link to {link.path}"
    if not isinstance(link, h5py.HardLink):
        return "is a user-defined link"
    return None


def storage_problem(ds: h5py.Dataset) -> str | None:
    """Why a dataset's bytes are not in its own file, or None when they are."""
    import h5py

    plist = ds.id.get_create_plist()
    if plist.get_layout() == h5py.h5d.VIRTUAL:
        return "is a virtual dataset mapping other files"
    if plist.get_external_count() > 0:
        name = plist.get_external(0)[0]
        return f"uses external storage ({name.decode(errors='replace') if isinstance(name, bytes) else name})"
    return None


def _refuse(path: Path, where: str, problem: str) -> NotLocalError:
    return NotLocalError(f"{path}: dataset {where} {problem}; layerdiff reads only data stored in the file itself")


def local_item(group: h5py.Group, name: str, path: Path, where: str) -> h5py.Group | h5py.Dataset | None:
    """`group[name]` without following links out of the file; None when absent."""
    import h5py

    link = group.get(name, getlink=True)
    if link is None:
        return None
    problem = _link_problem(link)
    if problem:
        raise _refuse(path, where, problem)
    item = group.get(name)
    if isinstance(item, h5py.Dataset):
        problem = storage_problem(item)
        if problem:
            raise _refuse(path, where, problem)
    return item


def local_dataset(group: h5py.Group, name: str, path: Path, where: str) -> h5py.Dataset | None:
    import h5py

    item = local_item(group, name, path, where)
    return item if isinstance(item, h5py.Dataset) else None


def local_group(group: h5py.Group, name: str, path: Path, where: str) -> h5py.Group | None:
    import h5py

    item = local_item(group, name, path, where)
    return item if isinstance(item, h5py.Group) else None


def check_whole_file(fh: h5py.File, path: Path) -> None:
    """Refuse the file if any link or dataset anywhere in it points outside it.

    HDF5's visitors stop when the callback returns a value (raising inside them is unsafe), so the
    first problem is returned out of the walk and raised afterwards."""
    import h5py

    def link_problem(name: str, link: object) -> tuple[str, str] | None:
        problem = _link_problem(link)
        return (name, problem) if problem else None

    def dataset_problem(name: str, item: object) -> tuple[str, str] | None:
        problem = storage_problem(item) if isinstance(item, h5py.Dataset) else None
        return (name, problem) if problem else None

    found = fh.visititems_links(link_problem) or fh.visititems(dataset_problem)
    if found:
        raise _refuse(path, f"/{found[0]}", found[1])
