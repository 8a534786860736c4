"""collector/engines/ncnn."""
