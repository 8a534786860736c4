"""analyzer/findings."""
