"""H2FDP(ctrl) maths (paper 000 Alg. 1; digest 000 Sec. 5, 9.5 and 10): nu, step size, estimators, the
energy/delay model, the Part II objective and its two solvers."""
import math
from dataclasses import replace

import numpy as np
import pytest

from hfl.common.control import h2fdp_ctrl as hc

PRIV = dict(M=7840, q=0.027, G=1.0, delta=1e-5, epsilon=1.0)


def random_problem(seed: int, **overrides) -> hc.CtrlProblem:
    """Emulator-scale inputs: 2-5 clusters of 2-8 devices, mJ / tens of ms per window, phi in {1, 1e2, 1e4}."""
    r = np.random.default_rng(seed)
    n = int(r.integers(2, 6))
    kw = dict(trusted=r.random(n) < 0.5, sizes=r.integers(2, 9, n), e_dev_local=r.uniform(1e-3, 1e-2, n),
              t_dev_local=r.uniform(0.01, 0.1, n), e_glob=r.uniform(5e-3, 5e-2, n), t_glob=r.uniform(1e-3, 1e-2, n),
              K_l=int(r.integers(0, 4)), T=200, t_k=int(r.integers(0, 190)), tau_max=8, s_max=6,
              phi=float(10.0 ** (2 * r.integers(0, 3))), **PRIV)
    kw.update(overrides)
    return hc.CtrlProblem(**kw)


def plan(choice: hc.CtrlChoice):
    return choice.tau, choice.s_trusted, choice.s_untrusted


# ------------------------------------------------------------------------------------------------- nu

def test_nu_matches_hand_computation_of_term_b():
    # 4 tau (K_l^3+1) M q^2 G^2 ln(1/delta) / (N^2 eps^2) = 4*5*9*10*0.01*4*3 / (4*0.25) = 216;
    # sum_c: trusted c2^2/s^2 = 2.25/4, untrusted v2^2/s = 0.25/4 -> 0.625; nu = 135.
    kw = dict(trusted=[True, False], K_l=2, M=10, q=0.1, G=2.0, delta=math.exp(-3), epsilon=0.5, c2=1.5, v2=0.5)
    assert hc.nu(5, [2, 4], **kw) == pytest.approx(135.0, rel=1e-12)
    assert hc.nu(np.array([1, 5]), np.array([2, 4]), N=2, **kw) == pytest.approx([27.0, 135.0], rel=1e-12)
    grid = hc.nu(np.arange(1, 4)[:, None], np.array([[[2, 4]], [[1, 1]]]).reshape(1, 2, 2), **kw)
    assert grid.shape == (3, 2) and grid[2, 1] == pytest.approx(3 * 216 / 5 * (2.25 + 0.25))
    # v2 defaults to c2: both clusters at s = 2 give 216/5 * (c2^2/4 + c2^2/2).
    assert hc.nu(1, [2, 2], **{**kw, "v2": None}) == pytest.approx(216 / 5 * (2.25 / 4 + 2.25 / 2))


@pytest.mark.parametrize("bad", [dict(s=[0, 4]), dict(s=[2, 4, 4]), dict(tau=0), dict(N=3), dict(q=0.0),
                                 dict(delta=1.0), dict(epsilon=-1.0), dict(trusted=[1, 0])])
def test_nu_rejects_bad_input(bad):
    kw = dict(tau=2, s=[2, 4], trusted=[True, False], K_l=1, **PRIV)
    with pytest.raises(ValueError):
        hc.nu(**{**kw, **bad})


def test_nu_falls_with_participation_and_trust_and_grows_with_tau():
    kw = dict(K_l=3, c2=1.0, v2=1.0, **PRIV)
    s = np.arange(1, 16, dtype=float)
    for trusted in ([True, False, False], [False, False, False], [True, True, True]):
        v = hc.nu(4, np.stack([s, s, s], axis=-1), trusted=trusted, **kw)
        assert np.all(np.diff(v) < 0)
        t = hc.nu(np.arange(1, 41), [5, 5, 5], trusted=trusted, **kw)
        assert np.all(np.diff(t) > 0)
    by_trust = [hc.nu(4, [5, 5, 5], trusted=[i > j for j in range(3)], **kw) for i in range(4)]  # 0..3 trusted
    assert all(a > b for a, b in zip(by_trust, by_trust[1:]))


