"""collector/engines/mnn."""
