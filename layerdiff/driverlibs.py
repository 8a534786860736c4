"""Which GPU driver library a process really uses: the libraries Vulkan manifests (ICD JSON files) and
OpenCL vendor files name, and which of them the process has mapped.

A GPU's name says nothing about the driver that computed: two machines with the same GPU and another
driver build can disagree, and a loader that picks an unexpected manifest gives another answer again.
Both the probe of a device (collector/transport/probe.py) and the engines' run headers use this, so it
sits at layerdiff's root. Imports nothing heavy.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

VULKAN_MANIFEST_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")


def named_library(manifest: Path) -> str:
    """The driver library a Vulkan manifest (JSON) or an OpenCL vendor file (one line) names, when absolute."""
    name = _library_field(Path(manifest))
    return name if name.startswith("/") else ""


def _library_field(manifest: Path) -> str:
    """The library a manifest names, as written ("" when unreadable or not a manifest)."""
    if manifest.suffix not in (".json", ".icd"):
        return ""
    try:
        text = manifest.read_text(errors="replace")
        name = (json.loads(text).get("ICD") or {}).get("library_path", "") if manifest.suffix == ".json" else text.strip()
    except (OSError, ValueError, AttributeError):
        return ""
    return name if isinstance(name, str) else ""


def vulkan_manifests() -> list[Path]:
    """The Vulkan driver manifests the loader reads: $VK_ICD_FILENAMES / $VK_DRIVER_FILES when set
    (then only those), else the standard manifest folders and the XDG data folders' vulkan/icd.d."""
    chosen = os.environ.get("VK_DRIVER_FILES") or os.environ.get("VK_ICD_FILENAMES")
    if chosen:
        return [Path(p) for p in chosen.split(os.pathsep) if p]
    dirs = list(VULKAN_MANIFEST_DIRS)
    dirs += [str(Path(d) / "vulkan" / "icd.d") for d in (os.environ.get("XDG_DATA_DIRS") or "").split(os.pathsep) if d]
    found = []
    for folder in dict.fromkeys(dirs):
        try:
            found += [Path(folder) / n for n in sorted(os.listdir(folder)) if n.endswith(".json")]
        except OSError:
            continue
    return found


def manifest_library(manifest: Path) -> str:
    """The library a Vulkan manifest names, as the loader resolves it: a relative path with a folder
    part is taken from the manifest's folder; a bare file name stays bare (the dynamic linker finds it)."""
    name = _library_field(manifest)
    if not name or name.startswith("/") or "/" not in name:
        return name
    return str((manifest.parent / name).resolve())


def mapped_libraries(maps_text: str) -> list[str]:
    """Every file path mapped into a process, from the text of its /proc/<pid>/maps, in first-seen order."""
    paths = []
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            paths.append(fields[5].strip())
    return list(dict.fromkeys(paths))


def mapped_vulkan_drivers(maps_text: str | None = None) -> list[dict]:
    """The Vulkan driver libraries (named by a manifest) this process has mapped, each with its
    manifest, path and size in bytes. A loader maps every driver it enumerates, so several can appear
    unless $VK_ICD_FILENAMES narrows the choice; [] when /proc/self/maps cannot be read."""
    if maps_text is None:
        try:
            maps_text = Path("/proc/self/maps").read_text(errors="replace")
        except OSError:
            return []
    mapped = mapped_libraries(maps_text)
    found = []
    for manifest in vulkan_manifests():
        library = manifest_library(manifest)
        if not library:
            continue
        hits = [p for p in mapped if p == library or ("/" not in library and os.path.basename(p) == library)]
        for path in hits:
            try:
                size = os.path.getsize(path)
            except OSError:
                size = -1
            found.append({"manifest": str(manifest), "path": path, "size": size})
    return found
