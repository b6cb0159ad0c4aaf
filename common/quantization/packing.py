"""Bit packing of unsigned integer indices, `width` bits each (1..16), little-endian bit order.

Index k occupies bits [k*width, (k+1)*width) of the byte string, least significant bit first, so any
width (3, 5, ceil(log2(s+1)) ...) and any length pack without padding between indices; only the last
byte is padded with zeros.
"""
from __future__ import annotations

import math

import numpy as np

MAX_WIDTH = 16


def _check_width(width: int) -> int:
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"width must be an integer in 1..{MAX_WIDTH} bits, got {width!r}")
    return int(width)


def width_for(values: int) -> int:
    """Bits needed for `values` distinct indices 0..values-1 (at least 1)."""
    if values < 1:
        raise ValueError(f"values must be >= 1, got {values}")
    return max(1, math.ceil(math.log2(values)))


def packed_nbytes(count: int, width: int) -> int:
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    return (count * _check_width(width) + 7) // 8


def pack(indices: np.ndarray, width: int) -> bytes:
    """Pack non-negative integers < 2**width into ceil(len * width / 8) bytes."""
    width = _check_width(width)
    idx = np.asarray(indices)
    if idx.ndim != 1:
        raise ValueError(f"indices must be one-dimensional, got shape {idx.shape}")
    if idx.size and (idx.dtype.kind not in "ui" or idx.min() < 0 or idx.max() >= 1 << width):
        raise ValueError(f"indices must be integers in [0, {(1 << width) - 1}] for width {width}")
    if width <= 8:  # eight indices fill `width` whole bytes: one little-endian 64-bit word per eight
        chunks = -(-idx.size // 8)
        v = np.zeros((chunks, 8), np.uint64)
        v.ravel()[:idx.size] = idx
        word = v[:, 0].copy()
        for k in range(1, 8):
            word |= v[:, k] << np.uint64(k * width)
        return word.astype("<u8").view(np.uint8).reshape(chunks, 8)[:, :width].tobytes()[:packed_nbytes(idx.size, width)]
    planes = (idx.astype(np.uint32)[:, None] >> np.arange(width, dtype=np.uint32)) & 1
    return np.packbits(planes.astype(np.uint8).ravel(), bitorder="little").tobytes()


def unpack(data: bytes, width: int, count: int) -> np.ndarray:
    """Inverse of `pack`: `count` indices as uint32; the byte length must be exactly packed_nbytes."""
    width = _check_width(width)
    need = packed_nbytes(count, width)
    if len(data) != need:
        raise ValueError(f"data must be {need} bytes for {count} indices of {width} bits, got {len(data)}")
    if width <= 8:  # as pack: `width` bytes hold eight indices, read as one little-endian 64-bit word
        chunks = -(-count // 8)
        words = np.zeros((chunks, 8), np.uint8)
        whole = np.zeros(chunks * width, np.uint8)
        whole[:need] = np.frombuffer(data, np.uint8)
        words[:, :width] = whole.reshape(chunks, width)
        word = words.view("<u8").ravel()
        out = np.empty((chunks, 8), np.uint32)
        mask = np.uint64((1 << width) - 1)
        for k in range(8):
            out[:, k] = (word >> np.uint64(k * width)) & mask
        return out.ravel()[:count]
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), count=count * width, bitorder="little")
    planes = bits.reshape(count, width).astype(np.uint32)
    return (planes << np.arange(width, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
