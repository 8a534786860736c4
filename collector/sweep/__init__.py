"""collector/sweep."""
