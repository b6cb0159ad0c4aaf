"""Clipping, noise and the pipeline stages of hfl.common.privacy."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from hfl.common.pipeline import AGGREGATORS, VECTOR_STAGES
from hfl.common.privacy import add_gaussian, add_laplace, clip_l2, clip_per_layer, per_layer_sensitivity

floats = st.floats(-1e6, 1e6, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(arrays(np.float32, st.integers(1, 300), elements=floats), st.floats(1e-3, 1e3))
def test_clip_l2_bounds_every_norm_and_keeps_direction(vec, bound):
    out, clipped = clip_l2(vec, bound)
    norm_in = np.linalg.norm(vec.astype(np.float64))
    norm_out = np.linalg.norm(out.astype(np.float64))
    assert out.dtype == vec.dtype
    assert norm_out <= bound  # exact: the clip shrinks by an ulp when float32 rounding overshoots
    assert clipped == (norm_in > bound)
    if not clipped:
        np.testing.assert_array_equal(out, vec)
    else:  # scaled copy: the direction is kept, and the norm is the bound to float32 precision
        assert norm_out == pytest.approx(bound, rel=1e-5)
        np.testing.assert_allclose(out, vec * (bound / norm_in), rtol=1e-5, atol=1e-30)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.data())
def test_clip_per_layer_bounds_every_layer(sizes, data):
    vec = data.draw(arrays(np.float32, sum(sizes), elements=floats))
    bounds = data.draw(st.lists(st.floats(1e-3, 1e3), min_size=len(sizes), max_size=len(sizes)))
    out, clipped = clip_per_layer(vec, bounds, sizes)
    edges = np.cumsum([0] + sizes)
    over = False
    for j, b in enumerate(bounds):
        seg_in, seg_out = vec[edges[j]:edges[j + 1]], out[edges[j]:edges[j + 1]]
        assert np.linalg.norm(seg_out.astype(np.float64)) <= b
        if np.linalg.norm(seg_in.astype(np.float64)) <= b:
            np.testing.assert_array_equal(seg_out, seg_in)
        else:
            over = True
    assert clipped == over
    assert np.linalg.norm(out.astype(np.float64)) <= per_layer_sensitivity(bounds) * (1 + 1e-12)


def test_per_layer_sensitivity_is_root_sum_of_squares_not_paper_typo():
    assert per_layer_sensitivity([3.0, 4.0]) == pytest.approx(5.0)  # the paper's sqrt(sum C_j) would give sqrt(7)


@pytest.mark.parametrize("call, message", [
    (lambda: clip_l2(np.ones(3), 0.0), "bound"),
    (lambda: clip_l2(np.ones(3), -1.0), "bound"),
    (lambda: clip_l2(np.array([1.0, np.nan]), 1.0), "finite"),
    (lambda: clip_per_layer(np.ones(5), [1.0, 1.0], [2, 2]), "sum to len"),
    (lambda: clip_per_layer(np.ones(4), [1.0], [2, 2]), "one length per bound"),
    (lambda: add_gaussian(np.ones(3), -1.0, np.random.default_rng(0)), "std"),
    (lambda: add_laplace(np.ones(3), float("inf"), np.random.default_rng(0)), "scale"),
])
def test_bad_input_names_the_parameter(call, message):
    with pytest.raises(ValueError, match=message):
        call()


N = 400_000


def test_gaussian_noise_std_monte_carlo():
    # relative standard error of a sample std over N draws is 1/sqrt(2N) = 0.11%; 1% is ~9 SE.
    base = np.linspace(-1, 1, N).astype(np.float32)
    noisy = add_gaussian(base, 0.7, np.random.default_rng(123))
    resid = noisy.astype(np.float64) - base
    assert noisy.dtype == np.float32
    assert resid.std() == pytest.approx(0.7, rel=0.01)
    assert abs(resid.mean()) < 5 * 0.7 / np.sqrt(N)  # 5 SE of the mean


def test_laplace_noise_scale_monte_carlo():
    # Laplace(b): std = sqrt(2) b, mean |x| = b. Kurtosis 6 makes the relative SE of the sample std
    # sqrt(5/N)/2 = 0.18%; 1.5% is ~8 SE. The SE of mean |x| is b/sqrt(N) = 0.16% relative; 1% is ~6 SE.
    noisy = add_laplace(np.zeros(N, dtype=np.float32), 0.3, np.random.default_rng(7)).astype(np.float64)
    assert noisy.std() == pytest.approx(np.sqrt(2) * 0.3, rel=0.015)
    assert np.abs(noisy).mean() == pytest.approx(0.3, rel=0.01)


def test_noise_is_reproducible_from_the_rng_only():
    vec = np.zeros(10, dtype=np.float32)
    a = add_gaussian(vec, 1.0, np.random.default_rng(5))
    b = add_gaussian(vec, 1.0, np.random.default_rng(5))
    c = add_gaussian(vec, 1.0, np.random.default_rng(6))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_stages_registered_and_match_functions():
    vec = np.arange(12, dtype=np.float32)
    rng = lambda: np.random.default_rng(1)  # noqa: E731
    np.testing.assert_array_equal(VECTOR_STAGES.get("clip_l2")(vec, rng(), clip=2.0), clip_l2(vec, 2.0)[0])
    flat = VECTOR_STAGES.get("clip_per_layer")(vec, rng(), bound_0=1.0, bound_1=5.0, size_0=4, size_1=8)
    np.testing.assert_array_equal(flat, clip_per_layer(vec, [1.0, 5.0], [4, 8])[0])
    split = VECTOR_STAGES.get("clip_per_layer")(vec, rng(), clip=2.0, size_0=6, size_1=6)
    np.testing.assert_allclose(np.linalg.norm(split), 2.0, rtol=1e-6)
    np.testing.assert_array_equal(VECTOR_STAGES.get("gaussian")(vec, rng(), std=0.5), add_gaussian(vec, 0.5, rng()))
    np.testing.assert_array_equal(VECTOR_STAGES.get("gaussian")(vec, rng(), noise_multiplier=2.0, sensitivity=0.25),
                                  add_gaussian(vec, 0.5, rng()))
    np.testing.assert_array_equal(VECTOR_STAGES.get("laplace")(vec, rng(), scale=0.5), add_laplace(vec, 0.5, rng()))
    with pytest.raises(ValueError, match="noise_multiplier"):
        VECTOR_STAGES.get("gaussian")(vec, rng())


def test_fixed_denominator_sum_does_not_normalise():
    agg = AGGREGATORS.get("fixed_denominator_sum")
    out = agg([np.ones(3, np.float32), 2 * np.ones(3, np.float32)], [0.5, 0.25])
    np.testing.assert_allclose(out, np.ones(3))  # 0.5*1 + 0.25*2, weights summing to 0.75 are not rescaled
