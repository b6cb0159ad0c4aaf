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
import json
import os

import grpc

from .config_error import ConfigError
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


SPEC_KEY = "cloud_tag"  # the spec's entry that holds the cloud's tag of the rest


def _spec_message(run_id: str, spec: dict) -> bytes:
    return f"hfl-spec|{run_id}|{json.dumps(spec, sort_keys=True, separators=(',', ':'))}".encode()


def sign_spec(secret: bytes | None, run_id: str, spec: dict) -> str:
    """The run's spec as the cloud hands it to its edges, with the cloud's tag (keyed from the relay secret, which
    edges never get) when it has the secret: a device host then knows the spec its edge passed on is the cloud's."""
    if secret is None:
        return json.dumps(spec)
    key = hmac.new(secret, b"hfl-spec-key", hashlib.sha256).digest()
    return json.dumps({**spec, SPEC_KEY: hmac.new(key, _spec_message(run_id, spec), hashlib.sha256).hexdigest()})


def check_spec(secret: bytes | None, run_id: str, spec_json: str, edge: str) -> dict:
    """The spec an edge passed on, checked against the cloud's tag when this host holds the secret (ConfigError if it
    is missing or does not match: the edge altered the run's spec); the spec without the tag."""
    spec = json.loads(spec_json)
    given = spec.pop(SPEC_KEY, None)
    if secret is not None:
        key = hmac.new(secret, b"hfl-spec-key", hashlib.sha256).digest()
        want = hmac.new(key, _spec_message(run_id, spec), hashlib.sha256).hexdigest()
        if not isinstance(given, str) or not hmac.compare_digest(given, want):
            raise ConfigError(f"the run spec from {edge} carries {'no' if given is None else 'a wrong'} cloud tag: it "
                             f"is not the spec the cloud issued for run {run_id} (altered on the way)")
    return spec
