"""Quantizer maths against papers 001 (QSGD) and 004 (SQ, DP-SQ, LaplaceSQ): formulas and seeded Monte Carlo."""
import numpy as np
import pytest
from scipy.special import expit

from hfl.common.quantization.dpsq import (dpsq, dpsq_expected_distortion, dpsq_quantize,
                                          dpsq_uniform_cell_distortion, nearest_probability)
from hfl.common.quantization.laplace_sq import laplace_sq, laplace_sq_expected_distortion
from hfl.common.quantization.qsgd import (qsgd, qsgd_expected_relative_error, qsgd_quantize, relative_error)
from hfl.common.quantization.sq import cell_position, sq, step


def _draws(x, n, levels, rng):
    """n independent QSGD draws of x in one call: n copies in buckets of len(x) share x's norm."""
    out = qsgd(np.tile(x, n), rng, levels, bucket_size=x.size)
    return out.reshape(n, x.size).astype(np.float64)


def test_qsgd_is_unbiased():
    x = np.random.default_rng(0).normal(size=40)
    s, n = 2, 20000
    draws = _draws(x, n, s, np.random.default_rng(1))
    norm = np.linalg.norm(x)
    a = np.abs(x) / norm * s
    p = a - np.floor(a)
    se = norm / s * np.sqrt(p * (1 - p) / n) + 1e-12
    # 5 standard errors per coordinate: P(any of 40 exceeds) ~ 40 * 6e-7, so a pass is not luck
    # and a real bias of one level step times p(1-p) (order 0.1 * norm / s) would be ~100 SE.
    assert np.all(np.abs(draws.mean(axis=0) - x) <= 5 * se + 1e-6 * norm)
    floor_rounded = np.sign(x) * norm * np.floor(a) / s  # control: a biased rounding must fail the same check
    assert np.any(np.abs(floor_rounded - x) > 5 * se + 1e-6 * norm)


def test_qsgd_measured_q_matches_formula():
    x = np.random.default_rng(2).standard_t(3, size=500)
    for s in (1, 3, 7):
        norm = np.linalg.norm(x)
        a = np.abs(x) / norm * s
        p = a - np.floor(a)
        formula = np.sum(p * (1 - p)) / s ** 2  # digest 001, 9.6
        assert qsgd_expected_relative_error(x, s) == pytest.approx(formula, rel=1e-5)  # float32 norm rounding
        draws = _draws(x, 4000, s, np.random.default_rng(s))
        measured = np.mean([relative_error(x, d) for d in draws])
        # mean of 4000 draws of a sum of 500 bounded Bernoulli terms: relative SE well under 0.5%
        assert measured == pytest.approx(formula, rel=0.02)


def test_qsgd_outputs_lie_on_the_levels_and_bucketing_uses_bucket_norms():
    rng = np.random.default_rng(3)
    x = rng.normal(size=101)
    out = qsgd(x, rng, 4).astype(np.float64)
    k = np.abs(out) / np.linalg.norm(x) * 4
    assert np.allclose(k, np.round(k), atol=1e-4) and k.max() <= 4 + 1e-6
    assert np.all((np.sign(out) == np.sign(x)) | (out == 0))
    norms, codes = qsgd_quantize(x, 4, rng, bucket_size=10)
    assert norms.size == 11 and np.allclose(norms[-1], np.abs(x[100]), rtol=1e-6)
    assert np.array_equal(qsgd(np.zeros(5), rng, 3), np.zeros(5))
    with pytest.raises(ValueError, match="levels"):
        qsgd(x, rng, 0)
    with pytest.raises(ValueError, match="bucket_size"):
        qsgd(x, rng, 2, bucket_size=-1)


def test_sq_is_unbiased_with_variance_t_one_minus_t():
    x = np.linspace(-1, 1, 7)
    n = 20000
    rng = np.random.default_rng(4)
    draws = np.stack([sq(x, rng, 2).astype(np.float64) for _ in range(n)])
    delta = step(-1, 1, 4)
    _, t = cell_position(x, -1.0, 1.0, 4)
    var = t * (1 - t) * delta ** 2
    # 5 SE per coordinate, as for QSGD
    assert np.all(np.abs(draws.mean(axis=0) - x) <= 5 * np.sqrt(var / n) + 1e-6)
    assert np.allclose(draws.var(axis=0), var, atol=0.05 * delta ** 2)


