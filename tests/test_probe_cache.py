"""The host's `--probe` answers are kept, and asked again whenever what they depend on changes.

Real probes: the `local` device's ncnn host engine in a child process (pip ncnn, Vulkan on lavapipe
where installed). The device's `execute` is wrapped only to count the probe processes.
"""
from __future__ import annotations

import json
import os

import pytest

from layerdiff.collector.sweep.plan import probe_backends
from layerdiff.collector.transport import probe as probe_module
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.collector.transport.probe import local_probe_path, probe_document

pytest.importorskip("ncnn")


class CountingDevice(LocalDevice):
    """The real local device; counts the processes it starts."""

    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    def execute(self, argv, **kwargs):
        self.started += 1
        return super().execute(argv, **kwargs)


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERDIFF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_kept_answer_replaces_the_probe_process(cache_root):
    device = CountingDevice()
    first = probe_backends(device, "ncnn")
    assert device.started == 1
    kept = list((cache_root / "probes").glob("local-ncnn-*.json"))
    assert kept == [local_probe_path("ncnn")]
    second = probe_backends(device, "ncnn")
    assert device.started == 1, "the kept answer must be used: no second probe process"
    assert second == first
    assert first[0]["cpu"]["ok"] is True


def test_a_driver_setting_changes_the_key_and_the_answer(cache_root, monkeypatch, tmp_path):
    """Pointing the Vulkan loader at no driver is a different machine state: asked afresh, and the
    answer really differs (no Vulkan device), while the usual state's answer stays kept."""
    device = CountingDevice()
    usual_path = local_probe_path("ncnn")
    usual, _ = probe_backends(device, "ncnn")
    missing = tmp_path / "no_such_icd.json"
    monkeypatch.setenv("VK_ICD_FILENAMES", str(missing))
    monkeypatch.setenv("VK_DRIVER_FILES", str(missing))
    assert local_probe_path("ncnn") != usual_path
    without, _ = probe_backends(device, "ncnn")
    assert device.started == 2
    assert without["vulkan"]["ok"] is False
    assert without["cpu"]["ok"] is True
    monkeypatch.delenv("VK_ICD_FILENAMES")
    monkeypatch.delenv("VK_DRIVER_FILES")
    again, _ = probe_backends(device, "ncnn")
    assert again == usual
    assert device.started == 2, "the usual state's answer is still the kept one"


def test_a_damaged_answer_is_asked_again_and_rewritten(cache_root):
    device = CountingDevice()
    probe_backends(device, "ncnn")
    path = local_probe_path("ncnn")
    path.write_text('{"engines": ', encoding="utf-8")
    backends, _ = probe_backends(device, "ncnn")
    assert device.started == 2
    assert backends["cpu"]["ok"] is True
    assert json.loads(path.read_text(encoding="utf-8"))["engines"]["ncnn"]["backends"] == backends


def test_only_the_newest_answers_of_an_engine_stay(cache_root):
    device = CountingDevice()
    path = local_probe_path("ncnn")
    path.parent.mkdir(parents=True)
    older = [path.with_name(f"local-ncnn-{i:020d}.json") for i in range(probe_module.KEEP_ANSWERS)]
    other_engine = path.with_name("local-mnn-0123456789abcdef0123.json")
    for age, stale in enumerate([*older, other_engine]):
        stale.write_text(json.dumps({"engines": {}}), encoding="utf-8")
        os.utime(stale, ns=(10**18 + age, 10**18 + age))
    probe_document(device, "ncnn")
    assert path.exists() and not older[0].exists(), "the oldest answer goes"
    assert all(p.exists() for p in older[1:]), f"{probe_module.KEEP_ANSWERS} answers of ncnn stay"
    assert other_engine.exists(), "another engine's answer is not this one's to drop"


def test_an_engine_built_here_is_always_asked():
    """ggml's and Paddle-Lite's harnesses are native programs built here: no module to watch."""
    assert local_probe_path("ggml") is None
    assert local_probe_path("paddle-lite") is None


def test_the_key_covers_the_interpreter_module_and_drivers(monkeypatch):
    base = local_probe_path("ncnn")
    monkeypatch.setattr(probe_module, "library_stat", lambda name: [1, 2, 3, 4])
    assert local_probe_path("ncnn") != base
    monkeypatch.undo()
    monkeypatch.setattr(probe_module, "_driver_files", lambda: [["/usr/share/vulkan/icd.d/new.json", 1, 2, 3]])
    assert local_probe_path("ncnn") != base
