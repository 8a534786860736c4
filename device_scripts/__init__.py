"""The device-side harness (C++ sources, CMake files, build scripts), shipped with the Python package.

Not Python code: this package exists so that a wheel or sdist install carries everything
`layerdiff.collector.harness.build` needs to build the harness for a phone, the host or aarch64 Linux.
"""
