"""collector/transport."""
