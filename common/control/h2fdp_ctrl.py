"""H2FDP(ctrl): the maths of the adaptive controller of paper 000 (Alg. 1; digest 000 Sec. 5 and 10). Pure numpy.

Part I `step_size`; Part II `exhaustive_search` / `nested_line_search` on a `CtrlProblem`, minimising over
(tau, s_T, s_U) J = a1 (T-t_k)/tau (E_Glob + K_l sum_c E_c,Loc) + a2 (T-t_k)/tau (D_Glob + K_l sum_c D_c,Loc)
+ a3 nu/phi, nu = term (b) of Thm 4.3 with p_c := 1[c trusted] (digest 10). s_T serves every trusted cluster,
s_U every untrusted one, capped by size: s_c = min(level, |S_c|); a level runs over 1..min(s_max, largest size
in its group) (0 for an empty group), tau over tau_min..min(tau_max, T - t_k). `remaining_rounds`: K_g cap.

Estimators (the paper only cites Lin et al. 2021 Sec. IV-C), from what devices can report:
- beta: max_i ||g_i(w) - g_i(w')|| / ||w - w'|| on two iterates (digest 10's suggestion); a lower bound of the
  smoothness along the observed directions, exact along the top Hessian eigenvector of a quadratic.
- sigma: max_i sqrt(sum_b ||g_ib - mean_b g_ib||^2 / (B-1)), B >= 2 minibatch gradients of device i at one
  model: the unbiased estimate of E||g_hat - grad F_i||^2, which sigma^2 bounds (max: one bound for all).
- zeta: max_c ||gbar_c - gbar|| (gbar_c: equal-weight mean of cluster c's gradients, rho = 1/s_c; gbar: mean of
  the cluster means, varrho = 1/N); zeta_c: max_i ||g_i - gbar_c(i)||. Both need gradients at one model (e.g.
  the round's first minibatch at the broadcast model); minibatch noise inflates them.
sigma, zeta, zeta_c enter a_2, B_1, B_2 of Thm 4.3, not nu: they do not move the Part II choice.

Energy/delay of a global round, per cluster c from the emulated clock: e_dev_local, t_dev_local (one
participant's window, compute + upload; the slowest participant's delay), t_up (one participant's upload air
time, the largest in the cluster) and e_glob, t_glob (the edge's side of a global aggregation):
  E_c,Loc = s_c e_dev_local[c], D_c,Loc = DELAY_READINGS[reading](s_c, t_dev_local[c], t_up[c]),
  E_Glob = sum_c (e_glob[c] + s_c e_dev_local[c]), D_Glob = max_c (t_glob[c] + D_c,Loc).
Two readings of D_c,Loc (delay_reading): "parallel" (default; the emulated clock's barrier: uploads on orthogonal
bands run at once, D_c,Loc = t_dev_local, free of s_c) and "sequential" (digest 000 Sec. 5: "the total consumed
time it takes for all selected devices in cluster c to transmit", a sum over the s_c selected devices:
D_c,Loc = t_dev_local + (s_c - 1) t_up, the window with s_c uploads one after another instead of one).
The device parts of the global terms are the last window of the interval, which ends in the global aggregation
(K_l + 1 windows per round, digest 10); final_window=False drops them. D_c,Loc is summed over c as in the paper.

Nested line search: for each tau (a 1-D scan), coordinate descent over (s_T, s_U) from (top, top): best point of
the whole s_T line, then of the s_U line, until a pass moves nothing. At fixed tau J = const + f_T(s_T) + f_U(s_U)
(energy and nu sum over clusters, delay is free of s under the parallel reading), so this is EXACT without a
feasibility callback, at
~2 tau_range (S_T + S_U) evaluations instead of tau_range S_T S_U. With a callback, an infeasible per-tau optimum
gives way to a descent over feasible points from the best feasible point on the two lines through it (exact
only where the per-tau optimum is feasible); if no line meets a feasible point, the exhaustive search decides.
Under the sequential reading D_Glob = max_c (t_glob + t_dev_local + (s_c - 1) t_up) couples s_T and s_U, and
coordinate descent can stop short (test_sequential_delay_defeats_coordinate_descent): nested_line_search then
hands the problem to the exhaustive search (method "exhaustive (delay couples s_T, s_U)").
Ties (both): smallest J, then smallest tau, then largest s_T, then largest s_U.

Monotonicity (digest 9.5) holds for the chosen plan's cost terms (raising a1 never raises its energy, a2 its
delay, a3 its nu: revealed preference), for s at fixed tau (a1 never raises it, a3 never lowers it) and for tau
in a2 (J is submodular in (tau, s); a2 weighs only 1/tau). The paper's joint claim (a1 up: tau up, s down) is
not a property of this integer program, where tau and s are complements (nu ~ tau g(s), energy ~ h(s)/tau):
one untrusted cluster with J = 10 a1 s/tau + tau/s goes from (1, 3) to (2, 5) when a1 rises from 1/90 to 0.016.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np

Feasible = Callable[[int, int, int], bool]


def _num(name, value, lo=0.0, strict=True) -> float:
    v = float(value)
    if not math.isfinite(v) or v < lo or (strict and v == lo):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {lo:g}, got {value!r}")
    return v


def _int(name, value, lo: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)


def _vec(name, values, n: Optional[int] = None) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1 or a.size == 0 or (n is not None and a.size != n) or not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{name} must be a list of {n or 'some'} finite numbers >= 0, got shape {a.shape}")
    return a


def nu(tau, s, *, trusted, K_l: int, M: int, q: float, G: float, delta: float, epsilon: float,
       c2: float = 1.0, v2: Optional[float] = None, N: Optional[int] = None):
    """Term (b) of Thm 4.3 (digest 000 Sec. 5) with p_c := 1[c trusted] (digest 10):
    4 tau (K_l^3 + 1) M q^2 G^2 ln(1/delta) / (N^2 eps^2) sum_c (1[T] c2^2/s_c^2 + (1 - 1[T]) v2^2/s_c).

    s: per-cluster participation, last axis = clusters (s_c >= 1); tau (>= 1) broadcasts against s[..., 0].
    v2 defaults to c2; N, if given, must equal the number of clusters. Natural log (digest 10)."""
    tr = np.asarray(trusted)
    if tr.ndim != 1 or tr.size == 0 or tr.dtype != bool:
        raise ValueError("trusted must be a non-empty list of booleans, one per cluster")
    n = tr.size
    if N is not None and _int("N", N, 1) != n:
        raise ValueError(f"N must equal the number of clusters ({n}), got {N!r}")
    s, tau = np.asarray(s, dtype=np.float64), np.asarray(tau, dtype=np.float64)
    if s.ndim == 0 or s.shape[-1] != n or not np.all(np.isfinite(s)) or np.any(s < 1):
        raise ValueError(f"s must hold {n} participation levels s_c >= 1 on its last axis")
    if not np.all(np.isfinite(tau)) or np.any(tau < 1):
        raise ValueError("tau must be >= 1")
    _int("K_l", K_l, 0), _int("M", M, 1), _num("G", G), _num("epsilon", epsilon), _num("c2", c2)
    if not 0 < q <= 1 or not 0 < delta < 1:
        raise ValueError(f"q must lie in (0, 1] and delta in (0, 1), got q={q!r}, delta={delta!r}")
    v2 = c2 if v2 is None else _num("v2", v2)
    acc = 0.0
    for c in range(n):  # fixed summation order: identical floats whatever the grid shape
        sc = s[..., c]
        acc = acc + (c2 * c2 / (sc * sc) if tr[c] else v2 * v2 / sc)
    coef = 4.0 * (K_l ** 3 + 1) * M * q * q * G * G * math.log(1.0 / delta) / (n * n * epsilon * epsilon)
    out = coef * tau * acc
    return float(out) if np.ndim(out) == 0 else out


def step_size(beta_hat: float, tau_prev: int, K_g: int, k: int, eta_override: Optional[float] = None
              ) -> tuple[float, float]:
    """Part I of Alg. 1 (digest 5): gamma_k = min(1/tau_{k-1}, 1/K_g)/beta_hat, eta_k = gamma_k/sqrt(k+1).
    eta_override (digest 10 "Tiny steps") replaces eta_k; gamma_k is still returned."""
    gamma = min(1.0 / _int("tau_prev", tau_prev, 1), 1.0 / _int("K_g", K_g, 1)) / _num("beta_hat", beta_hat)
    eta = gamma / math.sqrt(_int("k", k, 0) + 1)
    return gamma, (eta if eta_override is None else _num("eta_override", eta_override))


def _rows(name, a, ndim) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    a = a[None] if a.ndim == ndim - 1 else a
    if a.ndim != ndim or a.size == 0 or not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be a finite array with {ndim - 1} or {ndim} axes, got shape {a.shape}")
    return a


def estimate_beta(grad_a, grad_b, w_a, w_b) -> float:
    """beta_hat = max_i ||g_i(w_a) - g_i(w_b)|| / ||w_a - w_b|| (digest 10). grads: (devices, M) or (M,);
    models: (M,) shared or (devices, M). Devices whose two models coincide are skipped."""
    ga, gb = _rows("grad_a", grad_a, 2), _rows("grad_b", grad_b, 2)
    wa, wb = _rows("w_a", w_a, 2), _rows("w_b", w_b, 2)
    try:
        dg, dw = np.broadcast_arrays(ga - gb, wa - wb)
    except ValueError as err:
        raise ValueError("grad_a, grad_b, w_a, w_b must have matching shapes") from err
    step = np.linalg.norm(dw, axis=1)
    if not np.any(step > 0):
        raise ValueError("estimate_beta needs w_a != w_b for at least one device")
    return float(np.max(np.linalg.norm(dg, axis=1)[step > 0] / step[step > 0]))


def estimate_sigma(minibatch_grads) -> float:
    """sigma_hat = max_i sqrt(sum_b ||g_ib - mean_b g_ib||^2 / (B - 1)); input (devices, B, M) or (B, M)."""
    g = _rows("minibatch_grads", minibatch_grads, 3)
    if g.shape[1] < 2:
        raise ValueError("estimate_sigma needs at least 2 minibatch gradients per device")
    dev = g - g.mean(axis=1, keepdims=True)
    return float(np.sqrt(np.max(np.sum(dev * dev, axis=(1, 2)) / (g.shape[1] - 1))))


def _cluster_means(grads, clusters):
    g = _rows("grads", grads, 2)
    lab = np.asarray(clusters)
    if lab.shape != (g.shape[0],):
        raise ValueError(f"clusters must give one cluster label per device ({g.shape[0]}), got shape {lab.shape}")
    ids, inv = np.unique(lab, return_inverse=True)
    means = np.stack([g[inv == j].mean(axis=0) for j in range(ids.size)])
    return g, inv, means


def estimate_zeta(grads, clusters) -> float:
    """zeta_hat = max_c ||gbar_c - gbar||, gbar_c = mean of cluster c's device gradients, gbar = mean over clusters."""
    _, _, means = _cluster_means(grads, clusters)
    return float(np.max(np.linalg.norm(means - means.mean(axis=0), axis=1)))


