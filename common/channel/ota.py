"""Over-the-air superposition, interference, the received-power term Psi, the receive normalising factors
and the estimators of MultiAirFed (paper 003, sec. III; digest 3.3-3.6 and 10).

Signals are complex baseband per entry (one subcarrier per model entry). Payload rows are the normalised
real vectors s_bar of eqs. 12-13. The medium functions are pure: every fading draw is recomputed from
(seed, slot, link, tx, rx) and every payload-like random draw (interferers, noise) comes from `rng`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import exp1

from .fading import rayleigh
from .geometry import Topology
from .lanes import measure_then_add, standard_normals, triangular_rows
from .power import active_mask, inversion_coefficient, inversion_rho

PSI_MODES = ("paper", "corrected", "empirical")
INTERFERER_MODES = ("explicit", "aggregate", "independent")


@dataclass(frozen=True)
class OtaParams:
    """Defaults: paper 003, Table I (digest 8); noise powers are not given there, digest 10.14 suggests
    ~4e-15 W (-174 dBm/Hz over 1 MHz)."""
    alpha: float = 4.0
    th1: float = 0.5
    th0: float = 0.01
    P_u: float = 1.0
    P_d: float = 1.0
    sigma_d2: float = 10.0
    sigma_en2: float = 4e-15
    sigma_dn2: float = 4e-15
    fading: str = "complex"  # or "real" (digest 10.6)
    interference: bool = True  # False: a receiver hears only its own cluster (its own edge on the downlink)
    noise: bool = True
    interferers: str = "explicit"  # non-collaborating clusters: draw their payloads, or "aggregate" (same law)
    chunk: int = 4096  # columns per block when drawing interferer payloads (bounds memory)

    def __post_init__(self):
        for name in ("P_u", "P_d", "sigma_d2"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("sigma_en2", "sigma_dn2", "th0"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.th1 <= 0:
            raise ValueError(f"th1 must be > 0, got {self.th1}")
        if self.alpha <= 2:
            raise ValueError(f"alpha must be > 2 (Psi and beta diverge otherwise), got {self.alpha}")
        if self.interferers not in INTERFERER_MODES:
            raise ValueError(f"interferers must be one of {', '.join(INTERFERER_MODES)}, got {self.interferers!r}")
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {self.chunk}")


def rho_for(topology: Topology, params: OtaParams) -> float:
    return inversion_rho(params.P_u, params.th1, params.alpha, topology.r0, topology.R)


# ---------------------------------------------------------------- closed forms


def psi_corrected(lambda_p: float, devices_per_cluster: int, P_u: float, alpha: float, r0: float,
                  sigma_en2: float = 0.0) -> float:
    """Psi = 2 pi lambda_p M P_u / ((alpha-2) r0^(alpha-2)) + sigma_en^2 (digest 3.4, the sound reading of
    eq. 20: Campbell's theorem with interferers kept r0 from the reference server and without the
    double-counted e^{-th1}). Per-entry power."""
    if alpha <= 2:
        raise ValueError(f"alpha must be > 2, got {alpha}")
    return 2 * np.pi * lambda_p * devices_per_cluster * P_u / ((alpha - 2) * r0 ** (alpha - 2)) + sigma_en2


def _excluded_plane_integral(y: np.ndarray, alpha: float, r0: float, n_phi: int) -> np.ndarray:
    """For each |v| = y: integral of |x - v|^-alpha over {|x| >= 2 r0, |x - v| >= r0}.

    Whole plane outside the r0-disk around v (closed form) minus the part inside |x| < 2 r0, done in polar
    coordinates around v: for angle phi, |x| < 2 r0 holds for u in (u-, u+), u± = -y cos phi ± sqrt(4r0^2 - y^2 sin^2 phi).
    """
    phi = (np.arange(n_phi) + 0.5) * (2 * np.pi / n_phi)
    yy, pp = y[:, None], phi[None, :]
    disc = 4 * r0 ** 2 - (yy * np.sin(pp)) ** 2
    root = np.sqrt(np.maximum(disc, 0.0))
    lo = np.maximum(np.maximum(-yy * np.cos(pp) - root, r0), 0.0)
    hi = -yy * np.cos(pp) + root
    inside = (disc > 0) & (hi > lo)
    lo_s, hi_s = np.where(inside, lo, 1.0), np.where(inside, hi, 1.0)
    piece = np.where(inside, (lo_s ** (2 - alpha) - hi_s ** (2 - alpha)) / (alpha - 2), 0.0)
    return 2 * np.pi * r0 ** (2 - alpha) / (alpha - 2) - piece.sum(axis=1) * (2 * np.pi / n_phi)


def psi_paper(lambda_p: float, devices_per_cluster: int, rho: float, th1: float, alpha: float, r0: float,
              R: float, sigma_en2: float = 0.0, n_y: int = 64, n_phi: int = 8192) -> float:
    """Psi of paper 003, eq. 20, as printed (with its e^{-th1} factor), evaluated with the exclusion the
    digest (10.2/10.3) adds to make it finite: interferers at least r0 from the reference server.

    Psi = 2 M rho lambda_p E_1(th1) e^{-th1} / (R^2 - r0^2) * int_{r0}^{R} y^{alpha+1} I(y) dy + sigma_en^2,
    where I(y) is the plane integral over server positions x, |x| >= 2 r0, of |x + y|^-alpha
    (the printed triple integral rewritten: y (1 + x^2/y^2 - 2x/y cos)^(-alpha/2) = y^(alpha+1) / dist^alpha).
    """
    if alpha <= 2:
        raise ValueError(f"alpha must be > 2, got {alpha}")
    nodes, weights = np.polynomial.legendre.leggauss(n_y)
    y = 0.5 * (R - r0) * nodes + 0.5 * (R + r0)
    w = 0.5 * (R - r0) * weights
    radial = np.sum(w * y ** (alpha + 1) * _excluded_plane_integral(y, alpha, r0, n_phi))
    pref = 2 * devices_per_cluster * rho * lambda_p * exp1(th1) * np.exp(-th1) / (R ** 2 - r0 ** 2)
    return float(pref * radial + sigma_en2)


def dy_side_info(mu, sigma, samples) -> tuple[np.ndarray, np.ndarray]:
    """Paper 003's optional D_y-weighting (digest 2.1: "send D_y g and D_y w, and count sum D_y 1_y instead of
    |A_x|"). Normalised as in eq. 15, D_y x is the same unit payload as x with side information (D_y mu, D_y sigma):
    only the side information changes. `samples` are the transmitters' D_y (> 0)."""
    D = np.asarray(samples, dtype=np.float64).reshape(-1)
    mu, sigma = np.asarray(mu, dtype=np.float64).reshape(-1), np.asarray(sigma, dtype=np.float64).reshape(-1)
    if D.shape != mu.shape or D.shape != sigma.shape:
        raise ValueError(f"samples must give one D_y per transmitter ({mu.size}), got {D.size}")
    if not (np.isfinite(D).all() and (D > 0).all()):
        raise ValueError("samples (D_y) must be finite and > 0")
    return D * mu, D * sigma


