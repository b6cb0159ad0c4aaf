"""A device host: one OS process emulating many devices, each with its own identity, shard,
random stream and gRPC channel to its edge. Training runs off the event loop on one worker thread."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time

import grpc
import numpy as np
import torch

from hfl.common import config as config_mod
from hfl.common import host_credentials, modes, relay_tag, rpc, session, topology, wire
from hfl.common.session_stream import SessionStream
from hfl.common.data import dataset_digest
from hfl.common.models import build, num_parameters
from hfl.common.pipeline import Link
from hfl.common.privacy import instructions, on_wire
from hfl.common.seeding import torch_generator
from hfl.common.upstream import Upstream
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg

from . import feed, phases
from .phases import encode_overrides
from .modes import DevicePorts
from .trainer import Trainer, device_shards
from .training import Shard

log = logging.getLogger("hfl.devices")


class Device:
    """One emulated device. It survives refusals of its own messages (logged, counted; it sits out the
    rest of that round) and the death of its edge (reconnects with exponential backoff and jitter,
    registers again with `rejoin`, and takes whatever round the edge runs next)."""

    def __init__(self, node_id: str, cfg, run_id: str, shard: Shard, trainer: Trainer, link: Upstream, dim: int,
                 edge_id: str = ""):
        self.id = node_id
        self.edge_id = edge_id
        self.dim = dim
        self.cfg = cfg
        self.run_id = run_id
        self.shard = shard
        self.trainer = trainer
        self.link = link
        self.stream = SessionStream()  # its exchanges, on one stream per session with its edge
        self.feed = feed.Alone()  # how it fetches its round tasks: alone, or in its host's one fetch for its edge
        self.uplink = Link.device_uplink(cfg)
        self.downlink = Link.from_config(cfg.pipeline, "downlink")
        self.rounds_done = 0
        self.refused = 0
        self.diverged = 0  # rounds whose local training ended non-finite (sat out, nothing sent)
        self.reconnects = 0
        self.rejoin = False  # the first registration is a plain one unless the run is already under way
        self.give_up_after: float | None = None  # seconds of failed reconnections before the device stops
        self.mode = modes.build(cfg, "device", DevicePorts(cfg, node_id, run_id, self.index, dim, shard, trainer.run,
                                                           self._exchange, self.batches))

    index = property(lambda self: topology.device_index(self.id))  # its place in the run's seeded streams
    chunk_bytes = property(lambda self: self.cfg.net.chunk_kib * 1024)
    max_bytes = property(lambda self: self.cfg.net.max_message_mb << 20)

    def batches(self, round_: int, step: int) -> torch.Generator:
        return torch_generator(self.cfg.run.seed, "device", self.index, round_, step, "batches")

    async def register(self, rejoin: bool) -> None:
        await self.link.register(self.run_id, len(self.shard), rejoin=rejoin, timeout=30)

    async def _fetch(self, after: tuple[int, int]) -> tuple[pb.RoundTask, list[pb.Envelope]]:
        """The next round task, detached from the envelope that carried it, and that envelope in a list the round
        empties once it decoded the model (a sub-message would keep the whole envelope, model bytes and all); it may
        be the host's one fetch for its devices of this edge (feed.py), which nothing writes to."""
        envelope = await self.feed.next_after(self, after)
        task = pb.RoundTask()
        task.CopyFrom(envelope.task)
        return task, [envelope]

    async def _exchange(self, envelope: pb.Envelope) -> pb.Envelope:
        return await self.send(wire.chunked(envelope, self.chunk_bytes))

    async def send(self, chunks: list[pb.Chunk]) -> pb.Envelope:
        """One upload, its reply back, on the session's stream: the chunks leave the list as they are sent, so the
        upload's bytes are not held while the edge waits for the rest of its cluster."""
        return await self.stream.exchange(self.link.stub, chunks, self.max_bytes, self.link.metadata, self.link.token)

    def upload(self, task: pb.RoundTask, step: int, name: str, vec: np.ndarray, scalars: dict, dp=(),
                encode: dict | None = None) -> list[pb.Chunk]:
        tensor, transforms = self.uplink.send(vec, name, self.cfg.run.seed, self.index, task.round, step,
                                              {"encode": encode} if encode else None)
        transforms = list(transforms) + [on_wire.to_transform(r) for r in dp]
        transforms += self.mode.seal(task, step, tensor, transforms)
        meta = pb.Meta(run_id=self.run_id, round=task.round, phase=task.phases[step].kind, step=step,
                       sender_id=self.id, num_samples=len(self.shard), transforms=transforms, num_devices=1,
                       attempt=task.attempt)
        return wire.chunked(pb.Envelope(meta=meta, tensors=[tensor], scalars=scalars), self.chunk_bytes)

    async def run(self) -> str:
        after = (-1, 0)
        while True:
            try:
                if self.link.token is None:
                    await self.register(rejoin=self.rejoin)
                    if self.rejoin:
                        self.reconnects += 1
                        log.info("%s registered again with its edge", self.id)
                    self.rejoin = True
                    after = (-1, 0)  # a new session: take whatever round the edge runs now
                task, fetched = await self._fetch(after)
                if task.finished:
                    await self.link.close()
                    return "finished"
                if 0 <= after[0] < task.round - 1:  # rounds that did not draw this device (its edge sends it none)
                    self.mode.end_round(None)
                after = (task.round, task.attempt)
                try:
                    await self._round(task, fetched)
                except (ValueError, TypeError, RuntimeError, ArithmeticError) as exc:  # its training (a model's error)
                    raise RuntimeError(f"{self.id}: round {task.round} failed in its training: "
                                       f"{exc.__class__.__name__}: {exc}") from exc
                self.rounds_done += 1
                self.link.backoff.reset()
            except grpc.aio.AioRpcError as exc:
                if session.upstream_gone(exc) or session.session_lost(exc) or (
                        exc.code() == grpc.StatusCode.ALREADY_EXISTS and self.link.token is None):
                    log.warning("%s: edge unreachable or restarted (%s); reconnecting", self.id, exc.code().name)
                    self.link.lost()
                    try:
                        await self.link.backoff.sleep(self.give_up_after, f"edge {self.edge_id}")
                    except TimeoutError as gone:  # this device stops; the host's others go on
                        log.error("%s: %s", self.id, gone)
                        await self.link.close()
                        return "edge gone"
                    continue
                if exc.code() == grpc.StatusCode.ABORTED:
                    log.info("%s: %s", self.id, exc.details())
                    continue
                if self.link.token is None:  # the edge refuses to register us: nothing more to do
                    log.error("%s: registration refused: %s %s", self.id, exc.code().name, exc.details())
                    await self.link.close()
                    return "refused"
                self.refused += 1
                log.warning("%s: edge refused our message in round %s (%s: %s); sitting out the rest of the round",
                            self.id, after[0], exc.code().name, (exc.details() or "")[:300])
                await self.withdraw(after)
            except wire.WireError as exc:  # a reply we cannot read: treat like a refusal
                self.refused += 1
                log.warning("%s: unreadable reply in round %s: %s", self.id, after[0], exc)

    async def withdraw(self, after: tuple[int, int]) -> None:
        """Tell the edge not to wait for us for the rest of this round (best effort)."""
        meta = pb.Meta(run_id=self.run_id, round=after[0], attempt=after[1], sender_id=self.id, withdraw=True,
                       phase="withdraw")
        try:
            await self._exchange(pb.Envelope(meta=meta))
        except (grpc.aio.AioRpcError, wire.WireError) as exc:
            log.debug("%s: withdraw not taken: %s", self.id, exc)

    async def _round(self, task: pb.RoundTask, fetched: list[pb.Envelope]) -> None:
        """One round, each phase run by its registered handler (phases.py). A host's devices wait their turn on one
        training thread, then at the edges' barriers, holding the fewest model-sized arrays they can meanwhile (the
        envelope goes once the model is decoded, an upload's arrays once serialised, a reply once decoded)."""
        cluster = task.clusters[self.edge_id] if self.edge_id in task.clusters else pb.ClusterPlan()
        noise = instructions.read_device(cluster, self.id)  # refuses a plan it cannot execute as stated, up front
        if (cluster.participants or cluster.only_listed) and self.id not in cluster.participants:
            self.mode.end_round(None)  # not drawn: idle (sent no model), resynchronises from the next round's
            return
        w, _ = self.downlink.receive(wire.single_tensor(fetched.pop(), "model"), self.dim, self.cfg.run.seed,
                                     self.index, task.round, -1)
        w = self.mode.start_round(task, self.trainer.shared(w))
        release = on_wire.DeviceRelease(noise, task.phases, self.id, self.index, task.round, task.attempt,
                                        self.cfg.run.seed, self.cfg.privacy.noise_source)
        encode = encode_overrides(cluster.devices[self.id].params) if self.id in cluster.devices else None
        state = phases.RoundState(task, cluster, release, w, w, encode)  # the anchor is no copy: no update writes in place
        del w
        for step in range(len(task.phases)):
            # a device sits out the rest of a round it withdrew from, and steps the mode leaves it out of (e.g. it
            # failed the air downlink test th0 earlier in the round)
            if self.mode.takes_part(task, step) and not await phases.run(self, state, step):
                return
        self.mode.end_round(state.w)