def estimate_zeta_c(grads, clusters) -> float:
    """zeta_c_hat = max_i ||g_i - gbar_c(i)|| (intra-subnet diversity); grads (devices, M), one label per device."""
    g, inv, means = _cluster_means(grads, clusters)
    return float(np.max(np.linalg.norm(g - means[inv], axis=1)))


def energy_terms(s, e_dev_local, e_glob, final_window: bool = True):
    """(E_Glob(s), E_c,Loc(s_c)) of one global round (module docstring): s has clusters on its last axis;
    E_c,Loc = s_c e_dev_local[c], E_Glob = sum_c e_glob[c] (+ s_c e_dev_local[c] with final_window)."""
    e_loc = _vec("e_dev_local", e_dev_local)
    e_g = _vec("e_glob", e_glob, e_loc.size)
    s = np.asarray(s, dtype=np.float64)
    if s.ndim == 0 or s.shape[-1] != e_loc.size or np.any(s < 0):
        raise ValueError(f"s must hold {e_loc.size} participation levels >= 0 on its last axis")
    e_c = s * e_loc
    total = 0.0
    for c in range(e_loc.size):
        total = total + e_g[c] + (e_c[..., c] if final_window else 0.0)
    return total, e_c


def _parallel_delay(s, t_dev_local, t_up):
    """D_c,Loc = t_dev_local: the slowest participant's window, uploads at once (the emulated clock's barrier)."""
    return np.broadcast_to(t_dev_local, np.shape(s)).astype(np.float64)