def dy_count(samples, cluster_of_tx, clusters: int) -> np.ndarray:
    """sum_{y in A_x} D_y per cluster x: the count that replaces |A_x| under D_y-weighting (digest 2.1), so the
    edge's aggregate is sum_y D_y g_y / sum_y D_y and the core's sum_x sum_y D_y w_y / sum_x sum_y D_y."""
    return np.bincount(np.asarray(cluster_of_tx, dtype=np.int64).reshape(-1),
                       weights=np.asarray(samples, dtype=np.float64).reshape(-1), minlength=clusters)[:clusters]


def psi_sample(received: np.ndarray, n_active, rho: float) -> np.ndarray:
    """One empirical Psi observation per receiver: ||v_u||^2 / d - rho |A| (digest 10.2, `empirical`)."""
    v = np.atleast_2d(received)
    return _row_power(v) / v.shape[-1] - rho * np.asarray(n_active, dtype=np.float64)


def _row_power(v: np.ndarray) -> np.ndarray:
    """||v_i||^2 per receiver of complex [n, d] vectors or real [n, 2, d] rows, accumulated in float64."""
    if np.iscomplexobj(v):
        return np.einsum("ij,ij->i", v.real, v.real) + np.einsum("ij,ij->i", v.imag, v.imag)
    flat = v.reshape(v.shape[0], -1)
    return np.einsum("ij,ij->i", flat, flat, dtype=np.float64)


def running_mean(mean: float, count: int, samples) -> tuple[float, int]:
    """Fold new samples into a running mean; returns (mean, count)."""
    samples = np.atleast_1d(np.asarray(samples, dtype=np.float64))
    total = count + samples.size
    if total == 0:
        return mean, 0
    return float((mean * count + samples.sum()) / total), int(total)


def psi(mode: str, lambda_p: float, devices_per_cluster: int, params: OtaParams, r0: float, R: float,
        empirical: float | None = None) -> float:
    """Psi by mode (digest 10.2). `empirical` needs the running mean measured so far; until one exists the
    corrected closed form stands in (the caller labels which value it used)."""
    rho = inversion_rho(params.P_u, params.th1, params.alpha, r0, R)
    if mode == "paper":
        return psi_paper(lambda_p, devices_per_cluster, rho, params.th1, params.alpha, r0, R, params.sigma_en2)
    if mode == "corrected" or (mode == "empirical" and empirical is None):
        return psi_corrected(lambda_p, devices_per_cluster, params.P_u, params.alpha, r0, params.sigma_en2)
    if mode == "empirical":
        return float(empirical)
    raise ValueError(f"psi_mode must be one of {', '.join(PSI_MODES)}, got {mode!r}")


def downlink_beta(lambda_p: float, sigma_d2: float, alpha: float, r0: float, sigma_dn2: float, P_d: float) -> float:
    """beta = 2 pi lambda_p sigma_d^2 / ((alpha-2) r0^(alpha-2)) + sigma_dn^2 / P_d (paper 003, eq. 28)."""
    if alpha <= 2:
        raise ValueError(f"alpha must be > 2, got {alpha}")
    if P_d <= 0:
        raise ValueError(f"P_d must be > 0, got {P_d}")
    return 2 * np.pi * lambda_p * sigma_d2 / ((alpha - 2) * r0 ** (alpha - 2)) + sigma_dn2 / P_d


def edge_power(rho: float, n_active, psi_value: float, groups: int = 1):
    """E = rho |A| + C Psi: the per-entry power an edge normalises by before its broadcast (paper 003,
    eq. 19 intra-cluster with C = 1; sec. III-B with C clusters summed at the core)."""
    return rho * np.asarray(n_active, dtype=np.float64) + groups * psi_value


def downlink_gain(own_downlink_fading, own_distance, alpha: float):
    """G_0 = |f_o|^2 ||y_0||^-alpha (digest notation)."""
    return np.abs(np.asarray(own_downlink_fading)) ** 2 * np.asarray(own_distance, dtype=np.float64) ** -alpha


