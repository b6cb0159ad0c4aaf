"""The run's wireless plane and what every tier derives from it alone (paper 003 on real processes).

Every process recomputes the same plane from the config: the MCP-H topology is drawn from (run seed,
"channel", "topology"), the run's edges are its C collaborating clusters (edge-i is cluster i, the
reference cluster 0 at the origin) with topology.devices_per_edge devices each, numbered as the run numbers
them; the other clusters of the window are interferers the medium simulates. Fading is keyed by (seed,
slot, tx, rx), so a device knows whether it is active in a slot, an edge knows whom to wait for, and the
medium checks both, without a message about it.

Air phases (plans.AIR_GRADIENT_STEP, plans.AIR_MODEL_SYNC) carry `group` = 0 (the cluster's edge aggregates)
or 1 (the core sums the C clusters' received signals, digest 2.3 step 5).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from hfl.common import plans
from hfl.common.seeding import numpy_rng

from . import ota
from .geometry import Topology, matern_cluster
from .power import normalise
from .clock import slot as slot_id

__all__ = ["Plane", "plane_for", "slot_id", "air_steps", "alive", "listeners", "activity", "passes_th0",
           "device_estimates", "normalise"]


@dataclass(frozen=True)
class Plane:
    topology: Topology
    params: ota.OtaParams
    mode: str  # "ota" | "orthogonal" (exact averages over the same active sets, ideal downlink)
    seed: int
    rho: float
    psi: float  # closed form of channel.psi_mode ("empirical": the corrected form until the medium has measured)
    psi_mode: str
    beta: float
    receiver: str = "mmse"
    downlink: str = "in-phase"  # channel.downlink: what a device's downlink row holds ("in-phase" or "complex")
    # alive / activity masks per (round, step, air steps): every device of a host asks for the same ones each slot
    masks: dict = field(default_factory=dict, init=False, compare=False, repr=False)  # replace() starts a new one

    def cached_mask(self, what: str, round_: int, step: int, phases, compute) -> np.ndarray:
        """compute() once per (what, round, step, the plan's air steps), kept read-only (the last 256)."""
        key = (what, round_, step, tuple(air_steps(phases)))
        mask = self.masks.get(key)
        if mask is None:
            if len(self.masks) >= 256:
                self.masks.clear()
            mask = self.masks[key] = compute()
            mask.setflags(write=False)
        return mask

    def row_shape(self, d: int) -> list[int]:
        """The shape of one device's downlink row: [d] (exact means, or the in-phase component), [2, d] (complex)."""
        return [2, d] if not self.exact and self.downlink == "complex" else [d]

    def downlink_phase(self, slot: int, devices) -> np.ndarray | None:
        """Per listener, the phase its in-phase row is taken at (its own edge's downlink fading), or None where
        the rows are complex (ota.broadcast_rows)."""
        if self.downlink == "complex":
            return None
        return np.angle(ota.own_downlink_fading(self.topology, slot, self.seed, devices, self.params))

    @property
    def C(self) -> int:
        return self.topology.collaborating

    @property
    def exact(self) -> bool:
        return self.mode == "orthogonal"

    def collaborating(self) -> np.ndarray:
        return self.topology.collaborating_devices


@functools.lru_cache(maxsize=8)
def _plane(seed: int, ch, edges: int, per_edge: int) -> Plane:
    top = matern_cluster(ch.lambda_p_per_m2, per_edge, ch.r0, ch.R, ch.window_radius, edges,
                         numpy_rng(seed, "cloud", 0, 0, "channel", "topology"), interferer_devices=ch.interferer_devices)
    params = ch.ota_params()
    rho = ota.rho_for(top, params)
    # Psi's closed forms assume one device count for every cluster of the plane: the interferers' M_n, since all
    # but C - 1 of the clusters around an edge are interferers
    psi = ota.psi(ch.psi_mode, ch.lambda_p_per_m2, ch.interferer_devices, params, ch.r0, ch.R)
    beta = ota.downlink_beta(ch.lambda_p_per_m2, params.sigma_d2, params.alpha, ch.r0, params.sigma_dn2, params.P_d)
    return Plane(top, params, ch.model, seed, rho, psi, ch.psi_mode, beta, ch.receiver,
                 ch.downlink)


def plane_for(cfg) -> Plane:
    """The run's plane (cached per seed, [channel] section and topology); the run's device `dev-k` is plane device k."""
    return _plane(cfg.run.seed, cfg.channel, cfg.topology.edges, cfg.topology.devices_per_edge)


def air_steps(phases) -> list[int]:
    return [i for i, p in enumerate(phases) if p.kind in plans.AIR_PHASES]


def _final_group_model(phases, step: int) -> bool:
    p = phases[step]
    return p.kind == plans.AIR_MODEL_SYNC and p.params.get("group", 0.0) == 1.0 and step == air_steps(phases)[-1]


def passes_th0(plane: Plane, round_: int, step: int, devices) -> np.ndarray:
    """The downlink test |f_o|^2 >= th0 of each device in slot (round, step) (digest 10.11); always True on
    orthogonal links (their downlink is ideal)."""
    devices = np.asarray(devices, dtype=np.int64)
    if plane.exact:
        return np.ones(devices.shape, dtype=bool)
    f = ota.own_downlink_fading(plane.topology, slot_id(round_, step), plane.seed, devices, plane.params)
    return ota.downlink_passes(f, plane.params.th0)


def alive(plane: Plane, phases, round_: int, step: int) -> np.ndarray:
    """[n_devices] mask of plane devices still in the round at air phase `step`: a collaborating device that
    failed th0 in an earlier air slot of the round sits out the rest of it (digest 2.3 step 7); interferers
    are always alive."""
    def compute():
        mask = np.ones(plane.topology.n_devices, dtype=bool)
        collab = plane.collaborating()
        for s in air_steps(phases):
            if s >= step:
                break
            mask[collab] &= passes_th0(plane, round_, s, collab)
        return mask

    return plane.cached_mask("alive", round_, step, phases, compute)


def listeners(plane: Plane, phases, round_: int, step: int) -> np.ndarray:
    """Who takes part in air phase `step` (uploads, or listens): the alive devices; in the round's final
    inter-cluster model slot every device listens, since its estimate is its next round's model, but only
    the alive ones may transmit (digest 10.11: a dropped device is excluded from the model upload)."""
    if _final_group_model(phases, step):
        return np.ones(plane.topology.n_devices, dtype=bool)
    return alive(plane, phases, round_, step)


def activity(plane: Plane, phases, round_: int, step: int) -> np.ndarray:
    """[n_devices] active mask of air phase `step`: |f|^2 >= th1 among the alive devices, with the empty-cluster
    fallback (paper 003, eq. 15)."""
    return plane.cached_mask("activity", round_, step, phases, lambda: ota.slot_activity(
        plane.topology, slot_id(round_, step), plane.seed, plane.params, alive(plane, phases, round_, step)))


def device_estimates(plane: Plane, rows: np.ndarray, devices, round_: int, step: int, n_active, E, sigma_sum,
                     mu_mean, groups: int, psi: float, gradient: bool) -> np.ndarray:
    """g_hat (eq. 21) or w_hat (eq. 30) of each listed device from what it received: rows are [n, d] in-phase
    components or [n, 2, d] (real and imaginary parts) on OTA links (plane.downlink), [n, d] exact means on
    orthogonal ones. The receive factor theta
    is eq. 27 (groups = 1) or eq. 35 (groups = C), with the Psi the edge normalised by."""
    devices = np.asarray(devices, dtype=np.int64)
    if plane.exact:
        return np.asarray(rows, dtype=np.float32)
    rows = np.asarray(rows)
    top, p = plane.topology, plane.params
    f_o = ota.own_downlink_fading(top, slot_id(round_, step), plane.seed, devices, p)
    dist = np.linalg.norm(top.offsets[devices], axis=1)
    G0 = ota.downlink_gain(f_o, dist, p.alpha)
    if plane.receiver == "unbiased" or (plane.receiver == "mmse-gradients" and not gradient):
        theta = np.asarray(sigma_sum, dtype=np.float64) / np.asarray(n_active, dtype=np.float64)
    else:
        theta = ota.receive_factor(sigma_sum, n_active, plane.beta, G0, psi / plane.rho, groups)
    return ota.estimate_rows(rows, theta, plane.rho, p.P_d, E, n_active, f_o, dist, p.alpha, mu_mean)