# ------------------------------------------------------------------------------ step size, estimators

def test_step_size_and_override():
    assert hc.step_size(2.0, 5, 100, 3) == pytest.approx((0.005, 0.0025))
    assert hc.step_size(2.0, 500, 100, 0) == pytest.approx((0.001, 0.001))
    gamma, eta = hc.step_size(2.0, 5, 100, 3, eta_override=0.05)
    assert gamma == pytest.approx(0.005) and eta == 0.05
    for bad in (dict(beta_hat=0.0), dict(tau_prev=0), dict(K_g=0), dict(k=-1), dict(eta_override=0.0)):
        with pytest.raises(ValueError):
            hc.step_size(**{**dict(beta_hat=2.0, tau_prev=5, K_g=100, k=3), **bad})


def test_estimate_beta_recovers_the_largest_eigenvalue_of_quadratics():
    rng = np.random.default_rng(0)
    dim, hessians = 6, []
    for lam_max in (3.0, 7.5, 5.0):  # f_i(w) = w^T A_i w / 2, grad A_i w, smoothness = top eigenvalue
        q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
        hessians.append(q @ np.diag(np.r_[lam_max, rng.uniform(0.1, 2.0, dim - 1)]) @ q.T)
    top = np.linalg.eigh(hessians[1])[1][:, -1]
    w = rng.normal(size=dim)
    grads = lambda x: np.stack([h @ x for h in hessians])
    assert hc.estimate_beta(grads(w), grads(w + 0.3 * top), w, w + 0.3 * top) == pytest.approx(7.5, rel=1e-9)
    w2 = w + rng.normal(size=dim)  # any other direction under-estimates
    assert 0 < hc.estimate_beta(grads(w), grads(w2), w, w2) <= 7.5 + 1e-9
    per_device_w = np.stack([w, w, w2])  # device models may differ; a device that did not move is skipped
    moved_only = np.linalg.norm(hessians[2] @ (w2 - w)) / np.linalg.norm(w2 - w)
    grad_b = np.stack([hessians[0] @ w, hessians[1] @ w, hessians[2] @ w2])
    assert hc.estimate_beta(grads(w), grad_b, w, per_device_w) == pytest.approx(moved_only)
    with pytest.raises(ValueError, match="w_a != w_b"):
        hc.estimate_beta(grads(w), grads(w), w, w)


def test_sigma_and_diversity_estimators():
    mean = np.array([1.0, -2.0, 0.5])
    d = np.array([0.0, 3.0, 4.0])  # ||d|| = 5
    batches = np.stack([np.stack([mean + d, mean - d]), np.stack([mean, mean])])  # 2 devices x B=2
    assert hc.estimate_sigma(batches) == pytest.approx(math.sqrt(2 * 25 / 1))  # unbiased: /(B-1)
    assert hc.estimate_sigma(batches[0]) == pytest.approx(math.sqrt(50))
    with pytest.raises(ValueError):
        hc.estimate_sigma(batches[:, :1])
    # cluster 7: devices at (0,0),(2,0) -> mean (1,0); cluster 3: single device at (-1, 0); global mean (0, 0).
    g, labels = np.array([[0.0, 0.0], [2.0, 0.0], [-1.0, 0.0]]), np.array([7, 7, 3])
    assert hc.estimate_zeta(g, labels) == pytest.approx(1.0)
    assert hc.estimate_zeta_c(g, labels) == pytest.approx(1.0)
    assert hc.estimate_zeta_c(np.array([[0.0, 0.0], [6.0, 8.0], [1.0, 1.0]]), [0, 0, 1]) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="one cluster label per device"):
        hc.estimate_zeta(g, [0, 1])