def receive_factor(sigma_sum, n_active, beta: float, G0, psi_over_rho: float, groups: int = 1):
    """MMSE receive normalising factor theta (paper 003, eq. 27 for groups=1, eq. 35 for the inter-cluster
    step with C = groups): sum sigma / ((1 + beta/G0)(|A| + C Psi/rho)). It shrinks on purpose (digest 10.7)."""
    n_active = np.asarray(n_active, dtype=np.float64)
    if np.any(n_active < 1):
        raise ValueError("n_active must be >= 1")
    return np.asarray(sigma_sum) / ((1 + beta / np.asarray(G0)) * (n_active + groups * psi_over_rho))


def downlink_passes(own_downlink_fading, th0: float):
    """The th0 test on |f_o|^2 (digest 10.11): False means skip the update and drop out for the round."""
    return np.abs(np.asarray(own_downlink_fading)) ** 2 >= th0


def estimate(v_d: np.ndarray, theta, rho: float, P_d: float, E, n_active, own_downlink_fading,
             own_distance, alpha: float, mu_mean) -> np.ndarray:
    """g_hat (paper 003, eq. 21) or w_hat (eq. 30): Re(theta v_d / (sqrt(rho) sqrt(P_d/E) |A| f_o ||y0||^-a/2))
    + mean of the active devices' mu. Rows of v_d are devices; scalars broadcast per row.

    The real part is taken after dividing by f_o (digest 10.6: the paper is silent; the own-cluster
    signal is real there, so this discards half of the interference and noise)."""
    v = np.atleast_2d(v_d)
    col = lambda a: np.asarray(a).reshape(-1, 1) if np.ndim(a) else a  # noqa: E731
    scale = (np.sqrt(rho) * np.sqrt(P_d / col(E)) * col(n_active) * col(own_downlink_fading)
             * col(np.asarray(own_distance, dtype=np.float64)) ** (-alpha / 2))
    return np.real(col(theta) * v / scale) + col(mu_mean)


def estimate_rows(rows: np.ndarray, theta, rho: float, P_d: float, E, n_active, own_downlink_fading,
                  own_distance, alpha: float, mu_mean) -> np.ndarray:
    """`estimate` from received rows [n, 2, d] (real, imaginary parts) without forming complex vectors: with
    c = theta / (sqrt(rho) sqrt(P_d/E) |A| f_o ||y0||^-a/2) per row, Re(c v) = Re c Re v - Im c Im v; or from
    in-phase rows [n, d] (broadcast_rows with the phases of f_o), where theta is real, so c e^{i arg f_o} is. float32."""
    rows = np.asarray(rows)
    n = rows.shape[0]
    per_row = lambda a: np.broadcast_to(np.asarray(a), (n,))  # noqa: E731
    scale = (np.sqrt(rho) * np.sqrt(P_d / per_row(E).astype(np.float64)) * per_row(n_active)
             * per_row(own_downlink_fading) * per_row(np.asarray(own_distance, dtype=np.float64)) ** (-alpha / 2))
    c = per_row(theta) / scale
    if rows.ndim == 2:  # in-phase rows y = Re(e^{-i phi} v), phi = arg f_o: Re(c v) = (c e^{i phi}) y, real factor
        coef = (c * np.exp(1j * np.angle(per_row(own_downlink_fading)))).real
        out = rows * coef.astype(np.float32)[:, None]
        out += per_row(mu_mean).astype(np.float32)[:, None]
        return out.astype(np.float32, copy=False)
    out = rows[:, 0, :] * c.real.astype(np.float32)[:, None]
    out -= rows[:, 1, :] * c.imag.astype(np.float32)[:, None]
    out += per_row(mu_mean).astype(np.float32)[:, None]
    return out.astype(np.float32, copy=False)


# ---------------------------------------------------------------- superposition


def superpose(gains: np.ndarray, payloads: np.ndarray) -> np.ndarray:
    """Exact OTA superposition, one matmul: received[r] = sum_t gains[r, t] payloads[t]."""
    gains = np.atleast_2d(gains)
    payloads = np.atleast_2d(payloads)
    if gains.shape[1] != payloads.shape[0]:
        raise ValueError(f"gains have {gains.shape[1]} transmitters but payloads {payloads.shape[0]} rows")
    if np.iscomplexobj(payloads):
        return gains @ payloads
    stacked = np.vstack([gains.real, gains.imag]) @ payloads  # two real matmuls in one, payloads stay real
    n = gains.shape[0]
    return stacked[:n] + 1j * stacked[n:]


def awgn(shape, variance: float, rng: np.random.Generator) -> np.ndarray:
    """Circular complex Gaussian noise CN(0, variance) per entry."""
    if variance < 0:
        raise ValueError(f"noise variance must be >= 0, got {variance}")
    z = rng.standard_normal((2, *shape), dtype=np.float32)  # noise is far below signal: float32 draws suffice
    out = np.empty(shape, dtype=np.complex128)
    scale = np.sqrt(variance / 2)
    np.multiply(z[0], scale, out=out.real)
    np.multiply(z[1], scale, out=out.imag)
    return out