def _sequential_delay(s, t_dev_local, t_up):
    """D_c,Loc = t_dev_local + (s_c - 1) t_up: the s_c selected devices transmit one after another (digest 000
    Sec. 5, "the total consumed time it takes for all selected devices in cluster c to transmit")."""
    return t_dev_local + (np.maximum(s, 1.0) - 1.0) * t_up


@dataclass(frozen=True)
class DelayReading:
    local: Callable       # (s [..., C], t_dev_local [C], t_up [C]) -> D_c,Loc [..., C]
    separable: bool       # J at fixed tau is f_T(s_T) + f_U(s_U): the nested line search is exact


DELAY_READINGS = {"parallel": DelayReading(_parallel_delay, True),
                  "sequential": DelayReading(_sequential_delay, False)}


def delay_reading(name: str) -> DelayReading:
    if name not in DELAY_READINGS:
        raise ValueError(f"unknown delay reading {name!r}; allowed: {', '.join(sorted(DELAY_READINGS))}")
    return DELAY_READINGS[name]


def delay_terms(s, t_dev_local, t_up, t_glob, final_window: bool = True, reading: str = "parallel"):
    """(Delta_Glob, Delta_c,Loc) of one global round, s with clusters on its last axis (module docstring):
    D_c,Loc by the reading, D_Glob = max_c (t_glob[c] (+ D_c,Loc with final_window))."""
    t_loc = _vec("t_dev_local", t_dev_local)
    t_u = _vec("t_up", t_up, t_loc.size)
    t_g = _vec("t_glob", t_glob, t_loc.size)
    s = np.asarray(s, dtype=np.float64)
    if s.ndim == 0 or s.shape[-1] != t_loc.size or np.any(s < 0):
        raise ValueError(f"s must hold {t_loc.size} participation levels >= 0 on its last axis")
    d_c = delay_reading(reading).local(s, t_loc, t_u)
    return np.max(t_g + (d_c if final_window else 0.0 * d_c), axis=-1), d_c


