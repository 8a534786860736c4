"""analyzer/runs."""