# ------------------------------------------------------------------------------ energy / delay model

def test_energy_delay_model_and_objective_by_hand():
    e_g, e_c = hc.energy_terms([[2, 3]], [1.0, 10.0], [100.0, 1000.0])
    assert e_g == pytest.approx([1100 + 2 + 30]) and e_c.tolist() == [[2.0, 30.0]]
    assert hc.energy_terms([2, 3], [1.0, 10.0], [100.0, 1000.0], final_window=False)[0] == pytest.approx(1100)
    assert hc.delay_terms([3, 2], [0.5, 0.1], [0.2, 0.05], [1.0, 2.0])[0] == pytest.approx(2.1)
    assert hc.delay_terms([3, 2], [0.5, 0.1], [0.2, 0.05], [1.0, 2.0], final_window=False)[0] == pytest.approx(2.0)
    p = hc.CtrlProblem(trusted=[True, False], sizes=[3, 5], e_dev_local=[1.0, 10.0], t_dev_local=[0.5, 0.1],
                       e_glob=[100.0, 1000.0], t_glob=[1.0, 2.0], K_l=2, T=50, t_k=10, tau_max=8, s_max=4,
                       alpha1=0.5, alpha2=3.0, alpha3=2.0, phi=10.0, **PRIV)
    # s_T = 4 is capped at the trusted cluster's 3 devices; rounds = 40/4 = 10.
    energy, delay, nu_ = hc.cost_terms(p, 4, 4, 2)
    assert energy == pytest.approx(10 * ((1100 + 3 + 20) + 2 * (3 + 20)))
    assert delay == pytest.approx(10 * (2.1 + 2 * 0.6))
    assert nu_ == pytest.approx(hc.nu(4, [3, 2], trusted=[True, False], K_l=2, **PRIV))
    assert hc.objective(p, 4, 4, 2) == pytest.approx(0.5 * energy + 3 * delay + 2 * nu_ / 10)
    assert list(p.levels(True)) == [1, 2, 3] and list(p.levels(False)) == [1, 2, 3, 4]
    assert p.participation(4, 2).tolist() == [3.0, 2.0]


def test_problem_rejects_bad_input():
    good = dict(trusted=[True, False], sizes=[3, 5], e_dev_local=[1.0, 1.0], t_dev_local=[1.0, 1.0],
                e_glob=[1.0, 1.0], t_glob=[1.0, 1.0], K_l=1, T=50, t_k=10, tau_max=8, s_max=4, **PRIV)
    for bad in (dict(sizes=[3]), dict(sizes=[0, 5]), dict(e_glob=[-1.0, 1.0]), dict(t_k=50), dict(tau_min=9),
                dict(alpha1=-1.0), dict(phi=0.0), dict(K_l=-1), dict(trusted=[1, 0])):
        with pytest.raises(ValueError):
            hc.CtrlProblem(**{**good, **bad})
    assert list(hc.CtrlProblem(**{**good, "t_k": 45}).tau_grid) == [1, 2, 3, 4, 5]


def test_remaining_rounds_caps_at_k_g():
    assert hc.remaining_rounds(100, 40, 10, 2, 50) == 6
    assert hc.remaining_rounds(100, 40, 10, 2, 5) == 3  # K_g binds
    assert hc.remaining_rounds(100, 95, 10, 2, 50) == 0 and hc.remaining_rounds(100, 40, 10, 5, 5) == 0
    for bad in ((100, 101, 10, 0, 5), (100, 40, 10, 6, 5), (100, 40, 0, 0, 5)):
        with pytest.raises(ValueError):
            hc.remaining_rounds(*bad)


# ---------------------------------------------------------------------------------------- solvers

