"""(tau, gamma) optimiser of paper 001 Sec. IV and the paper-001 formulas in theory.py (digest 001, 9.5-9.6)."""
import math

import numpy as np
import pytest

from hfl.common.quantization import latency_opt as lo
from hfl.common.quantization import theory

# Digest 001 section 5 worked example: t_CP ~ 0.049 s, t_DE ~ 3.34 s, t_EC = 10 t_DE, T_di = 156 s, C = 3, N = 60.
PAPER = dict(deadline=156.0, t_cp=0.049, t_de=3.34, t_ec=33.4)


def test_link_times_table_iii():
    # Table III: h p / N0 = 50, log2(51) = 5.672 b/s/Hz; d_b = 32 * 591,274 (same padding), D = 100*3072*8 bits.
    t_cp, t_de, t_ec = lo.link_times(cycles_per_bit=20, data_bits=100 * 3072 * 8, cpu_hz=1e9, model_bits=32 * 591_274,
                                     bandwidth_hz=1e6, gain=1e-8, power_w=0.5, noise_w=1e-10)
    assert t_cp == pytest.approx(0.0491520)
    assert t_de == pytest.approx(32 * 591_274 / (1e6 * math.log2(51)))
    assert t_de == pytest.approx(3.34, abs=0.01) and t_ec == pytest.approx(10 * t_de)


def test_round_latency_models():
    assert lo.round_latency(12, 3, 1.0, 2.0, 20.0) == pytest.approx(15 + 24 + 20)
    assert lo.round_latency(12, 3, 1.0, 2.0, 20.0, uploads="exact") == pytest.approx(15 + 26 + 20)
    assert lo.hier_local_qsgd_latency(12, 3, 1.0, 2.0, 20.0) == pytest.approx(36 + 24 + 20)


def test_phi_equals_j_on_the_deadline():
    # An algebraic identity: only float round-off separates the two sides.
    for q1 in (0.0, 11.9, 149.3):
        s = lo.scaled_inputs(**PAPER, num_edges=3, num_devices=60, q1=q1)
        tau = np.linspace(1, 36, 50)
        gamma = s.a - (1 + s.r) * tau - s.eps_c
        np.testing.assert_allclose(lo.phi(tau, gamma, s.k), lo.j_of_tau(tau, s.k, s.a, s.r, s.eps_c), rtol=1e-10)


@pytest.mark.parametrize("params", [(156.0, 0.049, 3.34, 33.4, 11.9), (60.0, 1.0, 0.1, 1.0, 40.0),
                                    (100.0, 1.0, 0.5, 2.0, 30.0), (200.0, 1.0, 1.0, 5.0, 100.0)])
def test_stationary_coefficients_are_the_derivative(params):
    deadline, t_cp, t_de, t_ec, q1 = params
    s = lo.scaled_inputs(deadline, t_cp, t_de, t_ec, 3, 60, q1)
    a0, b0, c0 = lo.stationary_coefficients(s.k, s.a, s.r, s.eps_c)
    tau = np.linspace(1, 0.9 * (s.a - s.eps_c) / (1 + s.r), 9)
    h = 1e-4
    j = lambda t: lo.j_of_tau(t, s.k, s.a, s.r, s.eps_c)  # noqa: E731
    derivative = (j(tau + h) - j(tau - h)) / (2 * h)  # central difference: O(h^2) ~ 1e-8 relative error
    scaled = derivative * (s.a - s.r * tau - s.eps_c) ** 2
    np.testing.assert_allclose(scaled, a0 * tau ** 2 + b0 * tau + c0, rtol=1e-5, atol=1e-6 * abs(c0))


def _exhaustive(deadline, t_cp, t_de, t_ec, k):
    best = None
    for tau in range(1, 10_000):
        gamma = 0
        while lo.round_latency(tau, gamma + 1, t_cp, t_de, t_ec) <= deadline + 1e-9:
            gamma += 1
        if gamma < 1:
            break
        cost = float(lo.phi(tau, gamma, k))
        if best is None or cost <= best[2]:
            best = (tau, gamma, cost)
    return best


@pytest.mark.parametrize("params", [(60.0, 1.0, 0.1, 1.0, 40.0), (100.0, 1.0, 0.5, 2.0, 30.0),
                                    (200.0, 1.0, 1.0, 5.0, 100.0), (40.0, 1.0, 0.2, 1.0, 3.0)])
