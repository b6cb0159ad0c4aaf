"""Cloud server: drives the run, aggregates edge results, evaluates every round, writes the run directory."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import pathlib
import time
import uuid
from dataclasses import dataclass

import grpc
import numpy as np
import torch

from hfl.common import config as config_mod
from hfl.common import metrics, plans, rpc, topology, wire
from hfl.common.data import load_dataset
from hfl.common.models import build, get_flat, init_parameters, num_parameters
from hfl.common.pipeline import Link, aggregate
from hfl.common.seeding import torch_generator
from hfl.common.service_base import Refusals, RoundBoard, refuse
from hfl.device_client.training import evaluate, make_shard
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg

log = logging.getLogger("hfl.cloud")


@dataclass
class EdgeResult:
    delta: np.ndarray
    devices: int
    samples: int
    scalars: dict


class CloudServer(pbg.CloudServiceServicer):
    def __init__(self, cfg: config_mod.Config, run_dir: pathlib.Path, server: rpc.Server, admit=None):
        self.cfg = cfg
        self.run_dir = run_dir
        self.server = server
        self.admit = admit
        self.run_id = f"{cfg.run.name}-{uuid.uuid4().hex[:8]}"
        self.edges = topology.edge_ids(cfg)
        self.registered: set[str] = set()
        self.alive: set[str] = set()
        self.dropped: set[str] = set()
        self.refusals = Refusals()
        self.board = RoundBoard()
        self.round = -1
        self.results: dict[str, EdgeResult] = {}
        self.all_in = asyncio.Event()
        self.joined = asyncio.Event()
        self.chunk_bytes = cfg.net.chunk_kib * 1024
        self.max_bytes = cfg.net.max_message_mb << 20
        self.backhaul = Link.from_config(cfg.pipeline, "backhaul")
        self.downlink = Link.from_config(cfg.pipeline, "downlink")
        self.bytes_up = 0
        self.bytes_down = 0

    def prepare(self) -> None:
        """Load the test set and build the initial model (seeded by the run seed alone)."""
        torch.set_num_threads(self.cfg.train.torch_threads)
        data = load_dataset(self.cfg.data)
        x_te, y_te = data.x_test, data.y_test
        if self.cfg.data.max_test_samples:
            x_te, y_te = x_te[: self.cfg.data.max_test_samples], y_te[: self.cfg.data.max_test_samples]
        self.test = make_shard(x_te, y_te, data.mean, data.std)
        self.model = build(self.cfg.model.name, data.input_shape, data.num_classes)
        init_parameters(self.model, torch_generator(self.cfg.run.seed, "cloud", 0, 0, "init"))
        self.w = get_flat(self.model)
        self.dim = num_parameters(self.model)
        self.spec_json = json.dumps({"config": config_mod.to_dict(self.cfg), "model_dim": self.dim})
        log.info("model %s: %d parameters; %d test samples; run %s", self.cfg.model.name, self.dim, len(self.test), self.run_id)

    # ---- edge-facing RPCs -------------------------------------------------------------------
    def _check_edge(self, context, node: str) -> None:
        if node not in self.edges:
            raise wire.WireError(grpc.StatusCode.PERMISSION_DENIED,
                                 f"{node!r} is not an edge of this run ({self.edges[0]}..{self.edges[-1]})", "unknown_edge")
        if self.admit is not None:
            self.admit(context, node, self.edges)  # mutual TLS: the certificate must name `node`
        if node in self.dropped:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, f"{node} was dropped from this run", "dropped")

    async def Register(self, request: pb.RegisterRequest, context) -> pb.RegisterReply:
        try:
            self._check_edge(context, request.node_id)
            if self.round >= 0 and request.node_id not in self.alive:
                raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, "the run has started without this edge", "late")
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        self.registered.add(request.node_id)
        return pb.RegisterReply(run_id=self.run_id, spec_json=self.spec_json, cluster_id="cloud", members=self.edges)

    async def FetchRound(self, request: pb.FetchRequest, context):
        try:
            self._check_edge(context, request.node_id)
            if request.node_id not in self.registered:
                raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, f"{request.node_id} has not registered",
                                     "not_registered")
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        if request.after_round < 0 and self.round < 0:
            self.alive.add(request.node_id)
            if set(self.edges) <= self.alive:
                self.joined.set()
        round_, chunks, size = await self.board.wait_after(request.after_round)
        for chunk in chunks:
            yield chunk
        self.bytes_down += size
        await self.board.mark_fetched(round_, request.node_id)

    def _validate(self, envelope: pb.Envelope, context) -> EdgeResult:
        meta = envelope.meta
        self._check_edge(context, meta.sender_id)
        if meta.sender_id not in self.alive:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, f"{meta.sender_id} is not part of this run", "not_joined")
        if meta.run_id != self.run_id:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, f"update for run {meta.run_id!r}", "wrong_run")
        if meta.round != self.round or meta.phase != plans.CLOUD_SYNC:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"update for round {meta.round} ({meta.phase}), the cloud expects round {self.round} cloud_sync",
                                 "wrong_round")
        if meta.sender_id in self.results:
            raise wire.WireError(grpc.StatusCode.ALREADY_EXISTS, f"{meta.sender_id} already submitted round {meta.round}", "replay")
        if meta.num_devices < 0 or meta.num_samples < 0:
            raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, "negative device or sample count", "bad_counts")
        idx = topology.edge_index(meta.sender_id)
        delta, _ = self.backhaul.receive(wire.single_tensor(envelope, "delta"), self.dim, self.cfg.run.seed, idx,
                                         self.round, meta.step)
        scalars = {k: v for k, v in envelope.scalars.items() if np.isfinite(v)}
        return EdgeResult(delta, meta.num_devices, meta.num_samples, scalars)

    async def Submit(self, request_iterator, context) -> pb.Ack:
        try:
            envelope, size = await wire.read_envelope(request_iterator, self.max_bytes)
            result = self._validate(envelope, context)
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        self.bytes_up += size
        self.results[envelope.meta.sender_id] = result
        if self.alive <= set(self.results):
            self.all_in.set()
        return pb.Ack(accepted=True, detail=f"round {self.round} from {envelope.meta.sender_id}")

    # ---- the run ----------------------------------------------------------------------------
    async def run(self) -> int:
        cfg = self.cfg
        metrics_path = self.run_dir / "metrics.jsonl"
        metrics_path.unlink(missing_ok=True)
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="eval")
        loop = asyncio.get_running_loop()
        await self.server.ready()
        log.info("waiting for %d edges", len(self.edges))
        try:
            await asyncio.wait_for(self.joined.wait(), cfg.net.join_timeout_s)
        except asyncio.TimeoutError:
            pass
        if not self.alive:
            raise RuntimeError(f"no edge joined within {cfg.net.join_timeout_s}s")
        self.dropped |= set(self.edges) - self.alive
        if self.dropped:
            log.warning("starting without edges %s", sorted(self.dropped))
        plan = plans.build_plan(cfg)
        started = time.monotonic()
        cloud_weights = plans.weights_rule(cfg, "cloud")
        rows = []
        for r in range(cfg.run.rounds):
            round_started = time.monotonic()
            self.round = r
            self.results = {}
            self.all_in.clear()
            tensor = self.downlink.send(self.w, "model", cfg.run.seed, 0, r, -1)[0]
            task = pb.RoundTask(round=r, phases=plan)
            await self.board.publish(r, pb.Envelope(meta=pb.Meta(run_id=self.run_id, round=r, sender_id="cloud"),
                                                    tensors=[tensor], task=task), self.chunk_bytes)
            try:
                await asyncio.wait_for(self.all_in.wait(), cfg.net.phase_timeout_s * (len(plan) + 1))
            except asyncio.TimeoutError:
                missing = self.alive - set(self.results)
                log.warning("round %d: no result from %s; dropping them", r, sorted(missing))
                self.alive -= missing
                self.dropped |= missing
            self.w = self._aggregate(cloud_weights)
            self._checkpoint(r)
            row = await loop.run_in_executor(executor, self._evaluate, r, rows)
            row.update(self._round_stats(r, started, round_started))
            rows.append(row)
            metrics.append_jsonl(metrics_path, row)
            log.info("round %d: accuracy %s loss %s (%.2fs)", r, row["accuracy"], row["loss"], row["round_seconds"])
            if not self.alive:
                log.error("every edge is gone; stopping")
                break
        await self._finish(rows, started)
        executor.shutdown(wait=False)
        return 0 if self.alive else 1

    def _checkpoint(self, r: int) -> None:
        """The global model after round r, replaced atomically so a crash never leaves half a file."""
        tmp = self.run_dir / "checkpoint.tmp.npz"
        np.savez(tmp, round=r, weights=self.w, model=self.cfg.model.name, run_id=self.run_id)
        tmp.replace(self.run_dir / "checkpoint.npz")

    def _aggregate(self, rule: str) -> np.ndarray:
        names = sorted(n for n, res in self.results.items() if res.devices > 0)  # arrival order must not matter
        if not names:
            return self.w
        weights = [self.results[n].samples if rule == "samples" else self.results[n].devices for n in names]
        # w_{t+1} = w_t + sum_l (N_l / N) delta_l  (or sample counts), in float64
        step = aggregate(self.cfg.pipeline.aggregate, [self.results[n].delta for n in names], weights)
        return (self.w.astype(np.float64) + step).astype(np.float32)

    def _evaluate(self, r: int, rows: list) -> dict:
        last = r == self.cfg.run.rounds - 1
        if r % self.cfg.run.eval_every and not last:
            return {"round": r, "accuracy": None, "loss": None, "eval_seconds": 0.0}
        started = time.monotonic()
        accuracy, loss = evaluate(self.model, self.w, self.test)
        return {"round": r, "accuracy": accuracy, "loss": loss, "eval_seconds": time.monotonic() - started}

    def _round_stats(self, r: int, started: float, round_started: float) -> dict:
        res = self.results.values()
        train = [(x.scalars["train_loss"], x.devices) for x in res if "train_loss" in x.scalars and x.devices]
        stats = {
            "bytes_up": int(self.bytes_up + sum(x.scalars.get("bytes_up", 0) for x in res)),
            "bytes_down": int(self.bytes_down + sum(x.scalars.get("bytes_down", 0) for x in res)),
            "refused": int(self.refusals.take() + sum(x.scalars.get("refused", 0) for x in res)),
            "dropped_devices": int(sum(x.scalars.get("dropped", 0) for x in res)),
            "edges": len(self.results),
            "devices": int(sum(x.devices for x in res)),
            "train_loss": (sum(l * n for l, n in train) / sum(n for _, n in train)) if train else None,
            "round_seconds": time.monotonic() - round_started,
            "wall_seconds": time.monotonic() - started,
        }
        self.bytes_up = self.bytes_down = 0
        return stats

    async def _finish(self, rows: list, started: float) -> None:
        final = self.round + 1
        await self.board.publish(final, pb.Envelope(meta=pb.Meta(run_id=self.run_id, round=final, sender_id="cloud"),
                                                    task=pb.RoundTask(round=final, finished=True)), self.chunk_bytes)
        missing = await self.board.wait_fetched(final, set(self.alive), self.cfg.net.grace_s + 10)
        if missing:
            log.warning("edges that did not collect the final task: %s", sorted(missing))
        evaluated = [r for r in rows if r["accuracy"] is not None]
        summary = {
            "run_id": self.run_id,
            "algorithm": self.cfg.run.algorithm,
            "seed": self.cfg.run.seed,
            "rounds": len(rows),
            "final_accuracy": evaluated[-1]["accuracy"] if evaluated else None,
            "final_loss": evaluated[-1]["loss"] if evaluated else None,
            "best_accuracy": max((r["accuracy"] for r in evaluated), default=None),
            "wall_seconds": time.monotonic() - started,
            "bytes_up": sum(r["bytes_up"] for r in rows),
            "bytes_down": sum(r["bytes_down"] for r in rows),
            "refused": sum(r["refused"] for r in rows) + self.refusals.take(),
            "refused_by_reason_at_cloud": dict(self.refusals.total),
            "dropped_edges": sorted(self.dropped),
            "model": self.cfg.model.name,
            "model_parameters": self.dim,
            "dataset": self.cfg.data.dataset,
            "devices": self.cfg.num_devices,
            "edges": self.cfg.topology.edges,
            "weights": {"edge": plans.weights_rule(self.cfg, "edge"), "cloud": plans.weights_rule(self.cfg, "cloud")},
        }
        metrics.write_json(self.run_dir / "summary.json", summary)
        title = f"{self.cfg.run.algorithm} on {self.cfg.data.dataset} ({self.cfg.num_devices} devices, {len(self.edges)} edges)"
        try:
            metrics.plot_accuracy(rows, self.run_dir / "accuracy.png", title)
        except Exception:  # a plot must never cost the results
            log.exception("could not draw the accuracy plot")
        log.info("finished: final accuracy %s after %d rounds in %.1fs", summary["final_accuracy"], len(rows),
                 summary["wall_seconds"])


async def serve(cfg: config_mod.Config, listen: str, run_dir: str, port_file: str | None = None, server_credentials=None,
                admit=None) -> int:
    out = pathlib.Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(config_mod.to_toml(cfg))
    server = rpc.Server(listen, rpc.MAX_CHUNK, server_credentials)
    cloud = CloudServer(cfg, out, server, admit)
    pbg.add_CloudServiceServicer_to_server(cloud, server.server)
    await server.start(port_file)
    log.info("cloud listening on %s", server.address)
    try:
        await asyncio.get_running_loop().run_in_executor(None, cloud.prepare)
        return await cloud.run()
    finally:
        await server.stop(cfg.net.grace_s)
