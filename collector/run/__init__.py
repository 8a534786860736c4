"""collector/run."""
