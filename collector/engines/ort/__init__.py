"""collector/engines/ort."""