@pytest.mark.parametrize("seed", range(20))
def test_nested_line_search_equals_exhaustive_search(seed):
    """Exact by separability at fixed tau (module docstring): no restriction on the inputs."""
    for extra in ({}, dict(trusted=np.zeros(3, bool), sizes=[4, 6, 9], e_dev_local=[1e-3] * 3,
                           t_dev_local=[0.1] * 3, e_glob=[1e-2] * 3, t_glob=[1e-2] * 3)):
        p = random_problem(seed, **extra)
        ex, ls = hc.exhaustive_search(p), hc.nested_line_search(p)
        assert plan(ex) == plan(ls) and ex.objective == ls.objective
        assert (ex.method, ls.method) == ("exhaustive", "nested_line_search")
        assert ex.evaluations == p.tau_grid.size * p.levels(True).size * p.levels(False).size
        J = hc.objective(p, *np.meshgrid(p.tau_grid, p.levels(True), p.levels(False), indexing="ij"))
        assert ex.objective == J.min()
        assert ex.s_trusted == 0 if extra else ex.s_trusted >= 0  # no trusted cluster: level 0


def test_line_search_is_cheaper_on_the_paper_grid():
    p = random_problem(3, tau_max=40, s_max=15, sizes=np.full(5, 15), trusted=np.arange(5) < 2,
                       e_dev_local=np.full(5, 4e-3), t_dev_local=np.full(5, 0.02), e_glob=np.full(5, 0.016),
                       t_glob=np.full(5, 0.003), t_k=0)
    ex, ls = hc.exhaustive_search(p), hc.nested_line_search(p)
    assert plan(ex) == plan(ls) and ex.evaluations == 40 * 15 * 15 and ls.evaluations < ex.evaluations / 3


def test_feasibility_callback():
    p = random_problem(1)
    free = hc.exhaustive_search(p)
    calls = []
    hc.exhaustive_search(p, lambda *pt: calls.append(pt) or True)
    assert calls == [plan(free)]  # lazy: best point first
    J = hc.objective(p, *np.meshgrid(p.tau_grid, p.levels(True), p.levels(False), indexing="ij"))
    for feasible in (lambda t, a, b: (t, a, b) != plan(free),  # only the optimum excluded
                     lambda t, a, b: t * (a + b) <= plan(free)[0] * (plan(free)[1] + plan(free)[2]) - 1,
                     lambda t, a, b: t == 1 and b == 1):
        ex, ls = hc.exhaustive_search(p, feasible), hc.nested_line_search(p, feasible)
        assert feasible(*plan(ex)) and feasible(*plan(ls)) and plan(ex) != plan(free)
        ok = np.vectorize(feasible)(*np.meshgrid(p.tau_grid, p.levels(True), p.levels(False), indexing="ij"))
        assert ex.objective == J[ok].min() and ls.objective >= ex.objective
    for solver in (hc.exhaustive_search, hc.nested_line_search):
        with pytest.raises(ValueError, match="no feasible plan"):
            solver(p, lambda *pt: False)


def test_fallback_when_no_line_meets_a_feasible_point():
    p = random_problem(2)
    kw = {f: getattr(p, f) for f in p.__dataclass_fields__}
    tau = int(p.tau_grid[-1])
    at_tau = hc.exhaustive_search(hc.CtrlProblem(**{**kw, "tau_min": tau}))  # per-tau optimum at the last tau
    target = (tau, int(p.levels(True)[0]), int(p.levels(False)[0]))
    assert target[1] != at_tau.s_trusted and target[2] != at_tau.s_untrusted  # off both lines through it
    ls = hc.nested_line_search(p, lambda *pt: pt == target)
    assert plan(ls) == target and ls.method == "nested_line_search+exhaustive"