@dataclass(frozen=True, eq=False)
class CtrlProblem:
    """One Part II instance at global round k (digest 000 Sec. 5, step 2). Per-cluster arrays: trusted, sizes
    (|S_c|), e_dev_local, t_dev_local, e_glob, t_glob. tau ranges over tau_min..min(tau_max, T - t_k); pass
    tau_min = K_l + 1 to leave room for K_l local aggregations inside an interval."""
    trusted: np.ndarray
    sizes: np.ndarray
    e_dev_local: np.ndarray
    t_dev_local: np.ndarray
    e_glob: np.ndarray
    t_glob: np.ndarray
    K_l: int
    M: int
    q: float
    G: float
    delta: float
    epsilon: float
    T: int
    t_k: int
    tau_max: int
    s_max: int
    alpha1: float = 1.0
    alpha2: float = 1.0
    alpha3: float = 1.0
    phi: float = 1.0
    c2: float = 1.0
    v2: Optional[float] = None
    tau_min: int = 1
    final_window: bool = True
    t_up: Optional[np.ndarray] = None      # per cluster; None = zeros (the sequential reading then equals parallel)
    delay_reading: str = "parallel"

    def __post_init__(self):
        tr = np.asarray(self.trusted)
        if tr.ndim != 1 or tr.size == 0 or tr.dtype != bool:
            raise ValueError("trusted must be a non-empty list of booleans, one per cluster")
        sizes = np.asarray(self.sizes)
        if sizes.shape != tr.shape or not np.issubdtype(sizes.dtype, np.integer) or np.any(sizes < 1):
            raise ValueError(f"sizes must be {tr.size} integers >= 1 (devices per cluster)")
        if self.t_up is None:
            object.__setattr__(self, "t_up", np.zeros(tr.size))
        delay_reading(self.delay_reading)
        arrays = {f: _vec(f, getattr(self, f), tr.size)
                  for f in ("e_dev_local", "t_dev_local", "e_glob", "t_glob", "t_up")}
        for f, v in dict(trusted=tr, sizes=sizes.astype(np.int64), **arrays).items():
            object.__setattr__(self, f, v)
        for f in ("alpha1", "alpha2", "alpha3"):
            _num(f, getattr(self, f), strict=False)
        _num("phi", self.phi), _int("T", self.T, 1), _int("t_k", self.t_k, 0), _int("s_max", self.s_max, 1)
        if _int("tau_min", self.tau_min, 1) > min(_int("tau_max", self.tau_max, 1), self.T - self.t_k):
            raise ValueError(f"no tau left: tau_min={self.tau_min} > min(tau_max={self.tau_max}, "
                             f"T - t_k={self.T - self.t_k})")
        nu(1, np.ones(tr.size), **self._nu_kwargs())  # validates the privacy constants

    def _nu_kwargs(self) -> dict:
        return dict(trusted=self.trusted, K_l=self.K_l, M=self.M, q=self.q, G=self.G, delta=self.delta,
                    epsilon=self.epsilon, c2=self.c2, v2=self.v2)

    @property
    def tau_grid(self) -> np.ndarray:
        return np.arange(self.tau_min, min(self.tau_max, self.T - self.t_k) + 1)

    def levels(self, trusted: bool) -> np.ndarray:
        """Admissible participation levels of a group: 1..min(s_max, largest cluster), or [0] if it is empty."""
        group = self.sizes[self.trusted == trusted]
        return np.arange(1, min(self.s_max, int(group.max())) + 1) if group.size else np.zeros(1, np.int64)

    def participation(self, s_T, s_U) -> np.ndarray:
        """s_c = min(s_T or s_U, |S_c|) with clusters on a new last axis (use .astype(int) for the plan)."""
        a, b = np.broadcast_arrays(np.asarray(s_T, np.float64), np.asarray(s_U, np.float64))
        return np.stack([np.minimum(a if t else b, z) for t, z in zip(self.trusted, self.sizes)], axis=-1)