def test_brute_force_matches_exhaustive_and_closed_form(params):
    deadline, t_cp, t_de, t_ec, q1 = params
    choice = lo.choose_tau_gamma(deadline, t_cp, t_de, t_ec, num_edges=3, num_devices=60, q1=q1)
    k = lo.split_constant(3, 60, q1)
    tau, gamma, cost = _exhaustive(deadline, t_cp, t_de, t_ec, k)
    assert (choice.tau, choice.gamma) == (tau, gamma) and choice.phi == pytest.approx(cost)
    assert choice.latency <= deadline and choice.curve_tau.size == choice.curve_phi.size
    closed = lo.closed_form_tau_gamma(deadline, t_cp, t_de, t_ec, num_edges=3, num_devices=60, q1=q1)
    if closed.feasible:
        # Same tau; gamma differs only by the floor to whole steps.
        assert closed.tau == pytest.approx(choice.tau)
        assert 0 <= closed.gamma - choice.gamma < 1


def test_feasible_stationary_points_are_maxima():
    # Finding (not in the paper): wherever J has a feasible stationary point it is a local MAXIMUM, so the paper's
    # candidate set {1, roots} can only return tau = 1 or an infeasible root; the minimum sits at tau = 1 or at the
    # largest feasible tau, which the integer search covers. Seeded random instances; the second difference
    # with h = 1e-3 is accurate to ~1e-6 relative, far below the curvatures seen.
    rng = np.random.default_rng(0)
    seen = 0
    for _ in range(3000):
        t_de, t_ec, deadline = rng.uniform(0, 5), rng.uniform(0, 20), rng.uniform(10, 500)
        edges = int(rng.integers(1, 6))
        s = lo.scaled_inputs(deadline, 1.0, t_de, t_ec, edges, edges * int(rng.integers(1, 30)), rng.uniform(0, 200))
        a0, b0, c0 = lo.stationary_coefficients(s.k, s.a, s.r, s.eps_c)
        disc = b0 * b0 - 4 * a0 * c0
        if a0 == 0 or disc < 0:
            continue
        for x in ((-b0 - math.sqrt(disc)) / (2 * a0), (-b0 + math.sqrt(disc)) / (2 * a0)):
            if x >= 1 and s.a - (1 + s.r) * x - s.eps_c >= 1:
                j = lambda t: lo.j_of_tau(t, s.k, s.a, s.r, s.eps_c)  # noqa: E731
                assert j(x + 1e-3) - 2 * j(x) + j(x - 1e-3) < 0
                seen += 1
    assert seen > 100


def test_paper_worked_example():
    # Digest 001 section 5: comms-dominated, the optimum is the largest feasible tau (36); for q1 = 11.9 the
    # quadratic's roots are about 36.4 and 37.1 (just past the boundary), for q1 = 149.3 there are none.
    for q1 in (11.9, 149.3):
        choice = lo.choose_tau_gamma(**PAPER, num_edges=3, num_devices=60, q1=q1)
        assert choice.tau == 36 == choice.curve_tau.max()
    closed = lo.closed_form_tau_gamma(**PAPER, num_edges=3, num_devices=60, q1=11.9)
    assert closed.roots == pytest.approx((36.4, 37.1), abs=0.1) and not closed.feasible
    assert lo.closed_form_tau_gamma(**PAPER, num_edges=3, num_devices=60, q1=149.3).roots == ()


def test_random_feasible_pair_is_feasible_and_seeded():
    pairs = {lo.random_feasible_pair(**PAPER, rng=np.random.default_rng(seed)) for seed in range(30)}
    assert len(pairs) > 5
    for tau, gamma in pairs:
        assert gamma >= 1 and lo.round_latency(tau, gamma, 0.049, 3.34, 33.4) <= 156.0
    assert lo.random_feasible_pair(**PAPER, rng=np.random.default_rng(7)) == \
        lo.random_feasible_pair(**PAPER, rng=np.random.default_rng(7))


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match="deadline"):
        lo.choose_tau_gamma(30.0, 0.049, 3.34, 33.4, num_edges=3, num_devices=60, q1=1.0)
    with pytest.raises(ValueError, match="uploads"):
        lo.choose_tau_gamma(**PAPER, num_edges=3, num_devices=60, q1=1.0, uploads="some")
    with pytest.raises(ValueError, match="t_cp"):
        lo.choose_tau_gamma(156.0, 0.0, 3.34, 33.4, num_edges=3, num_devices=60, q1=1.0)
    with pytest.raises(ValueError, match="q1"):
        lo.choose_tau_gamma(**PAPER, num_edges=3, num_devices=60, q1=-1.0)
    with pytest.raises(ValueError, match="num_devices"):
        lo.choose_tau_gamma(**PAPER, num_edges=3, num_devices=2, q1=1.0)