def test_ties_smallest_tau_then_largest_s():
    p = random_problem(4, alpha1=0.0, alpha3=0.0)  # J = alpha2 (T - t_k)/tau delay: every s ties, largest tau wins
    top = (int(p.tau_grid[-1]), int(p.levels(True)[-1]), int(p.levels(False)[-1]))
    assert plan(hc.exhaustive_search(p)) == plan(hc.nested_line_search(p)) == top
    p = random_problem(4, alpha1=0.0, alpha2=0.0)  # J = nu, increasing in tau, falling in s
    assert plan(hc.exhaustive_search(p)) == plan(hc.nested_line_search(p)) == (1,) + top[1:]


# ------------------------------------------------------------------------------ monotonicity (9.5)

ALPHAS = np.geomspace(1e-3, 1e3, 25)


def sweep(p: hc.CtrlProblem, which: str, **fixed):
    kw = {f: getattr(p, f) for f in p.__dataclass_fields__}
    return [hc.exhaustive_search(hc.CtrlProblem(**{**kw, **fixed, which: a})) for a in ALPHAS]


@pytest.mark.parametrize("seed", range(20))
def test_raising_a_weight_never_raises_its_own_cost_term(seed):
    """Revealed preference (a theorem for any exact argmin): a1 up -> chosen energy never up; a2 -> delay; a3 -> nu."""
    p = random_problem(seed)
    for index, which in enumerate(("alpha1", "alpha2", "alpha3")):
        costs = [float(hc.cost_terms(p, *plan(c))[index]) for c in sweep(p, which)]
        assert all(b <= a * (1 + 1e-12) for a, b in zip(costs, costs[1:])), which


@pytest.mark.parametrize("seed", range(20))
def test_paper_directions_that_hold(seed):
    """Digest 9.5 where it is a property of the integer program: at fixed tau, a1 up never raises s_T or s_U, a3
    up never lowers them, a2 leaves them alone (single crossing of separable f_T, f_U); a2 up never lowers tau
    (J submodular in (tau, s), a2 weighs only 1/tau). tau moving with a1 up / a3 down is checked on these
    emulator-scale inputs only: it is not a theorem (see the counterexample test)."""
    p = random_problem(seed)
    for tau in (1, 3, 8):
        fixed = dict(tau_min=tau, tau_max=tau, t_k=0)
        for which, sign in (("alpha1", -1), ("alpha3", 1), ("alpha2", 0)):
            s = np.array([(c.s_trusted, c.s_untrusted) for c in sweep(p, which, **fixed)])
            d = np.diff(s, axis=0)
            assert np.all(d == 0) if sign == 0 else np.all(sign * d >= 0), (which, tau)
    for which, sign in (("alpha2", 1), ("alpha1", 1), ("alpha3", -1)):
        taus = np.array([c.tau for c in sweep(p, which)])
        assert np.all(sign * np.diff(taus) >= 0), which
    low, high = sweep(p, "alpha1")[0], sweep(p, "alpha1")[-1]
    assert high.tau >= low.tau and high.s_untrusted <= low.s_untrusted and high.s_trusted <= low.s_trusted


def test_paper_joint_claim_is_not_pointwise():
    """One untrusted cluster, nu = tau/s, energy 10 s/tau, no delay: J = 10 a1 s/tau + tau/s depends on tau/s
    only; raising a1 from 1/90 to 0.016 moves the optimum from (1, 3) (ratio 1/3, ties (2, 6)) to (2, 5): the
    longer interval comes with MORE participants. The paper's Fig. 8 direction is a training average."""
    kw = dict(trusted=[False], sizes=[6], e_dev_local=[1.0], t_dev_local=[0.0], e_glob=[0.0], t_glob=[0.0], K_l=0,
              M=1, q=1.0, G=1.0, delta=math.exp(-1), epsilon=2.0, T=10, t_k=0, tau_max=8, s_max=6, alpha3=1.0)
    assert hc.nu(3, [2], trusted=[False], K_l=0, M=1, q=1.0, G=1.0, delta=math.exp(-1), epsilon=2.0) == 1.5
    low = hc.exhaustive_search(hc.CtrlProblem(alpha1=1 / 90, **kw))
    high = hc.exhaustive_search(hc.CtrlProblem(alpha1=0.016, **kw))
    assert plan(hc.nested_line_search(hc.CtrlProblem(alpha1=1 / 90, **kw))) == plan(low)  # same tie-break
    assert (low.tau, low.s_untrusted) == (1, 3) and (high.tau, high.s_untrusted) == (2, 5)
    assert low.s_trusted == high.s_trusted == 0


