"""A raw gRPC client speaking hfl.v1 by hand, to play a device or an edge in tests."""
from __future__ import annotations

import json
import threading
import time

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hfl.common import session, wire
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg


def status_of(fn) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def stream(envelope_or_bytes) -> list[pb.Chunk]:
    payload = envelope_or_bytes if isinstance(envelope_or_bytes, bytes) else envelope_or_bytes.SerializeToString()
    return list(wire.to_chunks(payload, 1 << 20))


def wait_serving(channel: grpc.Channel, timeout: float = 120.0, what: str = "the server") -> None:
    """Until the server behind `channel` reports SERVING on its health service: its own readiness signal (an edge
    reports it once it has joined its cloud; before, it answers every request UNAVAILABLE). A port file says only
    that the socket listens. UNAVAILABLE (not listening yet) and NOT_SERVING are "not yet"; any other error is not."""
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=max(1.0, deadline - time.monotonic()))
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
            last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            last = f"{exc.code().name}: {exc.details()}"
        assert time.monotonic() < deadline, f"{what} not SERVING within {timeout:.0f}s ({last})"
        time.sleep(0.1)


class RawDevice:
    def __init__(self, address: str, node_id: str, num_samples: int = 400, insider: bool = True):
        self.insider = insider  # holds the run's join secret (HFL_JOIN_SECRET, set for the test session)
        self.channel = grpc.insecure_channel(address)
        grpc.channel_ready_future(self.channel).result(timeout=60)
        self.stub = pbg.EdgeServiceStub(self.channel)
        self.id = node_id
        self.num_samples = num_samples
        discovery = self.discover(deadline=time.monotonic() + 120)
        self.run_id = discovery.run_id
        spec = json.loads(discovery.spec_json)
        self.dim = spec["model_dim"]
        if node_id.startswith("dev-") and node_id[4:].isdigit() and int(node_id[4:]) < len(spec["samples"]):
            self.num_samples = spec["samples"][int(node_id[4:])]  # the claim the edge checks
        self.token = ""
        self.presence = None

    def discover(self, deadline: float) -> pb.RegisterReply:
        # An edge answers UNAVAILABLE until it has joined the cloud; wait_for_ready covers only the socket.
        while True:
            try:
                return self.stub.Register(pb.RegisterRequest(node_id=""), wait_for_ready=True,
                                          timeout=max(1.0, deadline - time.monotonic()))
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    @property
    def metadata(self):
        return session.metadata(self.token)

    def register(self, num_samples: int | None = None, rejoin: bool = False, hold_presence: bool = True):
        reply = self.stub.Register(pb.RegisterRequest(run_id=self.run_id, node_id=self.id, rejoin=rejoin,
                                                      num_samples=self.num_samples if num_samples is None else num_samples),
                                   metadata=session.join_metadata() if self.insider else ())
        self.token = reply.session_token
        if hold_presence:  # a live session, as a real device holds it
            self.presence = self.stub.Presence(pb.PresenceRequest(run_id=self.run_id, node_id=self.id),
                                               metadata=self.metadata)
            next(self.presence)
        return reply

    def fetch(self, after: int, attempt: int = 0, metadata=None) -> pb.Envelope:
        call = self.stub.FetchRound(pb.FetchRequest(run_id=self.run_id, node_id=self.id, after_round=after,
                                                    after_attempt=attempt), metadata=metadata or self.metadata)
        return wire.read_envelope_sync(call)[0]

    def envelope(self, round_: int, step: int, phase: str, vec=None, sender=None, tensor=None, attempt: int = 0,
                 scalars=None) -> pb.Envelope:
        if tensor is None:
            tensor = wire.encode(np.zeros(self.dim, np.float32) if vec is None else vec, "float32", "delta")
        meta = pb.Meta(run_id=self.run_id, round=round_, phase=phase, step=step, sender_id=sender or self.id,
                       num_samples=self.num_samples, num_devices=1, attempt=attempt)
        return pb.Envelope(meta=meta, tensors=[tensor], scalars=scalars or {})

    def exchange(self, payload, metadata=None) -> pb.Envelope:
        return wire.read_envelope_sync(self.stub.Exchange(iter(stream(payload)), metadata=metadata or self.metadata))[0]

    def wait_held(self, upload: pb.Envelope, timeout: float = 60.0) -> int:
        """Until the edge holds `upload` (this device's, sent in the background): then an upload of the same round,
        attempt and phase with a vector of the wrong shape is refused as a replay (ALREADY_EXISTS), and before, for its
        shape (INVALID_ARGUMENT), which changes nothing. The edge's own answer, not a guess at how long it takes under
        load. Returns how many probes were sent: the edge refused (and counted) every one."""
        meta = upload.meta
        probe = self.envelope(meta.round, meta.step, meta.phase, vec=np.zeros(self.dim - 1, np.float32),
                              attempt=meta.attempt)
        deadline = time.monotonic() + timeout
        sent = 1
        while (code := status_of(lambda: self.exchange(probe))) != grpc.StatusCode.ALREADY_EXISTS:
            assert code == grpc.StatusCode.INVALID_ARGUMENT, f"a probe of {self.id}'s upload got {code}"
            assert time.monotonic() < deadline, f"the edge did not take {self.id}'s upload within {timeout:.0f}s"
            time.sleep(0.1)
            sent += 1
        return sent

    def exchange_in_background(self, payload) -> threading.Thread:
        result = {}

        def run():
            try:
                result["reply"] = self.exchange(payload)
            except grpc.RpcError as exc:
                result["error"] = exc.code()

        thread = threading.Thread(target=run, daemon=True)
        thread.result = result
        thread.start()
        return thread


class RawEdge:
    def __init__(self, address: str, token: str = ""):
        self.channel = grpc.insecure_channel(address)
        self.stub = pbg.CloudServiceStub(self.channel)
        self.token = token

    def register(self, node_id: str, rejoin: bool = False):
        reply = self.stub.Register(pb.RegisterRequest(node_id=node_id, rejoin=rejoin), timeout=30,
                                   metadata=session.join_metadata())
        self.token = reply.session_token
        return reply

    def submit(self, envelope_or_bytes, metadata=None) -> pb.Ack:
        return self.stub.Submit(iter(stream(envelope_or_bytes)), metadata=metadata or session.metadata(self.token))
