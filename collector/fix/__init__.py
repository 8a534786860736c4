"""collector/fix."""
