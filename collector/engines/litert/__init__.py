"""collector/engines/litert: LiteRT (TensorFlow Lite) `.tflite` models on the host (CPU interpreter, WebGPU accelerator)."""