@pytest.mark.parametrize("eps1", [0.0, 0.5, 1.5])
def test_dpsq_picks_the_nearest_level_with_probability_e_eps_over_1_plus_e_eps(eps1):
    n = 200_000
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, size=n)
    x[:2] = (-1.0, 1.0)
    lo, hi, idx = dpsq_quantize(x, rng, 3, eps1)
    lower, frac = cell_position(x, lo, hi, 8)
    nearest = lower + (frac > 0.5)
    freq = float(np.mean(idx == nearest))
    p = expit(eps1)
    assert p == pytest.approx({0.0: 0.5, 0.5: 0.6225, 1.5: 0.8176}[eps1], abs=1e-4)
    assert freq == pytest.approx(p, abs=5 * np.sqrt(p * (1 - p) / n))  # 5 binomial SE (~0.0055 at 0.5)
    assert np.all((idx == lower) | (idx == lower + 1))


def test_dpsq_ties_go_to_the_lower_level_and_edges_follow_p10():
    rng = np.random.default_rng(6)
    mid = np.zeros(100_000)  # midpoint of the one cell [-1, 1] at 1 bit: the lower level counts as nearest
    lo, hi, idx = dpsq_quantize(np.r_[-1.0, mid, 1.0], rng, 1, 20.0, range_mode="fixed", clip=1.0)
    assert float(np.mean(idx[1:-1] == 0)) > 0.999
    assert idx[-1] == 1  # a == hi sits in the top cell, nearest to the top level
    const = dpsq(np.full(9, 3.25), rng, 4, 0.0)
    assert np.all(const == np.float32(3.25))  # constant vector: the constant is sent


def test_dpsq_mean_distortion_matches_eq7_for_uniform_input():
    n = 1_000_000
    rng = np.random.default_rng(7)
    a = rng.uniform(-10, 10, size=n)
    delta = 20 / 63
    closed = dpsq_uniform_cell_distortion(delta, 0.1)
    assert closed == pytest.approx(0.0323, abs=1e-4)  # digest 004, 9.1
    eq7 = float(dpsq_expected_distortion(a, 6, 0.1, range_mode="fixed", clip=10).mean())
    mc = float(np.mean((dpsq(a, rng, 6, 0.1, range_mode="fixed", clip=10) - a) ** 2))
    # per-sample distortion <= Delta^2 ~ 0.1, so the SE of a 1e6 mean is <= 1e-4; allow 5 SE
    assert eq7 == pytest.approx(closed, abs=5e-4) and mc == pytest.approx(eq7, abs=5e-4)


@pytest.mark.parametrize("rho", ["range", "step"])
def test_dpsq_distortion_below_laplace_sq_and_bounded(rho):
    a = np.random.default_rng(8).uniform(-10, 10, size=50_000)
    for bits in (4, 5, 6):
        delta = 20 / (2 ** bits - 1)
        for eps1 in np.linspace(1.5, 0.1, 15):
            dp = dpsq_expected_distortion(a, bits, eps1, range_mode="fixed", clip=10).mean()
            lap = laplace_sq_expected_distortion(a, bits, eps1, rho=rho, range_mode="fixed", clip=10).mean()
            assert dp < lap and dp <= delta ** 2 / 3 * 1.02  # 2%: sample mean of the uniform-cell value
        tiny = dpsq_expected_distortion(a, bits, 1e-9, range_mode="fixed", clip=10).mean()
        assert tiny <= delta ** 2 / 3 * 1.02
    assert nearest_probability(np.inf) == 1.0


def test_laplace_sq_matches_its_distortion_formula():
    n = 1_000_000
    rng = np.random.default_rng(9)
    a = rng.uniform(-10, 10, size=n)
    out = laplace_sq(a, rng, 6, 1.0, rho="step", range_mode="fixed", clip=10)
    formula = laplace_sq_expected_distortion(a, 6, 1.0, rho="step", range_mode="fixed", clip=10).mean()
    # Laplace z^2 has std sqrt(20) b^2 against mean 2 b^2: relative SE of a 1e6 mean ~0.2%; allow 2%
    assert np.mean((out - a) ** 2) == pytest.approx(formula, rel=0.02)
    with pytest.raises(ValueError, match="rho"):
        laplace_sq(a[:3], rng, 6, 1.0, rho="huge")
    with pytest.raises(ValueError, match="eps_scope"):
        laplace_sq(a[:3], rng, 6, 1.0, eps_scope="global")
    with pytest.raises(ValueError, match="epsilon1"):
        laplace_sq(a[:3], rng, 6, 0.0)


