"""The fast DP-SGD-WAV path (book-keeping norms in the coefficient domain, noise transformed alone) against the
reference path (materialised per-example gradients, layout.row_norms, HWT -> noise -> IHWT) on fixed inputs."""
import numpy as np
import pytest
import torch
from torch import nn

from hfl.common.models import build, get_flat, init_parameters
from hfl.common.privacy.dpsgd import dp_sgd, noise_scales, noisy_sum
from hfl.common.privacy.per_example import (_bookkeeping_layers, _bookkeeping_parts, bookkeeping_clipped_sum,
                                            clip_factors, clipped_sum, example_norms, layer_sizes,
                                            per_example_gradients)
from hfl.common.privacy.wavelet_noise import (blocked_inverse_noise, compact_scales, fine_coefficient_index,
                                              haar_inverse_prefix, needed_coefficients, per_level_scales,
                                              wavelet_noise)
from hfl.common.privacy.wavelet_norms import _BLOCK_MAX, _grouped_levels, wavelet_part_norms
from hfl.common.privacy.wavelet import WaveletLayout, haar_inverse
from hfl.device_client.training import make_shard

# the shipped models at their datasets' shapes, an mlp whose input (25) has no power-of-two factor (nothing
# factors: every layer is materialised) and a deeper mlp whose Linear layers align to different levels
CASES = [("mlp", (1, 28, 28)), ("mlp", (1, 5, 5)), ("mnist-cnn", (1, 28, 28)), ("cifar-cnn", (3, 32, 32)),
         ("deep", (1, 28, 28)), ("ota-cnn", (1, 28, 28)), ("linear", (1, 28, 28))]


def _model(name, shape):
    if name == "deep":
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 96), nn.ReLU(),
                              nn.Linear(96, 10))
    else:
        model = build(name, shape, 10)
    init_parameters(model, torch.Generator().manual_seed(0))
    return model


def _batch(shape, n, seed=0):
    rng = np.random.default_rng(seed)
    shard = make_shard(rng.integers(0, 256, size=(n,) + tuple(shape), dtype=np.uint8), rng.integers(0, 10, size=n),
                       [0.5] * shape[0], [0.25] * shape[0])
    return shard


@pytest.mark.parametrize("name,shape", CASES)
@pytest.mark.parametrize("scope", ["flat", "per_layer"])
def test_coefficient_norms_without_rows_equal_the_materialised_ones(name, shape, scope):
    model = _model(name, shape)
    x, y = _batch(shape, 6).batch(torch.arange(6))
    params = {k: v.detach() for k, v in model.named_parameters()}
    _, parts, _ = _bookkeeping_parts(model, params, x, y, _bookkeeping_layers(model))
    g, _ = per_example_gradients(model, params, x, y)
    layout = WaveletLayout(layer_sizes(model), scope)
    for calibration in ("sound", "paper"):
        fast = wavelet_part_norms([parts[k] for k in params], layout, calibration)
        ref = layout.row_norms(g.double(), calibration)
        # float32 gradients and block sums against a float64 transform of the same float32 rows: 1e-5 relative
        torch.testing.assert_close(fast, ref, rtol=1e-5, atol=0)


@pytest.mark.parametrize("name,shape", [c for c in CASES if c[0] != "cifar-cnn"])  # its norms are tested above
@pytest.mark.parametrize("scope,per_layer", [("flat", False), ("per_layer", False), ("per_layer", True)])
def test_wavelet_clipped_sum_equals_the_materialised_one(name, shape, scope, per_layer):
    model = _model(name, shape)
    x, y = _batch(shape, 6, seed=5).batch(torch.arange(6))
    params = {k: v.detach() for k, v in model.named_parameters()}
    g, _ = per_example_gradients(model, params, x, y)
    layout = WaveletLayout(layer_sizes(model), scope)
    segments = layer_sizes(model) if per_layer else None
    norms = example_norms(g, layout, "sound", segments)
    bounds = norms.median(dim=0).values.double()  # some examples clipped, some not
    ref = clipped_sum(g, clip_factors(norms, bounds), segments)
    got, _, got_norms = bookkeeping_clipped_sum(model, params, x, y, bounds, per_layer, _bookkeeping_layers(model),
                                                layout, "sound")
    torch.testing.assert_close(got_norms, norms, rtol=1e-5, atol=0)
    # float32 sums in another order: 1e-4 relative, 1e-5 absolute on O(1) sums
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    # accumulated into a vector (dp_sgd adds the lot's sum to the step's noise row): that vector plus the same sum
    base = torch.linspace(-1, 1, ref.numel())
    into = base.clone()
    same, _, _ = bookkeeping_clipped_sum(model, params, x, y, bounds, per_layer, _bookkeeping_layers(model),
                                         layout, "sound", out=into)
    assert same is into
    torch.testing.assert_close(into, base + got, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size,m", [(1, 1), (1, 4), (5, 8), (8, 8), (100, 128), (129, 256), (1000, 1024),
                                    (159010, 262144)])
