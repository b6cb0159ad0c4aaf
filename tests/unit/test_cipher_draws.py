"""DP-SGD's keystream draws (secret_random.CipherDraws): Box-Muller against its formula, the normals' law by seeded
statistical checks with stated tolerances, lots, and DP-SGD on them (seeded replay, secret draws differ)."""
import math

import numpy as np
import pytest
import torch
from scipy import stats

from hfl.common.models import build, get_flat, init_parameters
from hfl.common.privacy import dpsgd
from hfl.common.secret_random import CipherDraws, CipherGenerator, box_muller, dp_draws, dp_numpy_rng
from hfl.device_client.training import make_shard

KEY = bytes(range(32))


def test_box_muller_is_the_formula_on_hand_words():
    a = np.array([0, 2 ** 31 - 1, 2 ** 32 - 1, 12345], np.uint32)
    b = np.array([2 ** 30, 0, 2 ** 31, 3 * 2 ** 30], np.uint32)
    out = box_muller(a, b, np.empty(7, np.float32))  # odd: the last pair gives its cosine only
    u1 = (a.astype(np.float64) + 1) / 2 ** 32
    r = np.sqrt(-2 * np.log(u1))
    theta = 2 * np.pi * b.astype(np.float64) / 2 ** 32
    want = np.concatenate([r * np.cos(theta), (r * np.sin(theta))[:3]])
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    assert out[0] == pytest.approx(0, abs=1e-5) and out[4] == pytest.approx(math.sqrt(64 * math.log(2)), rel=1e-6)
    assert out[2] == 0  # u1 = 1: r = 0
    scaled = box_muller(a, b, np.empty(7, np.float32), scale=0.37)  # N(0, 0.37^2): the scale rides on r
    np.testing.assert_allclose(scaled, 0.37 * want, rtol=1e-5, atol=1e-6)


def test_normals_have_the_standard_law():
    """400,000 draws from a fixed key: KS p > 1e-3, mean within 5 standard errors, variance within 5 of its
    standard errors (sqrt(2 / n)), the mass beyond 3 within 5 binomial errors of 0.0027, the bound sqrt(64 ln 2)."""
    n = 400_000
    z = CipherDraws(KEY).randn(n).double().numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.mean()) < 5 / math.sqrt(n) and abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    tail, p = (np.abs(z) > 3).mean(), 2 * stats.norm.sf(3)
    assert abs(tail - p) < 5 * math.sqrt(p * (1 - p) / n)
    assert np.abs(z).max() <= math.sqrt(64 * math.log(2)) + 1e-5
    # pairs are independent: cos and sin halves uncorrelated
    k = n // 2
    assert abs(np.corrcoef(z[:k], z[k:])[0, 1]) < 5 / math.sqrt(k)


def test_the_keystream_decides_the_draws():
    a, b = CipherDraws(KEY), CipherDraws(KEY)
    first = a.randn(3, 5)
    assert first.shape == (3, 5) and first.dtype == torch.float32
    assert torch.equal(first, b.randn(3, 5))
    assert not torch.equal(a.randn(3, 5), first)  # the stream goes on
    assert not torch.equal(CipherDraws(bytes(32)).randn(3, 5), first)
    out = torch.empty(4, 3)
    assert CipherDraws(KEY).randn(out=out) is out  # written in place
    assert torch.equal(out, CipherDraws(KEY).randn(4, 3))
    with pytest.raises(ValueError, match="32 bytes"):
        CipherDraws(bytes(16))


def test_uniforms_and_lots():
    u = CipherDraws(KEY).rand(200_000).double().numpy()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / len(u))
    draws = CipherDraws(KEY)
    lots = np.stack([np.sort(draws.sample(6, 2).numpy()) for _ in range(3000)])
    assert (lots[:, 0] < lots[:, 1]).all() and lots.min() >= 0 and lots.max() < 6  # distinct, in range
    pairs = np.bincount(lots[:, 0] * 6 + lots[:, 1], minlength=36)[[i * 6 + j for i in range(6) for j in range(i + 1, 6)]]
    assert stats.chisquare(pairs).pvalue > 1e-3  # each of the 15 subsets equally likely


def test_noisy_sum_on_the_keystream_has_the_stated_std():
    total = torch.zeros(200_000)
    out = dpsgd.noisy_sum(total, torch.full((1,), 2.0), None, CipherDraws(KEY), torch.empty(200_000))
    assert abs(out.double().std().item() - 2.0) < 5 * 2.0 / math.sqrt(2 * 200_000)


