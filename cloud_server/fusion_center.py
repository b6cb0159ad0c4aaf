"""The cloud as paper 004's fusion center, for relay algorithms (plans.Algorithm.relay).

Each round it draws the cluster sizes {c_m} and the devices (quantization.precision) and sends every drawn
device its own bits / epsilon_1 in the round plan. Edges forward each upload unchanged (digest 004 P13); here
each relayed upload is checked, dequantized, passed through its device's link (AWGN of std sigma_m), and scored
by the fusion rule. The global step is sum_i omega_i y_i with omega_i = s_i / sum_j s_j over every device of the
round, so an edge's uploads reduce exactly to (sum_i s_i y_i / sum_i s_i, sum_i s_i): that pair is the edge's
result (persisted before the Ack like any other), and the cloud's weighted mean over edges with weights sum_i s_i
is the paper's fusion over all devices.
"""
from __future__ import annotations

import hashlib
import logging
import math
import pathlib

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from hfl.common import metrics, plans, relay_tag, topology, validate, wire
from hfl.common.pipeline import Link, StageRef
from hfl.common.quantization import fusion, precision, theory
from hfl.common.seeding import numpy_rng
from hfl.proto import hfl_v1_pb2 as pb

FUSION_WEIGHT = "fusion_weight"  # an edge result's sum of fusion scores (set by the cloud, never by an edge)
log = logging.getLogger("hfl.fusion")
SCORE_FLOOR = 1e-30              # FWO: scores capped at 1 / floor, so a perfect upload (theta = inf) stays finite


def _refuse(message: str, reason: str, code=grpc.StatusCode.INVALID_ARGUMENT) -> wire.WireError:
    return wire.WireError(code, message, reason)


