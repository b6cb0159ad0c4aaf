"""Cloud server: the edges' gRPC service. It checks every message against what it knows (the run, the round in
progress, each edge's cluster), keeps the edges' liveness (roster.py), and hands what it accepted to the round
driver (driver.py), which runs the rounds and writes the run directory.
"""
from __future__ import annotations

import asyncio
import logging
import pathlib

import grpc

from hfl.common import config as config_mod
from hfl.common import plans, relay_tag, rpc, topology, validate, wire
from hfl.common.observe import live, members as member_states
from hfl.common.channel.round_clock import BACKHAUL_BYTES
from hfl.common.privacy import on_wire
from hfl.common.rundir import check_run_dir
from hfl.common import session
from hfl.common.service_base import Gate, Refusals, refuse
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg

from .driver import RoundDriver
from .roster import EdgeRoster
from .store import EdgeResult

log = logging.getLogger("hfl.cloud")


class CloudServer(Gate, pbg.CloudServiceServicer):
    def __init__(self, cfg: config_mod.Config, run_dir: pathlib.Path, server: rpc.Server, admit=None,
                 resume: bool = False, plots: bool = True):
        self.server = server
        self.admit = admit
        self.roster = EdgeRoster(topology.edge_ids(cfg), cfg.net.rejoin_grace_s, cfg.net.presence_deadline_s)
        self.refusals = Refusals()
        self.stop = asyncio.Event()
        self.driver = RoundDriver(cfg, run_dir, resume, self.roster, self.refusals, self._traffic, self.stop, plots)
        self.spec_json = None  # set last in prepare(): until then every RPC answers UNAVAILABLE
        self.chunk_bytes = cfg.net.chunk_kib * 1024
        self.max_bytes = cfg.net.max_message_mb << 20
        self.bytes_up = 0
        self.bytes_down = 0

    # what the gate and observers read (common/service_base.py, common/observe/live.py)
    cfg = property(lambda self: self.driver.cfg)
    run_dir = property(lambda self: self.driver.run_dir)
    run_id = property(lambda self: self.driver.run_id)
    round = property(lambda self: self.driver.round)
    board = property(lambda self: self.driver.board)
    mode = property(lambda self: self.driver.mode)
    rows = property(lambda self: self.driver.rows)
    stop_reason = property(lambda self: self.driver.stop_reason)
    edges = property(lambda self: self.roster.edges)
    members = property(lambda self: self.roster.edges)  # the nodes below it (Gate)
    live = property(lambda self: self.roster.live)
    started = property(lambda self: self.roster.started)
    ready = property(lambda self: self.roster.ready)
    plan = property(lambda self: self.driver.plan)

    @property
    def on_round(self):
        return self.driver.on_round

    @on_round.setter
    def on_round(self, callback) -> None:
        self.driver.on_round = callback

    def prepare(self) -> None:
        """The driver's model and test set, then the run's spec signed for the edges: from here on RPCs are served."""
        spec = self.driver.prepare()
        self.spec_json = relay_tag.sign_spec(relay_tag.secret_from_env(), self.run_id, spec)

    async def run(self) -> int:
        await self.server.ready()
        return await self.driver.run()

    def _traffic(self) -> tuple[int, int]:
        counted, self.bytes_up, self.bytes_down = (self.bytes_up, self.bytes_down), 0, 0
        return counted

    # ---- edge-facing RPCs -------------------------------------------------------------------
    def _check_edge(self, context, node: str) -> None:
        if self.spec_json is None:
            raise wire.WireError(grpc.StatusCode.UNAVAILABLE, "the cloud is starting", "not_ready")
        validate.check_id(node, "node_id")
        if node not in self.edges:
            raise wire.WireError(grpc.StatusCode.PERMISSION_DENIED,
                                 f"{validate.short(node)} is not an edge of this run ({self.edges[0]}..{self.edges[-1]})",
                                 "unknown_edge")
        if self.admit is not None:
            self.admit(context, node, self.edges)  # mutual TLS: the certificate must name `node`

    def _authenticate(self, context, node: str, token: str | None = None) -> str:
        self._check_edge(context, node)
        return self.live.sessions.check(context, node, token)

    async def Register(self, request: pb.RegisterRequest, context) -> pb.RegisterReply:
        node = request.node_id
        try:
            self._check_edge(context, node)
            validate.check_id(request.run_id, "run_id", validate.MAX_RUN_ID)
            if request.run_id and request.run_id != self.run_id:
                raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"run {validate.short(request.run_id)} is not this cloud's run ({self.run_id})",
                                     "wrong_run")
            session.check_nonce(request.nonce)
            self.live.sessions.admit(node, request.nonce)
            if request.trust not in ("", "trusted", "untrusted"):
                raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"trust claim {validate.short(request.trust)}: trusted, untrusted or empty", "bad_register")
            if self.roster.started and not request.rejoin:
                raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"the run has started: {node} can only come back with rejoin", "started")
            session.check_join(context, node)  # last: a malformed request is refused for what is wrong with it
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        if not self.live.sessions.has(node) and (node in self.live.lost or node in self.live.absent):
            log.info("%s rejoined during round %d", node, self.round)
        if request.trust:
            self.roster.claims[node] = request.trust
        token = self.live.registered(node, request.nonce)
        return pb.RegisterReply(run_id=self.run_id, spec_json=self.spec_json, cluster_id="cloud", members=self.edges,
                                session_token=token, round=self.round if self.roster.started else -1)

    def fetching(self, node: str) -> None:
        self.roster.mark_ready(node)

    async def Air(self, request_iterator, context):
        """The wireless medium: one edge's emissions for an air slot in, what its devices receive out."""
        try:
            if self.spec_json is None:
                raise wire.WireError(grpc.StatusCode.UNAVAILABLE, "the cloud is starting", "not_ready")
            envelope, size = await wire.read_envelope(request_iterator, self.max_bytes)
            validate.check_meta(envelope.meta, self.cfg.run.rounds, len(self.driver.plan) or 1)
            self._authenticate(context, envelope.meta.sender_id)
            if envelope.meta.run_id != self.run_id:
                raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"air slot for run {validate.short(envelope.meta.run_id)}", "wrong_run")
            reply = await self.mode.air(envelope.meta.sender_id, envelope, self.round, self.driver.plan)
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        self.bytes_up += size
        if reply is None:  # not a retryable code: the edge must not take it for a lost cloud
            await context.abort(grpc.StatusCode.ABORTED, "the medium failed on this slot (see the cloud's log)")
        for chunk in wire.to_frames(reply, self.chunk_bytes):  # a head, then one envelope per device
            self.bytes_down += len(chunk.data)
            yield chunk

    def _validate(self, envelope: pb.Envelope) -> EdgeResult:
        meta, driver = envelope.meta, self.driver
        if meta.run_id != self.run_id:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, f"update for run {validate.short(meta.run_id)}",
                                 "wrong_run")
        if meta.round != driver.round or meta.phase != plans.CLOUD_SYNC:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"update for round {meta.round} ({validate.short(meta.phase)}), the cloud expects round "
                                 f"{driver.round} cloud_sync", "wrong_round")
        if meta.sender_id in driver.results:
            raise wire.WireError(grpc.StatusCode.ALREADY_EXISTS, f"{meta.sender_id} already submitted round {meta.round}",
                                 "replay")
        validate.check_count(meta.num_devices, "num_devices", 0, self.cfg.topology.devices_per_edge)
        validate.check_count(meta.num_samples, "num_samples", 0, driver.cluster_samples[meta.sender_id])
        scalars = validate.check_scalars(envelope.scalars, meta.sender_id)
        members = topology.edge_members(self.cfg, topology.edge_index(meta.sender_id))
        records = on_wire.from_transforms(meta.transforms, allowed=set(members))
        device_states = member_states.check_members(envelope.members, members, meta.sender_id)
        accepted = self.mode.accept(meta.sender_id, envelope, driver.round, records)
        scalars.update(accepted.scalars)
        return EdgeResult(accepted.delta, meta.num_devices, meta.num_samples, scalars, list(meta.transforms),
                          accepted.fused, device_states)

    async def Submit(self, request_iterator, context) -> pb.Ack:
        try:
            if self.spec_json is None:
                raise wire.WireError(grpc.StatusCode.UNAVAILABLE, "the cloud is starting", "not_ready")
            envelope, size = await wire.read_envelope(request_iterator, self.max_bytes)
            validate.check_meta(envelope.meta, self.cfg.run.rounds, 1 << 16)
            self._authenticate(context, envelope.meta.sender_id)
            result = self._validate(envelope)
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        node = envelope.meta.sender_id
        self.bytes_up += size
        result.scalars[BACKHAUL_BYTES] = float(size)  # measured here: the edge's emulated upload time
        await self.driver.accept(node, result)
        self.live.absent.discard(node)
        self.roster.mark_ready(node)
        return pb.Ack(accepted=True, detail=f"round {self.round} from {node}")


async def serve(cfg: config_mod.Config, listen: str, run_dir: str, port_file: str | None = None, server_credentials=None,
                admit=None, resume: bool = False, force: bool = False, web_tls=None, plots: bool = True) -> int:
    out = pathlib.Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_run_dir(out, resume, force)
    if not resume:
        (out / "config.toml").write_text(config_mod.to_toml(cfg))
    server = rpc.Server(listen, rpc.MAX_CHUNK, server_credentials)
    cloud = CloudServer(cfg, out, server, admit, resume, plots)
    rpc.add_servicer(pbg.add_CloudServiceServicer_to_server, cloud, server.server, cloud.malformed)
    await server.start(port_file)
    log.info("cloud listening on %s", server.address)
    web = await live.start_cloud(cloud, web_tls)  # the live page and /metrics (observe.listen)
    try:
        await asyncio.get_running_loop().run_in_executor(None, cloud.prepare)
        return await cloud.run()
    finally:
        cloud.stop.set()
        await web.close()
        await server.stop(cfg.net.grace_s)
