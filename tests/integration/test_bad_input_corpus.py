"""A corpus of hostile messages against a running testbed: each gets its exact status, none changes the results.

As in test_bad_input.py, two devices of edge-001 (dev-00004 = a, dev-00005 = b) are played by hand so that
the edge's barrier of round 0 cannot complete while the corpus is sent (neither has uploaded yet), and the
cloud cannot close round 0 either (edge-001 has not submitted). A clean run with the same seed is the
reference: per-round accuracy, loss and train_loss must be identical, every refusal the services saw must be
counted in `refused`, and no log line may grow with what an attacker sent.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import grpc
import numpy as np
from grpc import StatusCode as S

from hfl.common import session, validate, wire
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg

from .conftest import SMALL
from .rawclient import RawDevice, RawEdge, stream

OVERRIDES = SMALL + ["topology.hosts_per_edge=3", "train.tau=1", "run.rounds=2", "net.max_message_mb=1"]
PLAYED = ["devices-001-1", "devices-001-2"]  # dev-00004 and dev-00005
MIB = 1 << 20
HUGE_ID = "x" * MIB        # in unary requests
BIG_ID = "\U0001F600" * (128 << 10)  # 512 KiB of 4-byte characters: fits an envelope under net.max_message_mb=1
CONCURRENT = 200


class Case:
    def __init__(self, expect: S, counted: bool | None = True, short_detail: bool = False):
        self.expect, self.counted, self.short_detail = expect, counted, short_detail
        self.code, self.detail, self.seconds = None, "", 0.0


def outcome(fn) -> tuple[S, str]:
    try:
        result = fn()
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, pb.Envelope)):
            list(result)  # drain a response stream: a refusal may come with its end
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return S.OK, ""


def raw_call(channel: grpc.Channel, method: str, chunks: list[bytes], metadata=(), timeout: float = 30,
             unary_response: bool = False):
    """A stream of Chunk messages given as raw bytes (which need not parse as a Chunk at all)."""
    if unary_response:
        call = channel.stream_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        return call(iter(chunks), metadata=metadata, timeout=timeout)
    call = channel.stream_stream(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    return list(call(iter(chunks), metadata=metadata, timeout=timeout))


def chunk_bytes(payload: bytes, size: int = 1 << 20) -> list[bytes]:
    return [pb.Chunk(data=c.data).SerializeToString() for c in wire.to_chunks(payload, size)]


def play(tb, attack: bool):
    a, b = RawDevice(tb.edge_addresses[1], "dev-00004"), RawDevice(tb.edge_addresses[1], "dev-00005")
    a.register()
    b.register()
    cases: dict[str, Case] = {}
    after = -1
    while True:
        task = a.fetch(after).task
        task_b = b.fetch(after).task
        if task.finished:
            assert task_b.finished
            return cases
        for step, phase in enumerate(task.phases):
            if phase.kind != "edge_model_sync":
                continue
            good_b = b.envelope(task.round, step, phase.kind)
            if attack and task.round == 0:
                pending = corpus(tb, a, b, task.round, step, phase.kind, good_b, cases)
            else:
                pending = b.exchange_in_background(good_b)
            a.exchange(a.envelope(task.round, step, phase.kind))
            pending.join(timeout=60)
            assert "reply" in pending.result, pending.result
        after = task.round


def corpus(tb, a: RawDevice, b: RawDevice, round_: int, step: int, kind: str, good: pb.Envelope,
           cases: dict[str, Case]) -> threading.Thread:
    started = time.monotonic()
    edge_addr, cloud_addr = tb.edge_addresses[1], tb.cloud_address
    dim, run_id, rounds = b.dim, b.run_id, 2
    exchange_method = "/hfl.v1.EdgeService/Exchange"

    def case(name, expect, fn, counted=True, short_detail=False):
        assert name not in cases, name
        c = cases[name] = Case(expect, counted, short_detail)
        t0 = time.monotonic()
        c.code, c.detail = outcome(fn)
        c.seconds = time.monotonic() - t0

    def env(round_=round_, step=step, phase=kind, sender=None, vec=None, tensor=None, attempt=0, scalars=None,
            run=None, tensors=None, transforms=None):
        e = b.envelope(round_, step, phase, vec=vec, sender=sender, tensor=tensor, attempt=attempt, scalars=scalars)
        if sender is not None:
            e.meta.sender_id = sender  # RawDevice.envelope() would take "" for its own id
        if run is not None:
            e.meta.run_id = run
        if tensors is not None:
            del e.tensors[:]
            e.tensors.extend(tensors)
        if transforms is not None:
            e.meta.transforms.extend(transforms)
        return e

    def tensor(**kw):
        t = wire.encode(np.zeros(dim, np.float32), "float32", "delta")
        for k, v in kw.items():
            if k == "shape":
                t.ClearField("shape")
                t.shape.extend(v)
            else:
                setattr(t, k, v)
        return t

    def with_value(value, at=7, encoding="float32"):
        vec = np.zeros(dim, np.float32)
        vec[at] = value
        return wire.encode(vec, encoding, "delta")

    def X(payload, metadata=None):
        """Exchange as b, with b's own session token; a deadline, since an accepted upload waits at the barrier."""
        call = b.stub.Exchange(iter(stream(payload)), metadata=metadata or b.metadata, timeout=10)
        return wire.read_envelope_sync(call)[0]

    def X1(payload, metadata=None):
        """The same upload in one unary call (ExchangeOne, what a device sends when its upload fits one chunk)."""
        data = payload if isinstance(payload, bytes) else payload.SerializeToString()
        return wire.read_chunk(b.stub.ExchangeOne(pb.Chunk(data=data), metadata=metadata or b.metadata, timeout=10),
                               MIB)[0]

    def XS(payload, metadata=None):
        """The same upload framed on a Session stream (what a device sends now), in frames of at most 1 MiB."""
        data = payload if isinstance(payload, bytes) else payload.SerializeToString()
        parts = [data[i:i + MIB] for i in range(0, len(data), MIB)] or [b""]
        frames = [pb.Chunk(data=p, end=i == len(parts) - 1).SerializeToString() for i, p in enumerate(parts)]
        call = b.channel.stream_stream("/hfl.v1.EdgeService/Session")(iter(frames), metadata=metadata or b.metadata,
                                                                      timeout=10)
        return wire.read_raw_chunk(next(call), MIB)[0]

    channel = b.channel

    # -- malformed bytes, truncated and empty streams ------------------------------------------------------
    payload = good.SerializeToString()
    case("malformed: varint overflow", S.INVALID_ARGUMENT, lambda: X(b"\xff\xff\xff\xff\x0f"))
    case("malformed: 11-byte varint length", S.INVALID_ARGUMENT, lambda: X(b"\x0a" + b"\xff" * 10 + b"\x01"))
    case("malformed: field number 0", S.INVALID_ARGUMENT, lambda: X(b"\x00\x01"))
    case("malformed: end-group without start", S.INVALID_ARGUMENT, lambda: X(b"\x0c"))
    case("malformed: meta length past the end", S.INVALID_ARGUMENT, lambda: X(b"\x0a\x7f\x0a\x01"))
    # a known field with another wire type is kept as an unknown field: an envelope with no meta, from nobody
    case("malformed: wrong wire type for meta", S.PERMISSION_DENIED, lambda: X(b"\x0d\x00\x00\x00\x00"))
    case("truncated envelope (half the bytes)", S.INVALID_ARGUMENT, lambda: X(payload[: len(payload) // 2]))
    case("truncated envelope (last byte cut)", S.INVALID_ARGUMENT, lambda: X(payload[:-1]))
    case("truncated stream (first of 4 chunks)", S.INVALID_ARGUMENT,
         lambda: raw_call(channel, exchange_method, chunk_bytes(payload, len(payload) // 4 + 1)[:1], b.metadata))
    case("empty stream (no chunk at all)", S.PERMISSION_DENIED,
         lambda: raw_call(channel, exchange_method, [], b.metadata))
    case("empty stream (one empty chunk)", S.PERMISSION_DENIED, lambda: X(b""))
    case("chunk that is not a Chunk", S.INVALID_ARGUMENT,
         lambda: raw_call(channel, exchange_method, [b"\xff\xff\xff"], b.metadata))
    case("second chunk that is not a Chunk", S.INVALID_ARGUMENT,
         lambda: raw_call(channel, exchange_method, chunk_bytes(payload[:50]) + [b"\x0a\x7f"], b.metadata))
    # the edge may see the cut stream end and refuse what came (malformed), or be cancelled first: counted or not
    case("stream abandoned mid-upload", S.CANCELLED, lambda: abandoned_upload(b, payload), counted=None)
    case("oversized payload (2 MiB in 1 MiB chunks)", S.RESOURCE_EXHAUSTED, lambda: X(b"\x00" * (2 * MIB)))
    case("oversized chunk (12 MiB, over the gRPC frame cap)", S.RESOURCE_EXHAUSTED,
         lambda: raw_call(channel, exchange_method, [pb.Chunk(data=b"\x00" * (12 * MIB)).SerializeToString()],
                          b.metadata), counted=None)  # gRPC drops it; the edge may then see an empty stream

    # -- the same refusals for an upload in one unary call (ExchangeOne) -------------------------------------
    case("one: request that is not a Chunk", S.INVALID_ARGUMENT, lambda: channel.unary_unary(
        "/hfl.v1.EdgeService/ExchangeOne", request_serializer=lambda x: x, response_deserializer=lambda x: x)(
        b"\xff\xff\xff", metadata=b.metadata, timeout=10))
    case("one: malformed envelope", S.INVALID_ARGUMENT, lambda: X1(b"\xff\xff\xff\xff\x0f"))
    case("one: truncated envelope", S.INVALID_ARGUMENT, lambda: X1(payload[:-1]))
    case("one: oversized payload (2 MiB)", S.RESOURCE_EXHAUSTED, lambda: X1(b"\x00" * (2 * MIB)))

    # -- and for an upload framed on a device's Session stream ----------------------------------------------
    case("session: frame that is not a Chunk", S.INVALID_ARGUMENT, lambda: next(channel.stream_stream(
        "/hfl.v1.EdgeService/Session")(iter([b"\xff\xff\xff"]), metadata=b.metadata, timeout=10)))
    case("session: malformed envelope", S.INVALID_ARGUMENT, lambda: XS(b"\xff\xff\xff\xff\x0f"))
    case("session: truncated envelope", S.INVALID_ARGUMENT, lambda: XS(payload[:-1]))
    case("session: oversized payload (2 MiB in 1 MiB frames)", S.RESOURCE_EXHAUSTED, lambda: XS(b"\x00" * (2 * MIB)))
    case("session: no token", S.PERMISSION_DENIED, lambda: XS(env(), metadata=(("x", "y"),)))
    case("session: a's upload with b's token", S.PERMISSION_DENIED, lambda: XS(env(sender="dev-00004")))
    case("session: b's upload with a's token", S.PERMISSION_DENIED, lambda: XS(env(), metadata=a.metadata))

    # -- impersonation ------------------------------------------------------------------------------------
    case("no token", S.PERMISSION_DENIED, lambda: X(env(), metadata=(("x", "y"),)))
    case("empty token", S.PERMISSION_DENIED, lambda: X(env(), metadata=session.metadata("")))
    case("forged token", S.PERMISSION_DENIED, lambda: X(env(), metadata=session.metadata("A" * 32)))
    case("1 KiB token", S.PERMISSION_DENIED, lambda: X(env(), metadata=session.metadata("A" * 1024)))
    case("a's upload with b's token", S.PERMISSION_DENIED, lambda: X(env(sender="dev-00004")))
    case("b's upload with a's token", S.PERMISSION_DENIED, lambda: X(env(), metadata=a.metadata))
    case("unknown sender", S.PERMISSION_DENIED, lambda: X(env(sender="dev-09999")))
    case("sender of the other cluster", S.PERMISSION_DENIED, lambda: X(env(sender="dev-00000")))
    case("empty sender", S.PERMISSION_DENIED, lambda: X(env(sender="")))
    case("sender id of 1 MiB (the envelope is over the limit)", S.RESOURCE_EXHAUSTED, lambda: X(env(sender=HUGE_ID)),
         short_detail=True)
    case("sender id of 512 KiB", S.INVALID_ARGUMENT, lambda: X(env(sender=BIG_ID)), short_detail=True)
    case("sender id with NUL", S.INVALID_ARGUMENT, lambda: X(env(sender="dev-00005\x00")))
    case("one: no token", S.PERMISSION_DENIED, lambda: X1(env(), metadata=(("x", "y"),)))
    case("one: a's upload with b's token", S.PERMISSION_DENIED, lambda: X1(env(sender="dev-00004")))
    edge0 = RawDevice(tb.edge_addresses[0], "dev-00000")
    case("edge-000: b's token as b", S.PERMISSION_DENIED, lambda: edge0.exchange(env(), metadata=b.metadata))
    case("edge-000: b's token as dev-00000", S.PERMISSION_DENIED,
         lambda: edge0.exchange(env(sender="dev-00000"), metadata=b.metadata))
    case("FetchRound without token", S.PERMISSION_DENIED, lambda: b.fetch(-1, metadata=(("x", "y"),)))
    case("FetchRound as a with b's token", S.PERMISSION_DENIED, lambda: a.fetch(-1, metadata=b.metadata))
    case("FetchRound as 1 MiB id", S.INVALID_ARGUMENT, lambda: b.stub.FetchRound(
        pb.FetchRequest(run_id=run_id, node_id=HUGE_ID), metadata=b.metadata), short_detail=True)

    def fetch_for(*also):
        """b's fetch for itself and for `also` ((node, session token), ...), as a device host sends one."""
        return lambda: b.stub.FetchRound(pb.FetchRequest(run_id=run_id, node_id=b.id, after_round=round_, also=[
            pb.FetchFor(node_id=n, session_token=t) for n, t in also]), metadata=b.metadata, timeout=10)
    case("FetchRound for a with a forged token", S.PERMISSION_DENIED, fetch_for(("dev-00004", "A" * 32)))
    case("FetchRound for a with b's token", S.PERMISSION_DENIED, fetch_for(("dev-00004", b.token)))
    case("FetchRound for a with no token", S.PERMISSION_DENIED, fetch_for(("dev-00004", "")))
    case("FetchRound for a device of the other cluster", S.PERMISSION_DENIED, fetch_for(("dev-00000", b.token)))
    case("FetchRound for b itself again", S.INVALID_ARGUMENT, fetch_for(("dev-00005", b.token)))
    case("FetchRound for more devices than the cluster has", S.INVALID_ARGUMENT,
         fetch_for(*[("dev-00004", a.token)] * 3))
    case("Presence without token", S.PERMISSION_DENIED,
         lambda: next(b.stub.Presence(pb.PresenceRequest(run_id=run_id, node_id="dev-00005"))))
    case("Presence as a with b's token", S.PERMISSION_DENIED,
         lambda: next(b.stub.Presence(pb.PresenceRequest(run_id=run_id, node_id="dev-00004"), metadata=b.metadata)))

    # -- registration: override, weight hijack ---------------------------------------------------------
    def register(node, num_samples=None, rejoin=False, run=None, address=edge_addr, nonce=b""):
        stub = b.stub if address == edge_addr else edge0.stub
        req = pb.RegisterRequest(run_id=run_id if run is None else run, node_id=node, rejoin=rejoin,
                                 num_samples=b.num_samples if num_samples is None else num_samples, nonce=nonce)
        return lambda: stub.Register(req, timeout=30, metadata=session.join_metadata())  # an insider's register

    unary = lambda method, data: lambda: channel.unary_unary(method, request_serializer=lambda x: x,
                                                              response_deserializer=lambda x: x)(data, timeout=30)
    case("Register request that is not a RegisterRequest", S.INVALID_ARGUMENT,
         unary("/hfl.v1.EdgeService/Register", b"\xff\xff\xff"))
    case("register unknown id", S.PERMISSION_DENIED, register("dev-09999"))
    case("register other cluster", S.PERMISSION_DENIED, register("dev-00000"))
    case("register 1 MiB id", S.INVALID_ARGUMENT, register(HUGE_ID), short_detail=True)
    case("register 1 MiB run id", S.INVALID_ARGUMENT, register("dev-00005", run=HUGE_ID), short_detail=True)
    case("register wrong run id", S.FAILED_PRECONDITION, register("dev-00005", run="hfl-00000000"))
    case("register override mid-run (no rejoin)", S.ALREADY_EXISTS, register("dev-00005"))
    case("register override mid-run (rejoin)", S.ALREADY_EXISTS, register("dev-00005", rejoin=True))
    case("weight hijack 10**12", S.ALREADY_EXISTS, register("dev-00005", 10 ** 12, rejoin=True))
    case("weight hijack 2**63-1", S.ALREADY_EXISTS, register("dev-00004", 2 ** 63 - 1, rejoin=True))
    case("weight hijack -1", S.ALREADY_EXISTS, register("dev-00004", -1, rejoin=True))
    case("weight hijack at edge-000", S.ALREADY_EXISTS,
         register("dev-00000", 2 ** 63 - 1, rejoin=True, address=tb.edge_addresses[0]))
    # a nonce is a live session's only when it is the one its node registered with (b registered with none)
    case("register live device with a nonce of its own (rejoin)", S.ALREADY_EXISTS,
         register("dev-00005", rejoin=True, nonce=session.new_nonce()))
    case("register live device with a zero nonce", S.ALREADY_EXISTS, register("dev-00005", rejoin=True, nonce=bytes(16)))
    case("register nonce of 15 bytes", S.INVALID_ARGUMENT, register("dev-00005", rejoin=True, nonce=b"n" * 15))
    case("register nonce of 17 bytes", S.INVALID_ARGUMENT, register("dev-00004", rejoin=True, nonce=b"n" * 17))
    case("register nonce of 1 MiB", S.INVALID_ARGUMENT, register("dev-00004", rejoin=True, nonce=b"n" * MIB),
         short_detail=True)

    # -- wrong run, round, phase, step, attempt -------------------------------------------------------------
    case("wrong run id", S.FAILED_PRECONDITION, lambda: X(env(run="hfl-00000000")))
    case("empty run id", S.FAILED_PRECONDITION, lambda: X(env(run="")))
    case("run id of 512 KiB", S.INVALID_ARGUMENT, lambda: X(env(run=BIG_ID)), short_detail=True)
    case("wrong round (next)", S.FAILED_PRECONDITION, lambda: X(env(round_=round_ + 1)))
    case("round out of range", S.INVALID_ARGUMENT, lambda: X(env(round_=rounds + 5)))
    case("negative round", S.INVALID_ARGUMENT, lambda: X(env(round_=-1)))
    case("round 2**63-1", S.INVALID_ARGUMENT, lambda: X(env(round_=2 ** 63 - 1)))
    case("wrong step (next)", S.FAILED_PRECONDITION, lambda: X(env(step=step + 1)))
    case("wrong step (previous)", S.FAILED_PRECONDITION, lambda: X(env(step=step - 1)))
    case("step out of range", S.INVALID_ARGUMENT, lambda: X(env(step=1000)))
    case("negative step", S.INVALID_ARGUMENT, lambda: X(env(step=-(2 ** 63))))
    case("wrong phase name", S.FAILED_PRECONDITION, lambda: X(env(phase="cloud_sync")))
    case("phase name of 512 KiB", S.INVALID_ARGUMENT, lambda: X(env(phase=BIG_ID)), short_detail=True)
    case("wrong attempt", S.FAILED_PRECONDITION, lambda: X(env(attempt=1)))
    case("negative attempt", S.INVALID_ARGUMENT, lambda: X(env(attempt=-1)))
    case("huge attempt", S.INVALID_ARGUMENT, lambda: X(env(attempt=2 ** 40)))
    case("one: wrong round (next)", S.FAILED_PRECONDITION, lambda: X1(env(round_=round_ + 1)))
    case("one: wrong phase name", S.FAILED_PRECONDITION, lambda: X1(env(phase="cloud_sync")))

    # -- tensors: shapes, dtypes, encodings, names, non-finite values ----------------------------------------
    case("shape dim-1", S.INVALID_ARGUMENT, lambda: X(env(vec=np.zeros(dim - 1, np.float32))))
    case("shape dim+1", S.INVALID_ARGUMENT, lambda: X(env(vec=np.zeros(dim + 1, np.float32))))
    case("shape [1, dim]", S.INVALID_ARGUMENT, lambda: X(env(tensor=tensor(shape=[1, dim]))))
    case("shape [-dim]", S.INVALID_ARGUMENT, lambda: X(env(tensor=tensor(shape=[-dim]))))
    case("shape [] (scalar)", S.INVALID_ARGUMENT, lambda: X(env(tensor=tensor(shape=[]))))
    case("shape [2**62]", S.INVALID_ARGUMENT, lambda: X(env(tensor=tensor(shape=[2 ** 62]))))
    case("data shorter than shape", S.INVALID_ARGUMENT,
         lambda: X(env(tensor=tensor(data=np.zeros(dim - 1, np.float32).tobytes()))))
    case("empty data", S.INVALID_ARGUMENT, lambda: X(env(tensor=tensor(data=b""))))
    case("dtype float64", S.INVALID_ARGUMENT,
         lambda: X(env(tensor=tensor(dtype="float64", data=np.zeros(dim, np.float64).tobytes()))))
    case("dtype int8", S.INVALID_ARGUMENT, lambda: X(env(tensor=tensor(dtype="int8"))))
    case("float16 encoding, float32 dtype", S.INVALID_ARGUMENT, lambda: X(env(tensor=tensor(encoding="float16"))))
    case("unknown encoding", S.INVALID_ARGUMENT, lambda: X(env(tensor=tensor(encoding="pickle"))))
    case("encoding name of 512 KiB", S.INVALID_ARGUMENT, lambda: X(env(tensor=tensor(encoding=BIG_ID))),
         short_detail=True)
    case("qsgd with a garbage header", S.INVALID_ARGUMENT,
         lambda: X(env(tensor=tensor(encoding="qsgd", data=b"\x04qsgd" + b"\xff" * 40))))
    case("sq with an infinite range", S.INVALID_ARGUMENT, lambda: X(env(tensor=sq_with_inf_range(dim))))
    case("wrong tensor name", S.INVALID_ARGUMENT, lambda: X(env(tensor=tensor(name="gradient"))))
    case("tensor name of 512 KiB", S.INVALID_ARGUMENT, lambda: X(env(tensor=tensor(name=BIG_ID))),
         short_detail=True)
    case("two tensors", S.INVALID_ARGUMENT, lambda: X(env(tensors=[tensor(), tensor()])))
    case("no tensor", S.INVALID_ARGUMENT, lambda: X(env(tensors=[])))
    case("nan in the delta", S.INVALID_ARGUMENT, lambda: X(env(tensor=with_value(np.nan))))
    case("+inf in the delta", S.INVALID_ARGUMENT, lambda: X(env(tensor=with_value(np.inf, at=dim - 1))))
    case("-inf in the delta", S.INVALID_ARGUMENT, lambda: X(env(tensor=with_value(-np.inf, at=0))))
    case("inf in a float16 delta", S.INVALID_ARGUMENT,
         lambda: X(env(tensor=with_value(np.inf, encoding="float16"))))
    case("one: nan in the delta", S.INVALID_ARGUMENT, lambda: X1(env(tensor=with_value(np.nan))))
    case("one: shape dim-1", S.INVALID_ARGUMENT, lambda: X1(env(vec=np.zeros(dim - 1, np.float32))))
    case("one: two tensors", S.INVALID_ARGUMENT, lambda: X1(env(tensors=[tensor(), tensor()])))

    # -- scalars -----------------------------------------------------------------------------------------
    bad_scalars = {
        "unknown scalar name": {"evil": 1.0},
        "scalar name of 512 KiB": {BIG_ID: 1.0},
        "train_loss nan": {"train_loss": float("nan")},
        "train_loss inf": {"train_loss": float("inf")},
        "train_loss 1e300": {"train_loss": 1e300},
        "train_loss negative": {"train_loss": -1.0},
        "bytes_up negative": {"bytes_up": -1.0},
        "refused negative": {"refused": -5.0},
        "dropped huge": {"dropped": 1e12},
        "too many scalars": {**{f"s{i}": 1.0 for i in range(validate.MAX_SCALARS + 1)}},
    }
    for name, scalars in bad_scalars.items():
        case(name, S.INVALID_ARGUMENT, lambda s=scalars: X(env(scalars=s)), short_detail=name.endswith("KiB"))

    # -- transforms -----------------------------------------------------------------------------------
    def tr(name="qsgd", **params):
        return pb.Transform(stage="encode", name=name, tier="device", params=params)

    case("transform param nan", S.INVALID_ARGUMENT, lambda: X(env(transforms=[tr(levels=float("nan"))])))
    case("transform param inf", S.INVALID_ARGUMENT, lambda: X(env(transforms=[tr(q=float("-inf"))])))
    case("transform name of 512 KiB", S.INVALID_ARGUMENT, lambda: X(env(transforms=[tr(BIG_ID)])),
         short_detail=True)
    case("transform param name of 512 KiB", S.INVALID_ARGUMENT,
         lambda: X(env(transforms=[tr(**{BIG_ID: 1.0})])), short_detail=True)
    case("too many transforms", S.INVALID_ARGUMENT,
         lambda: X(env(transforms=[tr()] * (validate.MAX_TRANSFORMS + 1))))
    many = getattr(validate, "MAX_TRANSFORM_PARAMS", validate.MAX_SCALARS) + 1
    too_many = env(transforms=[tr(**{f"{i:x}": 1.0 for i in range(many)})])
    case(f"too many transform params ({many})",
         S.INVALID_ARGUMENT if too_many.ByteSize() <= MIB else S.RESOURCE_EXHAUSTED, lambda: X(too_many))
    dp = lambda **params: pb.Transform(stage="dp_event", name="gaussian", tier="device", params=params)
    case("DP event that does not parse", S.INVALID_ARGUMENT, lambda: X(env(transforms=[dp(x=1.0)])))
    case("DP event covering another cluster's device", S.INVALID_ARGUMENT, lambda: X(env(transforms=[
        dp_event(["dev-00000"])])))

    # -- the cloud, while edge-001 cannot have submitted round 0 ----------------------------------------------
    rogue = RawEdge(cloud_addr)
    delta = wire.encode(np.zeros(dim, np.float32), "float32", "delta")

    def sub(sender="edge-001", r=round_, tensor=delta, step=2, **meta):
        m = pb.Meta(run_id=run_id, round=r, phase="cloud_sync", step=step, sender_id=sender, num_devices=3,
                    num_samples=1200)
        for k, v in meta.items():
            if k == "transforms":
                m.transforms.extend(v)
            else:
                setattr(m, k, v)
        return pb.Envelope(meta=m, tensors=[tensor], scalars={"refused": 0.0})

    nan_delta = wire.encode(np.full(dim, np.nan, np.float32), "float32", "delta")
    case("cloud: register unknown edge", S.PERMISSION_DENIED, lambda: rogue.register("edge-999"))
    case("cloud: register a device id", S.PERMISSION_DENIED, lambda: rogue.register("dev-00005"))
    case("cloud: register 1 MiB id", S.INVALID_ARGUMENT, lambda: rogue.register(HUGE_ID), short_detail=True)
    case("cloud: register live edge", S.ALREADY_EXISTS, lambda: rogue.register("edge-001"))
    case("cloud: register live edge (rejoin)", S.ALREADY_EXISTS, lambda: rogue.register("edge-001", rejoin=True))
    case("cloud: register live edge with a nonce of its own", S.ALREADY_EXISTS, lambda: rogue.stub.Register(
        pb.RegisterRequest(node_id="edge-001", rejoin=True, nonce=session.new_nonce()), timeout=30,
        metadata=session.join_metadata()))
    case("cloud: register nonce of 1 byte", S.INVALID_ARGUMENT, lambda: rogue.stub.Register(
        pb.RegisterRequest(node_id="edge-001", rejoin=True, nonce=b"\0"), timeout=30, metadata=session.join_metadata()))
    case("cloud: register with wrong run id", S.FAILED_PRECONDITION, lambda: rogue.stub.Register(
        pb.RegisterRequest(run_id="hfl-00000000", node_id="edge-001"), timeout=30))
    case("cloud: submit from unknown edge", S.PERMISSION_DENIED, lambda: rogue.submit(sub("edge-999")))
    case("cloud: submit as edge-001, no token", S.PERMISSION_DENIED, lambda: rogue.submit(sub()))
    case("cloud: submit nan as edge-001, no token", S.PERMISSION_DENIED, lambda: rogue.submit(sub(tensor=nan_delta)))
    case("cloud: submit as edge-001 with a device's token", S.PERMISSION_DENIED,
         lambda: rogue.submit(sub(), metadata=b.metadata))
    case("cloud: submit as edge-000 with a forged token", S.PERMISSION_DENIED,
         lambda: rogue.submit(sub("edge-000"), metadata=session.metadata("B" * 32)))
    case("cloud: submit 512 KiB sender", S.INVALID_ARGUMENT, lambda: rogue.submit(sub(BIG_ID)), short_detail=True)
    case("cloud: submit round out of range", S.INVALID_ARGUMENT, lambda: rogue.submit(sub(r=10 ** 9)))
    case("cloud: submit negative step", S.INVALID_ARGUMENT, lambda: rogue.submit(sub(step=-1)))
    case("cloud: submit transform param nan", S.INVALID_ARGUMENT,
         lambda: rogue.submit(sub(transforms=[tr(levels=float("nan"))])))
    case("cloud: submit malformed bytes", S.INVALID_ARGUMENT, lambda: rogue.submit(b"\xff\xff\xff\xff\x0f"))
    case("cloud: chunk that is not a Chunk", S.INVALID_ARGUMENT, lambda: raw_call(
        rogue.channel, "/hfl.v1.CloudService/Submit", [b"\xff\xff\xff"], unary_response=True))
    case("cloud: submit empty stream", S.PERMISSION_DENIED, lambda: rogue.stub.Submit(iter([]), timeout=30))
    case("cloud: submit oversized", S.RESOURCE_EXHAUSTED, lambda: rogue.submit(b"\x00" * (2 * MIB)))
    case("cloud: FetchRound as edge-001, no token", S.PERMISSION_DENIED, lambda: rogue.stub.FetchRound(
        pb.FetchRequest(run_id=run_id, node_id="edge-001"), timeout=30))
    case("cloud: Presence as edge-001, a device's token", S.PERMISSION_DENIED, lambda: next(rogue.stub.Presence(
        pb.PresenceRequest(run_id=run_id, node_id="edge-001"), metadata=b.metadata, timeout=30)))

    # -- 200 concurrent bogus streams (threads, all started together, each bounded by a deadline) -----------------
    concurrent_codes = bogus_streams(tb, b, exchange_method)
    for i, (code, expect) in enumerate(concurrent_codes):
        c = cases[f"concurrent bogus stream {i:03d}"] = Case(expect)
        c.code = code

    # -- replay: the genuine upload is accepted first, then sent again --------------------------------------
    cases["_before_replay"] = time.monotonic() - started
    pending = b.exchange_in_background(good)
    probes = b.wait_held(good)  # the edge holds the genuine upload: what comes next is its replay
    for i in range(probes):  # each probe was refused and counted: for its shape, the last as a replay
        c = cases[f"probe of the genuine upload {i}"] = Case(S.ALREADY_EXISTS if i == probes - 1 else S.INVALID_ARGUMENT)
        c.code = c.expect
    assert pending.is_alive(), (pending.result, time.monotonic() - started,  # held at the barrier until a uploads
                                sorted((c.seconds, n) for n, c in cases.items() if isinstance(c, Case))[-6:])
    # (with a deadline: were a replay taken for the genuine upload, it would wait at the barrier)
    case("replay", S.ALREADY_EXISTS, lambda: list(b.stub.Exchange(iter([pb.Chunk(data=good.SerializeToString())]),
                                                                  metadata=b.metadata, timeout=20)))
    case("replay with another vector", S.ALREADY_EXISTS, lambda: X(env(vec=np.ones(dim, np.float32))))
    case("one: replay", S.ALREADY_EXISTS, lambda: X1(good))
    case("replay of a's slot by b", S.PERMISSION_DENIED, lambda: X(env(sender="dev-00004")))
    cases["_elapsed"] = time.monotonic() - started
    return pending


def abandoned_upload(dev: RawDevice, payload: bytes):
    """Send the first chunk of an upload, then cancel the call before the stream ends."""
    release = threading.Event()

    def chunks():
        yield pb.Chunk(data=payload[:100])
        release.wait(10)

    call = dev.stub.Exchange(chunks(), metadata=dev.metadata, timeout=30)
    threading.Timer(0.5, call.cancel).start()
    try:
        return list(call)
    finally:
        release.set()


def dp_event(covers: list[str]) -> pb.Transform:
    from hfl.common.privacy import on_wire
    from hfl.common.privacy.events import DpRecord

    rec = DpRecord(tier="device", node=covers[0], covers=tuple(covers), mechanism="gaussian", noise_multiplier=1.0,
                   sensitivity=1.0, sampling_rate=1.0, count=1, round=0, stream="global")
    return on_wire.to_transform(rec)


def sq_with_inf_range(dim: int) -> pb.Tensor:
    t = wire.encode(np.linspace(-1, 1, dim).astype(np.float32), "sq", "delta", np.random.default_rng(0), bits=3)
    data = bytearray(t.data)
    head = 1 + data[0] + 22  # name, then version, width, levels, length, bucket, side count
    data[head:head + 4] = np.array([-np.inf], "<f4").tobytes()
    t.data = bytes(data)
    return t


def bogus_streams(tb, dev: RawDevice, exchange_method: str) -> list[tuple[S, S]]:
    """CONCURRENT streams at once, a quarter each: edge without token, edge malformed, cloud impersonation,
    cloud oversized-by-chunks. Returns (code, expected code) per stream."""
    edge_channel = grpc.insecure_channel(tb.edge_addresses[1])
    cloud_channel = grpc.insecure_channel(tb.cloud_address)
    edge_stub, cloud_stub = pbg.EdgeServiceStub(edge_channel), pbg.CloudServiceStub(cloud_channel)
    no_token = dev.envelope(0, 1, "edge_model_sync").SerializeToString()
    impersonation = pb.Envelope(meta=pb.Meta(run_id=dev.run_id, round=0, phase="cloud_sync", step=2,
                                             sender_id="edge-001")).SerializeToString()
    kinds = [
        (S.PERMISSION_DENIED, lambda: list(edge_stub.Exchange(iter([pb.Chunk(data=no_token)]), timeout=60))),
        (S.INVALID_ARGUMENT, lambda: list(edge_stub.Exchange(iter([pb.Chunk(data=b"\xff\xff\xff\xff\x0f")]),
                                                             metadata=dev.metadata, timeout=60))),
        (S.PERMISSION_DENIED, lambda: cloud_stub.Submit(iter([pb.Chunk(data=impersonation)]), timeout=60)),
        (S.RESOURCE_EXHAUSTED, lambda: cloud_stub.Submit(iter([pb.Chunk(data=b"\x00" * (256 << 10))] * 5),
                                                         timeout=60)),
    ]
    go = threading.Barrier(CONCURRENT + 1)
    results: list = [None] * CONCURRENT

    def worker(i):
        expect, fn = kinds[i % len(kinds)]
        go.wait(30)
        results[i] = (outcome(fn)[0], expect)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(CONCURRENT)]
    for t in threads:
        t.start()
    go.wait(30)
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "bogus streams still running after 60 s"
    edge_channel.close()
    cloud_channel.close()
    return results


def test_edge_refuses_everything_before_it_joined_its_cloud(tmp_path):
    """An edge whose cloud is not there yet answers UNAVAILABLE, whatever it is sent (issue 6, finding 9)."""
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-m", "hfl.cli", "edge", "--id", "1", "--listen", "127.0.0.1:0",
                             "--cloud", "127.0.0.1:1", "--port-file", str(port_file), "--wait", "60"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        channel = grpc.insecure_channel(f"127.0.0.1:{port_file.read_text().strip()}")
        stub = pbg.EdgeServiceStub(channel)
        env = pb.Envelope(meta=pb.Meta(run_id="r", sender_id="dev-00004", phase="edge_model_sync", step=1))
        codes = {
            "exchange": outcome(lambda: list(stub.Exchange(iter([pb.Chunk(data=env.SerializeToString())]), timeout=10))),
            "exchange malformed": outcome(lambda: list(stub.Exchange(iter([pb.Chunk(data=b"\xff\xff")]), timeout=10))),
            "exchange empty": outcome(lambda: list(stub.Exchange(iter([]), timeout=10))),
            "exchange one": outcome(lambda: stub.ExchangeOne(pb.Chunk(data=env.SerializeToString()), timeout=10)),
            "session": outcome(lambda: list(stub.Session(iter([pb.Chunk(data=env.SerializeToString(), end=True)]),
                                                         timeout=10))),
            "register": outcome(lambda: stub.Register(pb.RegisterRequest(node_id="dev-00004", num_samples=1),
                                                      timeout=10)),
            "discovery": outcome(lambda: stub.Register(pb.RegisterRequest(), timeout=10)),
            "fetch": outcome(lambda: list(stub.FetchRound(pb.FetchRequest(node_id="dev-00004"), timeout=10))),
            "presence": outcome(lambda: next(stub.Presence(pb.PresenceRequest(node_id="dev-00004"), timeout=10))),
        }
        assert {k: v[0] for k, v in codes.items()} == dict.fromkeys(codes, S.UNAVAILABLE), codes
        assert proc.poll() is None  # still waiting for its cloud, not crashed
        channel.close()
    finally:
        proc.kill()
        proc.wait(10)


def test_bad_input_corpus(hfl_testbed):
    clean = hfl_testbed(overrides=OVERRIDES, skip_hosts=PLAYED)
    assert play(clean, attack=False) == {}
    clean_summary = clean.wait(timeout=300)

    attacked = hfl_testbed(overrides=OVERRIDES, skip_hosts=PLAYED)
    cases = play(attacked, attack=True)
    summary = attacked.wait(timeout=300)

    elapsed = cases.pop("_elapsed")
    cases.pop("_before_replay")
    assert elapsed < 45, f"the corpus took {elapsed:.0f}s: the edge's barrier may have timed out"
    distinct = [n for n in cases if not n.startswith("concurrent")]
    assert len(distinct) >= 60 and len(cases) - len(distinct) == CONCURRENT
    problems = []  # every failed expectation at once: one run shows the whole picture

    wrong = {name: (c.code.name, c.expect.name) for name, c in cases.items() if c.code != c.expect}
    if wrong:
        problems.append(f"{len(wrong)} of {len(cases)} messages got another status (got, expected): {wrong}")
    long_details = {n: len(c.detail.encode()) for n, c in cases.items()
                    if len(c.detail.encode()) >= (1024 if c.short_detail else 2048)}
    if long_details:
        problems.append(f"status details over 1 KiB (oversized ids) or 2 KiB (any), in bytes: {long_details}")

    # not one refused message changed an aggregate: same per-round results as the clean run with the same seed
    key = lambda rows: [(r["round"], r["accuracy"], r["loss"], r["train_loss"]) for r in rows]
    if key(attacked.metrics()) != key(clean.metrics()):
        problems.append(f"results changed: {key(attacked.metrics())} != clean {key(clean.metrics())}")
    if not summary["rounds"] == clean_summary["rounds"] == 2 or summary["final_accuracy"] != clean_summary["final_accuracy"]:
        problems.append(f"summary differs: {summary} vs clean {clean_summary}")

    # every message a service refused is counted (those gRPC itself turned away never reach a service)
    counted = sum(c.counted is True for c in cases.values())
    maybe = sum(c.counted is None for c in cases.values())
    per_round = [r["refused"] for r in attacked.metrics()]
    if clean_summary["refused"] != 0 or summary["refused"] != sum(per_round) or \
            not counted <= summary["refused"] <= counted + maybe:
        problems.append(f"refused: summary {summary['refused']}, per round {per_round}, expected {counted} "
                        f"(+ up to {maybe}; clean run: {clean_summary['refused']})")
    if per_round[0] < counted - 3:  # all but edge-000's three may come in round 1
        problems.append(f"refused in round 0: {per_round[0]} of {counted}")

    # nothing an attacker sent made a log line grow; no refusal logged a traceback
    for log in sorted((attacked.run_dir / "logs").glob("*.log")):
        text = log.read_bytes().decode(errors="replace")
        longest = max((len(line.encode()) for line in text.splitlines()), default=0)
        if longest > 2048:
            problems.append(f"{log.name}: a {longest}-byte log line")
        if "Traceback" in text:
            problems.append(f"{log.name}: a traceback: " + text[text.index("Traceback"):][:1500])
    assert not problems, "\n".join(problems)