def gaussian_superposition(gains: np.ndarray, d: int, rng: np.random.Generator, mode: str = "explicit",
                           chunk: int = 4096) -> np.ndarray:
    """gains @ Z for Z iid N(0, 1) [n_tx, d] (payloads of non-collaborating clusters, digest 10.8).

    explicit: draw Z block by block. aggregate: draw the same law through a factor of the gain matrix,
    [Re; Im] gains = R^T Q^T with Q orthonormal columns (QR), so gains @ Z ~ R^T W with W iid [2 n_rx, d]:
    exact in distribution and cheaper when transmitters outnumber twice the receivers.
    independent: the fast approximation for large planes: each receiver gets the exact law of its own
    interference (the 2x2 covariance of its real and imaginary parts) but independently of the other
    receivers, whose common interferers in truth correlate them. Costs 2 n_rx d normals and no matmul.
    """
    gains = np.atleast_2d(gains)
    n_rx, n_tx = gains.shape
    if n_tx == 0:
        return np.zeros((n_rx, d), dtype=np.complex128)
    if mode == "independent":
        a = np.sum(gains.real ** 2, axis=1)
        b = np.sum(gains.real * gains.imag, axis=1)
        c = np.sum(gains.imag ** 2, axis=1)
        l11 = np.sqrt(a)
        l21 = np.divide(b, l11, out=np.zeros_like(b), where=l11 > 0)
        l22 = np.sqrt(np.maximum(c - l21 ** 2, 0.0))
        w = rng.standard_normal((2, n_rx, d), dtype=np.float32)
        return (l11[:, None] * w[0]) + 1j * (l21[:, None] * w[0] + l22[:, None] * w[1])
    if mode == "aggregate" and n_tx > 2 * n_rx:
        stacked = np.vstack([gains.real, gains.imag])  # [2 n_rx, n_tx]
        _, r = np.linalg.qr(stacked.T)  # stacked = r.T @ q.T
        out = r.T @ rng.standard_normal((r.shape[0], d))
        return out[:n_rx] + 1j * out[n_rx:]
    if mode not in INTERFERER_MODES:
        raise ValueError(f"mode must be one of {', '.join(INTERFERER_MODES)}, got {mode!r}")
    stacked = np.vstack([gains.real, gains.imag]).astype(np.float32)
    out = np.empty((2 * n_rx, d), dtype=np.float64)
    for start in range(0, d, chunk):
        stop = min(d, start + chunk)
        out[:, start:stop] = stacked @ rng.standard_normal((n_tx, stop - start), dtype=np.float32)
    return out[:n_rx] + 1j * out[n_rx:]


def folds(mode: str, noise_var: float, n_rx: int) -> bool:
    """Whether interference_and_noise draws interference and noise as one joint Gaussian (folded_factor)."""
    return mode == "aggregate" and noise_var > 0 and n_rx > 0


def folded_factor(gains: np.ndarray, noise_var: float, project: np.ndarray | None = None) -> np.ndarray:
    """[2 n_rx, 2 n_rx] float32 lower-triangular Cholesky factor L of S S^T + noise_var / 2 I, S the real gains
    interleaved by receiver (row 2i Re gains[i], row 2i + 1 Im gains[i]): L W with W iid N(0, 1) [2 n_rx, d] is
    every receiver's interference plus CN(0, noise_var) noise, rows (Re r_0, Im r_0, Re r_1, ...), the layout of
    the devices' [n_rx, 2, d] rows. Row k of L W needs only W's first k + 1 rows (broadcast_rows uses it).
    With `project` (in_phase_projection's [n_rx, 2 n_rx] P): the [n_rx, n_rx] factor of P S S^T P^T + noise_var / 2 I,
    the law of P applied to those rows (P P^T = I)."""
    stacked = _interleaved_rows(gains)
    if project is not None:
        stacked = project @ stacked
    cov = stacked @ stacked.T + (noise_var / 2) * np.eye(stacked.shape[0])
    return np.linalg.cholesky(cov).astype(np.float32)


def _interleaved_rows(gains: np.ndarray) -> np.ndarray:
    """[2 n, k] float64 real gains interleaved by receiver: row 2i Re gains[i], row 2i + 1 Im gains[i]."""
    stacked = np.empty((2 * gains.shape[0], gains.shape[1]))
    stacked[0::2], stacked[1::2] = gains.real, gains.imag
    return stacked


def in_phase_projection(phase) -> np.ndarray:
    """[n, 2 n] float64 P with row i = (cos phi_i, sin phi_i) on receiver i's (Re, Im) rows: P r = Re(e^{-i phi} v),
    the in-phase component of what receiver i hears after it corrects the phase phi_i of its own link (coherent
    detection). Its rows are orthonormal (P P^T = I), so P maps CN(0, s) noise to N(0, s / 2) per row."""
    phase = np.asarray(phase, dtype=np.float64).reshape(-1)
    n = phase.size
    out = np.zeros((n, 2 * n))
    out[np.arange(n), 2 * np.arange(n)] = np.cos(phase)
    out[np.arange(n), 2 * np.arange(n) + 1] = np.sin(phase)
    return out


def interference_and_noise(gains: np.ndarray, d: int, rng: np.random.Generator, mode: str, chunk: int,
                           noise_var: float) -> tuple[np.ndarray, bool]:
    """gains @ Z (Z iid N(0, 1)) plus CN(0, noise_var) noise per entry; returns (draw, noise folded in).

    In `aggregate` mode with noise, both are one joint Gaussian draw: the real interleaved (Re, Im) of every
    receiver has covariance S S^T + noise_var / 2 I (S the interleaved real gains), drawn as L W with L its
    Cholesky factor (folded_factor) and W iid [2 n_rx, d]: the same law as drawing them apart, at 2 n_rx d normals
    instead of (n_tx + 2 n_rx) d."""
    gains = np.atleast_2d(gains)
    n_rx = gains.shape[0]
    if not folds(mode, noise_var, n_rx):
        return gaussian_superposition(gains, d, rng, mode, chunk), False
    out = folded_factor(gains, noise_var) @ standard_normals(rng, np.empty((2 * n_rx, d), dtype=np.float32))
    drawn = np.empty((n_rx, d), dtype=np.complex128)
    drawn.real = out[0::2]
    drawn.imag = out[1::2]
    return drawn, True


