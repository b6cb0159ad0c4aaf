"""Haar wavelet transform (Privelet convention) and wavelet noise of paper 002 (digest Sec. 3.3-3.4, P1)."""
import numpy as np
import pytest
import torch

from hfl.common.privacy.wavelet import (WaveletLayout, coefficient_norms, effective_multiplier, element_noise_variance,
                                        haar_forward, haar_inverse, haar_norms, haar_weights, lemma2_multiplier, pad,
                                        padded_length, wavelet_clip, wavelet_gaussian)

TABLE_II = [4, 8, 1, 9, 8, 4, 5, 3]


def test_table_ii_numpy_and_torch():
    expected = [5.25, -2, -4, 2, 1, 0.5, 1, 0.25]
    np.testing.assert_array_equal(haar_forward(np.array(TABLE_II, dtype=np.float64)), expected)
    t = haar_forward(torch.tensor([TABLE_II, TABLE_II], dtype=torch.float64))
    assert isinstance(t, torch.Tensor) and t.shape == (2, 8)
    np.testing.assert_array_equal(t.numpy(), [expected, expected])
    np.testing.assert_array_equal(haar_weights(8), [8, 2, 2, 2, 2, 4, 4, 8])


def test_ancestor_chain_of_element_2():
    h = haar_forward(np.array(TABLE_II, dtype=np.float64))
    assert h[0] + h[7] - h[5] + h[2] == 1.0  # digest: 1 = 5.25 + 0.25 - 0.5 + (-4)


@pytest.mark.parametrize("length", [1, 2, 7, 8, 1000, 4097])
def test_inverse_round_trip_padded(length):
    rng = np.random.default_rng(length)
    x = rng.normal(size=(3, length))
    layout = WaveletLayout([length])
    assert layout.coeff_length == padded_length(length)
    np.testing.assert_allclose(layout.inverse(layout.forward(x)), x, rtol=0, atol=1e-12)
    xt = torch.from_numpy(x)
    np.testing.assert_allclose(haar_inverse(haar_forward(pad(xt))).numpy()[:, :length], x, rtol=0, atol=1e-12)


def test_per_layer_round_trip_and_weights():
    sizes = [5, 3, 9]
    layout = WaveletLayout(sizes, scope="per_layer")
    assert layout.coeff_length == 8 + 4 + 16
    np.testing.assert_array_equal(layout.weights[:8], haar_weights(8))
    np.testing.assert_array_equal(layout.weights[8:12], haar_weights(4))
    x = np.random.default_rng(1).normal(size=17)
    np.testing.assert_allclose(layout.inverse(layout.forward(x)), x, atol=1e-12)
    # per-layer coefficients of layer 2 are the flat HWT of that layer alone
    np.testing.assert_allclose(layout.forward(x)[12:], haar_forward(pad(x[8:])), atol=1e-14)


def test_forward_is_linear_and_matches_weighted_sum_form():
    # W (.) H is the matrix of +-1 partial sums: W_0 H_0 = sum(x), W d = sum(left) - sum(right)
    x = np.random.default_rng(2).normal(size=16)
    wh = haar_weights(16) * haar_forward(x)
    assert wh[0] == pytest.approx(x.sum())
    assert wh[-1] == pytest.approx(x[:8].sum() - x[8:].sum())
    assert wh[1] == pytest.approx(x[0] - x[1])


def test_bad_inputs():
    with pytest.raises(ValueError, match="power-of-two"):
        haar_forward(np.zeros(6))
    with pytest.raises(ValueError, match="scope"):
        WaveletLayout([4], scope="levels")
    with pytest.raises(ValueError, match="sizes"):
        WaveletLayout([])
    with pytest.raises(ValueError, match="clip"):
        wavelet_clip(np.ones(4), 0.0, WaveletLayout([4]))
    with pytest.raises(ValueError, match="calibration"):
        coefficient_norms(np.ones(4), np.ones(4), "loose")


def test_exact_variance_formula():
    assert element_noise_variance(8) == pytest.approx(0.34375)
    assert element_noise_variance(2 ** 20) == pytest.approx(1 / 3, rel=1e-6)
    assert lemma2_multiplier(1.0, 1024) == pytest.approx(np.sqrt(2 / 12))


@pytest.mark.parametrize("m", [8, 256])
def test_monte_carlo_element_noise_variance(m):
    # 40k independent rows x m elements; each element's sample variance over 40k rows has relative std
    # sqrt(2/40000) = 0.7%; averaging over the m elements only tightens it, so 3% on the mean is > 4 sigma.
    # The per-element check uses 5% (7 sigma over at most 256 elements).
    s, rows = 2.0, 40_000
    rng = np.random.default_rng(10 + m)
    noise = rng.normal(size=(rows, m)) * (s / haar_weights(m))
    elem = haar_inverse(noise)
    var = elem.var(axis=0)
    target = element_noise_variance(m, s)
    assert var.mean() == pytest.approx(target, rel=0.03)
    assert np.all(np.abs(var / target - 1) < 0.05)
    assert target < (2 + np.log2(m)) / 2 * s * s  # below the paper's Lemma 1 bound


