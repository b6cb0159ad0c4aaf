"""The cloud's side of each round mode (common/modes.py): what an edge's result carries, how the round's model is
made, which figures the round adds. The cloud service calls these at fixed points and never asks which mode runs.

A mode gets narrow ports (the config, the run directory, the model's size and two callbacks on the edges'
liveness), never the server object.
"""
from __future__ import annotations

import logging
import pathlib
from dataclasses import dataclass
from typing import Callable

import grpc
import numpy as np

from hfl.common import modes, plans, robust, topology, wire
from hfl.common.pipeline import Link
from hfl.common.privacy.trust import sample_participants
from hfl.common.seeding import numpy_rng
from hfl.proto import hfl_v1_pb2 as pb

from .fusion_center import FUSION_WEIGHT, FusionCenter

log = logging.getLogger("hfl.cloud")

# The cloud's weight of one edge's result under aggregation.cloud_weights (normalised by the aggregator):
# its samples, its devices (N_l / N), equal (1 / L: paper 000), or its share of the fusion scores (relay, paper 004).
CLOUD_WEIGHTS = {
    "samples": lambda res: float(res.samples),
    "devices": lambda res: float(res.devices),
    "equal": lambda res: 1.0,
    "fusion": lambda res: float(res.scalars[FUSION_WEIGHT]),
}


class RoundRefused(Exception):
    """The round cannot be run (the privacy budget forbids it); the run stops with this reason."""


@dataclass
class CloudPorts:
    cfg: object
    run_dir: pathlib.Path
    dim: int
    expected_edges: Callable[[], list[str]]     # the edges still worth waiting for (live, not given up)
    drop_edges: Callable[[set[str]], None]      # stop waiting for these in this round (they are back when they submit)
    slot_timeout_s: float                       # how long a shared slot waits for a missing edge
    refusals: object = None                     # service_base.Refusals: what a mode refuses outside an RPC is counted
    device_samples: tuple = ()                  # every device's sample count D_y, by device index


@dataclass
class Accepted:
    delta: np.ndarray
    scalars: dict    # added to the edge's own scalars
    fused: list      # relay: one row per fused device upload


class DigitalCloud:
    """Each edge submits its cluster's model delta over the backhaul; the cloud aggregates the deltas."""

    def __init__(self, ports: CloudPorts):
        self.cfg, self.dim, self.run_dir = ports.cfg, ports.dim, ports.run_dir
        self.ports = ports
        self.backhaul = Link.from_config(self.cfg.pipeline, "backhaul")
        self.edges = topology.edge_ids(self.cfg)
        self.weights_rule = plans.weights_rule(self.cfg, "cloud")

    # ---- one edge's result --------------------------------------------------------------------
    def state(self) -> dict:
        """What the mode keeps across rounds that a resumed cloud needs (JSON), saved with each checkpoint."""
        return {}

    def restore(self, state: dict, round_: int) -> None:
        """A resumed cloud: the mode's state as of the checkpoint, and the round that resumes."""

    @property
    def result_size(self) -> int:
        """Values in an accepted edge result's delta (what a resumed cloud checks its pending results against)."""
        return self.dim

    def accept(self, edge: str, envelope: pb.Envelope, round_: int, records) -> Accepted:
        """Decode an edge's result (raises WireError and changes nothing); `records` are its DP events."""
        delta, _ = self.backhaul.receive(wire.single_tensor(envelope, "delta"), self.dim, self.cfg.run.seed,
                                         topology.edge_index(edge), round_, envelope.meta.step)
        return Accepted(delta, {}, [])

    async def air(self, edge: str, envelope: pb.Envelope, round_: int, phases) -> list[pb.Envelope] | None:
        raise wire.WireError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"{self.cfg.run.algorithm} does not run on the wireless medium", "no_medium")

    # ---- the round ----------------------------------------------------------------------------
    def decide(self, r: int):
        """A controller's decision for round r (None: the round runs as configured)."""
        return None

    def plan(self, r: int, decision, schedule) -> list[pb.Phase]:
        return schedule.plan(r)

    def cluster_plans(self, r: int, decision) -> dict[str, pb.ClusterPlan]:
        """Round r's per-cluster plan (participants here); raises RoundRefused when the round must not run."""
        if not self.cfg.train.participants:
            return {}
        return {e: pb.ClusterPlan(participants=sample_participants(
            topology.edge_members(self.cfg, topology.edge_index(e)), self.cfg.train.participants,
            numpy_rng(self.cfg.run.seed, "cloud", 0, r, "participants", e))) for e in self.edges}

    def model(self, r: int, results: dict, w: np.ndarray) -> np.ndarray | None:
        """The round's global model; None keeps the previous one (nothing to aggregate)."""
        names = sorted(n for n, res in results.items() if res.devices > 0)  # arrival order must not matter
        if not names:
            return None
        weights = [CLOUD_WEIGHTS[self.weights_rule](results[n]) for n in names]
        # w_{t+1} = w_t + sum_l (N_l / N) delta_l  (or sample counts, or 1 / L each), in float64
        step = robust.aggregate(self.cfg.pipeline.aggregate, self.cfg.pipeline.params,
                                [results[n].delta for n in names], weights)
        return (w.astype(np.float64) + step).astype(np.float32)

    def evaluated(self, r: int) -> dict[str, np.ndarray]:
        """Models evaluated beside the global one (name -> weights): accuracy_<name> columns."""
        return {}

    def columns(self, r: int, results: dict, stats: dict) -> None:
        """Add the mode's figures to round r's metrics row."""

    def describe(self, rows: list[dict]) -> dict:
        """The mode's entries of summary.json."""
        return {}

    def plots(self, rows: list[dict], title: str) -> None:
        """Extra plots in the run directory (accuracy.png is the service's)."""

    def component(self, name: str):
        """A named part of the mode for observers (the live page): "fusion", "medium", "policy", "controller"."""
        return getattr(self, name, None) if name in ("fusion", "medium") else None


