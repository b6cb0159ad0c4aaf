"""The wireless medium, hosted by the cloud (paper 003; DESIGN: wireless medium): the one place that sees every
transmission of an air slot. Each collaborating edge hands in its cluster's emissions (the Air RPC); once every
expected edge is in, or net.phase_timeout_s has passed, the slot closes, channel.medium.air_slot computes what
every listed device receives, and each edge gets its own devices' rows. A late emission finds the slot closed.

At the round's final inter-cluster model slot the medium also holds the round's models for evaluation: the
ideal global model (the exact mean of the transmitted models, eq. 11), the reference device's estimate
(device 0 of the reference cluster, Theorem 1) and the mean of every device's estimate (digest 10.10).
"""
from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import time
from dataclasses import dataclass, field

import grpc
import numpy as np

from hfl.common import batches, metrics, plans, topology, validate, wire
from hfl.common.channel import lanes
from hfl.common.channel import medium as medium_fn
from hfl.common.channel import ota
from hfl.common.channel import plane as air
from hfl.common.seeding import numpy_rng
from hfl.proto import hfl_v1_pb2 as pb

log = logging.getLogger("hfl.medium")

NORMALISED_TOL = 1e-3  # |mean| and |std - 1| of a normalised payload (float32 round-off is ~1e-7)
MAX_INTERFERERS_SHOWN = 3000  # interferer devices on the live page's plane (a drawing, not a data set)


@dataclass
class Emission:
    tx: list[str]
    payloads: list[np.ndarray] | None  # one [d] row per transmitter, read in place from its message (stacked once a slot)
    mu: list[float]
    sigma: list[float]
    listen: list[str]
    model_sums: dict[str, float]


@dataclass
class Slot:
    deadline: float  # one per slot, from its first emission (or refusal)
    emissions: dict[str, Emission] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)  # edges whose emission was refused: not waited for
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None  # the closing computation, started once, shielded from any one edge's cancel
    replies: dict[str, list[pb.Envelope]] = field(default_factory=dict)

    @property
    def closing(self) -> bool:
        return self.task is not None


def reply_envelopes(meta: pb.Meta, res, rows: list[int], listen: list[str], psi: float) -> list[pb.Envelope]:
    """What one edge gets back from a slot, split per device: a head (meta and the scalars its devices estimate with)
    and one envelope per listening device with its received row, so the largest message is one row (d x 4 bytes
    in-phase, 2 x d x 4 complex, on OTA links), whatever the cluster's size M (a whole reply was M x 2 x d x 4).
    The edge reads them with wire.read_envelopes."""
    head = pb.Envelope(meta=meta)
    if rows:
        first = rows[0]
        head.scalars.update(n_active=float(res.n_active[first]), E=float(res.E[first]),
                            sigma_sum=float(res.sigma_sum[first]), mu_mean=float(res.mu_mean[first]), psi=psi)
    return [head] + [wire.add_raw(pb.Envelope(), res.rows[i], "float32", listen[i]) for i in rows]


def estimator_label(receiver: str, psi_mode: str, exact: bool = False) -> str:
    """Which reading of paper 003's estimator a run used, for its summary: the paper's (eqs. 27 / 35 with eq. 20's
    Psi) or the corrected one (digest 10.2 and the MMSE-on-models finding), or a mix of the two."""
    if exact:
        return "orthogonal: exact means over the active sets (no receive factor, no Psi)"
    if receiver == "mmse" and psi_mode == "paper":
        return "paper: MMSE receiver of eqs. 27 / 35 on every slot, the paper's Psi (eq. 20)"
    if receiver == "unbiased" and psi_mode == "corrected":
        return "corrected: unbiased receiver sum sigma / |A|, the corrected Psi"
    return f"mixed: receiver {receiver}, Psi {psi_mode}"


def _refuse(code: grpc.StatusCode, message: str, reason: str) -> wire.WireError:
    return wire.WireError(code, message, reason)