class DeviceHost:
    """One process emulating devices of one or several edges. `edge_address` is one address or a list (each
    HOST:PORT or EDGE_ID=HOST:PORT): the host takes its share (`host_index` of `hosts`) of the union of their
    members (topology.union_slice), and every device dials its own edge. `identity` says what the devices
    present (common/host_credentials.py: nothing, one certificate for all, or each its own) and so which
    edges the host must discover."""

    def __init__(self, edge_address: str | list[str], host_index: int = 0, hosts: int = 1, identity=None,
                 wait_s: float = 300.0):
        self.edge_addresses = [edge_address] if isinstance(edge_address, str) else list(edge_address)
        if not self.edge_addresses:
            raise ValueError("a device host needs at least one edge address")
        self.host_index = host_index
        self.hosts = hosts
        self.identity = identity if identity is not None else host_credentials.SharedCredentials()
        self.wait_s = wait_s

    async def _discover(self, dial: host_credentials.Dial) -> pb.RegisterReply:
        probe = rpc.channel(dial.address, 2 << 20, dial.credentials, self.identity.override_host)
        try:
            await rpc.wait_serving(probe, self.wait_s, f"edge {dial.address}")
            reply = await pbg.EdgeServiceStub(probe).Register(pb.RegisterRequest(node_id=""))
        finally:
            await probe.close()
        if dial.edge is not None and reply.cluster_id != dial.edge:
            raise ValueError(f"{dial.address} serves {reply.cluster_id}, not {dial.edge}")
        return reply

    @staticmethod
    def _checked_spec(replies: list[pb.RegisterReply]) -> tuple[config_mod.Config, dict]:
        """The run's config from the edges' discovery replies, trusted only as far as it can be checked: the cloud's
        tag on the spec (with the relay secret), one run and one spec for every edge, each edge's members as the
        topology gives them, and no plugin this host did not load itself."""
        secret = relay_tag.secret_from_env()
        specs = [relay_tag.check_spec(secret, r.run_id, r.spec_json, r.cluster_id) for r in replies]
        if any(r.run_id != replies[0].run_id or s != specs[0] for r, s in zip(replies, specs)):
            raise config_mod.ConfigError("the edges describe different runs: " + ", ".join(f"{r.cluster_id} {r.run_id}" for r in replies))
        cfg = config_mod.from_dict(specs[0]["config"], remote=True)
        for r in replies:
            expected = topology.edge_members(cfg, topology.edge_index(r.cluster_id))
            if list(r.members) != expected:
                raise config_mod.ConfigError(f"{r.cluster_id} lists members {r.members[:3]}..., not its devices in the run's "
                                 f"topology ({expected[0]}..{expected[-1]})")
        return cfg, specs[0]

    async def run(self) -> int:
        started = time.monotonic()
        _raise_fd_limit()
        dials = self.identity.dials(self.edge_addresses, self.host_index, self.hosts)
        if not dials:
            log.warning("no devices for host %d of %d", self.host_index, self.hosts)
            return 0
        replies = await asyncio.gather(*(self._discover(d) for d in dials))
        cfg, spec = self._checked_spec(replies)
        torch.set_num_threads(cfg.train.torch_threads)
        ids = self.identity.devices(list(zip(dials, replies)), self.host_index, self.hosts)
        clusters = ", ".join(r.cluster_id for r in replies)
        if not ids:
            log.warning("no devices for host %d of %d on %s", self.host_index, self.hosts, clusters)
            return 0
        home = {}  # device -> (its edge's address, its edge's reply)
        for dial, reply in zip(dials, replies):
            for m in reply.members:
                home.setdefault(m, (dial.address, reply))
        edges_here = sorted({home[n][1].cluster_id for n in ids})
        log.info("host %d/%d of %s: %d devices (%s..%s) of %d edge(s)", self.host_index, self.hosts, clusters, len(ids),
                 ids[0], ids[-1], len(edges_here))
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="train")
        try:
            shards, data = await asyncio.get_running_loop().run_in_executor(executor, device_shards, cfg, ids)
            digest = dataset_digest(data)
            if spec.get("data_digest") not in (None, digest):
                raise config_mod.ConfigError(
                    f"dataset {cfg.data.dataset!r} differs here from the cloud's (digest {digest}, the "
                    f"cloud's {spec['data_digest']}): a dataset must give the same arrays in every process (a plugin "
                    f"dataset: seed it, and read the same files)")
            model = build(cfg.model.name, data.input_shape, data.num_classes)
            del data
            trainer = Trainer.placed(model, executor, cfg, self.host_index)
            # the largest message a device takes: ExchangeOne's reply is a whole envelope, up to max_message_mb
            message = max(cfg.net.chunk_kib * 1024, cfg.net.max_message_mb << 20)
            dim = num_parameters(model)
            devices = []
            for node in ids:
                address, reply = home[node]
                link = Upstream(node, address, message, wire.edge_stub, self.identity.for_device(node),
                                self.identity.override_host)
                device = Device(node, cfg, reply.run_id, shards.pop(node), trainer, link, dim, reply.cluster_id)
                device.rejoin = reply.round >= 0  # the run is under way: this host restarted
                device.give_up_after = self.wait_s  # an edge unreachable for this long ended, or died for good
                devices.append(device)
            log.info("%d devices ready in %.1fs", len(devices), time.monotonic() - started)
            outcomes = await feed.run_all(devices, message, cfg.net.host_fetch and self.identity.shared)
            log.info("devices done: %s; refusals of our messages: %d; diverged rounds: %d; reconnections: %d",
                     {o: outcomes.count(o) for o in set(outcomes)}, sum(d.refused for d in devices),
                     sum(d.diverged for d in devices), sum(d.reconnects for d in devices))
            return 0
        finally:
            executor.shutdown(wait=False, cancel_futures=True)


def _raise_fd_limit() -> None:
    """Every emulated device holds its own connection (one descriptor each): lift the soft limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20), hard))
    except (ImportError, ValueError, OSError) as exc:
        log.debug("cannot raise the descriptor limit: %s", exc)