class RelayCloud(DigitalCloud):
    """The edges forward every device upload unchanged; the cloud fuses them (paper 004, digest P13)."""

    def __init__(self, ports: CloudPorts):
        super().__init__(ports)
        self.fusion = FusionCenter(self.cfg, self.dim, self.run_dir, ports.refusals)

    def accept(self, edge: str, envelope: pb.Envelope, round_: int, records) -> Accepted:
        delta, weight, fused = self.fusion.fuse(edge, envelope, round_, 1 << 16)
        return Accepted(delta, {FUSION_WEIGHT: weight}, fused)

    def cluster_plans(self, r: int, decision) -> dict[str, pb.ClusterPlan]:
        return self.fusion.cluster_plans(r)

    def columns(self, r: int, results: dict, stats: dict) -> None:
        stats.update(self.fusion.round_stats(r))
        self.fusion.log([row for e in sorted(results) for row in results[e].fused])

    def describe(self, rows: list[dict]) -> dict:
        out = {"fusion": self.fusion.describe()}
        if "epsilon" in out["fusion"]:
            out["epsilon"] = out["fusion"]["epsilon"]
        claims = [r["epsilon_claimed"] for r in rows if r.get("epsilon_claimed") is not None]
        if claims:
            out["epsilon_claimed"] = max(claims)
        return out


class AirCloud(DigitalCloud):
    """Uploads travel over the cloud's wireless medium (paper 003); the round's model is the ideal global model the
    medium saw (eq. 11), the reference device's and the mean device's estimates are evaluated beside it."""

    EXTRA = ("reference", "device_mean")

    def __init__(self, ports: CloudPorts):
        super().__init__(ports)
        from .medium import Medium

        self.medium = Medium(self.cfg, self.run_dir, self.dim, ports.refusals, ports.device_samples)
        self.round_models: dict = {}

    result_size = 0  # the medium holds the round's models

    def state(self) -> dict:
        return self.medium.state()

    def restore(self, state: dict, round_: int) -> None:
        self.medium.restore(state, round_)

    def accept(self, edge: str, envelope: pb.Envelope, round_: int, records) -> Accepted:
        if envelope.tensors:
            raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, "on the wireless medium an edge submits no "
                                 "model: the medium holds the round's models", "bad_tensors")
        return Accepted(np.zeros(0, np.float32), {}, [])

    async def air(self, edge: str, envelope: pb.Envelope, round_: int, phases) -> list[pb.Envelope] | None:
        try:
            emission = self.medium.parse(envelope, round_, phases)
        except wire.WireError as exc:  # an authenticated edge with nothing valid for this slot: do not wait for it
            if exc.reason != "replay" and envelope.meta.round == round_:
                self.medium.refused(edge, round_, envelope.meta.step, self.ports.slot_timeout_s)
            raise
        return await self.medium.air(edge, emission, round_, envelope.meta.step, phases, self.ports.expected_edges,
                                     self.ports.slot_timeout_s, self.ports.drop_edges)

    def model(self, r: int, results: dict, w: np.ndarray) -> np.ndarray | None:
        self.round_models = self.medium.take_models(r)
        ideal = self.round_models.get("ideal")
        if ideal is None:
            log.warning("round %d: the medium saw no model transmission; keeping the previous global model", r)
            return None
        return ideal.astype(np.float32)

    def evaluated(self, r: int) -> dict[str, np.ndarray]:
        return {k: v for k, v in self.round_models.items() if k in self.EXTRA}

    def columns(self, r: int, results: dict, stats: dict) -> None:
        stats["air_dropped"] = int(sum(x.scalars.get("air_dropped", 0) for x in results.values()))
        stats.update(self.medium.round_columns(r, self.round_models))

    def describe(self, rows: list[dict]) -> dict:
        out = {"medium": self.medium.describe()}
        evaluated = [r for r in rows if r["accuracy"] is not None]
        for name in self.EXTRA:  # the paper reports the reference device (Theorem 1)
            values = [r.get(f"accuracy_{name}") for r in evaluated if r.get(f"accuracy_{name}") is not None]
            out[f"final_accuracy_{name}"] = values[-1] if values else None
        return out


modes.register_tier("cloud", "digital", DigitalCloud)
modes.register_tier("cloud", "relay", RelayCloud)
modes.register_tier("cloud", "air", AirCloud)