# Spec h2fdp-ctrl-alpha-fmnist at round 1: 10 clusters of 5 (5 trusted), F-MNIST linear model (M = 7,850,
# q = 32 / 1,200), K_l = 3 (tau multiples of 4), c2 = 0.1, tau_max 40, T = 4000 (200 rounds x 20), phi = 0.01;
# energy / delay per cluster as the emulated clock measured round 0 (tau 20): 16.8 mJ and 0.162 s per participant
# window, 0.332 J and 2.6 ms per edge's global part.
SPEC = dict(trusted=np.arange(10) < 5, sizes=np.full(10, 5), e_dev_local=np.full(10, 0.0168),
            t_dev_local=np.full(10, 0.162), e_glob=np.full(10, 0.332), t_glob=np.full(10, 0.0026), K_l=3, M=7850,
            q=32 / 1200, G=1.0, delta=1e-5, epsilon=1.0, T=4000, t_k=20, tau_max=40, s_max=5, c2=0.1, tau_min=4,
            phi=0.01)


def spec_plan(**alphas):
    p = hc.CtrlProblem(**{**SPEC, **alphas})
    window = lambda tau, *_: tau % 4 == 0  # the controller's K_l-fixed feasibility (cloud_server/controller.py)
    ls, ex = hc.nested_line_search(p, window), hc.exhaustive_search(p, window)
    assert plan(ls) == plan(ex)
    return plan(ls)


def test_alpha_directions_at_the_spec_inputs():
    """Digest 9.5 (a1 or a2 up: tau_k up, s_c^k down; a3 up: the opposite) on the spec's inputs. The plans are
    (tau, s_T, s_U). What holds: every tau direction; s down with a1 and up with a3, but only once tau sits at
    tau_max (while tau is free the optimum uses every device: tau and s are complements). What does not: a2
    never lowers s (delay is free of s here: the participants upload in parallel and D_c,Loc is the slowest
    one's measured window), and a3 from 1 up cannot raise s, already at s_max = 5."""
    base = spec_plan()
    assert base == (24, 5, 5)
    assert spec_plan(alpha1=10.0) == (40, 4, 5)            # tau up, s down: the paper's direction
    assert spec_plan(alpha2=10.0) == (40, 5, 5)            # tau up, s unchanged
    assert spec_plan(alpha3=10.0) == (8, 5, 5)             # tau down, s unchanged (at s_max)
    assert spec_plan(alpha3=0.1) == (40, 4, 5)             # so a3 0.1 -> 1: tau down, s up
    a1 = [spec_plan(alpha1=a) for a in ALPHAS]
    a2 = [spec_plan(alpha2=a) for a in ALPHAS]
    a3 = [spec_plan(alpha3=a) for a in ALPHAS]
    for seq, tau_sign, s_sign in ((a1, 1, -1), (a2, 1, 1), (a3, -1, 1)):
        t, s = np.array([x[0] for x in seq]), np.array([x[1] + x[2] for x in seq])
        assert np.all(tau_sign * np.diff(t) >= 0) and np.all(s_sign * np.diff(s) >= 0)
    assert len({x[1:] for x in a2}) == 1                  # a2 over 1e-3..1e3: s never moves
    assert a1[-1] == (40, 1, 1) and a3[0] == (40, 1, 1)   # s does move, at the tau cap