class Medium:
    def __init__(self, cfg, run_dir: pathlib.Path, dim: int, refusals=None, device_samples=()):
        from hfl.common.channel.config import check_air_messages

        check_air_messages(cfg, dim)  # a deployment that skipped the preflight fails here, before any round
        self.cfg = cfg
        self.run_dir = run_dir
        # channel.weighting = samples: each transmitter's D_y weights its payload (paper 003, digest 2.1)
        self.device_samples = list(device_samples) if cfg.channel.weighting == "samples" else None
        self.refusals = refusals  # service_base.Refusals: a transmitter left out is a refusal with its reason
        self.dim = dim
        self.plane = air.plane_for(cfg)
        lanes.medium_threads(cfg.channel.medium_threads)
        self.edges = topology.edge_ids(cfg)
        self.slots: dict[tuple[int, int], Slot] = {}
        self.edges_dropped: dict[int, set[str]] = {}  # round -> edges a slot of it closed without
        self.masks: dict[tuple[int, int], tuple] = {}
        self.psi_mean, self.psi_count = 0.0, 0
        self.stats: dict[int, list[dict]] = {}
        self.models: dict[int, dict] = {}
        self.distinct: dict[int, int] = {}
        self.seconds = 0.0  # wall time spent computing slots (the benchmark's share of the round)
        top = self.plane.topology
        metrics.write_json(run_dir / "topology.json", {**top.to_json(), "channel": cfg.channel.model,
                                                       "rho": self.plane.rho, "psi": self.plane.psi,
                                                       "psi_mode": self.plane.psi_mode, "beta": self.plane.beta,
                                                       "receiver": self.plane.receiver,
                                                       "run_devices": [topology.device_id(i) for i in
                                                                       top.collaborating_devices.tolist()]})
        try:
            from hfl.common.channel.topology_plot import draw_topology

            draw_topology(top, run_dir / "topology.png")
        except Exception:  # a plot must never cost the run
            log.exception("could not draw topology.png")
        log.info("medium: %s plane, %d edges (%d collaborating), %d devices; rho %.3g, Psi %.3g (%s), beta %.3g",
                 cfg.channel.model, top.n_edges, top.collaborating, top.n_devices, self.plane.rho, self.plane.psi,
                 self.plane.psi_mode, self.plane.beta)

    # ---- one edge's emission ------------------------------------------------------------------
    def parse(self, envelope: pb.Envelope, round_: int, phases) -> Emission:
        """Check an edge's emissions for slot (round_, meta.step); raises WireError and changes nothing."""
        meta = envelope.meta
        edge = meta.sender_id
        if meta.round != round_:
            raise _refuse(grpc.StatusCode.FAILED_PRECONDITION, f"air slot of round {meta.round}; the medium is in "
                          f"round {round_}", "wrong_round")
        if meta.step >= len(phases) or phases[meta.step].kind not in plans.AIR_PHASES or meta.phase != phases[meta.step].kind:
            raise _refuse(grpc.StatusCode.FAILED_PRECONDITION, f"phase {meta.step} ({meta.phase!r}) is not an air "
                          f"phase of round {round_}", "wrong_phase")
        slot = self.slots.get((round_, meta.step))
        if slot is not None and slot.closing:
            raise _refuse(grpc.StatusCode.FAILED_PRECONDITION, f"air slot of round {round_} phase {meta.step} is "
                          "closed (it went on without this edge)", "slot_closed")
        if slot is not None and edge in slot.emissions:
            raise _refuse(grpc.StatusCode.ALREADY_EXISTS, f"{edge} already emitted in round {round_} phase "
                          f"{meta.step}", "replay")
        members = set(topology.edge_members(self.cfg, topology.edge_index(edge)))
        if envelope.scalars:
            raise _refuse(grpc.StatusCode.INVALID_ARGUMENT, f"an emission carries its rows only, not scalars "
                          f"({validate.short(next(iter(envelope.scalars)))}, ...)", "bad_air")
        rows = batches.air_rows(envelope, members, edge)  # one per member at most, each once, finite, sigma > 0
        sums = {row.node: float(row.model_sum) for row in rows}
        listen = sorted(sums)
        mask_listen, active, _ = self._masks(round_, meta.step, phases)
        for node in listen:
            if not mask_listen[topology.device_index(node)]:
                raise _refuse(grpc.StatusCode.FAILED_PRECONDITION, f"{node} failed th0 earlier in round {round_}",
                              "air_dropped")
        out = Emission([], [], [], [], listen, sums)
        for row in rows:
            if not row.HasField("tensor"):
                continue
            node = row.node
            if not active[topology.device_index(node)]:
                raise _refuse(grpc.StatusCode.FAILED_PRECONDITION, f"{node} is not active in slot "
                              f"{air.slot_id(round_, meta.step)}", "air_not_active")
            vec = batches.payload(row.tensor, self.dim)
            if abs(vec.mean(dtype=np.float64)) > NORMALISED_TOL or abs(vec.std(dtype=np.float64) - 1) > NORMALISED_TOL:
                raise _refuse(grpc.StatusCode.INVALID_ARGUMENT, f"air payload of {node} is not normalised", "bad_air")
            out.tx.append(node)
            out.payloads.append(vec)
            out.mu.append(float(row.mu))
            out.sigma.append(float(row.sigma))
        return out

    def _masks(self, round_: int, step: int, phases) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(listeners, active, alive) masks of the plane's devices for an air slot, computed once per slot."""
        key = (round_, step)
        if key not in self.masks:
            self.masks = {k: v for k, v in self.masks.items() if k[0] >= round_}
            self.masks[key] = (air.listeners(self.plane, phases, round_, step),
                               air.activity(self.plane, phases, round_, step), air.alive(self.plane, phases, round_, step))
        return self.masks[key]

    def _slot(self, key, timeout: float) -> Slot:
        if key not in self.slots:
            self.slots[key] = Slot(deadline=time.monotonic() + timeout)
        return self.slots[key]

    def refused(self, edge: str, round_: int, step: int, timeout: float) -> None:
        """`edge`'s emission for (round_, step) was refused: it has nothing for this slot, do not wait for it."""
        slot = self._slot((round_, step), timeout)
        slot.refused.add(edge)
        slot.arrived.set()

    async def air(self, edge: str, emission: Emission, round_: int, step: int, phases, expected, timeout: float,
                  drop=lambda edges: None) -> list[pb.Envelope] | None:
        """Add `edge`'s emission to its slot and wait until the slot closes; `expected()` names the edges still
        worth waiting for (live, not given up). An edge the slot closed without is handed to `drop` (the cloud stops
        waiting for it in this round's later slots and results, so one silent edge costs one slot's wait, not every
        slot's: issue 24, finding 5); it is back as soon as it emits or submits again."""
        key = (round_, step)
        slot = self._slot(key, timeout)
        slot.emissions[edge] = emission
        slot.arrived.set()
        while slot.task is None:
            waiting = set(expected()) - set(slot.emissions) - slot.refused
            if not waiting or time.monotonic() >= slot.deadline:
                if waiting:
                    log.warning("air slot %s: going on without %s (not waited for again this round)", key,
                                sorted(waiting))
                    self.edges_dropped.setdefault(round_, set()).update(waiting)
                    drop(waiting)
                slot.task = asyncio.get_running_loop().create_task(self._close(key, slot, phases))
                break
            slot.arrived.clear()
            try:
                await asyncio.wait_for(slot.arrived.wait(), min(0.5, max(0.0, slot.deadline - time.monotonic())))
            except asyncio.TimeoutError:
                pass
        # Concurrency hazard: the edge whose call started the close may be cancelled (it died); the computation
        # must still finish and answer every other edge, hence one task, shielded.
        await asyncio.shield(slot.task)
        return slot.replies.get(edge)  # None: the computation failed (logged)

    async def _close(self, key, slot: Slot, phases) -> None:
        slot.arrived.set()
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._compute, key, slot, phases)
        except Exception:  # noqa: BLE001 - every waiting edge must be answered
            log.exception("air slot %s failed", key)
        finally:
            for emission in slot.emissions.values():
                emission.payloads = None  # the replies are what is still needed
            for old in [k for k in self.slots if k[0] < key[0]]:
                del self.slots[old]

    def _compute(self, key, slot: Slot, phases) -> None:
        started = time.monotonic()
        round_, step = key
        phase = phases[step]
        group = phase.params.get("group", 0.0) == 1.0
        edges = sorted(slot.emissions)
        tx = [n for e in edges for n in slot.emissions[e].tx]
        listen = [n for e in edges for n in slot.emissions[e].listen]
        rows = [v for e in edges for v in slot.emissions[e].payloads]
        mu = [m for e in edges for m in slot.emissions[e].mu]
        sigma = [s for e in edges for s in slot.emissions[e].sigma]
        keep = medium_fn.side_info_accepted(mu, sigma, self.cfg.channel.side_info_bound)
        if not keep.all():  # counted and left out of the superposition: the others' slot goes on
            owner = [e for e in edges for _ in slot.emissions[e].tx]
            for i in np.flatnonzero(~keep):
                log.warning("air slot %s: left out %s of %s (implausible side information)", key, tx[i], owner[i])
                if self.refusals is not None:
                    self.refusals.add("air_side_info", owner[i], f"slot {key}: {tx[i]}'s mu {mu[i]:.6g}, sigma "
                                      f"{sigma[i]:.6g} far outside the slot's others' (channel.side_info_bound)")
            tx, rows = [n for n, k in zip(tx, keep) if k], [v for v, k in zip(rows, keep) if k]
            mu, sigma = list(np.asarray(mu)[keep]), list(np.asarray(sigma)[keep])
        payloads = np.stack(rows) if rows else np.zeros((0, self.dim), np.float32)  # the slot's one copy of its rows
        del rows
        idx = lambda nodes: np.array([topology.device_index(n) for n in nodes], dtype=np.int64)  # noqa: E731
        psi = self.psi_mean if (self.plane.psi_mode == "empirical" and self.psi_count) else self.plane.psi
        rng = numpy_rng(self.cfg.run.seed, "cloud", 0, round_, step, "medium")
        _, active, alive = self._masks(round_, step, phases)
        samples = None if self.device_samples is None else [self.device_samples[i] for i in idx(tx)]
        res = medium_fn.air_slot(self.plane, round_, step, group, payloads, idx(tx), mu, sigma, idx(listen), alive,
                                 rng, psi, samples)
        if self.plane.psi_mode == "empirical" and res.psi_samples.size:
            self.psi_mean, self.psi_count = ota.running_mean(self.psi_mean, self.psi_count, res.psi_samples)
        collab_alive = alive[self.plane.collaborating()]
        row = dict(res.stats)
        row.update(step=step, psi=psi, air_refused=int((~keep).sum()),
                   active_expected=int(active[self.plane.collaborating()].sum()),
                   activity_rate=float(len(tx) / max(1, collab_alive.sum())))
        self.stats.setdefault(round_, []).append(row)
        if round_ not in self.distinct:
            sums = [v for e in edges for v in slot.emissions[e].model_sums.values()]
            self.distinct[round_] = len(set(sums))
        at = {n: i for i, n in enumerate(listen)}
        meta = pb.Meta(round=round_, step=step, phase=phase.kind, sender_id="medium")
        for e in edges:
            slot.replies[e] = reply_envelopes(meta, res, [at[n] for n in slot.emissions[e].listen], listen, psi)
        if phase.kind == plans.AIR_MODEL_SYNC and group and step == air.air_steps(phases)[-1]:
            self._round_models(round_, step, res, psi)
        self.seconds += time.monotonic() - started

    def _round_models(self, round_: int, step: int, res, psi: float) -> None:
        est, ok = medium_fn.estimates(self.plane, res, round_, step, True, psi)
        models: dict = {"ideal": res.ideal}
        if ok.any():
            good = est[ok]
            mean = good.mean(axis=0, dtype=np.float64).astype(np.float32)  # float64 sums, no [n, d] float64 copy
            models["device_mean"] = mean
            good -= mean  # a copy (boolean index): each device's distance from the mean, in place
            rms = np.sqrt(np.einsum("ij,ij->i", good, good, dtype=np.float64) / good.shape[1])
            norm = float(np.sqrt(np.einsum("i,i->", mean, mean, dtype=np.float64) / mean.size))
            spread = rms.mean() / max(1e-12, norm)
            models["spread"] = float(spread)
            # the reference device is device 0 of the reference cluster (Theorem 1); in a round where it failed th0
            # it keeps a model the medium does not see, and the round has no reference figure
            zero = np.flatnonzero((res.listeners == 0) & ok)
            if zero.size:
                models["reference"] = est[int(zero[0])]
        self.models[round_] = models
        self._persist(round_)

    # ---- a restart of the cloud ---------------------------------------------------------------
    def _pending(self, round_: int) -> pathlib.Path:
        return self.run_dir / "pending" / f"round-{round_:06d}" / "medium.npz"

    def _persist(self, round_: int) -> None:
        """The round's models and figures, durable before its last slot's replies go out: a cloud that dies before
        its checkpoint resumes the round with them (the edges' submits of it then count), as the digital path does
        with its pending results."""
        from .store import write_atomic

        path = self._pending(round_)
        path.parent.mkdir(parents=True, exist_ok=True)
        models = self.models[round_]
        arrays = {f"model_{k}": v for k, v in models.items() if isinstance(v, np.ndarray)}
        figures = {"spread": models.get("spread"), "stats": self.stats.get(round_, []),
                   "distinct": self.distinct.get(round_), "dropped": sorted(self.edges_dropped.get(round_, ()))}
        write_atomic(path, figures=json.dumps(metrics.clean(figures)), **arrays)

    def state(self) -> dict:
        return {"psi_mean": self.psi_mean, "psi_count": self.psi_count}

    def restore(self, state: dict, round_: int) -> None:
        self.psi_mean = float(state.get("psi_mean", 0.0))
        self.psi_count = int(state.get("psi_count", 0))
        path = self._pending(round_)
        if not path.exists():
            return
        try:
            with np.load(path) as saved:
                models = {k[len("model_"):]: np.asarray(saved[k], np.float32) for k in saved.files if k.startswith("model_")}
                figures = json.loads(str(saved["figures"]))
            if any(v.shape != (self.dim,) or not np.isfinite(v).all() for v in models.values()) or "ideal" not in models:
                raise ValueError("models of the wrong size, non-finite, or no ideal model")
        except Exception as exc:  # noqa: BLE001 - a bad file costs the round's models: its slots run again
            log.error("--resume: discarding %s (%s): round %d's air slots count only if they run again", path, exc,
                      round_)
            path.unlink(missing_ok=True)
            return
        if figures.get("spread") is not None:
            models["spread"] = float(figures["spread"])
        self.models[round_] = models
        self.stats[round_] = list(figures.get("stats") or [])
        if figures.get("distinct") is not None:
            self.distinct[round_] = int(figures["distinct"])
        if figures.get("dropped"):
            self.edges_dropped[round_] = set(figures["dropped"])
        log.info("resumed round %d with the models the medium saw before the restart", round_)

    # ---- per-round figures --------------------------------------------------------------------
    def round_columns(self, round_: int, models: dict) -> dict:
        rows = self.stats.pop(round_, [])
        out = {"air_slots": len(rows), "air_transmitters": int(sum(r["air_transmitters"] for r in rows)),
               "air_active_expected": int(sum(r["active_expected"] for r in rows)),
               "air_missing": int(sum(r.get("missing_transmitters", 0) for r in rows)),
               "air_refused": int(sum(r.get("air_refused", 0) for r in rows)),
               "air_edges_dropped": len(self.edges_dropped.pop(round_, ())),
               "activity_rate": float(np.mean([r["activity_rate"] for r in rows])) if rows else None,
               "device_models_distinct": self.distinct.pop(round_, None),
               "model_spread": models.get("spread"),
               "medium_seconds": self.seconds}
        if rows and not self.plane.exact:
            out.update(received_power=float(np.mean([r["received_power"] for r in rows])),
                       interference_power=float(np.mean([r["interference_power"] for r in rows])),
                       downlink_interference_power=float(np.mean([r["downlink_interference_power"] for r in rows])),
                       psi_used=float(rows[-1]["psi"]))
        self.seconds = 0.0
        return out

    def take_models(self, round_: int) -> dict:
        return self.models.pop(round_, {})

    def positions(self, max_interferers: int = MAX_INTERFERERS_SHOWN) -> dict:
        """The plane for observers (the live page), in metres: the run's edges are its clusters 0..C-1 and its device
        k is plane device k; the other servers and their devices are interferers (the first `max_interferers` of
        those devices are listed, with their total)."""
        top = self.plane.topology
        xy = lambda a: np.round(a, 1).tolist()  # noqa: E731 - decimetres are finer than any drawing
        run_devices = top.collaborating_devices
        others = top.interferer_devices
        return {"units": "metres", "window_radius": top.window_radius, "r0": top.r0, "R": top.R,
                "model": self.cfg.channel.model,
                "edges": [{"id": topology.edge_id(i), "x": x, "y": y} for i, (x, y) in
                          enumerate(xy(top.edges[:top.collaborating]))],
                "devices": [{"id": topology.device_id(int(k)), "edge": topology.edge_id(int(top.device_edge[k])),
                             "x": x, "y": y} for k, (x, y) in zip(run_devices, xy(top.devices[run_devices]))],
                "interferer_edges": xy(top.edges[top.collaborating:]),
                "interferer_devices": xy(top.devices[others[:max_interferers]]),
                "interferer_devices_total": int(others.size)}

    def describe(self) -> dict:
        top = self.plane.topology
        return {"model": self.cfg.channel.model, "weighting": self.cfg.channel.weighting, "edges_in_plane": top.n_edges, "collaborating": top.collaborating,
                "devices_in_plane": top.n_devices, "rho": self.plane.rho, "psi_mode": self.plane.psi_mode,
                "receiver": self.plane.receiver, "estimator": estimator_label(self.plane.receiver, self.plane.psi_mode, self.plane.exact),
                "psi_closed_form": self.plane.psi, "psi_empirical": self.psi_mean if self.psi_count else None,
                "beta": self.plane.beta, "interferers": self.cfg.channel.interferers,
                "evaluated": "accuracy: the ideal global model (exact mean of the transmitted models, eq. 11); "
                             "accuracy_reference: device 0 of the reference cluster (Theorem 1); "
                             "accuracy_device_mean: the mean of every device's estimate"}
