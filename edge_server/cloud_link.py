"""The edge's upward client: it joins the cloud's run, and every call it makes (fetch a round, an air slot, submit
the cluster's result) survives a cloud that died or restarted: it reconnects with backoff, registers again with
rejoin and retries."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import grpc

from hfl.common import config as config_mod
from hfl.common import rpc, session, topology, validate, wire
from hfl.common.upstream import Upstream
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg

log = logging.getLogger("hfl.edge")


@dataclass(frozen=True)
class Joined:
    """The run an edge joined, as the cloud's signed spec states it."""

    cfg: config_mod.Config
    spec_json: str
    run_id: str
    dim: int
    members: list[str]
    samples: dict[str, int]  # each member's sample count in the run's partition
    round: int               # the round the run is in (-1: not started)

    def check_member(self, node: str, edge: str) -> None:
        validate.check_id(node, "node_id")
        if node not in self.samples:
            raise wire.WireError(grpc.StatusCode.PERMISSION_DENIED,
                                 f"{validate.short(node)} is not a device of {edge} "
                                 f"(members {self.members[0]}..{self.members[-1]})", "unknown_device")

    def check_samples(self, node: str, claimed: int) -> None:
        """A registration's sample count against the run's partition."""
        limit = self.cfg.net.max_samples_per_device
        if not 1 <= claimed <= limit:
            raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, f"num_samples = {claimed} outside [1, {limit}]",
                                 "bad_register")
        if claimed != self.samples[node]:
            raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{node} claims {claimed} samples; the run's partition gives it {self.samples[node]}",
                                 "bad_register")


class CloudLink:
    def __init__(self, node_id: str, address: str, credentials=None, override_host: str | None = None,
                 wait_s: float = 300.0, trust: str = "", rejoin_first: bool = False):
        self.id = node_id
        self.address = address
        self.credentials = credentials
        self.override_host = override_host
        self.wait_s = wait_s
        self.trust = trust  # "untrusted" lowers the cloud's policy for this site; it can never raise it
        self.rejoin_first = rejoin_first  # started for a resumed run: register with rejoin, not refused first
        self.upstream: Upstream | None = None
        self.run_id = ""
        self.max_bytes = 2 << 20

    async def join(self) -> Joined:
        probe = rpc.channel(self.address, 2 << 20, self.credentials, self.override_host)
        await rpc.wait_serving(probe, self.wait_s, f"cloud {self.address}")
        await probe.close()
        self.upstream = Upstream(self.id, self.address, rpc.MAX_CHUNK, pbg.CloudServiceStub, self.credentials,
                                 self.override_host)
        try:
            reply = await self.upstream.register("", rejoin=self.rejoin_first, trust=self.trust)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            reply = await self.upstream.register("", rejoin=True, trust=self.trust)  # restarted while the run goes on
            log.info("%s rejoined its run at round %d (restarted while the run went on)", self.id, reply.round)
        spec = json.loads(reply.spec_json)
        cfg = config_mod.from_dict(spec["config"], check_choices=False, remote=True)
        members = topology.edge_members(cfg, topology.edge_index(self.id))
        counts = spec.get("samples")
        samples = {m: int(counts[topology.device_index(m)]) for m in members} if counts else {}
        self.run_id = reply.run_id
        self.max_bytes = cfg.net.max_message_mb << 20
        return Joined(cfg, reply.spec_json, reply.run_id, int(spec["model_dim"]), members, samples, reply.round)

    async def call(self, call, what: str):
        """Run `call()` against the cloud; if the cloud died or restarted, reconnect with backoff, register
        again (rejoin) and retry. Refusals other than a lost session propagate."""
        cloud = self.upstream
        while True:
            try:
                if cloud.token is None:
                    reply = await cloud.register(self.run_id, rejoin=True, timeout=10, trust=self.trust)
                    if reply.run_id != self.run_id:
                        raise RuntimeError(f"the cloud now serves run {reply.run_id}, not {self.run_id}")
                    log.info("%s registered again with the cloud (round %d)", self.id, reply.round)
                result = await call()
                cloud.backoff.reset()
                return result
            except grpc.aio.AioRpcError as exc:
                if not (session.upstream_gone(exc) or session.session_lost(exc)
                        or exc.code() == grpc.StatusCode.ALREADY_EXISTS and cloud.token is None):
                    raise
                log.warning("%s: cloud unreachable or restarted during %s (%s); retrying", self.id, what, exc.code().name)
                cloud.lost()
                await cloud.backoff.sleep(self.wait_s, f"cloud {self.address}")

    async def air(self, chunks: list, what: str, devices: int) -> list[pb.Envelope]:
        """A shared slot on the cloud's medium: the head, then one envelope per device."""
        async def call():
            stream = self.upstream.stub.Air(iter(chunks), metadata=self.upstream.metadata)
            return (await wire.read_envelopes(stream, self.max_bytes, 1 + devices))[0]

        return await self.call(call, what)

    async def fetch(self, after: int) -> pb.Envelope:
        async def call():
            stream = self.upstream.stub.FetchRound(pb.FetchRequest(run_id=self.run_id, node_id=self.id,
                                                                   after_round=after), metadata=self.upstream.metadata)
            return (await wire.read_envelope(stream, self.max_bytes))[0]

        return await self.call(call, f"fetch after round {after}")

    async def submit(self, chunks: list, round_: int) -> None:
        """The cluster's result of `round_`; a refusal is logged, never raised (the edge goes on with the next round)."""
        async def call():
            return await self.upstream.stub.Submit(iter(chunks), metadata=self.upstream.metadata)

        try:
            await self.call(call, f"submit of round {round_}")
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.ALREADY_EXISTS:
                log.info("%s: the cloud already has round %d from this edge", self.id, round_)
            else:
                log.error("cloud refused round %d from %s: %s %s", round_, self.id, exc.code().name, exc.details())

    async def close(self) -> None:
        if self.upstream is not None:
            await self.upstream.close()