def cost_terms(p: CtrlProblem, tau, s_T, s_U):
    """(energy, delay, nu) of the plan over the remaining horizon, broadcast over tau, s_T, s_U:
    (T-t_k)/tau (E_Glob + K_l sum_c E_c,Loc), (T-t_k)/tau (D_Glob + K_l sum_c D_c,Loc), nu (digest 000 Sec. 5)."""
    tau = np.asarray(tau, dtype=np.float64)
    s = p.participation(s_T, s_U)
    e_g, e_c = energy_terms(s, p.e_dev_local, p.e_glob, p.final_window)
    d_g, d_c = delay_terms(s, p.t_dev_local, p.t_up, p.t_glob, p.final_window, p.delay_reading)
    e_loc = d_loc = 0.0
    for c in range(p.trusted.size):  # fixed summation order, as in nu
        e_loc, d_loc = e_loc + e_c[..., c], d_loc + d_c[..., c]
    rounds = (p.T - p.t_k) / tau
    return rounds * (e_g + p.K_l * e_loc), rounds * (d_g + p.K_l * d_loc), nu(tau, s, **p._nu_kwargs())


def objective(p: CtrlProblem, tau, s_T, s_U):
    """J = alpha1 energy + alpha2 delay + alpha3 nu / phi (Part II, digest 000 Sec. 5 step 2); broadcasts."""
    energy, delay, nu_ = cost_terms(p, tau, s_T, s_U)
    return p.alpha1 * energy + p.alpha2 * delay + p.alpha3 * nu_ / p.phi


@dataclass(frozen=True)
class CtrlChoice:
    """The chosen plan: tau_k and the two levels (per-cluster s_c^k: problem.participation(s_trusted, s_untrusted))."""
    tau: int
    s_trusted: int
    s_untrusted: int
    objective: float
    evaluations: int
    method: str


def _memo(feasible: Optional[Feasible]) -> Feasible:
    if feasible is None:
        return lambda *_: True
    seen: dict = {}
    return lambda *pt: seen[pt] if pt in seen else seen.setdefault(pt, bool(feasible(*pt)))


