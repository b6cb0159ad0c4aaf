"""The emulated clock of a run: emulated seconds and joules of every round, whatever the algorithm.

The physics is common/channel/clock.py; this module applies it to what the services see. Digital links
(papers 000 App. D and 001 sec. IV): every device has its own band W (orthogonal, interference-free
access), a message of b bits takes b / (W log2(1 + p |h|^2 / (N_0 W))) with |h|^2 = beta(d) |u|^2, the
distance d from the run's geometry and u ~ CN(0, 1) redrawn per message from (run seed, slot, tx, rx).
The backhaul is wired: b / rate. A device's training takes samples x cycles per sample / f (paper 003,
t_CM = c N_b / f; paper 001, t_CP = c D / f), f heterogeneous per device.

Barrier semantics (the edge waits for every participant, the cloud for every edge):
  device-upload phase of a cluster:  max_d (t_compute,d + t_air,d) + t_broadcast
  round:                             t_cloud->edge + max_e (sum of e's phases + t_edge->cloud,e)
Energy (joules): each device p t_air + kappa f^2 cycles; each edge P_edge x (its broadcasts + its backhaul
upload); the cloud's own sends cost time only. Message sizes are the bytes on the wire, so quantized
codecs shorten air time. Emulated figures depend on the config, the seed and the message sizes only,
never on wall time; a restarted round attempt starts its cluster's clock afresh, and a member dropped
by a barrier timeout does not count (the emulated barrier waits only for those who took part).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hfl.common import plans, topology
from hfl.common.seeding import numpy_rng

from . import clock
from .clock import slot


# scalars an edge reports with its submit (registered in hfl.common.validate.SCALARS)
CLUSTER_SECONDS, DEVICE_JOULES, EDGE_JOULES = "clock_seconds", "device_joules", "edge_joules"
# the latency model's inputs as this cluster saw them (paper 001's t_CP, t_DE): the slowest participant's
# compute time of one SGD step, and its upload air time (largest over the round's upload phases)
STEP_SECONDS, UPLOAD_SECONDS = "t_step_seconds", "t_upload_seconds"
SAMPLES_PROCESSED = "samples_processed"  # optional, from a device: samples it trained on since its last upload
BACKHAUL_BYTES = "backhaul_bytes"  # measured by the cloud on a submit; unregistered, so no peer can claim it


@dataclass(frozen=True)
class ClockParams:
    bandwidth_hz: float
    device_power_w: float
    edge_power_w: float
    noise_dbm_per_hz: float
    beta0_db: float
    exponent: float
    d0: float
    fading: bool
    backhaul_rate_bps: float
    cycles_per_sample: float
    kappa: float
    downlink: bool
    pace: bool

    @classmethod
    def from_config(cls, cfg) -> "ClockParams":
        k = cfg.clock
        return cls(bandwidth_hz=k.bandwidth_hz, device_power_w=float(clock.dbm_to_watts(k.device_power_dbm)),
                   edge_power_w=float(clock.dbm_to_watts(k.edge_power_dbm)), noise_dbm_per_hz=k.noise_dbm_per_hz,
                   beta0_db=k.beta0_db, exponent=k.pathloss_exponent, d0=k.d0, fading=k.fading,
                   backhaul_rate_bps=k.backhaul_rate_bps, cycles_per_sample=k.cycles_per_sample, kappa=k.kappa,
                   downlink=k.downlink, pace=k.pace)


def device_distances(cfg) -> np.ndarray:
    """[N] distance (m) of every device of the run to its edge, the same in every process (run seed).

    ring: |y| = sqrt(r0^2 + u (R^2 - r0^2)), the MCP-H offset law of paper 003 (digest 3.1) with the
    [channel] r0, R; matern: the whole MCP-H plane of [channel] with the run's edges as its collaborating
    clusters (the geometry an over-the-air medium draws); fixed: clock.device_distance for all."""
    n, mode, ch = cfg.num_devices, cfg.clock.geometry, cfg.channel
    if mode == "fixed":
        return np.full(n, float(cfg.clock.device_distance))
    rng = numpy_rng(cfg.run.seed, "cloud", 0, 0, "clock", mode)
    if mode == "ring":
        return np.sqrt(ch.r0 ** 2 + rng.random(n) * (ch.R ** 2 - ch.r0 ** 2))
    from .plane import plane_for  # the plane the medium uses

    return np.linalg.norm(plane_for(cfg).topology.offsets[:n], axis=1)


def device_cpu_hz(cfg) -> np.ndarray:
    """[N] CPU frequency of every device: uniform in [f (1 - spread), f (1 + spread)], from the run seed."""
    rng = numpy_rng(cfg.run.seed, "cloud", 0, 0, "clock", "cpu_hz")
    return clock.device_frequencies(cfg.num_devices, cfg.clock.cpu_hz, cfg.clock.cpu_spread, rng)


def planned_samples(phases, prev_step: int, step: int, n: int, batch: int) -> int:
    """Samples one device trained on in phases prev_step + 1 .. step (its work since its previous upload),
    as the trainer draws them: local_sgd takes `steps` mini-batches of min(B, n) or `epochs` passes over n,
    local_dp_sgd `steps` lots of q n on average;
    an edge gradient step one mini-batch."""
    b = min(batch, n)
    total = 0
    for phase in phases[prev_step + 1: step + 1]:
        if phase.kind == plans.LOCAL_SGD:
            p = phase.params
            total += int(p["epochs"]) * n if "epochs" in p else int(p.get("steps", 0)) * b
        elif phase.kind == plans.LOCAL_DP_SGD:  # expected lot size q n per step
            total += int(round(int(phase.params["steps"]) * float(phase.params["q"]) * n))
        elif phase.kind in (plans.EDGE_GRADIENT_STEP, plans.AIR_GRADIENT_STEP):
            total += b
    return total


def link_gains(p: ClockParams, seed: int, slot_: int, tx, rx, distance) -> np.ndarray:
    return clock.digital_link_gain(seed, slot_, tx, rx, distance, p.beta0_db, p.exponent, p.d0, p.fading)


def air_times(p: ClockParams, bits, gains, power_w: float) -> np.ndarray:
    """bits / (W log2(1 + p |h|^2 / (N_0 W))) per message (paper 001, t_DE; paper 000, MQ / R_j)."""
    return clock.digital_air_time(bits, p.bandwidth_hz, clock.snr(power_w, gains, p.noise_dbm_per_hz, p.bandwidth_hz))


def upload_phase(p: ClockParams, bits, samples, gains, cpu_hz) -> tuple[float, np.ndarray]:
    """One device-upload phase of a cluster: (seconds until the slowest participant's upload is in,
    [k] joules per participant: p t_air + kappa f^2 cycles). Every argument is per participant."""
    cycles = clock.compute_cycles(samples, p.cycles_per_sample)
    air = air_times(p, bits, gains, p.device_power_w)
    seconds = clock.phase_time(clock.compute_time(samples, p.cycles_per_sample, cpu_hz) + air)
    return seconds, clock.device_energy(p.device_power_w, air, cycles, cpu_hz, p.kappa)


def broadcast(p: ClockParams, bits: float, gains) -> tuple[float, float]:
    """The edge sends one message to all of `gains`' receivers at P_edge: the slowest receiver sets the time
    (it must decode too); (seconds, the edge's joules). Zero when clock.downlink is off."""
    gains = np.asarray(gains, dtype=np.float64)
    if not p.downlink or gains.size == 0:
        return 0.0, 0.0
    seconds = float(air_times(p, bits, gains.min(), p.edge_power_w))
    return seconds, float(clock.transmit_energy(p.edge_power_w, seconds))


def round_time(p: ClockParams, down_bits: float, cluster_seconds, up_bits) -> tuple[float, np.ndarray]:
    """(round seconds, [E] backhaul upload seconds): the model goes down every edge's link at once, then the
    cloud waits for its slowest edge (cluster phases + upload); no edge, no time after the downlink."""
    up = clock.backhaul_time(up_bits, p.backhaul_rate_bps)
    total = np.asarray(cluster_seconds, dtype=np.float64) + up
    return float(clock.backhaul_time(down_bits, p.backhaul_rate_bps)) + clock.phase_time(total), up


class EdgeClock:
    """One edge's emulated clock for its cluster's part of a round (the edge calls start, uploaded, phase, report)."""

    def __init__(self, cfg, edge_index: int, members: list[str], samples: dict[str, int]):
        self.p = ClockParams.from_config(cfg)
        self.seed = cfg.run.seed
        self.batch = cfg.train.batch_size
        self.node = {m: topology.device_index(m) for m in members}
        self.edge_node = cfg.num_devices + edge_index  # fading draws: devices 0..N-1, edges N..
        dist, cpu = device_distances(cfg), device_cpu_hz(cfg)
        self.distance = {m: float(dist[i]) for m, i in self.node.items()}
        self.cpu_hz = {m: float(cpu[i]) for m, i in self.node.items()}
        self.samples = {m: int(samples.get(m, self.batch)) for m in members}
        self.start(0, [], (), 0)

    def start(self, round_: int, phases, receivers, model_bytes: int) -> None:
        """A new round attempt: the edge has just broadcast the global model (`model_bytes`) to `receivers`."""
        self.round, self.phases = round_, list(phases)
        self.seconds = self.device_j = self.edge_j = 0.0
        self.step_s = self.upload_s = 0.0
        self.last_upload: dict[str, int] = {}
        self.sizes: dict[tuple[int, str], int] = {}
        self._broadcast(-1, sorted(receivers), model_bytes)

    def uploaded(self, step: int, node: str, nbytes: int) -> None:
        self.sizes[(step, node)] = nbytes

    def phase(self, step: int, contributions, reply_bytes: int) -> None:
        """The barrier of phase `step` closed on `contributions` (node -> object with .scalars) and the edge
        sends a `reply_bytes` reply to those nodes."""
        nodes = sorted(contributions)
        if not nodes:
            return
        samples = [int(contributions[n].scalars.get(SAMPLES_PROCESSED, planned_samples(
            self.phases, self.last_upload.get(n, -1), step, self.samples[n], self.batch))) for n in nodes]
        bits = [8 * self.sizes.get((step, n), 0) for n in nodes]
        tx = [self.node[n] for n in nodes]
        gains = link_gains(self.p, self.seed, slot(self.round, step), tx, self.edge_node, [self.distance[n] for n in nodes])
        cpu = [self.cpu_hz[n] for n in nodes]
        seconds, joules = upload_phase(self.p, bits, samples, gains, cpu)
        self.step_s = max(self.step_s, float(np.max(clock.compute_time(self.batch, self.p.cycles_per_sample, cpu))))
        self.upload_s = max(self.upload_s, float(np.max(air_times(self.p, bits, gains, self.p.device_power_w))))
        self.seconds += seconds
        self.device_j += float(joules.sum())
        self.last_upload.update((n, step) for n in nodes)
        self._broadcast(step, nodes, reply_bytes)

    def air_phase(self, step: int, contributions, plane, dim: int) -> None:
        """An air slot (paper 003, eq. 36): the slowest participant's compute, the uplink slot d / W, for the
        inter-cluster step (group = 1) the received signal up the backhaul and the sum back (64 d bits each way,
        complex64), and the downlink slot d / W. A transmitter spends |p_y|^2 d / W (its per-entry power over
        the slot; E|p|^2 = P_u), the edge P_d d / W; every participant its compute energy."""
        from . import ota
        from .power import inversion_coefficient

        nodes = sorted(contributions)
        if not nodes:
            return
        samples = [planned_samples(self.phases, self.last_upload.get(n, -1), step, self.samples[n], self.batch)
                   for n in nodes]
        cpu = [self.cpu_hz[n] for n in nodes]
        compute = clock.compute_time(samples, self.p.cycles_per_sample, cpu)
        t_slot = clock.ota_slot_time(dim, self.p.bandwidth_hz)
        group = self.phases[step].params.get("group", 0.0) == 1.0
        backhaul = 2 * float(clock.backhaul_time(64 * dim, self.p.backhaul_rate_bps)) if group else 0.0
        self.seconds += clock.phase_time(compute) + 2 * t_slot + backhaul
        tx = np.array([self.node[n] for n in nodes if contributions[n].vec is not None], dtype=np.int64)
        if tx.size:
            top = plane.topology
            f = ota.own_uplink_fading(top, slot(self.round, step), plane.seed, tx, plane.params)
            p = inversion_coefficient(f, np.linalg.norm(top.offsets[tx], axis=1), plane.rho, plane.params.alpha,
                                      np.ones(tx.size, dtype=bool))
            self.device_j += float(clock.transmit_energy(np.abs(p) ** 2, t_slot).sum())
        cycles = clock.compute_cycles(samples, self.p.cycles_per_sample)
        self.device_j += float(np.sum(clock.compute_energy(cycles, cpu, self.p.kappa)))
        self.edge_j += float(clock.transmit_energy(plane.params.P_d, t_slot))
        self.step_s = max(self.step_s, float(np.max(clock.compute_time(self.batch, self.p.cycles_per_sample, cpu))))
        self.upload_s = max(self.upload_s, t_slot)
        self.last_upload.update((n, step) for n in nodes)

    def _broadcast(self, step: int, nodes: list[str], nbytes: int) -> None:
        if not nodes:
            return
        gains = link_gains(self.p, self.seed, slot(self.round, step), self.edge_node, [self.node[n] for n in nodes],
                           [self.distance[n] for n in nodes])
        seconds, joules = broadcast(self.p, 8 * nbytes, gains)
        self.seconds += seconds
        self.edge_j += joules

    def report(self) -> dict[str, float]:
        out = {CLUSTER_SECONDS: self.seconds, DEVICE_JOULES: self.device_j, EDGE_JOULES: self.edge_j}
        if self.step_s or self.upload_s:
            out.update({STEP_SECONDS: self.step_s, UPLOAD_SECONDS: self.upload_s})
        return out


class CloudClock:
    """The run's cumulative emulated time and energy; `rows` are the metrics rows kept by a resumed run."""

    def __init__(self, cfg, rows=()):
        self.cfg = cfg
        self.p = ClockParams.from_config(cfg)
        last = rows[-1] if rows else {}
        self.seconds = float(last.get("emulated_seconds") or 0.0)
        self.joules = float(last.get("energy_joules_total") or 0.0)

    def round(self, results, model_bytes: int) -> dict[str, float]:
        """Metrics of a round from the edges' results (name -> object with .scalars) and the model's size."""
        names = sorted(results)
        scalars = [results[n].scalars for n in names]
        seconds, up = round_time(self.p, 8 * model_bytes, [s.get(CLUSTER_SECONDS, 0.0) for s in scalars],
                                 [8 * s.get(BACKHAUL_BYTES, 0.0) for s in scalars])
        device_j = sum(s.get(DEVICE_JOULES, 0.0) for s in scalars)
        joules = device_j + sum(s.get(EDGE_JOULES, 0.0) for s in scalars) + float(
            clock.transmit_energy(self.p.edge_power_w, up.sum()))
        self.seconds += seconds
        self.joules += joules
        out = {"round_emulated_seconds": seconds, "emulated_seconds": self.seconds, "energy_joules": joules,
               "device_energy_joules": device_j, "energy_joules_total": self.joules}
        steps = [s[STEP_SECONDS] for s in scalars if STEP_SECONDS in s]
        if steps:  # paper 001's latency inputs as emulated this round (the barrier: the slowest of each)
            out.update(t_cp_emulated=max(steps), t_de_emulated=max(s.get(UPLOAD_SECONDS, 0.0) for s in scalars),
                       t_ec_emulated=float(up.max()) if up.size else 0.0)
        return out

    def lag(self, wall_seconds: float) -> float:
        """clock.pace: how long to hold the next round so that wall-clock time catches up with emulated time."""
        return max(0.0, self.seconds - wall_seconds) if self.p.pace else 0.0

    def summary(self) -> dict:
        k = self.cfg.clock
        return {"emulated_seconds": self.seconds, "energy_joules": self.joules,
                "clock": {"links": "digital: own band W per device, Shannon rate; backhaul bits / rate",
                          "geometry": k.geometry, "fading": "rayleigh" if k.fading else "off",
                          "downlink_counted": k.downlink, "paced": k.pace}}