# ---------------------------------------------------------------- the medium


def own_uplink_fading(topology: Topology, slot: int, seed: int, devices, params: OtaParams) -> np.ndarray:
    """f_{y->x} of each device towards its own edge: what a device uses for its power control."""
    devices = np.asarray(devices, dtype=np.int64)
    return rayleigh(seed, slot, devices, topology.device_edge[devices], "up", 1.0, params.fading)


def own_downlink_fading(topology: Topology, slot: int, seed: int, devices, params: OtaParams) -> np.ndarray:
    """f_o of each device from its own edge, |f_o|^2 with mean sigma_d^2."""
    devices = np.asarray(devices, dtype=np.int64)
    return rayleigh(seed, slot, topology.device_edge[devices], devices, "down", params.sigma_d2, params.fading)


def slot_activity(topology: Topology, slot: int, seed: int, params: OtaParams, alive=None) -> np.ndarray:
    """Active mask over every device of the plane for an uplink slot (eq. 15 test + empty-set fallback).
    alive: optional [n_devices] mask of devices still in the round (interferers are always alive)."""
    every = np.arange(topology.n_devices)
    return active_mask(own_uplink_fading(topology, slot, seed, every, params), topology.device_edge, params.th1,
                       alive)


def uplink_gains(topology: Topology, slot: int, seed: int, tx_devices, rx_edges, params: OtaParams,
                 rho: float) -> np.ndarray:
    """[n_rx, n_tx] complex gains p_y ||x+y-z||^-a/2 f_{y->z} (paper 003, eq. 14) of active transmitters.
    Towards its own edge an active device's gain is exactly sqrt(rho) (inversion), set so without round-off."""
    tx = np.asarray(tx_devices, dtype=np.int64)
    rx = np.asarray(rx_edges, dtype=np.int64)
    own = topology.device_edge[tx]
    active = np.ones(tx.shape, dtype=bool)
    own_dist = np.linalg.norm(topology.offsets[tx], axis=1)
    p = inversion_coefficient(own_uplink_fading(topology, slot, seed, tx, params), own_dist, rho, params.alpha, active)
    dist = topology.distances(topology.devices[tx], topology.edges[rx])
    f = rayleigh(seed, slot, tx[None, :], rx[:, None], "up", 1.0, params.fading)
    gains = p[None, :] * dist ** (-params.alpha / 2) * f
    is_own = own[None, :] == rx[:, None]
    return np.where(is_own, np.sqrt(rho), gains).astype(np.complex128)


@dataclass(frozen=True)
class Reception:
    received: np.ndarray  # [n_rx, d] complex
    receivers: np.ndarray  # edge (uplink) or device (downlink) indices
    n_active: np.ndarray  # uplink: |A_z| of each receiving edge's own cluster; downlink: empty
    signal_power: np.ndarray  # per-entry power of the own-cluster (own-edge) part
    interference_power: np.ndarray  # per-entry power of everything else except noise
    interferers_active: int  # transmitting devices / edges of non-collaborating clusters
    missing: np.ndarray  # uplink: active collaborating devices that did not transmit


def _uplink_links(payloads, tx_devices, topology: Topology, slot: int, seed: int, params: OtaParams, receivers,
                  alive):
    """The uplink slot's checked inputs: (payloads, tx, rx, n_active of each receiving edge, missing active
    collaborating devices, active interferers, own-cluster mask [n_rx, n_tx], gains [n_rx, n_tx], interferers' gains
    [n_rx, n_int] or None where none is heard, rho)."""
    payloads = np.atleast_2d(np.asarray(payloads))
    tx = np.asarray(tx_devices, dtype=np.int64).reshape(-1)
    if payloads.shape[0] != tx.size:
        raise ValueError(f"payloads has {payloads.shape[0]} rows for {tx.size} tx_devices")
    if tx.size and (tx.min() < 0 or tx.max() >= topology.n_devices):
        raise ValueError(f"tx_devices must lie in [0, {topology.n_devices})")
    if len(np.unique(tx)) != tx.size:
        raise ValueError("tx_devices must not repeat")
    if np.any(topology.device_edge[tx] >= topology.collaborating):
        raise ValueError("tx_devices must belong to collaborating clusters (interferers are simulated here)")
    if alive is not None:
        alive = np.asarray(alive, dtype=bool) | (topology.device_edge >= topology.collaborating)
    active = slot_activity(topology, slot, seed, params, alive)
    if not np.all(active[tx]):
        raise ValueError(f"devices {tx[~active[tx]].tolist()} are not active in slot {slot}")
    rx = np.arange(topology.collaborating) if receivers is None else np.asarray(receivers, dtype=np.int64)
    counts = np.bincount(topology.device_edge[active], minlength=topology.n_edges)
    counts[:topology.collaborating] = np.bincount(topology.device_edge[tx], minlength=topology.n_edges)[
        :topology.collaborating]
    sent = np.zeros(topology.n_devices, dtype=bool)
    sent[tx] = True
    missing = np.flatnonzero(active & ~sent & (topology.device_edge < topology.collaborating))
    rho = rho_for(topology, params)
    gains = uplink_gains(topology, slot, seed, tx, rx, params, rho)
    is_own = topology.device_edge[tx][None, :] == rx[:, None]
    if not params.interference:
        gains = np.where(is_own, gains, 0.0)
    interferers = np.flatnonzero(active & (topology.device_edge >= topology.collaborating))
    heard = params.interference and interferers.size
    gi = uplink_gains(topology, slot, seed, interferers, rx, params, rho) if heard else None
    return payloads, tx, rx, counts[rx], missing, interferers, is_own, gains, gi, rho