def test_wavelet_gaussian_per_element_std():
    # one 4096-long release: the element std is sqrt(element_noise_variance); 4096 samples give 1.1%
    # relative std on the variance, so 5% is > 4 sigma
    layout = WaveletLayout([4096])
    out = wavelet_gaussian(np.zeros(4096), 3.0, layout, np.random.default_rng(3))
    assert out.var() == pytest.approx(element_noise_variance(4096, 3.0), rel=0.05)


@pytest.mark.parametrize("calibration", ["sound", "paper"])
def test_wavelet_clip_bounds_the_right_norm(calibration):
    layout = WaveletLayout([100])
    x = np.random.default_rng(4).normal(size=100).astype(np.float32) * 10
    clipped, was = wavelet_clip(x, 1.5, layout, calibration)
    assert was
    norm = coefficient_norms(layout.forward(clipped.astype(np.float64)), layout.weights, calibration)
    assert norm <= 1.5 and norm == pytest.approx(1.5, rel=1e-5)
    small = x / 1000
    kept, was = wavelet_clip(small, 1e6, layout, calibration)
    assert not was
    np.testing.assert_array_equal(kept, small)


def test_weighted_norm_of_generic_vector_grows_like_sqrt_levels():
    # digest P1: ||W (.) H|| ~ sqrt(1 + log2 m) ||g|| for a generic vector (rows of W(.)HWT are orthogonal
    # +-1 patterns); for m = 4096 and 200 draws the mean ratio is within 2% of sqrt(13)
    m = 4096
    g = np.random.default_rng(5).normal(size=(200, m))
    ratio = coefficient_norms(haar_forward(g), haar_weights(m)) / np.linalg.norm(g, axis=1)
    assert ratio.mean() == pytest.approx(np.sqrt(13), rel=0.02)


def test_effective_multiplier():
    layout = WaveletLayout([1000])
    assert effective_multiplier(2.0, layout, "sound") == 2.0
    assert effective_multiplier(2.0, layout, "paper") == 2.0 / 1024
    # the worst case in paper mode: a constant vector puts all of ||H|| on H_0, the weight-m coefficient
    h = haar_forward(np.ones(1024))
    assert np.linalg.norm(h) == 1.0 and coefficient_norms(h, haar_weights(1024)) == 1024.0


@pytest.mark.parametrize("weighted", [False, True])
def test_level_by_level_norms_equal_coefficient_norms(weighted):
    x = np.random.default_rng(6).normal(size=(5, 512))
    ref = coefficient_norms(haar_forward(x), haar_weights(512), "sound" if weighted else "paper")
    np.testing.assert_allclose(haar_norms(x, weighted), ref, rtol=1e-12)
    xt = torch.from_numpy(x).float()
    np.testing.assert_allclose(haar_norms(xt, weighted).numpy(), ref, rtol=1e-5)


def test_layout_row_norms_per_segment():
    layout = WaveletLayout([5, 3, 9], scope="per_layer")
    x = np.random.default_rng(7).normal(size=(4, 17))
    h = layout.forward(x)
    got = layout.row_norms(x, "sound")
    for j, (lo, hi) in enumerate([(0, 8), (8, 12), (12, 28)]):
        np.testing.assert_allclose(got[:, j], np.linalg.norm(h[:, lo:hi] * layout.weights[lo:hi], axis=1), rtol=1e-12)
    flat = WaveletLayout([17])
    np.testing.assert_allclose(flat.row_norms(x, "paper")[:, 0], np.linalg.norm(flat.forward(x), axis=1), rtol=1e-12)


def test_stage_forms():
    from hfl.common.privacy.wavelet import wavelet_clip_stage, wavelet_gaussian_stage
    vec = np.random.default_rng(8).normal(size=20).astype(np.float32)
    a = wavelet_gaussian_stage(vec, np.random.default_rng(1), noise_multiplier=2.0, sensitivity=0.5)
    b = wavelet_gaussian(vec, 1.0, WaveletLayout([20]), np.random.default_rng(1))
    np.testing.assert_array_equal(a, b)
    per_layer = wavelet_gaussian_stage(vec, np.random.default_rng(1), std=1.0, size_0=12, size_1=8)
    np.testing.assert_array_equal(per_layer, wavelet_gaussian(vec, 1.0, WaveletLayout([12, 8], "per_layer"),
                                                              np.random.default_rng(1)))
    clipped = wavelet_clip_stage(vec, np.random.default_rng(0), clip=0.5)
    layout = WaveletLayout([20])
    assert coefficient_norms(layout.forward(clipped.astype(np.float64)), layout.weights) <= 0.5
    with pytest.raises(ValueError, match="std"):
        wavelet_gaussian_stage(vec, np.random.default_rng(0), sensitivity=1.0)
    with pytest.raises(ValueError, match="weighted"):
        wavelet_clip_stage(vec, np.random.default_rng(0), clip=0.5, weighted=0.5)
