"""layerdiff collector: devices (local, ADB phones) → harness runs → raw dumps → HDF5 files."""

__version__ = "0.1.0"
