"""Fixtures of the fault-injection suite."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def secret(tmp_path) -> Path:
    """A local file a crafted dump tries to read; its bytes must never appear in any output."""
    path = tmp_path / "secret.bin"
    path.write_bytes(b"TOPSECRET-" * 400)
    return path
