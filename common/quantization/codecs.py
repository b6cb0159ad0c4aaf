"""Quantizing wire codecs registered in hfl.common.wire.CODECS: qsgd, sq, dpsq, laplace-sq.

Tensor: dtype "float32" (what the receiver gets), shape [d], encoding = codec name, data = header + side
information + packed indices. Header, little-endian:

    u8 name length, name (ASCII), u8 version, u8 width (bits per index), u32 levels, u64 length d,
    u32 bucket size (qsgd; 0 = whole vector), u32 side count, side count x float32 (norms or lo, hi)

Everything a receiver needs is in the header, so decoding takes no parameters; anything inconsistent
is refused with WireError(INVALID_ARGUMENT, reason).
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Mapping

import grpc
import numpy as np

from hfl.common.wire import CODECS, WireError
from hfl.proto import hfl_v1_pb2 as pb

from . import dpsq as dpsq_mod
from . import laplace_sq as laplace_mod
from . import qsgd as qsgd_mod
from . import sq as sq_mod
from .packing import pack, packed_nbytes, unpack, width_for

VERSION = 1
_FIXED = struct.Struct("<BBIQII")  # version, width, levels, length, bucket, side count


@dataclass(frozen=True)
class Payload:
    name: str
    width: int
    levels: int
    length: int
    bucket: int
    side: np.ndarray  # float32
    indices: np.ndarray  # uint32


def header_bytes(name: str, side_count: int) -> int:
    return 1 + len(name.encode()) + _FIXED.size + 4 * side_count


def write_payload(p: Payload) -> bytes:
    name = p.name.encode("ascii")
    head = bytes([len(name)]) + name + _FIXED.pack(VERSION, p.width, p.levels, p.length, p.bucket, p.side.size)
    return head + np.asarray(p.side, "<f4").tobytes() + pack(p.indices, p.width)


def _refuse(tensor: pb.Tensor, message: str, reason: str) -> WireError:
    return WireError(grpc.StatusCode.INVALID_ARGUMENT, f"tensor {tensor.name!r}: {message}", reason)


def read_payload(tensor: pb.Tensor) -> Payload:
    """Parse header, side information and indices, refusing truncation and length mismatches."""
    data = tensor.data
    if tensor.dtype != "float32":
        raise _refuse(tensor, f"encoding {tensor.encoding!r} decodes to float32, got dtype {tensor.dtype!r}", "bad_dtype")
    if not data:
        raise _refuse(tensor, "empty payload, no header", "bad_header")
    end = 1 + data[0]
    if len(data) < end + _FIXED.size:
        raise _refuse(tensor, f"payload of {len(data)} bytes is shorter than its header", "bad_header")
    name = data[1:end].decode("ascii", errors="replace")
    if name != tensor.encoding:
        raise _refuse(tensor, f"header names codec {name!r} but the tensor says {tensor.encoding!r}", "codec_mismatch")
    version, width, levels, length, bucket, side_count = _FIXED.unpack_from(data, end)
    if version != VERSION:
        raise _refuse(tensor, f"header version {version}, expected {VERSION}", "bad_header")
    if not 1 <= width <= 16:
        raise _refuse(tensor, f"header width {width} outside 1..16 bits", "bad_header")
    count = math.prod(tensor.shape)
    if length != count:
        raise _refuse(tensor, f"header length {length} does not match shape {list(tensor.shape)}", "bad_length")
    side_end = end + _FIXED.size + 4 * side_count
    expected = side_end + packed_nbytes(length, width)
    if len(data) != expected:
        raise _refuse(tensor, f"{len(data)} bytes, header promises {expected} ({length} indices of {width} bits)",
                      "bad_length")
    side = np.frombuffer(data, "<f4", count=side_count, offset=end + _FIXED.size).astype(np.float32)
    if not np.isfinite(side).all():
        raise _refuse(tensor, "NaN or infinite norm or range in the header", "non_finite_header")
    return Payload(name, width, levels, length, bucket, side, unpack(data[side_end:], width, length))


def _known(name: str, params: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"{name}: unknown parameter(s) {unknown}; allowed: {', '.join(allowed)}")


class QuantizingCodec:
    """Shared encode/decode; subclasses give params, quantize, dequantize and their header checks."""

    name = ""
    quantizer = True  # Link records the measured distortion of codecs with this flag

    def params(self, **raw) -> dict:
        raise NotImplementedError

    def quantize(self, vec: np.ndarray, rng: np.random.Generator, **p) -> Payload:
        raise NotImplementedError

    def dequantize(self, payload: Payload) -> np.ndarray:
        raise NotImplementedError

    def check(self, payload: Payload, tensor: pb.Tensor) -> None:
        raise NotImplementedError

    def expected_stats(self, vec: np.ndarray, **params) -> dict[str, float]:
        """Closed-form expectations a receiver cannot compute itself (recorded beside the measured error)."""
        return {}

    def roundtrip(self, vec: np.ndarray, rng: np.random.Generator, **params) -> np.ndarray:
        return self.dequantize(self.quantize(vec, rng, **self.params(**params)))

    def encode(self, vec: np.ndarray, tensor_name: str, rng: np.random.Generator | None = None, **params) -> pb.Tensor:
        if rng is None:
            raise ValueError(f"{self.name}: rng is required (stochastic rounding)")
        payload = self.quantize(np.asarray(vec).ravel(), rng, **self.params(**params))
        if not np.isfinite(payload.side).all():
            raise ValueError(f"{self.name}: the norm or range does not fit float32")
        return pb.Tensor(name=tensor_name, dtype="float32", shape=[payload.length], encoding=self.name,
                         data=write_payload(payload))

    def decode(self, tensor: pb.Tensor) -> np.ndarray:
        payload = read_payload(tensor)
        self.check(payload, tensor)
        return self.dequantize(payload).reshape(tuple(tensor.shape))

    def bits(self, count: int, **params) -> int:
        p = self.params(**params)
        side = self.side_count(count, p)
        return 8 * (header_bytes(self.name, side) + packed_nbytes(count, self.width(p)))

    def width(self, p: dict) -> int:
        raise NotImplementedError

    def side_count(self, count: int, p: dict) -> int:
        return 2


class QSGDCodec(QuantizingCodec):
    """QSGD (paper 001): `levels` s (default 4, QHetFed's s1) or `bits` per coordinate (s = 2^(bits-1) - 1,
    the digest's s_is_bits reading), `bucket_size` (0 = whole vector)."""

    name = "qsgd"
    allowed = ("levels", "bits", "bucket_size")

    def params(self, **raw) -> dict:
        _known(self.name, raw, self.allowed)
        if "levels" in raw and "bits" in raw:
            raise ValueError("qsgd: give levels or bits, not both")
        levels = qsgd_mod.levels_for_bits(raw["bits"]) if "bits" in raw else qsgd_mod.check_levels(raw.get("levels", 4))
        return {"levels": levels, "bucket_size": qsgd_mod.check_bucket_size(raw.get("bucket_size", 0))}

    def width(self, p: dict) -> int:
        return qsgd_mod.code_width(p["levels"])

    def side_count(self, count: int, p: dict) -> int:
        return qsgd_mod.bucket_count(count, p["bucket_size"])

    def expected_stats(self, vec, **params) -> dict[str, float]:
        p = self.params(**params)
        return {"q_expected": qsgd_mod.qsgd_expected_relative_error(np.asarray(vec).ravel(), **p)}

    def quantize(self, vec, rng, levels: int, bucket_size: int) -> Payload:
        norms, codes = qsgd_mod.qsgd_quantize(vec, levels, rng, bucket_size)
        return Payload(self.name, self.width({"levels": levels}), levels, codes.size, bucket_size, norms, codes)

    def dequantize(self, p: Payload) -> np.ndarray:
        # a bucket over the length is one bucket: the header must not size an allocation beyond the payload
        return qsgd_mod.qsgd_dequantize(p.side, p.indices, p.levels, min(p.bucket, p.length))

    def check(self, p: Payload, tensor: pb.Tensor) -> None:
        if not 1 <= p.levels <= qsgd_mod.MAX_LEVELS or p.width != qsgd_mod.code_width(p.levels):
            raise _refuse(tensor, f"qsgd header: levels {p.levels} with width {p.width} is inconsistent", "bad_header")
        if p.side.size != qsgd_mod.bucket_count(p.length, p.bucket):
            raise _refuse(tensor, f"qsgd header: {p.side.size} norms for {p.length} values in buckets of {p.bucket}",
                          "bad_header")
        if (p.side < 0).any():
            raise _refuse(tensor, "qsgd header: negative norm", "bad_header")
        if p.indices.size and int((p.indices >> 1).max()) > p.levels:
            raise _refuse(tensor, f"qsgd level index {int((p.indices >> 1).max())} above the level count {p.levels}",
                          "bad_index")


class GridCodec(QuantizingCodec):
    """Codecs on paper 004's uniform b-bit grid: side information (lo, hi), indices 0..levels-1."""

    base_allowed = ("bits", "range_mode", "clip")

    def grid_params(self, raw: Mapping[str, Any]) -> dict:
        p = {"bits": sq_mod.check_bits(raw.get("bits", 4)), "range_mode": raw.get("range_mode", "minmax")}
        if p["range_mode"] not in sq_mod.RANGE_MODES:
            raise ValueError(f"{self.name}: range_mode must be one of {sq_mod.RANGE_MODES}, got {p['range_mode']!r}")
        if p["range_mode"] == "fixed":
            clip = raw.get("clip")
            if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not np.isfinite(clip) or clip <= 0:
                raise ValueError(f"{self.name}: clip must be a finite number > 0 with range_mode='fixed', got {clip!r}")
            p["clip"] = float(clip)
        elif "clip" in raw:
            raise ValueError(f"{self.name}: clip is only used with range_mode='fixed'")
        return p

    def width(self, p: dict) -> int:
        return p["bits"]

    def grid_payload(self, lo, hi, idx, bits: int) -> Payload:
        return Payload(self.name, bits, 1 << bits, idx.size, 0, np.array([lo, hi], np.float32), idx)

    def dequantize(self, p: Payload) -> np.ndarray:
        return sq_mod.dequantize_grid(p.indices, p.side[0], p.side[1], p.levels)

    def check(self, p: Payload, tensor: pb.Tensor) -> None:
        if not 2 <= p.levels <= 1 << 16 or p.width != width_for(p.levels):
            raise _refuse(tensor, f"{self.name} header: {p.levels} levels with width {p.width} is inconsistent",
                          "bad_header")
        if p.side.size != 2 or p.bucket != 0:
            raise _refuse(tensor, f"{self.name} header: expected a (lo, hi) range and no buckets", "bad_header")
        if p.side[0] > p.side[1]:
            raise _refuse(tensor, f"{self.name} header: range lo {p.side[0]} > hi {p.side[1]}", "bad_header")
        if p.indices.size and int(p.indices.max()) >= p.levels:
            raise _refuse(tensor, f"{self.name} index {int(p.indices.max())} above the level count {p.levels}",
                          "bad_index")


class SQCodec(GridCodec):
    """Plain b-bit stochastic quantizer of paper 004 (SQ-FL): `bits` (default 4), `range_mode`, `clip`."""

    name = "sq"

    def params(self, **raw) -> dict:
        _known(self.name, raw, self.base_allowed)
        return self.grid_params(raw)

    def quantize(self, vec, rng, bits: int, range_mode: str, clip: float | None = None) -> Payload:
        return self.grid_payload(*sq_mod.sq_quantize(vec, rng, bits, range_mode, clip), bits)


class DPSQCodec(GridCodec):
    """DP-SQ of paper 004 (Lemma 3): `bits` (default 4), `epsilon1` (required), `range_mode`, `clip`."""

    name = "dpsq"
    private = True  # its coins are DP randomness, its exact error statistics leak the update

    def params(self, **raw) -> dict:
        _known(self.name, raw, self.base_allowed + ("epsilon1",))
        if "epsilon1" not in raw:
            raise ValueError("dpsq: epsilon1 is required (per-coordinate DP level, >= 0)")
        return {**self.grid_params(raw), "epsilon1": dpsq_mod.check_epsilon1(raw["epsilon1"])}

    def expected_stats(self, vec, **params) -> dict[str, float]:
        """Sum of eq. (7) over coordinates: the device-reported distortion of FWO option (a) (digest P3)."""
        p = self.params(**params)
        return {"expected_distortion": float(dpsq_mod.dpsq_expected_distortion(np.asarray(vec).ravel(), **p).sum())}

    def quantize(self, vec, rng, bits: int, epsilon1: float, range_mode: str, clip: float | None = None) -> Payload:
        return self.grid_payload(*dpsq_mod.dpsq_quantize(vec, rng, bits, epsilon1, range_mode, clip), bits)


class LaplaceSQCodec(GridCodec):
    """LaplaceSQ baseline of paper 004 (eq. 3), re-quantized to b bits for the wire (see laplace_sq.py):
    `bits`, `epsilon1` (required, > 0), `rho` ("range" | "step" | number), `eps_scope`, `range_mode`, `clip`."""

    name = "laplace-sq"
    private = True

    def params(self, **raw) -> dict:
        _known(self.name, raw, self.base_allowed + ("epsilon1", "rho", "eps_scope"))
        if "epsilon1" not in raw:
            raise ValueError("laplace-sq: epsilon1 is required (per-coordinate DP level, > 0)")
        p = {**self.grid_params(raw), "epsilon1": dpsq_mod.check_epsilon1(raw["epsilon1"]),
             "rho": raw.get("rho", "range"), "eps_scope": raw.get("eps_scope", "per_coord")}
        laplace_mod.laplace_scale(-1.0, 1.0, p["bits"], p["epsilon1"], 1, p["rho"], p["eps_scope"])  # validates
        return p

    def quantize(self, vec, rng, bits: int, epsilon1: float, rho, eps_scope: str, range_mode: str,
                 clip: float | None = None) -> Payload:
        return self.grid_payload(*laplace_mod.laplace_sq_quantize(vec, rng, bits, epsilon1, rho, eps_scope,
                                                                  range_mode, clip), bits)


QUANTIZING_CODECS: dict[str, QuantizingCodec] = {c.name: c for c in (QSGDCodec(), SQCodec(), DPSQCodec(),
                                                                     LaplaceSQCodec())}
for _name, _codec in QUANTIZING_CODECS.items():
    if _name not in CODECS:
        CODECS.register(_name, _codec)
