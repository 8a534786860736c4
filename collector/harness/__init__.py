"""collector/harness."""