def test_inverse_from_the_needed_coefficients_is_the_full_inverse(size, m):
    gen = torch.Generator().manual_seed(size)
    full = torch.zeros(3, m, dtype=torch.float64)
    compact = []
    for start, count in needed_coefficients(size, m):
        v = torch.randn(3, count, generator=gen, dtype=torch.float64)
        full[:, start:start + count] = v
        compact.append(v)
    got = haar_inverse_prefix(torch.cat(compact, 1), size, m)
    torch.testing.assert_close(got, haar_inverse(full)[:, :size], rtol=0, atol=1e-12)


@pytest.mark.parametrize("scope", ["flat", "per_layer"])
def test_noise_alone_transformed_equals_hwt_noise_ihwt(scope):
    # the same coefficient draws, placed in a full coefficient vector (zeros where a coefficient reaches only
    # the padding), through the reference HWT -> add -> IHWT of the sum: equal to float32 rounding
    sizes = [300, 7, 1000, 1]
    layout = WaveletLayout(sizes, scope)
    scales = noise_scales(2.0, 1.5, layout)
    total = torch.randn(2, sum(sizes), generator=torch.Generator().manual_seed(1))
    got = noisy_sum(total.clone(), scales, layout, torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(7)
    full = torch.zeros(2, layout.coeff_length, dtype=torch.float64)
    start = 0
    for size, m in zip(layout.segments, layout.padded):
        spans = needed_coefficients(size, m)
        z = torch.randn(2, sum(c for _, c in spans), generator=gen).double()
        k = 0
        for a, c in spans:
            full[:, start + a:start + a + c] = z[:, k:k + c] * scales[start + a:start + a + c].double()
            k += c
        start += m
    ref = layout.inverse(layout.forward(total.double()) + full)
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=1e-5)
    assert [t.shape for t in wavelet_noise(layout, scales, torch.Generator(), 3)] == [(3, s) for s in layout.segments]


@pytest.mark.parametrize("calibration", ["sound", "paper"])
@pytest.mark.parametrize("name,shape", [("mlp", (1, 28, 28)), ("mnist-cnn", (1, 28, 28))])
def test_dp_sgd_wav_bookkeeping_equals_vmap_without_noise(name, shape, calibration):
    model = _model(name, shape)
    w = get_flat(model)
    shard = _batch(shape, 24, seed=2)
    runs = [dp_sgd(model, w, shard, 0.5, 2, 0.25, 0.05, 0.0, "wavelet", torch.Generator().manual_seed(3),
                   calibration=calibration, grad_method=method)[0] for method in ("vmap", "bookkeeping")]
    np.testing.assert_allclose(runs[1], runs[0], rtol=0, atol=2e-6)


def test_bookkeeping_refuses_a_model_it_cannot_follow():
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.LayerNorm(8), nn.Linear(8, 10))
    shard = _batch((1, 4, 4), 10)
    with pytest.raises(ValueError, match="grad_method"):
        dp_sgd(model, get_flat(model), shard, 0.1, 1, 0.5, 1.0, 1.0, "wavelet", torch.Generator(),
               grad_method="bookkeeping")
    # auto falls back to torch.func
    w, _, _ = dp_sgd(model, get_flat(model), shard, 0.1, 1, 0.5, 1.0, 1.0, "wavelet", torch.Generator())
    assert np.all(np.isfinite(w))


