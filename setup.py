"""One import package, `layerdiff`, whose stages keep the card's top-level folders.

collector/ installs as `layerdiff.collector`, analyzer/ as `layerdiff.analyzer`, samples/ as
`layerdiff.samples` and device_scripts/ as `layerdiff.device_scripts`; layerdiff/ holds the package
root (the notebook API, the error tree, the shared vocabulary). Every room and engine folder below
those is found here, so adding one needs no edit to this file. Everything else is in pyproject.toml.
"""
from setuptools import find_packages, setup

STAGES = {"layerdiff.collector": "collector", "layerdiff.analyzer": "analyzer",
          "layerdiff.samples": "samples", "layerdiff.device_scripts": "device_scripts"}

packages = ["layerdiff"]
for name, folder in STAGES.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir={"layerdiff": "layerdiff", **STAGES})
