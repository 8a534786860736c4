"""analyzer/formats."""