def medium_slot(payloads: np.ndarray, tx_devices, topology: Topology, slot: int, seed: int, params: OtaParams,
                rng: np.random.Generator, receivers=None, alive=None) -> Reception:
    """One OTA uplink slot (paper 003, eq. 14): every receiving edge gets the exact superposition of every
    transmitting device in the plane, plus the non-collaborating clusters' iid N(0,1) payloads under the
    same power control (digest 10.8), plus CN(0, sigma_en^2) noise.

    payloads: [n_tx, d] normalised rows of the transmitting collaborating devices `tx_devices`, which must
    be exactly the active devices of their clusters (a missing active device would bias the estimator).
    receivers: edges to compute (default: the C collaborating edges).
    alive: [n_devices] mask of devices still in the round (default all); activity is decided among them.
    n_active of a collaborating edge counts the transmitters actually given; `missing` lists active
    collaborating devices that did not transmit (the caller decides what to do about them).
    """
    payloads, tx, rx, n_active, missing, interferers, is_own, gains, gi, rho = _uplink_links(
        payloads, tx_devices, topology, slot, seed, params, receivers, alive)
    d = payloads.shape[1]
    received = superpose(gains, payloads)
    signal = np.sqrt(rho) * (is_own.astype(payloads.dtype) @ payloads)  # own cluster: real sqrt(rho) sum

    noise_var = params.sigma_en2 if params.noise else 0.0
    folded = False
    if gi is not None:
        drawn, folded = interference_and_noise(gi, d, rng, params.interferers, params.chunk, noise_var)
        received += drawn
    # measured interference; with the noise folded into the same draw its expectation is taken off
    interference_power = np.maximum(np.mean(np.abs(received - signal) ** 2, axis=1) - (noise_var if folded else 0.0), 0.0)
    if noise_var > 0 and not folded:
        received += awgn(received.shape, noise_var, rng)
    return Reception(received, rx, n_active, np.mean(np.abs(signal) ** 2, axis=1), interference_power,
                     int(interferers.size if params.interference else 0), missing)


def uplink_rows(payloads: np.ndarray, tx_devices, topology: Topology, slot: int, seed: int, params: OtaParams,
                rng: np.random.Generator, receivers=None, alive=None) -> Reception:
    """medium_slot computed in float32 straight into the edges' rows: `received` is [n_rx, 2, d] float32 (real and
    imaginary parts). Same gains, same draws from `rng` in the same order, so the same rows as medium_slot's up to
    float32 round-off (tests/unit/test_channel_ota.py). The other clusters' devices and, where folded, the
    interferers and the noise are one product (_into_rows); the own cluster's real sqrt(rho) sum is added after the
    interference power is measured."""
    payloads, tx, rx, n_active, missing, interferers, is_own, gains, gi, rho = _uplink_links(
        payloads, tx_devices, topology, slot, seed, params, receivers, alive)
    n, t, d = rx.size, tx.size, payloads.shape[1]
    noise_var = params.sigma_en2 if params.noise else 0.0
    folded = gi is not None and folds(params.interferers, noise_var, n)
    left = np.zeros((2 * n, t + (2 * n if folded else 0)), dtype=np.float32)
    others = np.where(is_own, 0.0, gains)
    left[0::2, :t], left[1::2, :t] = others.real, others.imag
    rows = _into_rows(left, payloads, gi if folded else None, noise_var, rng).reshape(n, 2, d)
    if gi is not None and not folded:
        _add_complex(rows, interference_and_noise(gi, d, rng, params.interferers, params.chunk, noise_var)[0])
    own = np.zeros((2 * n, t), dtype=np.float32)
    own[0::2] = np.sqrt(rho) * is_own  # towards its own edge an active device's gain is exactly sqrt(rho)
    power, signal_power = measure_then_add(rows, own, payloads)
    interference_power = np.maximum(power / d - (noise_var if folded else 0.0), 0.0)
    if noise_var > 0 and not folded:
        _add_complex(rows, awgn((n, d), noise_var, rng))
    return Reception(rows, rx, n_active, signal_power / d, interference_power,
                     int(interferers.size if params.interference else 0), missing)


def _into_rows(left: np.ndarray, head: np.ndarray, folded_gains, noise_var: float, rng,
               project: np.ndarray | None = None) -> np.ndarray:
    """[R, d] float32 rows = left @ [head; W] (R = left's rows): head [k, d] (payloads, or the edges' interleaved
    signals) and, where folded_gains is given, W iid N(0, 1) [R, d] (standard_normals' values) behind the factor
    left[:, k:] = folded_factor(folded_gains, noise_var, project). The factor is lower triangular: the product and
    the draws go by the lanes' column blocks on the medium's threads (lanes.triangular_rows)."""
    k, d = head.shape[0], head.shape[-1]
    head = head.reshape(k, d)
    if folded_gains is None:
        flat = np.empty((left.shape[0], d), dtype=np.float32)
        np.matmul(left, head, out=flat)
        return flat
    left[:, k:] = folded_factor(folded_gains, noise_var, project)
    return triangular_rows(left, head, rng)


def _add_complex(rows: np.ndarray, z: np.ndarray) -> None:
    rows[:, 0] += z.real
    rows[:, 1] += z.imag