def exhaustive_search(p: CtrlProblem, feasible: Optional[Feasible] = None) -> CtrlChoice:
    """J on the whole integer grid (one vectorised call), then the first point in tie-break order that
    feasible(tau, s_T, s_U) accepts (called lazily, best first). ValueError if none is feasible."""
    grid = np.broadcast_arrays(p.tau_grid[:, None, None], p.levels(True)[None, :, None], p.levels(False)[None, None, :])
    tau, st, su = (g.ravel() for g in grid)
    J = np.broadcast_to(objective(p, *grid), grid[0].shape).ravel()
    ok = _memo(feasible)
    for i in np.lexsort((-su, -st, tau, J)):
        if ok(int(tau[i]), int(st[i]), int(su[i])):
            return CtrlChoice(int(tau[i]), int(st[i]), int(su[i]), float(J[i]), J.size, "exhaustive")
    raise ValueError(f"no feasible plan: the feasibility callback (privacy ledger) rejected all {J.size} "
                     f"(tau, s_T, s_U) points of the grid")


def _line(p, tau, cur, axis, ok, count):
    """Best point accepted by ok on the line through cur along s_T (axis 0) or s_U (axis 1), or None."""
    lv = p.levels(axis == 0)
    J = np.broadcast_to(objective(p, tau, *((lv, cur[1]) if axis == 0 else (cur[0], lv))), lv.shape)
    count[0] += lv.size
    for i in np.lexsort((-lv, J)):
        pt = (int(lv[i]), cur[1]) if axis == 0 else (cur[0], int(lv[i]))
        if ok(tau, *pt):
            return pt, float(J[i])
    return None


def _descend(p, tau, cur, ok, count):
    """Coordinate descent over (s_T, s_U) at fixed tau from an accepted point, until a pass moves nothing."""
    moved = True
    while moved:
        moved = False
        for axis in (0, 1):
            pt, j = _line(p, tau, cur, axis, ok, count)
            moved, cur = moved or pt != cur, pt
    return cur, j


COUPLED_SEARCH = "exhaustive (delay couples s_T, s_U)"


def nested_line_search(p: CtrlProblem, feasible: Optional[Feasible] = None) -> CtrlChoice:
    """Paper's nested line search (module docstring): exact without a callback where the delay reading is
    separable; otherwise the exhaustive search decides. Same tie-break as exhaustive."""
    if not delay_reading(p.delay_reading).separable:
        return replace(exhaustive_search(p, feasible), method=COUPLED_SEARCH)
    ok, free, count, best = _memo(feasible), _memo(None), [0], None
    top = (int(p.levels(True)[-1]), int(p.levels(False)[-1]))
    for tau in map(int, p.tau_grid):
        cur, j = _descend(p, tau, top, free, count)
        if not ok(tau, *cur):
            cross = [r for r in (_line(p, tau, cur, a, ok, count) for a in (0, 1)) if r is not None]
            if not cross:
                continue
            start = min(cross, key=lambda r: (r[1], -r[0][0], -r[0][1]))[0]
            cur, j = _descend(p, tau, start, ok, count)
        key = (j, tau, -cur[0], -cur[1])
        best = key if best is None or key < best else best
    if best is None:  # nothing feasible met on any line: settle it on the whole grid (raises if none)
        fb = exhaustive_search(p, ok)
        return replace(fb, evaluations=fb.evaluations + count[0], method="nested_line_search+exhaustive")
    return CtrlChoice(best[1], -best[2], -best[3], best[0], count[0], "nested_line_search")


def remaining_rounds(T: int, t_k: int, tau: int, rounds_done: int, K_g: int) -> int:
    """Global rounds still to run with interval tau: min(floor((T - t_k)/tau), K_g - rounds_done), >= 0, so the
    realised number of aggregations never exceeds the K_g (and K_g K_l) the noise was calibrated for (digest 10)."""
    T, t_k, tau = _int("T", T, 0), _int("t_k", t_k, 0), _int("tau", tau, 1)
    K_g, done = _int("K_g", K_g, 1), _int("rounds_done", rounds_done, 0)
    if t_k > T or done > K_g:
        raise ValueError(f"need t_k <= T and rounds_done <= K_g, got t_k={t_k}, T={T}, rounds_done={done}, K_g={K_g}")
    return max(0, min((T - t_k) // tau, K_g - done))