def test_phi_is_a_sweep_of_alpha3_inverted():
    """phi enters the objective only as alpha_3 / phi (digest 000 Sec. 5, step 2), so the paper's phi sweep is the
    alpha_3 sweep read backwards: phi x10 plans what alpha_3 / 10 plans, at the spec's inputs and over the grid."""
    assert spec_plan(phi=0.1) == spec_plan(alpha3=0.1) == (40, 4, 5)
    assert spec_plan(phi=0.001) == spec_plan(alpha3=10.0) == (8, 5, 5)
    for a in ALPHAS[::4]:
        assert spec_plan(phi=0.01 / a) == spec_plan(alpha3=a)


# ------------------------------------------------------------------------------ sequential delay (digest 000 Sec. 5)

def test_delay_readings_by_hand():
    """parallel: D_c,Loc = t_dev_local (free of s); sequential (digest 000 Sec. 5, the selected devices transmit
    in turn): D_c,Loc = t_dev_local + (s_c - 1) t_up; D_Glob = max_c (t_glob + D_c,Loc) either way."""
    s = [[3, 2], [1, 5]]
    d_g, d_c = hc.delay_terms(s, [0.5, 0.1], [0.2, 0.05], [1.0, 2.0], reading="sequential")
    np.testing.assert_allclose(d_c, [[0.5 + 2 * 0.2, 0.1 + 0.05], [0.5, 0.1 + 4 * 0.05]])
    np.testing.assert_allclose(d_g, [max(1.9, 2.15), max(1.5, 2.3)])
    d_g, d_c = hc.delay_terms(s, [0.5, 0.1], [0.2, 0.05], [1.0, 2.0])
    assert d_c.tolist() == [[0.5, 0.1], [0.5, 0.1]]
    np.testing.assert_allclose(d_g, [2.1, 2.1])
    ones = hc.delay_terms([1, 1], [0.5, 0.1], [0.2, 0.05], [1.0, 2.0], reading="sequential")
    assert float(ones[0]) == pytest.approx(2.1) and ones[1].tolist() == [0.5, 0.1]  # one device: readings agree
    with pytest.raises(ValueError, match="unknown delay reading"):
        hc.delay_terms([1, 1], [0.5, 0.1], [0.2, 0.05], [1.0, 2.0], reading="serial")
    p = hc.CtrlProblem(trusted=[True, False], sizes=[3, 5], e_dev_local=[1.0, 10.0], t_dev_local=[0.5, 0.1],
                       t_up=[0.2, 0.05], e_glob=[100.0, 1000.0], t_glob=[1.0, 2.0], K_l=2, T=50, t_k=10, tau_max=8,
                       s_max=4, delay_reading="sequential", **PRIV)
    # s = (3, 2) (s_T = 4 capped at 3): D_c,Loc = (0.9, 0.15), D_Glob = max(1.9, 2.15); rounds = 40/4 = 10.
    assert hc.cost_terms(p, 4, 4, 2)[1] == pytest.approx(10 * (2.15 + 2 * (0.9 + 0.15)))


# Two clusters of 2 (one trusted), no energy, K_l = 0, tau = 1, nu = c2^2/s_T^2 + v2^2/s_U (coefficient 1), D_Glob =
# max(s_T, s_U) under the sequential reading: J(1,1) = 4, J(2,2) = 4.75, J(1,2) = 5.5, J(2,1) = 5.25 at alpha_2 = 2.
TOY = dict(trusted=[True, False], sizes=[2, 2], e_dev_local=[0.0, 0.0], t_dev_local=[1.0, 1.0], t_up=[1.0, 1.0],
           e_glob=[0.0, 0.0], t_glob=[0.0, 0.0], K_l=0, M=1, q=1.0, G=1.0, delta=math.exp(-1), epsilon=1.0, T=1,
           t_k=0, tau_max=1, s_max=2, alpha2=2.0, c2=1.0, v2=1.0)


