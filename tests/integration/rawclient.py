"""A raw gRPC client speaking hfl.v1 by hand, to play a device or an edge in tests."""
from __future__ import annotations

import json
import threading

import grpc
import numpy as np

from hfl.common import wire
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


class RawDevice:
    def __init__(self, address: str, node_id: str, num_samples: int = 400):
        self.channel = grpc.insecure_channel(address)
        grpc.channel_ready_future(self.channel).result(timeout=60)
        self.stub = pbg.EdgeServiceStub(self.channel)
        self.id = node_id
        self.num_samples = num_samples
        discovery = self.stub.Register(pb.RegisterRequest(node_id=""), wait_for_ready=True, timeout=120)
        self.run_id = discovery.run_id
        self.dim = json.loads(discovery.spec_json)["model_dim"]

    def register(self):
        return self.stub.Register(pb.RegisterRequest(run_id=self.run_id, node_id=self.id, num_samples=self.num_samples))

    def fetch(self, after: int) -> pb.Envelope:
        return wire.read_envelope_sync(self.stub.FetchRound(pb.FetchRequest(run_id=self.run_id, node_id=self.id,
                                                                            after_round=after)))[0]

    def envelope(self, round_: int, step: int, phase: str, vec=None, sender=None, tensor=None) -> pb.Envelope:
        if tensor is None:
            tensor = wire.encode(np.zeros(self.dim, np.float32) if vec is None else vec, "float32", "delta")
        meta = pb.Meta(run_id=self.run_id, round=round_, phase=phase, step=step, sender_id=sender or self.id,
                       num_samples=self.num_samples, num_devices=1)
        return pb.Envelope(meta=meta, tensors=[tensor])

    def exchange(self, payload) -> pb.Envelope:
        return wire.read_envelope_sync(self.stub.Exchange(iter(stream(payload))))[0]

    def exchange_in_background(self, payload) -> threading.Thread:
        result = {}
        thread = threading.Thread(target=lambda: result.update(reply=self.exchange(payload)), daemon=True)
        thread.result = result
        thread.start()
        return thread


class RawEdge:
    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.stub = pbg.CloudServiceStub(self.channel)

    def submit(self, envelope_or_bytes) -> pb.Ack:
        return self.stub.Submit(iter(stream(envelope_or_bytes)))
