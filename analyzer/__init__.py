"""layerdiff analyzer: HDF5 dumps in, aligned layers, metrics, findings, tables, plots and a report out."""

__version__ = "0.1.0"