def test_sequential_delay_defeats_coordinate_descent():
    """The max over clusters in D_Glob couples s_T and s_U: from the top (2, 2) no single coordinate move helps,
    yet (1, 1) is better. So under the sequential reading the nested line search defers to the exhaustive one."""
    p = hc.CtrlProblem(delay_reading="sequential", **TOY)
    J = {(a, b): float(hc.objective(p, 1, a, b)) for a in (1, 2) for b in (1, 2)}
    assert J == pytest.approx({(1, 1): 4.0, (2, 2): 4.75, (1, 2): 5.5, (2, 1): 5.25})
    assert hc._descend(p, 1, (2, 2), lambda *_: True, [0]) == ((2, 2), pytest.approx(4.75))  # stuck
    ls, ex = hc.nested_line_search(p), hc.exhaustive_search(p)
    assert plan(ls) == plan(ex) == (1, 1, 1) and ls.objective == pytest.approx(4.0)
    assert ls.method == "exhaustive (delay couples s_T, s_U)"
    par = hc.CtrlProblem(**TOY)  # parallel: delay 1 whatever s, the line search is exact and takes every device
    assert plan(hc.nested_line_search(par)) == plan(hc.exhaustive_search(par)) == (1, 2, 2)


@pytest.mark.parametrize("seed", range(6))
def test_searches_agree_under_sequential_reading(seed):
    """On random problems with random upload times, with and without a feasibility callback."""
    base = random_problem(seed)
    rng = np.random.default_rng(100 + seed)
    p = replace(base, t_up=rng.uniform(0, 1, base.trusted.size) * base.t_dev_local, delay_reading="sequential")
    assert plan(hc.nested_line_search(p)) == plan(hc.exhaustive_search(p))
    odd = lambda tau, s_t, s_u: (tau + s_t + s_u) % 3 != 0
    assert plan(hc.nested_line_search(p, odd)) == plan(hc.exhaustive_search(p, odd))


def spec_plan_sequential(t_up=0.0192, **alphas):
    """spec_plan under the sequential reading; t_up: one device's upload air time (the clusters' mean measured in
    round 0 of h2fdp-ctrl-alpha-seq-fmnist, base-seq seed 0; 0.018-0.021 s over its rounds and seeds)."""
    p = hc.CtrlProblem(**{**SPEC, "t_up": np.full(10, t_up), "delay_reading": "sequential", **alphas})
    window = lambda tau, *_: tau % 4 == 0
    ls, ex = hc.nested_line_search(p, window), hc.exhaustive_search(p, window)
    assert plan(ls) == plan(ex)
    return plan(ls)


def test_alpha_directions_sequential_at_the_spec_inputs():
    """Under the paper's sequential reading the delay grows with s_c^k and alpha_2 acts like alpha_1 on s: over
    1e-3..1e3 tau rises to tau_max and s falls to 1, as with alpha_1; alpha_3 keeps its directions. alpha_2 x10
    sits at the edge of the first step: s_T falls to 4 from alpha_2 = 12 at t_up = 0.0192 s, from x10 at 0.020."""
    assert spec_plan_sequential() == (24, 5, 5)
    assert spec_plan_sequential(alpha1=10.0) == (40, 4, 5)
    assert spec_plan_sequential(alpha2=10.0) == (40, 5, 5) and spec_plan_sequential(alpha2=12.0) == (40, 4, 5)
    assert spec_plan_sequential(0.020, alpha2=10.0) == (40, 4, 5)
    assert spec_plan_sequential(alpha2=100.0) == (40, 2, 2)
    for which, tau_sign, s_sign in (("alpha1", 1, -1), ("alpha2", 1, -1), ("alpha3", -1, 1)):
        seq = [spec_plan_sequential(**{which: a}) for a in ALPHAS]
        t, s = np.array([x[0] for x in seq]), np.array([x[1] + x[2] for x in seq])
        assert np.all(tau_sign * np.diff(t) >= 0) and np.all(s_sign * np.diff(s) >= 0), which
        assert s.min() == 2 and s.max() == 10, which  # s spans 1..5 per group: alpha_2 now moves it