def medium_broadcast(edge_signals: np.ndarray, tx_edges, rx_devices, topology: Topology, slot: int, seed: int,
                     params: OtaParams, rng: np.random.Generator) -> Reception:
    """One simultaneous downlink slot (paper 003, eq. 18 / sec. III-B): each listed device receives
    sum_x ||x - pos||^-a/2 f_x s_x + n_d over every transmitting edge.

    edge_signals: [n_tx_edges, d] what each edge in `tx_edges` transmits, already scaled by sqrt(P_d/E).
    Every edge not in `tx_edges` belongs to another task and transmits at the same time: its signal is
    modelled as sqrt(P_d) times iid N(0,1) entries (its own power-normalised sum, independent of ours).
    """
    signals, tx, rx, g, is_own, others_gains = _broadcast_links(edge_signals, tx_edges, rx_devices, topology, slot,
                                                                 seed, params)
    d = signals.shape[1]
    received = superpose(g, signals)
    own_col = np.argmax(is_own, axis=1)
    has_own = is_own[np.arange(rx.size), own_col]
    a = np.where(has_own, g[np.arange(rx.size), own_col], 0.0)  # own-edge gain: the signal is a s_own
    others = np.setdiff1d(np.arange(topology.n_edges), tx)
    noise_var = params.sigma_dn2 if params.noise else 0.0
    folded = False
    if others_gains is not None:
        drawn, folded = interference_and_noise(others_gains, d, rng, params.interferers, params.chunk, noise_var)
        received += drawn
    # per-row ||r - a s||^2 = ||r||^2 - 2 Re(conj(a) <s, r>) + |a|^2 ||s||^2, without a [n_rx, d] temporary
    s_own = signals[own_col]
    cross = np.einsum("ij,ij->i", np.conj(s_own), received) if rx.size else np.zeros(0)
    s_pow = np.sum(np.abs(signals) ** 2, axis=1)[own_col]
    r_pow = np.einsum("ij,ij->i", received.real, received.real) + np.einsum("ij,ij->i", received.imag, received.imag)
    interference_power = np.maximum((r_pow - 2 * np.real(np.conj(a) * cross) + np.abs(a) ** 2 * s_pow) / d
                                    - (noise_var if folded else 0.0), 0.0)
    signal_power = np.abs(a) ** 2 * s_pow / d
    if noise_var > 0 and not folded:
        received += awgn(received.shape, noise_var, rng)
    return Reception(received, rx, np.zeros(0, dtype=np.int64), signal_power,
                     interference_power, int(others.size if params.interference else 0), np.zeros(0, dtype=np.int64))


def _broadcast_links(edge_signals, tx_edges, rx_devices, topology: Topology, slot: int, seed: int, params: OtaParams):
    """The downlink slot's checked inputs and gains: (signals, tx, rx, g [n_rx, n_tx] from the transmitting edges,
    own-edge mask, sqrt(P_d) x gains from every other edge of the plane or None where nothing else is heard)."""
    signals = np.atleast_2d(np.asarray(edge_signals))
    tx = np.asarray(tx_edges, dtype=np.int64).reshape(-1)
    rx = np.asarray(rx_devices, dtype=np.int64).reshape(-1)
    if signals.shape[0] != tx.size:
        raise ValueError(f"edge_signals has {signals.shape[0]} rows for {tx.size} tx_edges")
    if len(np.unique(tx)) != tx.size or (tx.size and (tx.min() < 0 or tx.max() >= topology.n_edges)):
        raise ValueError(f"tx_edges must be distinct edges in [0, {topology.n_edges})")
    if rx.size and (rx.min() < 0 or rx.max() >= topology.n_devices):
        raise ValueError(f"rx_devices must lie in [0, {topology.n_devices})")
    pos = topology.devices[rx]

    def gains_from(edges):
        dist = topology.distances(topology.edges[edges], pos)
        f = rayleigh(seed, slot, edges[None, :], rx[:, None], "down", params.sigma_d2, params.fading)
        return dist ** (-params.alpha / 2) * f

    g = gains_from(tx)
    is_own = topology.device_edge[rx][:, None] == tx[None, :]
    if not params.interference:
        g = np.where(is_own, g, 0.0)
    others = np.setdiff1d(np.arange(topology.n_edges), tx)
    others_gains = np.sqrt(params.P_d) * gains_from(others) if params.interference and others.size else None
    return signals, tx, rx, g, is_own, others_gains


def _interleaved(g: np.ndarray) -> np.ndarray:
    """[2 n_rx, 2 n_tx] float32 real form of complex gains g on interleaved rows and columns: row 2i gives Re r_i,
    row 2i + 1 Im r_i from the signals' rows (Re s_0, Im s_0, Re s_1, ...), so a product lands in [n_rx, 2, d]
    (re, im) rows without a copy."""
    n, m = g.shape
    out = np.empty((2 * n, 2 * m), dtype=np.float32)
    out[0::2, 0::2], out[0::2, 1::2] = g.real, -g.imag
    out[1::2, 0::2], out[1::2, 1::2] = g.imag, g.real
    return out


def _signal_rows(signals: np.ndarray) -> np.ndarray:
    """[m, 2, d] real rows of [m, d] signals (complex, or real with no imaginary part); [m, 2, d] rows as they are."""
    if signals.ndim == 3:
        return signals
    return np.stack([np.real(signals), np.imag(signals)], axis=1).astype(np.float32)


