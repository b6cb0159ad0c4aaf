"""End-to-end integrity of relayed uploads (paper 004's relay, issue 24): a tag the relaying edge cannot forge.

The launcher gives the cloud and the device hosts, never the edges, a per-run secret (`HFL_RELAY_SECRET`, random,
never in `config.toml` or a log). Each device keys an HMAC-SHA256 with HMAC(secret, device id) and tags its upload's
(run id, round, attempt, step, device id, the tensor's header and SHA-256, and every transform record the cloud
reads, such as a reported distortion); the cloud recomputes it. An edge can then still delay or
drop an upload (the cloud counts drawn devices it never received), but not forge one, replay it into another round
or attempt, or pass one device's upload off as another's. Without the secret (roles started by hand without it) the
cloud cannot check, and says so in summary.json.
"""
from __future__ import annotations

import hashlib
import hmac
import os

import grpc

from .wire import WireError

ENV = "HFL_RELAY_SECRET"
STAGE = "relay_tag"  # Transform.stage of the tag; Transform.name holds its 64 hex digits


def secret_from_env() -> bytes | None:
    value = os.environ.get(ENV, "")
    return value.encode() if value else None


def device_key(secret: bytes, device: str) -> bytes:
    return hmac.new(secret, b"hfl-relay-device|" + device.encode(), hashlib.sha256).digest()


def tag(key: bytes, run_id: str, round_: int, attempt: int, device: str, step: int, tensor, transforms) -> str:
    """The device's HMAC over everything of its upload that the cloud reads: the round, attempt and phase step, the
    tensor (name, dtype, shape, encoding, SHA-256 of its bytes) and every transform record with its parameters (a
    device-reported distortion among them), in order; the tag's own record is left out."""
    records = "|".join(f"{t.stage}/{t.name}/{t.tier}/{t.bits}/" + ",".join(f"{k}={float(v).hex()}" for k, v in
                                                                          sorted(t.params.items()))
                       for t in transforms if t.stage != STAGE)
    shape = ",".join(map(str, tensor.shape))
    message = (f"{run_id}|{round_}|{attempt}|{device}|{step}|{tensor.name}|{tensor.dtype}|{shape}|{tensor.encoding}|"
               f"{hashlib.sha256(tensor.data).hexdigest()}|{records}").encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def check(secret: bytes, run_id: str, upload) -> None:
    """Refuse a relayed upload (an Envelope with one tensor) whose tag is missing or is not the one its sender would
    have made for this run, round, attempt, step, tensor and records (PERMISSION_DENIED, reason bad_relay_tag)."""
    meta, device = upload.meta, upload.meta.sender_id
    tags = [t.name for t in meta.transforms if t.stage == STAGE]
    want = tag(device_key(secret, device), run_id, meta.round, meta.attempt, device, meta.step, upload.tensors[0],
               meta.transforms)
    if len(tags) != 1 or not hmac.compare_digest(tags[0], want):
        raise WireError(grpc.StatusCode.PERMISSION_DENIED,
                        f"{device}'s relayed upload carries {'no' if not tags else 'a wrong'} device tag for round "
                        f"{meta.round} attempt {meta.attempt}: forged, replayed or altered on the way", "bad_relay_tag")