def test_exact_uploads_leave_less_time():
    paper = lo.choose_tau_gamma(**PAPER, num_edges=3, num_devices=60, q1=11.9)
    exact = lo.choose_tau_gamma(**PAPER, num_edges=3, num_devices=60, q1=11.9, uploads="exact")
    assert exact.curve_tau.max() <= paper.curve_tau.max() and exact.uploads == "exact"
    assert exact.latency == pytest.approx(float(lo.round_latency(exact.tau, exact.gamma, 0.049, 3.34, 33.4, "exact")))


# ---- theory.py, paper 001 ----

def test_formula_sanity_values():
    # Digest 001 9.6: at tau = 12, gamma = 3 the factors are 21 and 492, and Delta > 0.
    f = theory.gap_difference_factors(12, 3)
    assert f["q2_het"] == 21 and f["q1"] == 492
    kw = dict(lr=0.01, smooth=1.0, sigma2_over_b=1.0, num_devices=60, num_edges=3, q1=11.9, q2=1.0, het=1.0)
    parts = theory.gap_difference(12, 3, **kw)
    assert parts["total"] > 0
    # The four terms add up to e-bar - e exactly (algebra, float round-off only).
    diff = theory.hier_local_qsgd_error_floor(12, 3, **kw) - theory.qhetfed_error_floor(12, 3, **kw)
    assert parts["total"] == pytest.approx(float(diff), rel=1e-12)
    # Digest 001 section 10: Delta > 0 fails for gamma = 1.
    assert theory.gap_difference_factors(12, 1)["q2_het"] < 0


@pytest.mark.parametrize("q1,larger_tau_better", [(11.9, True), (149.3, False)])
def test_corollary_1_split_rule(q1, larger_tau_better):
    assert theory.split_threshold(60, 3) == 19
    kw = dict(lr=0.01, smooth=1.0, sigma2_over_b=1.0, num_devices=60, num_edges=3, q1=q1, q2=1.0, het=0.5)
    e15, e10 = theory.qhetfed_error_floor(15, 5, **kw), theory.qhetfed_error_floor(10, 10, **kw)
    assert (e15 < e10) == larger_tau_better


def test_qsgd_bound_and_exact_error():
    assert theory.qsgd_variance_bound(100, 3) == pytest.approx(min(100 / 9, 10 / 3))
    x = np.random.default_rng(1).normal(size=500)
    exact = theory.qsgd_relative_error(x, 4)
    assert 0 < exact <= theory.qsgd_variance_bound(500, 4)
    # Against a seeded Monte Carlo of the QSGD definition: 4000 draws, the relative error of the mean of a
    # bounded per-draw statistic is ~ a few / sqrt(4000) ~ 3%; allow 5%.
    rng = np.random.default_rng(2)
    norm, s = np.linalg.norm(x), 4
    a = np.abs(x) / norm * s
    low = np.floor(a)
    draws = low + (rng.random((4000, x.size)) < a - low)
    err = ((np.sign(x) * norm * draws / s - x) ** 2).sum(axis=1).mean() / norm ** 2
    assert err == pytest.approx(exact, rel=0.05)
    try:
        from hfl.common.quantization.qsgd import qsgd_expected_relative_error
    except ImportError:
        return
    # The codec rounds its norm to float32 (relative 6e-8), hence 1e-6 rather than float64 round-off.
    assert qsgd_expected_relative_error(x, 4) == pytest.approx(exact, rel=1e-6)


def test_format_choice_lists_the_choice_and_curve():
    choice = lo.choose_tau_gamma(**PAPER, num_edges=3, num_devices=60, q1=11.9)
    text = lo.format_choice(choice, lo.closed_form_tau_gamma(**PAPER, num_edges=3, num_devices=60, q1=11.9), limit=5)
    assert text.startswith("chosen tau=36 gamma=") and "feasible=False" in text
    assert len(text.splitlines()) == 3 + 5
    assert choice.as_dict()["curve"][-1]["tau"] == 36