def test_bad_parameters_name_the_parameter():
    rng = np.random.default_rng(0)
    x = np.ones(3)
    with pytest.raises(ValueError, match="bits"):
        dpsq(x, rng, 0, 1.0)
    with pytest.raises(ValueError, match="bits"):
        sq(x, rng, 17)
    with pytest.raises(ValueError, match="epsilon1"):
        dpsq(x, rng, 4, -1.0)
    with pytest.raises(ValueError, match="epsilon1"):
        dpsq(x, rng, 4, float("nan"))
    with pytest.raises(ValueError, match="range_mode"):
        sq(x, rng, 4, range_mode="absmax")
    with pytest.raises(ValueError, match="clip"):
        sq(x, rng, 4, range_mode="fixed")
    with pytest.raises(ValueError, match="finite"):
        sq(np.array([1.0, np.nan]), rng, 4)


def _dpsq_indices_step_by_step(x, lo, hi, levels, eps1, rng):
    """Eq. (6) as written, one array per step: the reference the in-place encode must equal bit for bit."""
    delta = (float(hi) - float(lo)) / (levels - 1)
    pos = (np.clip(x, lo, hi) - float(lo)) / delta
    lower = np.minimum(np.floor(pos), levels - 2).astype(np.int64)
    frac = np.clip(pos - lower, 0.0, 1.0)
    take_nearest = rng.random(x.size) < nearest_probability(eps1)
    return (lower + (take_nearest != (frac <= 0.5))).astype(np.uint32)


@pytest.mark.parametrize("source", ["seeded-keystream", "numpy"])
def test_dpsq_encode_equals_the_step_by_step_formula_bit_for_bit(source):
    """The encode's in-place arithmetic, block by block (20,001 values: three blocks), and its coins from one
    comparison of the keystream words (CipherGenerator.below) give the indices of eq. (6) computed step by step, for
    every width, eps1 = 0 and inf included, ties, the range's ends, a constant vector and float32 input (a model's
    update, widened a block at a time)."""
    from hfl.common.quantization.dpsq import dpsq_indices
    from hfl.common.quantization.sq import vector_range
    from hfl.common.secret_random import dp_numpy_rng

    def rng(k):
        return (dp_numpy_rng("seeded", 7, "device", k, 3, 0, "encode") if source == "seeded-keystream"
                else np.random.default_rng(k))

    base = np.random.default_rng(1).normal(size=20_001)
    for k, (bits, eps1) in enumerate([(1, 0.0), (2, 1e-6), (3, 0.7), (4, 3.0), (8, 40.0), (2, np.inf)]):
        for x in (base, np.r_[base[:50], 0.0, -2.0, 2.0], np.full(7, 0.25), base.astype(np.float32)):
            lo, hi = vector_range(x)
            levels = 1 << bits
            if float(hi) == float(lo):
                continue  # one level: nothing to draw (the constant is sent)
            got = dpsq_indices(x, lo, hi, levels, eps1, rng(k))
            assert got.dtype == np.uint32
            want = _dpsq_indices_step_by_step(x.astype(np.float64), lo, hi, levels, eps1, rng(k))
            assert np.array_equal(got, want), (bits, eps1, x.dtype)


def test_sq_block_by_block_equals_its_one_pass_formula_bit_for_bit():
    """Q_b's indices block by block (three blocks) equal lower + (u < t) over the whole vector, one draw a value in
    order, float32 input included, the fixed range's clamp too."""
    from hfl.common.quantization.sq import cell_position, sq_indices, vector_range

    base = np.random.default_rng(2).normal(size=20_001)
    for x, mode, clip in ((base, "minmax", None), (base.astype(np.float32), "minmax", None), (base, "fixed", 1.5)):
        lo, hi = vector_range(x, mode, clip)
        for bits in (1, 3, 8):
            lower, frac = cell_position(x.astype(np.float64), lo, hi, 1 << bits)
            want = (lower + (np.random.default_rng(bits).random(x.size) < frac)).astype(np.uint32)
            assert np.array_equal(sq_indices(x, lo, hi, 1 << bits, np.random.default_rng(bits)), want), (mode, bits)


def test_keystream_coins_equal_uniforms_below_p():
    from hfl.common.secret_random import dp_numpy_rng

    for p in (0.0, 2.0 ** -53, 1e-9, 0.25, 0.5, 0.7310585786300049, 1 - 2.0 ** -53, 1.0, float("nan")):
        a, b = (dp_numpy_rng("seeded", 1, "device", 2, 0, "coins") for _ in range(2))
        assert np.array_equal(a.below(50_000, p), b.random(50_000) < p), p
        assert a.random(3).tolist() == b.random(3).tolist()  # both streams left at the same word
