"""Bounds on everything a peer can put in a message: ids, strings, counts and named scalars.

A message that passes the wire decoder can still poison a run (a 1e300 loss, a negative byte count, a
1 MiB id echoed into every log line). Every field a service reads goes through one of these checks;
mechanisms that report new scalars register their range in SCALARS.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import grpc

from .registry import Registry
from .wire import WireError

MAX_ID = 64          # node ids, phase names, tensor names
MAX_RUN_ID = 128
MAX_TRANSFORMS = 64
MAX_SCALARS = 64
MAX_TRANSFORM_PARAMS = 1 << 16  # a merged DP event names every device it covers
ECHO = 120           # longest piece of peer-supplied text echoed into a status or a log line


def short(text: object, limit: int = ECHO) -> str:
    """repr() of peer-supplied text, truncated so that it can be echoed safely."""
    s = text if isinstance(text, str) else str(text)
    if len(s) <= limit:
        return repr(s)
    return repr(s[:limit]) + f"... ({len(s)} chars)"


def truncate(message: str, limit: int = 600) -> str:
    """At most `limit` bytes of UTF-8 (an attacker's 4-byte characters must not make a status detail long)."""
    raw = message.encode("utf-8", "replace")
    if len(raw) <= limit:
        return message
    return raw[:limit].decode("utf-8", "ignore") + f"... ({len(message)} chars)"


def _invalid(message: str, reason: str) -> WireError:
    return WireError(grpc.StatusCode.INVALID_ARGUMENT, message, reason)


def check_id(value: str, what: str, limit: int = MAX_ID) -> str:
    if len(value) > limit:
        raise _invalid(f"{what} of {len(value)} characters (at most {limit})", "oversized_id")
    if not value.isprintable():
        raise _invalid(f"{what} {short(value)} has non-printable characters", "bad_id")
    return value


def check_count(value: int, what: str, lo: int, hi: int) -> int:
    if not lo <= value <= hi:
        raise _invalid(f"{what} = {value} outside [{lo}, {hi}]", "bad_counts")
    return value


@dataclass(frozen=True)
class ScalarSpec:
    lo: float
    hi: float
    doc: str = ""


SCALARS: Registry = Registry("scalar")
SCALARS.register("train_loss", ScalarSpec(0.0, 1e12, "mean mini-batch training loss (a diverging model is reported, not refused)"))
SCALARS.register("bytes_up", ScalarSpec(0.0, 1e15, "payload bytes received from devices since the last report"))
SCALARS.register("bytes_down", ScalarSpec(0.0, 1e15, "payload bytes sent to devices since the last report"))
SCALARS.register("refused", ScalarSpec(0.0, 1e9, "messages refused since the last report"))
SCALARS.register("dropped", ScalarSpec(0.0, 1e7, "devices dropped from the run so far"))
SCALARS.register("rejoined", ScalarSpec(0.0, 1e7, "devices that rejoined after a loss"))
SCALARS.register("restarts", ScalarSpec(0.0, 1e6, "times the edge restarted its cluster's round"))
# a ratio: LaplaceSQ read literally (noise of scale 1e6 rho at eps1 = 1e-6) legitimately reaches ~1e16
SCALARS.register("q_uplink", ScalarSpec(0.0, 1e300, "mean measured quantizer error ||Q(x) - x||^2 / ||x||^2 of the "
                                                     "devices' uploads this round"))
SCALARS.register("t_step_seconds", ScalarSpec(0.0, 1e9, "emulated compute time of one SGD step, slowest participant"))
SCALARS.register("t_upload_seconds", ScalarSpec(0.0, 1e9, "emulated upload air time, slowest participant"))
SCALARS.register("beta_estimate", ScalarSpec(0.0, 1e12, "smoothness estimate ||g(w') - g(w)|| / ||w' - w|| on one "
                                              "batch (largest over the sender's devices; H2FDP(ctrl))"))
SCALARS.register("clipped", ScalarSpec(0.0, 1e9, "uploads a trusted edge clipped to the plan's bound"))
SCALARS.register("samples_processed", ScalarSpec(0.0, 1e12, "samples a device trained on since its previous upload "
                                                             "(emulated compute time; the edge infers it from the plan "
                                                             "when absent)"))
# over the air (paper 003) a device's mu, sigma and model fingerprint are typed fields of its AirRow (batches.py)
SCALARS.register("air_dropped", ScalarSpec(0.0, 1e7, "devices that failed the downlink test th0 this round"))
SCALARS.register("clock_seconds", ScalarSpec(0.0, 1e12, "emulated seconds of the cluster's device phases this round"))
SCALARS.register("device_joules", ScalarSpec(0.0, 1e15, "emulated energy of the cluster's devices this round"))
SCALARS.register("edge_joules", ScalarSpec(0.0, 1e15, "emulated energy of the edge's broadcasts this round"))


def check_scalars(scalars, sender: str) -> dict[str, float]:
    """Every scalar must be registered, finite and within its range; returns a plain dict."""
    if len(scalars) > MAX_SCALARS:
        raise _invalid(f"{len(scalars)} scalars from {short(sender)} (at most {MAX_SCALARS})", "bad_scalar")
    out = {}
    for name, value in scalars.items():
        if name not in SCALARS:
            raise _invalid(f"unknown scalar {short(name)}; allowed: {', '.join(SCALARS.names())}", "bad_scalar")
        spec = SCALARS.get(name)
        if not (math.isfinite(value) and spec.lo <= value <= spec.hi):
            raise _invalid(f"scalar {name} = {value!r} outside [{spec.lo:g}, {spec.hi:g}]", "bad_scalar")
        out[name] = float(value)
    return out


def per_member(entries, node_of, members, sender: str, what: str, reason: str):
    """(device id, entry) for each of `entries`, a peer's rows of one device each (node_of(entry) its id), refused
    (INVALID_ARGUMENT, `reason`) past one per device of `members`, for a device not among them, or for one twice."""
    if len(entries) > len(members):
        raise _invalid(f"{len(entries)} {what}s from {short(sender)}, which has {len(members)} devices", reason)
    allowed, seen = set(members), set()
    for entry in entries:
        node = node_of(entry)
        if node not in allowed:
            raise _invalid(f"{what} for {short(node)}, not a device of {short(sender)}", reason)
        if node in seen:
            raise _invalid(f"two {what}s for {node}", reason)
        seen.add(node)
        yield node, entry


def check_meta(meta, rounds: int, plan_len: int) -> None:
    """Shape checks on Meta that hold whatever the receiver's state."""
    check_id(meta.sender_id, "sender_id")
    check_id(meta.run_id, "run_id", MAX_RUN_ID)
    check_id(meta.phase, "phase")
    check_count(meta.round, "round", 0, rounds)
    check_count(meta.step, "step", 0, max(plan_len - 1, 0))
    check_count(meta.attempt, "attempt", 0, 1 << 20)
    if len(meta.transforms) > MAX_TRANSFORMS:
        raise _invalid(f"{len(meta.transforms)} transforms (at most {MAX_TRANSFORMS})", "bad_transforms")
    for t in meta.transforms:
        for text, what in ((t.stage, "transform stage"), (t.name, "transform name"), (t.tier, "transform tier")):
            check_id(text, what)
        if len(t.params) > MAX_TRANSFORM_PARAMS:
            raise _invalid(f"transform {short(t.name)} has {len(t.params)} parameters", "bad_transforms")
        for key, value in t.params.items():
            check_id(key, "transform parameter name")
            if not math.isfinite(value):
                raise _invalid(f"transform {short(t.name)} parameter {short(key)} is not finite", "bad_transforms")
