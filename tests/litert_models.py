"""The `.tflite` corpus: real models inside mediapipe 0.10.14's wheel (tests/corpus-wheels.txt, --no-deps).

Newer mediapipe wheels ship no `.tflite` files; 0.10.14 ships 14. Only the files are used (mediapipe's
own Python code needs OpenCV and more, never imported). Inputs are deterministic images in [0, 1]:
mediapipe's detectors take float NHWC in [-1, 1] or [0, 1]; a smooth pattern with an edge keeps
detections and masks non-trivial.
"""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np

MEMBERS = {
    "face_detection_short_range": "mediapipe/modules/face_detection/face_detection_short_range.tflite",
    "selfie_segmentation": "mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite",
    "pose_detection": "mediapipe/modules/pose_detection/pose_detection.tflite",
    "face_landmark": "mediapipe/modules/face_landmark/face_landmark.tflite",
    "face_landmark_with_attention": "mediapipe/modules/face_landmark/face_landmark_with_attention.tflite",
    "pose_landmark_full": "mediapipe/modules/pose_landmark/pose_landmark_full.tflite",
    "face_detection_full_range_sparse": "mediapipe/modules/face_detection/face_detection_full_range_sparse.tflite",
}


def tflite_model(stem: str) -> Path:
    """The model file inside the installed mediapipe wheel (mediapipe itself is never imported)."""
    try:
        path = Path(importlib.metadata.distribution("mediapipe").locate_file(MEMBERS[stem]))
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("mediapipe is not installed; run device_scripts/setup_host.sh --test") from None
    if not path.is_file():
        raise RuntimeError(f"mediapipe does not ship {MEMBERS[stem]} (version changed? tests/corpus-wheels.txt pins 0.10.14)")
    return path


def image_input(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """A float32 NHWC picture: a soft gradient, a bright disc and a little noise."""
    _, height, width, channels = shape
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    disc = ((x - width * 0.5) ** 2 + (y - height * 0.45) ** 2 < (min(height, width) * 0.25) ** 2).astype(np.float32)
    base = 0.3 * x / width + 0.2 * y / height + 0.5 * disc
    noise = np.random.default_rng(seed).normal(0, 0.02, (height, width, channels)).astype(np.float32)
    return np.clip(base[None, :, :, None] + noise[None], 0, 1).astype(np.float32)
