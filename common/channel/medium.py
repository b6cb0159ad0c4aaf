"""One air slot of the run as a pure function: what the medium computes from every collaborating cluster's
emissions (paper 003, digest 2.3 steps 2.3-2.8 and 4-7).

OTA: the uplink superposes every transmitter of the plane at every collaborating edge (ota.uplink_rows, the
float32 form of ota.medium_slot; interferer clusters simulated), each edge re-broadcasts its received signal
normalised by E = rho |A_x| + Psi (group = 0) or every edge of the group broadcasts the core's sum normalised by
E = rho |A| + C Psi (group = 1), and every listed device receives the superposition of all edges (ota.broadcast_rows, the float32 form of
ota.medium_broadcast).
Orthogonal: every device receives the exact mean of its cluster's (group = 0) or the group's (group = 1)
active payloads, de-normalised.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import lanes, ota
from .plane import Plane, device_estimates, passes_th0, slot_id


@dataclass
class SlotResult:
    rows: np.ndarray          # [n_listen, d] float32 exact means or in-phase rows; [n_listen, 2, d] complex
    listeners: np.ndarray     # plane device of each row
    n_active: np.ndarray      # per listener: |A_x| (group 0) or |A| (group 1)
    E: np.ndarray             # per listener: the power its edge normalised by (1 on orthogonal links)
    sigma_sum: np.ndarray     # per listener: sum of sigma over the active set it estimates
    mu_mean: np.ndarray       # per listener: mean of mu over that set
    stats: dict = field(default_factory=dict)
    psi_samples: np.ndarray = field(default_factory=lambda: np.zeros(0))  # ||v_u||^2 / d - rho |A| per edge
    ideal: np.ndarray | None = None  # the exact mean of the transmitted vectors (eqs. 6 / 11)


def side_info_accepted(mu, sigma, bound: float) -> np.ndarray:
    """Which transmitters' side information (mu, sigma of eq. 15's normalisation) is plausible beside the others':
    sigma_i <= bound x median_{j != i} sigma_j and |mu_i - median_{j != i} mu_j| <= bound x median_{j != i} sigma_j.
    Leave-one-out medians, so one forged value cannot move its own yardstick (two transmitters: each is judged by the
    other). With fewer than two transmitters, or bound = 0, everything is accepted."""
    mu, sigma = np.asarray(mu, np.float64).reshape(-1), np.asarray(sigma, np.float64).reshape(-1)
    n = sigma.size
    if n < 2 or not bound > 0:
        return np.ones(n, bool)
    others = ~np.eye(n, dtype=bool)
    ref_sigma = np.median(np.broadcast_to(sigma, (n, n))[others].reshape(n, n - 1), axis=1)
    ref_mu = np.median(np.broadcast_to(mu, (n, n))[others].reshape(n, n - 1), axis=1)
    return (sigma <= bound * ref_sigma) & (np.abs(mu - ref_mu) <= bound * ref_sigma)


def air_slot(plane: Plane, round_: int, step: int, group: bool, payloads: np.ndarray, tx, mu, sigma, listen,
             alive: np.ndarray, rng: np.random.Generator, psi: float | None = None, samples=None) -> SlotResult:
    """payloads: [n_tx, d] normalised rows of the transmitting devices `tx` (plane indices), with their
    (mu, sigma); listen: the plane devices that receive. `alive` masks the plane devices still in the round
    (activity is decided among them); `psi` overrides the plane's closed form (empirical mode).
    `samples` (the transmitters' D_y) applies paper 003's D_y-weighting (ota.dy_side_info, ota.dy_count): the
    means become sum D_y x_y / sum D_y and `n_active` the sum of D_y. Orthogonal planes only: on the air, the
    power-normalised payloads superpose unweighted and the digest does not say how the estimator recovers the
    weights."""
    top = plane.topology
    tx = np.asarray(tx, dtype=np.int64).reshape(-1)
    listen = np.asarray(listen, dtype=np.int64).reshape(-1)
    mu = np.asarray(mu, dtype=np.float64).reshape(-1)
    sigma = np.asarray(sigma, dtype=np.float64).reshape(-1)
    payloads = np.asarray(payloads, dtype=np.float32)
    if payloads.ndim != 2 or payloads.shape[0] != tx.size:
        raise ValueError(f"payloads must be [{tx.size}, d], got {payloads.shape}")
    psi = plane.psi if psi is None else float(psi)
    C = plane.C
    cluster_of_tx = top.device_edge[tx]
    cluster_of_listener = top.device_edge[listen]
    counts = np.bincount(cluster_of_tx, minlength=C)[:C].astype(np.float64)
    if samples is not None:
        if not plane.exact:
            raise ValueError("D_y-weighting (samples) is defined on orthogonal links only")
        mu, sigma = ota.dy_side_info(mu, sigma, samples)
        counts = ota.dy_count(samples, cluster_of_tx, C)
    sig = np.bincount(cluster_of_tx, weights=sigma, minlength=C)[:C]
    mus = np.bincount(cluster_of_tx, weights=mu, minlength=C)[:C]
    # the true payloads are sigma s_bar + mu: their (per-cluster) means are one weighted matmul, never [n_tx, d] float64
    weights = np.zeros((C, tx.size))
    weights[cluster_of_tx, np.arange(tx.size)] = sigma
    total = float(np.sum(samples)) if samples is not None else tx.size  # sum D_y, or |A|
    ideal = ((lanes.row_combination(sigma, payloads) + np.float32(mu.sum())) / np.float32(total)) if tx.size else None
    if group:
        n_active = np.full(listen.size, counts.sum())
        sigma_sum, mu_mean = np.full(listen.size, sig.sum()), np.full(listen.size, mus.sum() / (counts.sum() or 1.0))
    else:
        n_active = counts[cluster_of_listener]
        sigma_sum = sig[cluster_of_listener]
        mu_mean = mus[cluster_of_listener] / np.where(n_active > 0, n_active, 1.0)
    stats = {"air_transmitters": int(tx.size), "air_listeners": int(listen.size)}
    if plane.exact:
        means = ((weights @ payloads + mus[:, None]) / np.where(counts > 0, counts, 1.0)[:, None]).astype(np.float32)
        rows = np.repeat(ideal[None, :], listen.size, axis=0) if group and ideal is not None else means[cluster_of_listener]
        return SlotResult(rows.astype(np.float32), listen, n_active, np.ones(listen.size), sigma_sum, mu_mean, stats,
                          ideal=ideal)

    slot = slot_id(round_, step)
    rec = ota.uplink_rows(payloads, tx, top, slot, plane.seed, plane.params, rng, receivers=np.arange(C), alive=alive)
    psi_samples = ota.psi_sample(rec.received, rec.n_active, plane.rho)
    if group:
        E = ota.edge_power(plane.rho, rec.n_active.sum(), psi, C)
        signals = ota.edge_transmit(np.repeat(rec.received.sum(axis=0, keepdims=True), C, axis=0), plane.params.P_d, E)
        E_listen = np.full(listen.size, float(E))
    else:
        E_edges = ota.edge_power(plane.rho, np.maximum(rec.n_active, 1), psi)
        signals = ota.edge_transmit(rec.received, plane.params.P_d, E_edges)
        E_listen = E_edges[cluster_of_listener]
    down = ota.broadcast_rows(signals, np.arange(C), listen, top, slot, plane.seed, plane.params, rng,
                              plane.downlink_phase(slot, listen))
    rows = down.received
    stats.update(received_power=float(rec.signal_power.mean()), interference_power=float(rec.interference_power.mean()),
                 interferers_active=rec.interferers_active, missing_transmitters=int(rec.missing.size),
                 downlink_interference_power=float(down.interference_power.mean()) if listen.size else 0.0)
    return SlotResult(rows, listen, n_active, E_listen, sigma_sum, mu_mean, stats, psi_samples, ideal)


def estimates(plane: Plane, result: SlotResult, round_: int, step: int, group: bool, psi: float,
              gradient: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Every listener's estimate and whether it passed th0 (the medium's view of what each device computes)."""
    if result.listeners.size == 0:
        return np.zeros((0, result.rows.shape[-1]), np.float32), np.zeros(0, dtype=bool)
    ok = passes_th0(plane, round_, step, result.listeners) & (result.n_active >= 1)
    est = device_estimates(plane, result.rows, result.listeners, round_, step, np.maximum(result.n_active, 1),
                           result.E, result.sigma_sum, result.mu_mean, plane.C if group else 1, psi, gradient)
    return est, ok
