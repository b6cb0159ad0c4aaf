"""Cloud server: drives the run, aggregates edge results, evaluates every round, writes the run directory.

Nothing it acknowledged is lost in a crash: an accepted edge result is written to `pending/` before the
edge gets its Ack, and every round ends with an atomic checkpoint. `--resume` continues the same run id
from the checkpoint; edges and devices reconnect on their own.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import pathlib
import time
import uuid

import grpc
import numpy as np
import torch

from hfl.common import config as config_mod
from hfl.common import metrics, modes, plans, relay_tag, robust, rpc, session, topology, validate, wire
from hfl.common.observe import live, members as member_states
from hfl.common.channel.round_clock import BACKHAUL_BYTES, CloudClock
from hfl.common.privacy import on_wire
from hfl.common.rundir import check_run_dir, plot_data_report, write_data_report
from hfl.common.data import load_dataset
from hfl.common.models import build, get_flat, init_parameters, num_parameters
from hfl.common.partition import data_report, partition
from hfl.common.pipeline import Link
from hfl.common.quantization.schedule import RoundSchedule
from hfl.common.seeding import numpy_rng, torch_generator
from hfl.common.service_base import Gate, Liveness, Refusals, RoundBoard, refuse
from hfl.common.privacy.proxy_clip import resolve_clip
from hfl.common.shard import evaluate, make_shard
from hfl.proto import hfl_v1_pb2 as pb
from hfl.proto import hfl_v1_pb2_grpc as pbg

from .modes import CloudPorts, RoundRefused
from .round_wrappers import wrap
from .store import EdgeResult, RunStore

log = logging.getLogger("hfl.cloud")


def launch_to_now() -> float:
    """Seconds since the run was launched (HFL_LAUNCHED_AT, set by the launcher), else since this process began."""
    try:
        launched = float(os.environ["HFL_LAUNCHED_AT"])
    except (KeyError, ValueError):
        import psutil

        launched = psutil.Process().create_time()
    return round(time.time() - launched, 3)


class CloudServer(Gate, pbg.CloudServiceServicer):
    def __init__(self, cfg: config_mod.Config, run_dir: pathlib.Path, server: rpc.Server, admit=None,
                 resume: bool = False):
        self.cfg = cfg
        self.run_dir = run_dir
        self.server = server
        self.admit = admit
        self.resume = resume
        self.run_id = f"{cfg.run.name}-{uuid.uuid4().hex[:8]}"
        self.store = RunStore(run_dir)
        self.edges = topology.edge_ids(cfg)
        self.live = Liveness(cfg.net.rejoin_grace_s, cfg.net.presence_deadline_s)
        self.ready: set[str] = set()
        self.excluded: set[str] = set()
        self.started = False
        self.stop = asyncio.Event()
        self.rejected_aggregates = 0
        self.spec_json = None  # set last in prepare(): until then every RPC answers UNAVAILABLE
        self.claims: dict[str, str] = {}  # an edge site's own trust claim (it can only lower the policy)
        self.stop_reason: str | None = None
        self.refusals = Refusals()
        self.slot_dropped: set[str] = set()  # edges a shared slot went on without, since the round began
        self.board = RoundBoard()
        self.round = -1
        self.results: dict[str, EdgeResult] = {}
        self.persisting: set[str] = set()  # results accepted but not yet on disk (see Submit)
        self.joined = asyncio.Event()
        self.chunk_bytes = cfg.net.chunk_kib * 1024
        self.max_bytes = cfg.net.max_message_mb << 20
        self.downlink = Link.from_config(cfg.pipeline, "downlink")
        self.bytes_up = 0
        self.bytes_down = 0
        self.tau_gamma: dict | None = None  # summary.json: how tau and gamma were set
        self.mode = None  # the round mode (cloud_server/modes.py), wrapped by privacy and control in run()
        self.plan: list[pb.Phase] = []  # the round plan in progress
        self.on_round = lambda r, results, stats: None  # the live page's per-round callback (common/observe/live.py)

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
        self.cfg = resolve_clip(self.cfg, self.model, data)  # privacy.clip_rule: a clip from public data, once
        self.w = get_flat(self.model)
        self.dim = num_parameters(self.model)
        parts = partition(data.y_train, self.cfg.num_devices, numpy_rng(self.cfg.run.seed, "data", "partition"), self.cfg.data,
                          edges=self.cfg.topology.edges)
        self.data_report = (data_report(data.y_train, parts, self.cfg.topology.edges, data.num_classes),
                            f"{data.name}, partition {self.cfg.data.partition}")
        write_data_report(self.run_dir, self.data_report[0])
        self.device_samples = [len(p) for p in parts]  # the claim each device's registration is checked against
        self.cluster_samples = {e: sum(self.device_samples[topology.device_index(d)]
                                       for d in topology.edge_members(self.cfg, topology.edge_index(e))) for e in self.edges}
        self.mode = modes.build(self.cfg, "cloud", CloudPorts(self.cfg, self.run_dir, self.dim, self._expected_edges,
                                                              self._drop_edges, self._slot_timeout(), self.refusals,
                                                              tuple(self.device_samples)))
        self.first_round, self.rows = 0, []
        self.startup_seconds: float | None = None
        if self.resume:
            self._resume()
            self.round = self.first_round  # edges may submit this round as soon as they reconnect
            self.results = self.store.load_pending(self.round, self.run_id, self.mode.result_size)
            self.mode.restore(self._resumed_state, self.round)
        spec = {"config": config_mod.to_dict(self.cfg), "model_dim": self.dim, "samples": self.device_samples}
        self.spec_json = relay_tag.sign_spec(relay_tag.secret_from_env(), self.run_id, spec)
        log.info("model %s: %d parameters; %d test samples; run %s", self.cfg.model.name, self.dim, len(self.test), self.run_id)

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

    def _authenticate(self, context, node: str) -> str:
        self._check_edge(context, node)
        return self.live.sessions.check(context, node)

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
            if self.started and not request.rejoin:
                raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"the run has started: {node} can only come back with rejoin", "started")
            session.check_join(context, node)  # last: a malformed request is refused for what is wrong with it
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        if not self.live.sessions.has(node) and (node in self.live.lost or node in self.live.absent):
            log.info("%s rejoined during round %d", node, self.round)
        if request.trust:
            self.claims[node] = request.trust
        token = self.live.registered(node, request.nonce)
        return pb.RegisterReply(run_id=self.run_id, spec_json=self.spec_json, cluster_id="cloud", members=self.edges,
                                session_token=token, round=self.round if self.started else -1)

    def fetching(self, node: str) -> None:
        self._mark_ready(node)

    async def Air(self, request_iterator, context):
        """The wireless medium: one edge's emissions for an air slot in, what its devices receive out."""
        try:
            if self.spec_json is None:
                raise wire.WireError(grpc.StatusCode.UNAVAILABLE, "the cloud is starting", "not_ready")
            envelope, size = await wire.read_envelope(request_iterator, self.max_bytes)
            validate.check_meta(envelope.meta, self.cfg.run.rounds, len(self.plan) or 1)
            self._authenticate(context, envelope.meta.sender_id)
            if envelope.meta.run_id != self.run_id:
                raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"air slot for run {validate.short(envelope.meta.run_id)}", "wrong_run")
            reply = await self.mode.air(envelope.meta.sender_id, envelope, self.round, self.plan)
        except wire.WireError as exc:
            await refuse(context, self.refusals, exc)
        self.bytes_up += size
        if reply is None:  # not a retryable code: the edge must not take it for a lost cloud
            await context.abort(grpc.StatusCode.ABORTED, "the medium failed on this slot (see the cloud's log)")
        for chunk in wire.to_frames(reply, self.chunk_bytes):  # a head, then one envelope per device
            self.bytes_down += len(chunk.data)
            yield chunk

    def _expected_edges(self) -> list[str]:
        """The edges still worth waiting for in a shared slot: live or within their grace, not given up."""
        return [e for e in self.edges if e not in self.live.absent and (self.live.sessions.has(e) or e in self.live.lost)]

    def _drop_edges(self, edges) -> None:
        """Silent in a slot: not waited for again this round, expected again from the next (issue 24, finding 5)."""
        self.live.absent |= set(edges)
        self.slot_dropped |= set(edges)
        self.live.poke()

    def _slot_timeout(self) -> float:
        """How long a shared slot waits for a missing edge: longer than an edge's own barrier can take (its phase
        timeout, or a lost member's grace), so that an edge still waiting on its devices is not left behind."""
        return self.cfg.net.phase_timeout_s + self.cfg.net.rejoin_grace_s + 10.0

    def _mark_ready(self, node: str) -> None:
        self.ready.add(node)
        if set(self.edges) <= self.ready:
            self.joined.set()
        self.live.poke()

    def _validate(self, envelope: pb.Envelope) -> EdgeResult:
        meta = envelope.meta
        if meta.run_id != self.run_id:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION, f"update for run {validate.short(meta.run_id)}",
                                 "wrong_run")
        if meta.round != self.round or meta.phase != plans.CLOUD_SYNC:
            raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"update for round {meta.round} ({validate.short(meta.phase)}), the cloud expects round "
                                 f"{self.round} cloud_sync", "wrong_round")
        if meta.sender_id in self.results:
            raise wire.WireError(grpc.StatusCode.ALREADY_EXISTS, f"{meta.sender_id} already submitted round {meta.round}",
                                 "replay")
        validate.check_count(meta.num_devices, "num_devices", 0, self.cfg.topology.devices_per_edge)
        validate.check_count(meta.num_samples, "num_samples", 0, self.cluster_samples[meta.sender_id])
        scalars = validate.check_scalars(envelope.scalars, meta.sender_id)
        members = topology.edge_members(self.cfg, topology.edge_index(meta.sender_id))
        records = on_wire.from_transforms(meta.transforms, allowed=set(members))
        device_states = member_states.check_members(envelope.members, members, meta.sender_id)
        accepted = self.mode.accept(meta.sender_id, envelope, self.round, records)
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
        self.results[node] = result  # claims the slot at once: a concurrent replay is refused
        # Concurrency hazard: until the result is on disk the round must not count it, or the round driver can finish
        # the round and delete its pending folder under the executor thread still writing there.
        self.persisting.add(node)
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.store.persist, self.round, node, result,
                                                             self.run_id)
        except BaseException:
            self.results.pop(node, None)  # never acknowledged: never used
            raise
        finally:
            self.persisting.discard(node)
            self.live.poke()
        self.live.absent.discard(node)
        self._mark_ready(node)
        return pb.Ack(accepted=True, detail=f"round {self.round} from {node}")

    def _resume(self) -> None:
        """Continue from the checkpoint: its model and run id, the metrics rows up to it, the logs cut to it."""
        saved = self.store.load_checkpoint(self.w, self.cfg.aggregation.max_update_ratio)
        self.run_id, self.w, self.claims = saved.run_id, saved.w, saved.claims
        self._resumed_state = saved.mode_state
        rows = self.store.metrics_up_to(saved.last)
        if (not rows or rows[-1]["round"] < saved.last) and saved.stats is not None:
            saved.stats.update(self._evaluate(saved.last))
            rows.append(saved.stats)
        self.store.cut_logs(saved.last, rows, self.cfg.privacy.noise_source)
        self.rows, self.first_round = rows, saved.last + 1
        log.info("resuming run %s after round %d (%d metrics rows kept)", self.run_id, saved.last, len(rows))

    # ---- the run ----------------------------------------------------------------------------
    async def run(self) -> int:
        cfg = self.cfg
        metrics_path = self.run_dir / "metrics.jsonl"
        if not self.resume:
            metrics_path.unlink(missing_ok=True)
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="eval")
        loop = asyncio.get_running_loop()
        await self.server.ready()
        if self.resume:
            self.started = True  # edges come back with rejoin; the round barrier gives each its grace period
        else:
            await self._await_edges(cfg.net.join_timeout_s)
            if not self.ready:
                raise RuntimeError(f"no edge joined within net.join_timeout_s = {cfg.net.join_timeout_s}s (edges that "
                                   "registered and went away are named in the log above)")
            self.started = True
            missing = set(self.edges) - self.ready
            self.live.absent |= missing
            if missing:
                log.warning("starting without edges %s (they may still rejoin)", sorted(missing))
        schedule = RoundSchedule(cfg, self.dim, self.rows)  # the plan of each round; virtual_seconds
        self.mode = wrap(self.mode, cfg, self.run_dir, self.edges, self.device_samples, self.claims,
                         [p.numel() for p in self.model.parameters()], self.rows)
        rows = self.rows
        self.clock = CloudClock(cfg, rows)
        started = time.monotonic() - (rows[-1]["wall_seconds"] if rows else 0.0)
        pending = None
        for r in range(self.first_round, cfg.run.rounds):
            round_started = time.monotonic()
            if not (self.resume and r == self.first_round):  # a resumed round keeps what was accepted already
                self.round = r
                self.results = {}
            self.live.absent -= {e for e in self.slot_dropped if self.live.sessions.has(e)}
            self.slot_dropped.clear()
            decision = self.mode.decide(r)
            try:
                clusters = self.mode.cluster_plans(r, decision)
            except RoundRefused as exc:
                self.stop_reason = str(exc)
                break
            tensor = self.downlink.send(self.w, "model", cfg.run.seed, 0, r, -1)[0]
            plan = self.mode.plan(r, decision, schedule)
            self.plan = list(plan)
            task = pb.RoundTask(round=r, phases=plan, clusters=clusters)
            await self.board.publish(r, pb.Envelope(meta=pb.Meta(run_id=self.run_id, round=r, sender_id="cloud"),
                                                    tensors=[tensor], task=task), self.chunk_bytes)
            if self.startup_seconds is None:
                self.startup_seconds = launch_to_now()
            await self._await_results(r, cfg.net.phase_timeout_s * (len(plan) + 1))
            rejected = self._install(r, self.mode.model(r, self.results, self.w))
            stats = self._round_stats(r, started, round_started)
            self.on_round(r, self.results, stats)
            stats["aggregate_rejected"] = bool(rejected)
            if rejected:
                stats["aggregate_rejected_reason"] = rejected
            stats.update(self.clock.round(self.results, self.board.size))
            stats.update(schedule.record(stats))
            self.mode.columns(r, self.results, stats)
            # Round r's evaluation overlaps round r + 1 (it runs on its own thread); its row is written
            # before the next checkpoint, so a checkpoint of round k always has the rows before k on disk.
            if pending is not None:
                await self._write_row(*pending, rows, metrics_path)
            self.store.checkpoint(r, self.w, self.cfg.model.name, self.run_id, stats, self.mode.state())
            pending = (stats, loop.run_in_executor(executor, self._evaluate, r, self.w.copy(), self.mode.evaluated(r)))
            await asyncio.sleep(self.clock.lag(time.monotonic() - started))  # clock.pace
            if not self.results and not any(self.live.sessions.has(e) for e in self.edges):
                log.error("every edge is gone; stopping")
                break
        if pending is not None:
            await self._write_row(*pending, rows, metrics_path)
        self.tau_gamma = schedule.describe()
        await self._finish(rows, started)
        executor.shutdown(wait=False)
        return 0 if self.stop_reason or any(r["edges"] for r in rows[-1:]) else 1

    async def _await_edges(self, timeout: float, every_s: float = 30.0) -> None:
        """Wait for every edge to fetch its first round, saying every `every_s` which are missing; an edge that
        registered and then went away (its process exited) is not waited for past its grace period."""
        log.info("waiting for %d edges (net.join_timeout_s = %.0f)", len(self.edges), timeout)
        start = time.monotonic()
        deadline, note = start + timeout, start + every_s
        while not self.joined.is_set():
            for node in sorted(self.live.expire()):
                log.warning("%s registered, then went away for %.0fs before the run started; not waiting for it",
                            node, self.live.grace_s)
            missing = set(self.edges) - self.ready - self.live.absent
            now = time.monotonic()
            if not missing or now >= deadline:
                return
            if now >= note:
                log.info("waiting for edges %s (%d of %d ready, %.0fs left of net.join_timeout_s)", sorted(missing),
                         len(self.ready), len(self.edges), deadline - now)
                note += every_s
            await self.live.wait(min(deadline, note))

    async def _await_results(self, r: int, timeout: float) -> None:
        """Wait for every expected edge; a lost edge gets its grace period, a silent one `timeout`."""
        expected = set(self.edges) - self.live.absent
        for node in expected:
            if not self.live.sessions.has(node) and node not in self.live.lost:
                self.live.lost[node] = time.monotonic()  # not connected now (a resumed cloud): same grace as a loss
        deadline = time.monotonic() + timeout
        while True:
            for node in sorted(self.live.expire() & expected - set(self.results)):
                log.warning("round %d: %s lost for %.0fs; going on without it", r, node, self.live.grace_s)
            pending = expected - self.live.absent - (set(self.results) - self.persisting)
            if not pending:
                return
            if time.monotonic() >= deadline:
                log.warning("round %d: no result from %s; going on without them", r, sorted(pending))
                self.live.absent |= pending
                return
            await self.live.wait(deadline)

    @staticmethod
    async def _write_row(stats: dict, evaluation, rows: list, path: pathlib.Path) -> None:
        row = await evaluation
        row.update(stats)
        rows.append(row)
        metrics.append_jsonl(path, row)
        log.info("round %d: accuracy %s loss %s (%.2fs)", row["round"], row["accuracy"], row["loss"], row["round_seconds"])

    def _install(self, r: int, new: np.ndarray | None) -> str:
        """Make `new` the global model unless it must be refused (non-finite or exploding: the previous model is kept
        and the round says why); None keeps the previous model without a refusal (nothing was aggregated)."""
        if new is None:
            return ""
        reason = robust.refuse_install(new, self.w, self.cfg.aggregation.max_update_ratio)
        if reason:
            self.rejected_aggregates += 1
            log.error("round %d: refusing the aggregate (%s); keeping the previous global model", r, reason)
            return reason
        self.w = new
        return ""

    def _evaluate(self, r: int, w: np.ndarray | None = None, extra: dict | None = None) -> dict:
        """The global model's test accuracy and loss; `extra` models (name -> weights) add accuracy_<name>."""
        last = r == self.cfg.run.rounds - 1
        if r % self.cfg.run.eval_every and not last:
            return {"round": r, "accuracy": None, "loss": None, "eval_seconds": 0.0}
        started = time.monotonic()
        accuracy, loss = evaluate(self.model, self.w if w is None else w, self.test)
        diverged = not (np.isfinite(accuracy) and np.isfinite(loss))
        row = {"round": r, "accuracy": accuracy, "loss": loss, "diverged": diverged}
        for name, weights in sorted((extra or {}).items()):
            row[f"accuracy_{name}"] = evaluate(self.model, weights, self.test)[0] if np.isfinite(weights).all() else None
        row["eval_seconds"] = time.monotonic() - started
        return row

    def _round_stats(self, r: int, started: float, round_started: float) -> dict:
        res = self.results.values()
        train = [(x.scalars["train_loss"], x.devices) for x in res if "train_loss" in x.scalars and x.devices]
        stats = {
            "bytes_up": int(self.bytes_up + sum(x.scalars.get("bytes_up", 0) for x in res)),
            "bytes_down": int(self.bytes_down + sum(x.scalars.get("bytes_down", 0) for x in res)),
            "refused": int(self.refusals.take() + sum(x.scalars.get("refused", 0) for x in res)),
            "dropped_devices": int(sum(x.scalars.get("dropped", 0) for x in res)),
            "rejoined_devices": int(sum(x.scalars.get("rejoined", 0) for x in res)),
            "round_restarts": int(sum(x.scalars.get("restarts", 0) for x in res)),
            "edges": len(self.results),
            "devices": int(sum(x.devices for x in res)),
            "train_loss": (sum(l * n for l, n in train) / sum(n for _, n in train)) if train else None,
            **self._quantizer_errors(res),
            "round_seconds": time.monotonic() - round_started,
            "wall_seconds": time.monotonic() - started,
        }
        self.bytes_up = self.bytes_down = 0
        return stats

    @staticmethod
    def _quantizer_errors(results) -> dict:
        """q = ||Q(x) - x||^2 / ||x||^2 measured per tier (paper 001's q1 on uploads, q2 on the backhaul)."""
        up = [x.scalars["q_uplink"] for x in results if "q_uplink" in x.scalars]
        back = [t.params["q_measured"] for x in results for t in x.transforms
                if t.stage == "encode" and "q_measured" in t.params]
        out = {}
        if up:
            out["q_uplink"] = float(np.mean(up))
        if back:
            out["q_backhaul"] = float(np.mean(back))
        return out

    async def _finish(self, rows: list, started: float) -> None:
        final = self.round + 1
        await self.board.publish(final, pb.Envelope(meta=pb.Meta(run_id=self.run_id, round=final, sender_id="cloud"),
                                                    task=pb.RoundTask(round=final, finished=True)), self.chunk_bytes)
        live = {e for e in self.edges if self.live.sessions.has(e)}
        # an edge lost within its grace (reconnecting after a restart of this cloud) is told too, or it would go on
        # dialling a cloud that is gone
        returning = {e for e in self.live.lost if e in self.edges} - live
        if self.resume:  # a resumed cloud whose run ends at once: edges not connected yet are on their way back
            returning |= set(self.edges) - live - self.live.absent
        wait = self.cfg.net.grace_s + 10 + (self.cfg.net.rejoin_grace_s if returning else 0.0)
        missing = await self.board.wait_fetched(final, live | returning, wait)
        if missing:
            log.warning("edges that did not collect the final task: %s", sorted(missing))
        self.stop.set()
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
            "dropped_edges": sorted(self.live.absent),
            "aggregator": self.cfg.pipeline.aggregate,
            "aggregates_rejected": self.rejected_aggregates,
            "diverged": any(r.get("diverged") for r in rows),
            "resumed": self.resume,
            "startup_seconds": self.startup_seconds,
            "stop_reason": self.stop_reason,
            "model": self.cfg.model.name,
            "model_parameters": self.dim,
            "dataset": self.cfg.data.dataset,
            "devices": self.cfg.num_devices,
            "edges": self.cfg.topology.edges,
            "weights": {"edge": plans.weights_rule(self.cfg, "edge"), "cloud": plans.weights_rule(self.cfg, "cloud")},
            "tau_gamma": self.tau_gamma,
        }
        summary.update(self.clock.summary())
        summary.update(self.mode.describe(rows))
        metrics.write_json(self.run_dir / "summary.json", summary)
        title = f"{self.cfg.run.algorithm} on {self.cfg.data.dataset} ({self.cfg.num_devices} devices, {len(self.edges)} edges)"
        try:
            metrics.plot_accuracy(rows, self.run_dir / "accuracy.png", title)
            plot_data_report(self.run_dir, *self.data_report)
            self.mode.plots(rows, title)
        except Exception:  # a plot must never cost the results
            log.exception("could not draw the accuracy plot")
        log.info("finished: final accuracy %s after %d rounds in %.1fs", summary["final_accuracy"], len(rows),
                 summary["wall_seconds"])


async def serve(cfg: config_mod.Config, listen: str, run_dir: str, port_file: str | None = None, server_credentials=None,
                admit=None, resume: bool = False, force: bool = False, web_tls=None) -> int:
    out = pathlib.Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_run_dir(out, resume, force)
    if not resume:
        (out / "config.toml").write_text(config_mod.to_toml(cfg))
    server = rpc.Server(listen, rpc.MAX_CHUNK, server_credentials)
    cloud = CloudServer(cfg, out, server, admit, resume)
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
