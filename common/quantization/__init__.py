"""Quantization family: wire codecs (qsgd, sq, dpsq, laplace-sq), bit packing, and (beside them) the
fusion weights and optimisers of papers 001 and 004. numpy only: no torch here."""
from __future__ import annotations

import numpy as np


def roundtrip(codec_name: str, vec: np.ndarray, rng: np.random.Generator, **params) -> np.ndarray:
    """Quantize then dequantize `vec` with a registered quantizing codec, no wire; float32, same length.
    Equal to what the receiver decodes from the codec's tensor for the same rng state."""
    from .codecs import QUANTIZING_CODECS

    if codec_name not in QUANTIZING_CODECS:
        raise ValueError(f"codec_name must be one of {sorted(QUANTIZING_CODECS)}, got {codec_name!r}")
    return QUANTIZING_CODECS[codec_name].roundtrip(np.asarray(vec).ravel(), rng, **params)