@pytest.mark.parametrize("rows,cols,j0,k,n", [(200, 49, 4, 3, 18), (96, 4, 4, 2, 7), (8, 5, 2, 3, 5), (2, 1, 1, 1, 3)])
def test_grouped_levels_equal_the_outer_product_levels(rows, cols, j0, k, n):
    # the Gram form of levels j0+1..j0+k of d (x) S against pair sums of the materialised outer product (float64)
    gen = torch.Generator().manual_seed(rows + cols)
    d, sx = torch.randn(5, rows, generator=gen), torch.randn(5, cols, generator=gen)
    acc, out = torch.zeros(5, dtype=torch.float64), torch.empty(5, rows >> k, cols)
    _grouped_levels(d, sx, j0, k, n, acc, out)
    s = (d.double()[:, :, None] * sx.double()[:, None, :]).reshape(5, -1)
    want = torch.zeros(5, dtype=torch.float64)
    for t in range(1, k + 1):
        s = s.view(5, -1, 2).sum(-1)
        if j0 + t < n:  # Q_j of the sound norm, j < n
            want += s.square().sum(1)
    # C_t and the last level's block sums are float32 products: 1e-6 relative
    torch.testing.assert_close(acc, want, rtol=1e-6, atol=0)
    torch.testing.assert_close(out.reshape(5, -1).double(), s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,shape", [("mlp", (1, 28, 28)), ("deep", (1, 28, 28))])
def test_norms_through_row_groups_equal_the_materialised_ones(name, shape):
    # a batch whose outer products exceed _BLOCK_MAX takes the row-group (Gram) path for the sound norm
    model = _model(name, shape)
    first = next(m for m in model.modules() if isinstance(m, nn.Linear))
    assert 48 * first.out_features * first.in_features // 16 > _BLOCK_MAX
    x, y = _batch(shape, 48, seed=3).batch(torch.arange(48))
    params = {k: v.detach() for k, v in model.named_parameters()}
    _, parts, _ = _bookkeeping_parts(model, params, x, y, _bookkeeping_layers(model))
    g, _ = per_example_gradients(model, params, x, y)
    layout = WaveletLayout(layer_sizes(model), "flat")
    fast = wavelet_part_norms([parts[k] for k in params], layout, "sound")
    torch.testing.assert_close(fast, layout.row_norms(g.double(), "sound"), rtol=1e-5, atol=0)


class _RecordedDraws:
    """torch draws that keep every randn block they hand out, in order."""

    def __init__(self, seed):
        self.generator, self.blocks = torch.Generator().manual_seed(seed), []

    def randn(self, *shape, out=None, scale=1.0):
        self.blocks.append(torch.randn(*shape, generator=self.generator))
        return self.blocks[-1]


@pytest.mark.parametrize("size,m", [(1, 1), (1, 4), (5, 8), (16, 16), (17, 32), (100, 128), (129, 256), (257, 512),
                                    (1000, 1024), (4097, 8192), (159010, 262144)])
def test_block_order_noise_is_the_inverse_of_its_draws_placed_by_fine_coefficient_index(size, m):
    # every draw, scaled by its level's factor, at the coefficient fine_coefficient_index names (each coefficient that
    # reaches [0, size) drawn exactly once), through the reference float64 IHWT: equal to float32 rounding
    b, n = 3, m.bit_length() - 1
    scales = tuple(float(v) for v in np.linspace(0.5, 2.0, n + 1))
    draws = _RecordedDraws(size)
    got = blocked_inverse_noise(draws, b, size, m, scales)
    index = fine_coefficient_index(size, m)
    assert len(set(index.tolist())) == len(index)
    needed = {c for a, k in needed_coefficients(size, m) for c in range(a, a + k)}
    assert needed <= set(index.tolist())
    z = torch.stack([torch.cat([blk.reshape(b, -1)[r] for blk in draws.blocks]) for r in range(b)]).double()
    assert z.shape == (b, len(index))
    level = np.concatenate([[0]] + [np.full(m >> j, j) for j in range(1, n + 1)])
    full = torch.zeros(b, m, dtype=torch.float64)
    full[:, index] = z * torch.tensor([scales[v] for v in level[index]], dtype=torch.float64)
    torch.testing.assert_close(got.double(), haar_inverse(full)[:, :size], rtol=0, atol=1e-5)


@pytest.mark.parametrize("scope", ["flat", "per_layer"])
def test_noise_with_per_level_scales_has_the_scaled_draws_variance(scope):
    # the block-order path (per-level factors) and the compact path (each coefficient's own scale) draw the same
    # distribution: per-element variance of 400 rows against the exact sum of squared scales over each element's
    # coefficients, within 5 standard errors of a variance estimate (sqrt(2 / 400) relative)
    layout = WaveletLayout([300, 7, 1000, 1], scope)
    compact = compact_scales(layout, noise_scales(2.0, 1.5, layout))
    levels = per_level_scales(layout, compact)
    assert all(isinstance(s, tuple) for s in levels)
    got = torch.cat(wavelet_noise(layout, levels, torch.Generator().manual_seed(9), 400), 1).double()
    want = torch.cat(wavelet_noise(layout, compact, torch.Generator().manual_seed(9), 400), 1).double()
    exact = torch.cat([haar_inverse_prefix(torch.diag(c.double()), size, m).square().sum(0)
                       for size, m, c in zip(layout.segments, layout.padded, compact)])
    for sample in (got, want):
        assert float(((sample.var(0) / exact) - 1).abs().max()) < 5 * (2 / 400) ** 0.5
    # scales that are not constant on a level stay a tensor (and keep the old path)
    uneven = [c.clone() for c in compact]
    big = max(range(len(uneven)), key=lambda i: len(uneven[i]))
    uneven[big][5] *= 2.0  # inside d(1)
    assert isinstance(per_level_scales(layout, uneven)[big], torch.Tensor)


@pytest.mark.parametrize("kw", [dict(kernel_size=5, padding=2), dict(kernel_size=3, stride=2),
                                dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), bias=False)])
def test_conv_example_grads_are_each_examples_own_weight_gradient(kw):
    """The grouped backward against autograd on each example alone (fixed seed; float32 sums in another order:
    within 1e-5 of the largest entry)."""
    from hfl.common.privacy.per_example import conv_example_grads

    torch.manual_seed(0)
    m = nn.Conv2d(4, 6, **kw)
    a = torch.randn(5, 4, 11, 9)
    d = torch.randn_like(m(a))
    want = torch.stack([torch.autograd.grad((m(a[i:i + 1]) * d[i:i + 1]).sum(), m.weight)[0].reshape(6, -1)
                        for i in range(5)])
    got = conv_example_grads(m, a, d)
    assert got.shape == want.shape and float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
