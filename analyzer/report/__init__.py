"""analyzer/report."""