def _dp_run(draws):
    model = build("mlp", (1, 28, 28), 10)
    init_parameters(model, torch.Generator().manual_seed(0))
    rng = np.random.default_rng(0)
    shard = make_shard(rng.integers(0, 256, (64, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 64), [0.5], [0.25])
    w, _, _ = dpsgd.dp_sgd(model, get_flat(model), shard, 0.1, 3, 0.5, 1.0, 1.0, "gaussian", draws, lot="poisson")
    return w


def test_dp_sgd_replays_seeded_draws_and_not_secret_ones():
    seeded = _dp_run(dp_draws("seeded", 3, "device", 1, 2, "dp_sgd"))
    np.testing.assert_array_equal(seeded, _dp_run(dp_draws("seeded", 3, "device", 1, 2, "dp_sgd")))
    secret = _dp_run(dp_draws("secret", 3, "device", 1, 2, "dp_sgd"))
    assert not np.array_equal(secret, _dp_run(dp_draws("secret", 3, "device", 1, 2, "dp_sgd")))
    assert not np.array_equal(secret, seeded)


def test_dp_sgd_draws_each_steps_noise_afresh_when_it_draws_several_steps_at_once():
    """Noise-only steps (lots of rate 1e-9 are empty; lr = the expected lot, so a step moves theta by -noise): the
    linear model's 8 steps come from one block of 8 rows (dpsgd.NOISE_BLOCK), and their sum has variance 8 per
    coordinate (sigma S = 1), within 5 standard errors (8 sqrt(2 / 7850)); rows repeated would give 64."""
    assert dpsgd.NOISE_BLOCK // 7850 >= 8
    model = build("linear", (1, 28, 28), 10)
    init_parameters(model, torch.Generator().manual_seed(0))
    rng = np.random.default_rng(0)
    shard = make_shard(rng.integers(0, 256, (64, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 64), [0.5], [0.25])
    w0 = get_flat(model)
    q = 1e-9
    w, _, _ = dpsgd.dp_sgd(model, w0, shard, q * 64, 8, q, 1.0, 1.0, "gaussian", CipherDraws(KEY), lot="poisson")
    moved = (w.astype(np.float64) - w0)
    assert abs(moved.var() - 8) < 5 * 8 * math.sqrt(2 / moved.size)


class _HandWords:
    """A keystream that gives the words it was handed (the formulas on known inputs)."""

    def __init__(self, words):
        self.given = np.asarray(words, np.uint64)

    def words(self, n, dtype=np.uint32):
        return self.given[:n].astype(dtype)


def test_numpy_facing_draws_are_their_formulas_on_hand_words():
    words = [0, 2 ** 63, 2 ** 64 - 1, 3 << 40]
    u = CipherGenerator(_HandWords(words)).random(4)
    want = np.array([w >> 11 for w in words], np.float64) * 2.0 ** -53
    np.testing.assert_array_equal(u, want)
    assert u.max() < 1.0 and u.min() == 0.0
    # Laplace: the inverse CDF of v = (k + 1/2) 2^-52, k the top 52 bits: ln 2v below 1/2, -ln 2(1 - v) above
    x = CipherGenerator(_HandWords(words)).laplace(1.0, 2.0, size=4)
    v = (np.array([w >> 12 for w in words], np.float64) + 0.5) * 2.0 ** -52
    np.testing.assert_allclose(x, 1.0 + 2.0 * np.where(v < 0.5, np.log(2 * v), -np.log(2 * (1 - v))), rtol=1e-12)
    assert np.isfinite(x).all()  # the ends: +-ln 2^52 scales
    assert x[0] == pytest.approx(1.0 + 2.0 * math.log(2.0 ** -52), rel=1e-12)
    assert x[2] == pytest.approx(1.0 - 2.0 * math.log(2.0 ** -52), rel=1e-12)


def test_numpy_facing_draws_have_their_laws():
    """From a fixed key: KS p > 1e-3 against U(0, 1), N(0, 1) and Laplace(0, 1); N(3, 2^2) and Laplace(-1, 0.5)
    moments within 5 standard errors; shapes and dtypes as numpy.random.Generator gives them."""
    g = CipherGenerator(CipherDraws(KEY))
    n = 200_000
    assert stats.kstest(g.random(n), "uniform").pvalue > 1e-3
    assert stats.kstest(g.standard_normal(n), "norm").pvalue > 1e-3
    assert stats.kstest(g.laplace(size=n), "laplace").pvalue > 1e-3
    z = g.normal(3.0, 2.0, size=(400, 500))
    assert z.shape == (400, 500) and z.dtype == np.float64
    assert abs(z.mean() - 3.0) < 5 * 2.0 / math.sqrt(n) and abs(z.var() / 4.0 - 1) < 5 * math.sqrt(2 / n)
    b = g.laplace(-1.0, 0.5, size=n)  # variance 2 b^2, kurtosis 6: var of the sample variance (2 + 6 - 1) ... / n
    assert abs(b.mean() + 1.0) < 5 * math.sqrt(2 * 0.25 / n) and abs(b.var() / 0.5 - 1) < 5 * math.sqrt(5 / n)
    assert isinstance(g.random(), float) and isinstance(g.normal(), float)
    spread = g.normal(0.0, np.ones(3))  # numpy's rule without `size`: one draw per element of the parameters
    assert spread.shape == (3,) and len(set(spread.tolist())) == 3 and g.laplace(np.zeros((2, 2))).shape == (2, 2)
    assert g.standard_normal(3, dtype=np.float32).dtype == np.float32


def test_numpy_facing_draws_replay_seeded_and_spawn_apart():
    a = dp_numpy_rng("seeded", 7, "edge", 1, 2, "dp_noise")
    b = dp_numpy_rng("seeded", 7, "edge", 1, 2, "dp_noise")
    np.testing.assert_array_equal(a.normal(0, 1, 100), b.normal(0, 1, 100))
    kids = dp_numpy_rng("seeded", 7, "edge", 1, 2, "audit").spawn(2)
    again = dp_numpy_rng("seeded", 7, "edge", 1, 2, "audit").spawn(2)
    first, second = kids[0].random(50), kids[1].random(50)
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(first, again[0].random(50))
    assert not np.array_equal(dp_numpy_rng("secret", 7, "edge", 1, 2, "dp_noise").random(50),
                              dp_numpy_rng("secret", 7, "edge", 1, 2, "dp_noise").random(50))