def broadcast_rows(edge_signals: np.ndarray, tx_edges, rx_devices, topology: Topology, slot: int, seed: int,
                   params: OtaParams, rng: np.random.Generator, phase=None) -> Reception:
    """medium_broadcast computed in float32 straight into what the devices receive: `received` is [n_rx, 2, d]
    float32 (real and imaginary parts). edge_signals: [m, d] (complex) or real [m, 2, d] rows (uplink_rows' form).
    Same gains, same draws from `rng` in the same order, so the same rows as medium_broadcast's up to float32
    round-off (tests/unit/test_channel_ota.py).

    The other edges' interference and the noise, where folded (aggregate mode), ride in the same matrix product as
    the transmitting edges' signals: [G_others | L] @ [S; W] with W drawn in place (_into_rows); the own edge's
    a s_own is accumulated in place after the interference power is measured, so that power needs no cancellation.

    With `phase` (per listener: the phase of its own edge's downlink fading f_o) `received` is [n_rx, d], each
    listener's in-phase component Re(e^{-i phi} v) (in_phase_projection), the only part a device's estimator uses
    (estimate_rows). Where the law is folded it is drawn from the projected law itself: n_rx normals a column and an
    [n_rx, n_rx] factor instead of 2 n_rx and [2 n_rx, 2 n_rx] (a quarter of the product), the same law as the
    projection of the complex rows (not the same draws); `interference_power` is then its expectation over the
    Gaussian part (the complex rows' sample power differs from it by O(1 / sqrt(d)) relative). Otherwise the complex
    rows are drawn and projected."""
    if phase is not None and not _folds_downlink(params, topology, tx_edges, rx_devices):
        rec = broadcast_rows(edge_signals, tx_edges, rx_devices, topology, slot, seed, params, rng)
        p = np.asarray(phase, dtype=np.float64).reshape(-1, 1)
        rows = np.cos(p).astype(np.float32) * rec.received[:, 0] + np.sin(p).astype(np.float32) * rec.received[:, 1]
        return Reception(rows, rec.receivers, rec.n_active, rec.signal_power, rec.interference_power,
                         rec.interferers_active, rec.missing)
    signals, tx, rx, g, is_own, others_gains = _broadcast_links(edge_signals, tx_edges, rx_devices, topology, slot,
                                                                seed, params)
    n, m, d = rx.size, tx.size, signals.shape[-1]
    noise_var = params.sigma_dn2 if params.noise else 0.0
    folded = others_gains is not None and folds(params.interferers, noise_var, n)
    head = _signal_rows(signals).reshape(2 * m, d)
    others = _interleaved(np.where(is_own, 0.0, g))
    if phase is not None:  # folded: the own edge rides in the same product (the power is not measured, see above)
        project = in_phase_projection(phase)
        left = np.zeros((n, 2 * m + n), dtype=np.float32)
        left[:, :2 * m] = project @ _interleaved(g)
        rows = _into_rows(left, head, others_gains, noise_var, rng, project)
        interference_power = _expected_interference(others, head, others_gains, n)
    else:
        left = np.zeros((2 * n, 2 * m + (2 * n if folded else 0)), dtype=np.float32)
        left[:, :2 * m] = others
        rows = _into_rows(left, head, others_gains if folded else None, noise_var, rng).reshape(n, 2, d)
        if others_gains is not None and not folded:
            _add_complex(rows, interference_and_noise(others_gains, d, rng, params.interferers, params.chunk,
                                                      noise_var)[0])
        power, _ = measure_then_add(rows, _interleaved(np.where(is_own, g, 0.0)), head)
        interference_power = np.maximum(power / d - (noise_var if folded else 0.0), 0.0)
    own_col = np.argmax(is_own, axis=1)
    a2 = np.where(is_own[np.arange(n), own_col], np.abs(g[np.arange(n), own_col]) ** 2, 0.0)
    signal_power = a2 * _row_power(signals)[own_col] / d
    if noise_var > 0 and not folded:
        _add_complex(rows, awgn((n, d), noise_var, rng))
    return Reception(rows, rx, np.zeros(0, dtype=np.int64), signal_power, interference_power,
                     int(topology.n_edges - m if params.interference else 0), np.zeros(0, dtype=np.int64))


def _folds_downlink(params: OtaParams, topology: Topology, tx_edges, rx_devices) -> bool:
    """Whether broadcast_rows draws the other edges' interference and the noise as one folded law."""
    heard = params.interference and topology.n_edges > np.asarray(tx_edges).size
    return bool(heard and folds(params.interferers, params.sigma_dn2 if params.noise else 0.0,
                                np.asarray(rx_devices).size))


def _expected_interference(others: np.ndarray, head: np.ndarray, others_gains, n: int) -> np.ndarray:
    """Per listener, the per-entry power of everything but its own edge and the noise on its complex rows: the
    transmitting others' part exactly (others [2 n, 2 m] interleaved gains, head [2 m, d] the signals' rows, through
    their Gram matrix) and the aggregate interferers' N(0, 1) payloads in expectation (sum of |gain|^2)."""
    gram = (head @ head.T).astype(np.float64) / head.shape[1]  # float32 sums: a statistic, 1e-5 relative
    power = np.einsum("rk,kl,rl->r", others.astype(np.float64), gram, others.astype(np.float64))
    if others_gains is not None:
        power = power + (_interleaved_rows(np.atleast_2d(others_gains)) ** 2).sum(axis=1)
    return power.reshape(n, 2).sum(axis=1)


def edge_transmit(received: np.ndarray, P_d: float, E) -> np.ndarray:
    """What an edge broadcasts: sqrt(P_d / E) v_u (paper 003, sec. III-A step 5; E shared with devices, digest 10.2).
    received: complex [n, d], or real [n, 2, d] rows (kept in their float dtype)."""
    v = np.atleast_2d(received)
    scale = np.sqrt(P_d / np.asarray(E, dtype=np.float64)).reshape((-1,) + (1,) * (v.ndim - 1))
    return (scale if np.iscomplexobj(v) else scale.astype(v.dtype)) * v