class FusionCenter:
    def __init__(self, cfg, dim: int, run_dir: pathlib.Path, refusals=None):
        self.cfg = cfg
        self.dim = dim
        self.groups = precision.resolve(cfg)
        self.mode = precision.cluster_mode(cfg)
        self.rule = precision.fusion_rule(cfg)
        self.estimate = cfg.precision.distortion_estimate
        self.uplink = Link.device_uplink(cfg)
        self.codec = cfg.pipeline.uplink_encoding
        self.codec_eps = self.uplink.encode_params.get("epsilon1")
        self.log_path = run_dir / "fusion.jsonl"
        self.edges = topology.edge_ids(cfg)
        self._round: tuple[int, dict[str, dict], tuple[int, ...]] | None = None
        self.fused: list[dict] = []
        self.relay_secret = relay_tag.secret_from_env()  # None: relayed uploads cannot be authenticated
        self.missing: dict[int, int] = {}  # round -> drawn devices an edge submitted without (dropped on the way)
        self.refused: dict[int, int] = {}  # round -> relayed uploads refused alone (their edges' others fused)
        self.refusals = refusals  # service_base.Refusals: each upload refused alone is counted with its reason

    # ---- the round plan ---------------------------------------------------------------------------
    def draw(self, r: int) -> tuple[dict[str, dict], tuple[int, ...]]:
        """Round r's drawn devices with their plan entries, and {c_m}: a pure function of (seed, r)."""
        if self._round is None or self._round[0] != r:
            seed = self.cfg.run.seed
            sizes = precision.cluster_sizes(self.groups, self.mode, self.cfg.precision.participants,
                                            self.cfg.precision.bit_budget, numpy_rng(seed, "cloud", 0, r, "cluster_sizes"))
            drawn = precision.draw_devices(self.groups, sizes.sizes, numpy_rng(seed, "cloud", 0, r, "clusters"))
            self._round = (r, {topology.device_id(i): self.groups.device_plan(i) for i in drawn}, sizes.sizes)
        return self._round[1], self._round[2]

    def cluster_plans(self, r: int) -> dict[str, pb.ClusterPlan]:
        devices, _ = self.draw(r)
        out = {}
        for e in self.edges:
            plan = pb.ClusterPlan(only_listed=True)
            for d in topology.edge_members(self.cfg, topology.edge_index(e)):
                if d in devices:
                    plan.participants.append(d)
                    plan.devices[d].params.update(devices[d])
            out[e] = plan
        return out

    def round_stats(self, r: int) -> dict:
        devices, sizes = self.draw(r)
        bits = sum(int(p["bits"]) for p in devices.values())
        eps = [p.get("epsilon1", self.codec_eps) for p in devices.values()]
        out = {"cluster_sizes": list(sizes), "bits_per_coordinate": bits, "drawn_devices": len(devices),
               "relay_missing": self.missing.pop(r, 0), "relay_refused": self.refused.pop(r, 0)}
        if self.codec in ("dpsq", "laplace-sq") and eps and all(e is not None for e in eps):
            out["epsilon_claimed"] = theory.dpsq_upload_epsilon(self.dim, max(eps))
        return out

    # ---- one edge's relayed uploads ---------------------------------------------------------------
    def fuse(self, edge: str, envelope: pb.Envelope, r: int, plan_len: int) -> tuple[np.ndarray, float, list[dict]]:
        """Check, dequantize, pass through the link and score every upload `edge` relayed. A bad upload (forged,
        replayed, altered, not drawn) is refused alone, counted with its reason, and the others are fused; a submit
        with no good upload, or a malformed submit, raises WireError and changes nothing. Returns
        (sum s_i y_i / sum s_i, sum s_i, rows for fusion.jsonl)."""
        if envelope.tensors:
            raise _refuse(f"{edge} sent tensors: under {self.cfg.run.algorithm} an edge only relays its devices' "
                          "uploads", "bad_tensors")
        if envelope.WhichOneof("payload") == "air":
            raise _refuse(f"{edge} sent air rows: under {self.cfg.run.algorithm} an edge only relays its devices' "
                          "uploads", "bad_relay")
        uploads = envelope.relay.uploads
        if len(uploads) != envelope.meta.num_devices:
            raise _refuse(f"{edge} relays {len(uploads)} uploads but says num_devices = "
                          f"{envelope.meta.num_devices}", "bad_relay")
        drawn, _ = self.draw(r)
        members = set(topology.edge_members(self.cfg, topology.edge_index(edge)))
        seen: set[str] = set()
        acc = np.zeros(self.dim, np.float64)
        total = 0.0
        rows, refused = [], []
        for raw in uploads:
            try:
                node, score, y, row = self._one(edge, envelope.meta.run_id, raw, r, plan_len, drawn, members, seen)
            except wire.WireError as exc:
                refused.append(exc)
                continue
            acc += score * y.astype(np.float64)
            total += score
            rows.append(row)
        if refused and not rows:
            raise refused[0]
        for exc in refused:
            if self.refusals is not None:
                self.refusals.add(exc.reason, edge, f"one relayed upload, the others fused: {exc}")
        self.refused[r] = self.refused.get(r, 0) + len(refused)
        drawn_here = sorted(set(drawn) & members)
        if len(seen) < len(drawn_here):  # an edge may drop an upload: it cannot hide that it did
            log.warning("round %d: %s relayed %d of its %d drawn devices (missing %s)", r, edge, len(seen),
                        len(drawn_here), sorted(set(drawn_here) - seen)[:5])
            self.missing[r] = self.missing.get(r, 0) + len(drawn_here) - len(seen)
        delta = (acc / total).astype(np.float32) if total > 0 else np.zeros(self.dim, np.float32)
        return delta, total, rows

    def _one(self, edge: str, run_id: str, raw: bytes, r: int, plan_len: int, drawn: dict, members: set,
             seen: set) -> tuple[str, float, np.ndarray, dict]:
        """One relayed upload checked and scored: (device, score, y, its fusion.jsonl row); WireError if refused."""
        try:
            upload = pb.Envelope.FromString(raw)
        except DecodeError as exc:
            raise _refuse(f"{edge} relayed an unreadable upload: {exc}", "malformed") from None
        meta = upload.meta
        validate.check_meta(meta, self.cfg.run.rounds, plan_len)
        node = meta.sender_id
        if node not in members or node not in drawn:
            raise _refuse(f"{edge} relayed an upload from {validate.short(node)}, not one of its devices drawn for "
                          f"round {r}", "bad_relay", grpc.StatusCode.PERMISSION_DENIED)
        if node in seen:
            raise _refuse(f"{edge} relayed {node} twice in round {r}", "replay", grpc.StatusCode.ALREADY_EXISTS)
        if meta.round != r or meta.run_id != run_id or meta.phase != plans.EDGE_MODEL_SYNC:
            raise _refuse(f"{edge} relayed {node}'s upload for round {meta.round} ({validate.short(meta.phase)}), "
                          f"not round {r}", "wrong_round", grpc.StatusCode.FAILED_PRECONDITION)
        tensor = wire.single_tensor(upload, "delta")
        if self.relay_secret is not None:
            relay_tag.check(self.relay_secret, run_id, upload)
        if tensor.encoding != self.codec:
            raise _refuse(f"{node}'s upload is {validate.short(tensor.encoding)}, the run's uplink codec is "
                          f"{self.codec}", "wrong_codec")
        bits = int(drawn[node]["bits"])
        payload = precision.check_upload_header(self.groups, tensor, bits, node)
        std = float(drawn[node]["link_std"])
        link = StageRef("channel", "awgn", {"std": std}) if std > 0 else None
        y, _ = self.uplink.receive(tensor, self.dim, self.cfg.run.seed, topology.device_index(node), r, meta.step, link)
        distortion = self._distortion(node, upload, payload, bits, drawn[node]) if self.rule == "fwo" else None
        score = min(float(fusion.fusion_scores(self.rule, bits=[bits], distortions=[distortion or 0.0],
                                               link_stds=[std], dim=self.dim)[0]), 1 / SCORE_FLOOR)
        row = {"round": r, "device": node, "edge": edge, "group": int(drawn[node]["group"]), "bits": bits,
               "link_std": std, "score": score, "distortion": distortion, "bytes": len(tensor.data),
               "sha256": hashlib.sha256(tensor.data).hexdigest()}
        seen.add(node)  # fused: a second upload of the device is a replay; one refused leaves it missing
        return node, score, y, row

    def _distortion(self, node: str, upload: pb.Envelope, payload, bits: int, plan: dict) -> float:
        """FWO's E||Q(v)-v||^2 for one upload, by the configured estimate (digest 004 P3)."""
        if self.estimate == "device":
            reported = [t.params["expected_distortion"] for t in upload.meta.transforms
                        if t.stage == "encode" and "expected_distortion" in t.params]
            if len(reported) != 1 or not (math.isfinite(reported[0]) and reported[0] >= 0):
                raise _refuse(f"{node} reported no valid expected distortion (FWO's eq. 7 estimate)", "bad_transforms")
            distortion = float(reported[0])
        elif self.estimate == "uniform_cell":
            eps = float(plan.get("epsilon1", self.codec_eps) or 0.0)
            step = (float(payload.side[1]) - float(payload.side[0])) / (payload.levels - 1)
            distortion = self.dim * float(theory.dpsq_uniform_cell_distortion(step, eps))
        else:
            distortion = theory.dpsq_vector_bound(self.dim, self.groups.clip, bits)
        return distortion

    def log(self, rows: list[dict]) -> None:
        """fusion.jsonl: every fused upload with its weight omega_i (over the whole round) and its hash."""
        total = sum(row["score"] for row in rows)
        for row in sorted(rows, key=lambda x: x["device"]):
            metrics.append_jsonl(self.log_path, {**row, "weight": row["score"] / total if total else 0.0})

    def describe(self) -> dict:
        g = self.groups
        out = {"fusion": self.rule, "cluster_mode": self.mode, "distortion_estimate": self.estimate,
               "groups": [{"devices": s, "bits": b, "link_std": g.link_std[m],
                           "epsilon1": g.epsilon1[m] if g.epsilon1 else self.codec_eps}
                          for m, (s, b) in enumerate(zip(g.sizes, g.bits))],
               "participants": self.cfg.precision.participants or sum(g.sizes),
               "relay_integrity": ("device tags checked (HMAC keyed from HFL_RELAY_SECRET): an edge can delay or drop "
                                   "an upload, with a trace in relay_missing, not forge, replay or alter one (each "
                                   "such upload is refused alone, counted in relay_refused)")
               if self.relay_secret is not None else ("unchecked: HFL_RELAY_SECRET was not given to the cloud and "
                                                      "the device hosts, so an edge could forge or replay uploads"),
               "bit_budget": self.cfg.precision.bit_budget or None}
        if getattr(wire.CODECS.get(self.codec), "private", False):
            out["epsilon"] = "inf"
            out["epsilon_label"] = ("epsilon = inf: not DP under record or user adjacency (the range and the cell "
                                    "index are exact functions of the update, digest 004 P1, and the coins protect "
                                    "only inputs in the same cell, P2). epsilon_claimed: the paper's claim, "
                                    "d * epsilon1 per device per upload, no composition over rounds; not computed "
                                    "by an accountant")
        return out
