"""The cloud's round loop and its state: the global model, the round in progress and the results accepted for it,
evaluation, the metrics rows, checkpoints and the end of the run. The service (service.py) hands it what its RPCs
accepted; the roster (roster.py) tells it which edges to wait for.

Nothing acknowledged is lost in a crash: an accepted edge result is written to `pending/` before the edge gets its
Ack, and every round ends with an atomic checkpoint. `--resume` continues the same run id from the checkpoint.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import pathlib
import time
import uuid

import numpy as np
import torch

from hfl.common import metrics, modes, robust, topology
from hfl.common import config as config_mod
from hfl.common.channel.round_clock import CloudClock
from hfl.common.data import dataset_digest, load_dataset
from hfl.common.models import build, get_flat, init_parameters, num_parameters
from hfl.common.partition import data_report, partition
from hfl.common.pipeline import Link
from hfl.common.privacy.proxy_clip import resolve_clip
from hfl.common.quantization.schedule import RoundSchedule
from hfl.common.rundir import plot_data_report, write_data_report
from hfl.common.seeding import numpy_rng, torch_generator
from hfl.common.service_base import RoundBoard
from hfl.common.shard import evaluate, make_shard
from hfl.proto import hfl_v1_pb2 as pb

from .modes import CloudPorts, RoundRefused
from .roster import EdgeRoster
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


class RoundDriver:
    def __init__(self, cfg: config_mod.Config, run_dir: pathlib.Path, resume: bool, roster: EdgeRoster, refusals,
                 traffic, stop: asyncio.Event, plots: bool = True):
        self.cfg = cfg
        self.plots = plots  # the end's plots (a sweep draws its own from the metrics)
        self.stop = stop  # set once the edges collected the final task
        self.run_dir = run_dir
        self.resume = resume
        self.roster = roster
        self.refusals = refusals
        self.traffic = traffic  # traffic() -> (bytes up, bytes down) the RPCs counted since the last call
        self.run_id = f"{cfg.run.name}-{uuid.uuid4().hex[:8]}"
        self.store = RunStore(run_dir)
        self.board = RoundBoard()
        self.chunk_bytes = cfg.net.chunk_kib * 1024
        self.downlink = Link.from_config(cfg.pipeline, "downlink")
        self.round = -1
        self.results: dict[str, EdgeResult] = {}
        self.persisting: set[str] = set()  # results accepted but not yet on disk (see accept)
        self.plan: list[pb.Phase] = []  # the round plan in progress
        self.mode = None  # the round mode (cloud_server/modes.py), wrapped by privacy and control in run()
        self.rows: list[dict] = []
        self.first_round = 0
        self.rejected_aggregates = 0
        self.stop_reason: str | None = None
        self.startup_seconds: float | None = None
        self.tau_gamma: dict | None = None  # summary.json: how tau and gamma were set
        self.on_round = lambda r, results, stats: None  # the live page's per-round callback (common/observe/live.py)

    # ---- before the first RPC is served ------------------------------------------------------------
    def prepare(self) -> dict:
        """Load the test set and build the initial model (seeded by the run seed alone); the run's spec."""
        cfg = self.cfg
        torch.set_num_threads(cfg.train.torch_threads)
        data = load_dataset(cfg.data)
        digest = dataset_digest(data)
        x_te, y_te = data.x_test, data.y_test
        if cfg.data.max_test_samples:
            x_te, y_te = x_te[: cfg.data.max_test_samples], y_te[: cfg.data.max_test_samples]
        self.test = make_shard(x_te, y_te, data.mean, data.std)
        self.model = build(cfg.model.name, data.input_shape, data.num_classes)
        init_parameters(self.model, torch_generator(cfg.run.seed, "cloud", 0, 0, "init"))
        self.cfg = cfg = resolve_clip(cfg, self.model, data)  # privacy.clip_rule: a clip from public data, once
        self.w = get_flat(self.model)
        self.dim = num_parameters(self.model)
        parts = partition(data.y_train, cfg.num_devices, numpy_rng(cfg.run.seed, "data", "partition"), cfg.data,
                          edges=cfg.topology.edges)
        self.data_report = (data_report(data.y_train, parts, cfg.topology.edges, data.num_classes),
                            f"{data.name}, partition {cfg.data.partition}")
        write_data_report(self.run_dir, self.data_report[0])
        self.device_samples = [len(p) for p in parts]  # the claim each device's registration is checked against
        self.cluster_samples = {e: sum(self.device_samples[topology.device_index(d)]
                                       for d in topology.edge_members(cfg, topology.edge_index(e)))
                                for e in self.roster.edges}
        self.mode = modes.build(cfg, "cloud", CloudPorts(cfg, self.run_dir, self.dim, self.roster.expected,
                                                         self.roster.drop, self.slot_timeout(), self.refusals,
                                                         tuple(self.device_samples)))
        if self.resume:
            self._resume()
        log.info("model %s: %d parameters; %d test samples; run %s", cfg.model.name, self.dim, len(self.test),
                 self.run_id)
        return {"config": config_mod.to_dict(cfg), "model_dim": self.dim, "samples": self.device_samples,
                "data_digest": digest}

    def slot_timeout(self) -> float:
        """How long a shared slot waits for a missing edge: longer than an edge's own barrier can take (its phase
        timeout, or a lost member's grace), so that an edge still waiting on its devices is not left behind."""
        return self.cfg.net.phase_timeout_s + self.cfg.net.rejoin_grace_s + 10.0

    def _resume(self) -> None:
        """Continue from the checkpoint: its model and run id, the metrics rows up to it, the logs cut to it; the
        results already accepted for the round that resumes."""
        saved = self.store.load_checkpoint(self.w, self.cfg.aggregation.max_update_ratio)
        self.run_id, self.w, self.roster.claims = saved.run_id, saved.w, saved.claims
        rows = self.store.metrics_up_to(saved.last)
        if (not rows or rows[-1]["round"] < saved.last) and saved.stats is not None:
            saved.stats.update(self._evaluate(saved.last))
            rows.append(saved.stats)
        self.store.cut_logs(saved.last, rows, self.cfg.privacy.noise_source)
        self.rows, self.first_round = rows, saved.last + 1
        log.info("resuming run %s after round %d (%d metrics rows kept)", self.run_id, saved.last, len(rows))
        self.round = self.first_round  # edges may submit this round as soon as they reconnect
        self.results = self.store.load_pending(self.round, self.run_id, self.mode.result_size)
        self.mode.restore(saved.mode_state, self.round)

    # ---- what the service hands over --------------------------------------------------------------
    async def accept(self, node: str, result: EdgeResult) -> None:
        """Keep an edge's validated result for the round in progress, on disk before the edge is acknowledged."""
        self.results[node] = result  # claims the slot at once: a concurrent replay is refused
        # Concurrency hazard: until the result is on disk the round must not count it, or the round loop can finish
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
            self.roster.live.poke()

    # ---- the run --------------------------------------------------------------------------------
    async def run(self) -> int:
        cfg = self.cfg
        metrics_path = self.run_dir / "metrics.jsonl"
        if not self.resume:
            metrics_path.unlink(missing_ok=True)
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="eval")
        await self.roster.start(self.resume, cfg.net.join_timeout_s)
        schedule = RoundSchedule(cfg, self.dim, self.rows)  # the plan of each round; virtual_seconds
        self.mode = wrap(self.mode, cfg, self.run_dir, self.roster.edges, self.device_samples, self.roster.claims,
                         [p.numel() for p in self.model.parameters()], self.rows)
        self.clock = CloudClock(cfg, self.rows)
        started = time.monotonic() - (self.rows[-1]["wall_seconds"] if self.rows else 0.0)
        pending = None
        for r in range(self.first_round, cfg.run.rounds):
            stats = await self._round(r, schedule, started)
            if stats is None:
                break
            # Round r's evaluation overlaps round r + 1 (it runs on its own thread); its row is written
            # before the next checkpoint, so a checkpoint of round k always has the rows before k on disk.
            if pending is not None:
                await self._write_row(*pending, metrics_path)
            self.store.checkpoint(r, self.w, cfg.model.name, self.run_id, stats, self.mode.state())
            pending = (stats, asyncio.get_running_loop().run_in_executor(executor, self._evaluate, r, self.w.copy(),
                                                                         self.mode.evaluated(r)))
            await asyncio.sleep(self.clock.lag(time.monotonic() - started))  # clock.pace
            if not self.results and not self.roster.any_live():
                log.error("every edge is gone; stopping")
                break
        if pending is not None:
            await self._write_row(*pending, metrics_path)
        self.tau_gamma = schedule.describe()
        await self._finish(started)
        executor.shutdown(wait=False)
        return 0 if self.stop_reason or any(r["edges"] for r in self.rows[-1:]) else 1

    async def _round(self, r: int, schedule: RoundSchedule, started: float) -> dict | None:
        """Run round r up to its new model; its metrics row (without the evaluation), None if it must not run."""
        cfg = self.cfg
        round_started = time.monotonic()
        if not (self.resume and r == self.first_round):  # a resumed round keeps what was accepted already
            self.round = r
            self.results = {}
        self.roster.new_round()
        decision = self.mode.decide(r)
        try:
            clusters = self.mode.cluster_plans(r, decision)
        except RoundRefused as exc:
            self.stop_reason = str(exc)
            return None
        tensor = self.downlink.send(self.w, "model", cfg.run.seed, 0, r, -1)[0]
        plan = self.mode.plan(r, decision, schedule)
        self.plan = list(plan)
        task = pb.RoundTask(round=r, phases=plan, clusters=clusters)
        await self.board.publish(r, pb.Envelope(meta=pb.Meta(run_id=self.run_id, round=r, sender_id="cloud"),
                                                tensors=[tensor], task=task), self.chunk_bytes)
        if self.startup_seconds is None:
            self.startup_seconds = launch_to_now()
        await self.roster.await_results(r, cfg.net.phase_timeout_s * (len(plan) + 1), self.results, self.persisting)
        try:
            model = self.mode.model(r, self.results, self.w)
        except (ValueError, TypeError, ArithmeticError) as exc:  # e.g. an aggregator's parameter: say which round
            raise RuntimeError(f"round {r}: aggregating the edges' results failed ({self.cfg.pipeline.aggregate}): "
                               f"{exc.__class__.__name__}: {exc}") from exc
        rejected = self.install(r, model)
        stats = self._round_stats(started, round_started)
        self.on_round(r, self.results, stats)
        stats["aggregate_rejected"] = bool(rejected)
        if rejected:
            stats["aggregate_rejected_reason"] = rejected
        stats.update(self.clock.round(self.results, self.board.size))
        stats.update(schedule.record(stats))
        self.mode.columns(r, self.results, stats)
        return stats

    async def _write_row(self, stats: dict, evaluation, path: pathlib.Path) -> None:
        row = await evaluation
        row.update(stats)
        self.rows.append(row)
        metrics.append_jsonl(path, row)
        log.info("round %d: accuracy %s loss %s (%.2fs)", row["round"], row["accuracy"], row["loss"], row["round_seconds"])

    def install(self, r: int, new: np.ndarray | None) -> str:
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

    def _round_stats(self, started: float, round_started: float) -> dict:
        res = self.results.values()
        up, down = self.traffic()
        train = [(x.scalars["train_loss"], x.devices) for x in res if "train_loss" in x.scalars and x.devices]
        return {
            "bytes_up": int(up + sum(x.scalars.get("bytes_up", 0) for x in res)),
            "bytes_down": int(down + sum(x.scalars.get("bytes_down", 0) for x in res)),
            "refused": int(self.refusals.take() + sum(x.scalars.get("refused", 0) for x in res)),
            "dropped_devices": int(sum(x.scalars.get("dropped", 0) for x in res)),
            "rejoined_devices": int(sum(x.scalars.get("rejoined", 0) for x in res)),
            "round_restarts": int(sum(x.scalars.get("restarts", 0) for x in res)),
            "edges": len(self.results),
            "devices": int(sum(x.devices for x in res)),
            "train_loss": (sum(l * n for l, n in train) / sum(n for _, n in train)) if train else None,
            **quantizer_errors(res),
            "round_seconds": time.monotonic() - round_started,
            "wall_seconds": time.monotonic() - started,
        }

    async def _finish(self, started: float) -> None:
        final = self.round + 1
        await self.board.publish(final, pb.Envelope(meta=pb.Meta(run_id=self.run_id, round=final, sender_id="cloud"),
                                                    task=pb.RoundTask(round=final, finished=True)), self.chunk_bytes)
        live, returning = self.roster.to_tell(self.resume)
        wait = self.cfg.net.grace_s + 10 + (self.cfg.net.rejoin_grace_s if returning else 0.0)
        missing = await self.board.wait_fetched(final, live | returning, wait)
        if missing:
            log.warning("edges that did not collect the final task: %s", sorted(missing))
        self.stop.set()
        rows = self.rows
        facts = {"run_id": self.run_id, "wall_seconds": time.monotonic() - started,
                 "refused_now": self.refusals.take(), "refused_by_reason_at_cloud": dict(self.refusals.total),
                 "dropped_edges": sorted(self.roster.live.absent), "aggregates_rejected": self.rejected_aggregates,
                 "resumed": self.resume, "startup_seconds": self.startup_seconds, "stop_reason": self.stop_reason,
                 "model_parameters": self.dim, "tau_gamma": self.tau_gamma,
                 **self.clock.summary(), **self.mode.describe(rows)}
        summary = self.store.write_summary(self.cfg, rows, facts)
        if self.plots:
            self._plot(rows)
        log.info("finished: final accuracy %s after %d rounds in %.1fs", summary["final_accuracy"], len(rows),
                 summary["wall_seconds"])

    def _plot(self, rows: list[dict]) -> None:
        title = f"{self.cfg.run.algorithm} on {self.cfg.data.dataset} ({self.cfg.num_devices} devices, " \
                f"{len(self.roster.edges)} edges)"
        try:
            metrics.plot_accuracy(rows, self.run_dir / "accuracy.png", title)
            plot_data_report(self.run_dir, *self.data_report)
            self.mode.plots(rows, title)
        except Exception:  # a plot must never cost the results
            log.exception("could not draw the accuracy plot")


def quantizer_errors(results) -> dict:
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
