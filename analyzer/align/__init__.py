"""analyzer/align."""
