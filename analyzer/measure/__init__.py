"""analyzer/measure."""
