"""Per-example gradients, per-example clipping, lots and the DP-SGD / DP-SGD-WAV step (paper 002 Alg. 1)."""
import dp_accounting
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from hfl.common.models import build, get_flat, init_parameters
from hfl.common.privacy.dpsgd import accounting, dp_event, dp_sgd, draw_lot
from hfl.common.privacy.per_example import (_bookkeeping_layers, bookkeeping_clipped_sum, clip_factors, clip_rows,
                                            clipped_sum, layer_sizes, per_example_gradients, row_norms)
from hfl.common.privacy.wavelet import WaveletLayout, element_noise_variance
from hfl.device_client.training import local_sgd, make_shard

SHAPES = {"mlp": (1, 8, 8), "mnist-cnn": (1, 28, 28), "cifar-cnn": (3, 32, 32)}


def _model(name, shape=None):
    model = build(name, shape or SHAPES[name], 10)
    init_parameters(model, torch.Generator().manual_seed(0))
    return model


def _shard(shape, n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n,) + tuple(shape), dtype=np.uint8)
    y = rng.integers(0, 10, size=n)
    return make_shard(x, y, [0.5] * shape[0], [0.25] * shape[0])


@pytest.mark.parametrize("name,batch", [("mlp", 6), ("mnist-cnn", 4), ("cifar-cnn", 2)])
def test_per_example_gradients_equal_a_loop(name, batch):
    model = _model(name)
    x, y = _shard(SHAPES[name], batch).batch(torch.arange(batch))
    params = {k: v.detach() for k, v in model.named_parameters()}
    g, losses = per_example_gradients(model, params, x, y)
    assert g.shape == (batch, sum(layer_sizes(model)))
    for i in range(batch):
        model.zero_grad()
        loss = F.cross_entropy(model(x[i:i + 1]), y[i:i + 1])
        loss.backward()
        ref = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        # float32 gradients of O(1) size through different kernels (batched vs single): 1e-5 absolute
        torch.testing.assert_close(g[i], ref, atol=1e-5, rtol=1e-4)
        assert float(losses[i]) == pytest.approx(float(loss.detach()), rel=1e-5)


def test_flat_clipping_bounds_every_per_example_norm():
    model = _model("mnist-cnn")
    x, y = _shard(SHAPES["mnist-cnn"], 16).batch(torch.arange(16))
    g, _ = per_example_gradients(model, {k: v.detach() for k, v in model.named_parameters()}, x, y)
    norms = torch.linalg.vector_norm(g.double(), dim=1)
    c = float(norms.median())  # half the rows are over the bound, half under
    clipped, before = clip_rows(g, torch.tensor([c], dtype=torch.float64))
    after = torch.linalg.vector_norm(clipped.double(), dim=1)
    assert torch.all(after <= c)
    over = norms > c
    assert over.any() and (~over).any()
    # clipped rows land within the deliberate 2^-16 shrink (1.5e-5) below C, plus float32 rounding
    torch.testing.assert_close(after[over], torch.full_like(after[over], c), rtol=2e-5, atol=0)
    assert torch.equal(clipped[~over], g[~over])
    torch.testing.assert_close(before[:, 0].double(), norms, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", ["mlp", "mnist-cnn", "cifar-cnn"])
@pytest.mark.parametrize("per_layer", [False, True])
def test_bookkeeping_clipped_sum_equals_vmap(name, per_layer):
    # the ghost-norm path must give the same norms and the same clipped sum as materialised per-example
    # gradients; bounds at the median norm so that some examples are clipped and some are not
    model = _model(name)
    batch = 6
    x, y = _shard(SHAPES[name], batch, seed=5).batch(torch.arange(batch))
    params = {k: v.detach() for k, v in model.named_parameters()}
    g, losses = per_example_gradients(model, params, x, y)
    sizes = layer_sizes(model) if per_layer else None
    norms = row_norms(g, sizes)
    bounds = norms.median(dim=0).values.double()
    ref = clipped_sum(g, clip_factors(norms, bounds), sizes)
    got, got_losses, got_norms = bookkeeping_clipped_sum(model, params, x, y, bounds, per_layer,
                                                         _bookkeeping_layers(model))
    # float32 sums of O(1) gradients in another order: 1e-4 relative, 1e-6 absolute
    torch.testing.assert_close(got_norms, norms, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_losses, losses.detach(), rtol=1e-5, atol=1e-6)


def test_dp_sgd_methods_agree():
    model = _model("mnist-cnn")
    w = get_flat(model)
    shard = _shard(SHAPES["mnist-cnn"], 30)
    runs = [dp_sgd(model, w, shard, 0.1, 2, 0.3, 0.5, 1.0, "gaussian", torch.Generator().manual_seed(2),
                   grad_method=m)[0] for m in ("vmap", "bookkeeping")]
    np.testing.assert_allclose(runs[0], runs[1], atol=1e-5)


def test_per_layer_clipping_bounds_every_layer():
    sizes = [30, 5, 12]
    seg = torch.repeat_interleave(torch.arange(3), torch.tensor(sizes))
    v = torch.randn(50, 47, generator=torch.Generator().manual_seed(1)) * 3
    bounds = torch.tensor([1.0, 0.1, 2.0])
    clipped, _ = clip_rows(v, bounds, sizes)
    per_layer = torch.zeros(50, 3, dtype=torch.float64).index_add_(1, seg, clipped.double() ** 2).sqrt()
    assert torch.all(per_layer <= bounds.double())
    total = torch.linalg.vector_norm(clipped.double(), dim=1)
    assert torch.all(total <= float(bounds.double().square().sum().sqrt()))


def test_weighted_clipping_bounds_weighted_norm():
    layout = WaveletLayout([100])
    h = layout.forward(torch.randn(20, 100, generator=torch.Generator().manual_seed(2)))
    wt = torch.from_numpy(layout.weights).float()
    clipped, _ = clip_rows(h, torch.tensor([0.5]), None, wt)
    assert torch.all(torch.linalg.vector_norm((clipped * wt).double(), dim=1) <= 0.5)
    total = clipped_sum(h, clip_factors(row_norms(h, None, wt), torch.tensor([0.5])))
    torch.testing.assert_close(total, clipped.sum(0), rtol=1e-5, atol=1e-6)
    assert torch.all(torch.linalg.vector_norm((clipped * wt).double(), dim=1) <= 0.5)


def test_poisson_lot_sizes():
    # 2000 lots from n = 1000 at q = 0.05: sizes are Binomial(1000, 0.05), mean 50, variance 47.5. The mean
    # of 2000 has std sqrt(47.5 / 2000) = 0.15, so 0.8 is > 5 sigma; the sample variance has relative std
    # sqrt(2 / 1999) = 3.2%, so 15% is > 4 sigma (and a fixed-size lot, variance 0, fails it).
    gen = torch.Generator().manual_seed(3)
    sizes = np.array([len(draw_lot(1000, 0.05, "poisson", gen)) for _ in range(2000)])
    assert sizes.mean() == pytest.approx(50.0, abs=0.8)
    assert sizes.var(ddof=1) == pytest.approx(47.5, rel=0.15)
    lots = [draw_lot(1000, 0.05, "fixed", gen) for _ in range(5)]
    assert all(len(lot) == 50 and len(set(lot.tolist())) == 50 for lot in lots)


def test_no_noise_full_lot_equals_plain_sgd():
    # sigma = 0, a clip far above every gradient norm and a fixed lot of all n examples: the DP step is the
    # mean of per-example gradients, i.e. one plain full-batch SGD step
    model = _model("mlp")
    w = get_flat(model)
    shard = _shard(SHAPES["mlp"], 32)
    new, loss, _ = dp_sgd(model, w, shard, 0.1, 1, 1.0, 1e6, 0.0, "gaussian", torch.Generator().manual_seed(0),
                          lot="fixed")
    ref, ref_loss, _ = local_sgd(model, w, shard, 0.1, 32, torch.Generator().manual_seed(0), steps=1)
    np.testing.assert_allclose(new, ref, atol=2e-6)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    # the wavelet path is the same step when there is no noise and no clipping (HWT is linear and invertible)
    wav, _, _ = dp_sgd(model, w, shard, 0.1, 1, 1.0, 1e6, 0.0, "wavelet", torch.Generator().manual_seed(0),
                       lot="fixed")
    np.testing.assert_allclose(wav, ref, atol=2e-6)


@pytest.mark.parametrize("calibration", ["sound", "paper"])
@pytest.mark.parametrize("scope,per_layer", [("flat", False), ("per_layer", False), ("per_layer", True)])
def test_wavelet_step_clips_in_the_coefficient_domain(calibration, scope, per_layer):
    # sigma = 0, lr = 1, one fixed lot of all n: the update must be -(1/n) IHWT(sum_i clip(HWT(g_i))), built
    # here explicitly from materialised coefficients (the implementation sums in the gradient domain)
    model = _model("mlp")
    w = get_flat(model)
    n = 8
    shard = _shard(SHAPES["mlp"], n, seed=3)
    layout = WaveletLayout(layer_sizes(model), scope)
    g, _ = per_example_gradients(model, {k: v.detach() for k, v in model.named_parameters()},
                                 *shard.batch(torch.arange(n)))
    h = layout.forward(g.double())
    wt = torch.from_numpy(layout.weights) if calibration == "sound" else None
    seg = layout.padded if per_layer else None
    c = float(row_norms(h, seg, wt).median())
    bounds = [c] * len(layout.padded) if per_layer else None
    clipped, _ = clip_rows(h, torch.full((len(layout.padded) if per_layer else 1,), c, dtype=torch.float64), seg, wt)
    expected = w - layout.inverse(clipped.sum(0)).numpy() / n
    new, _, info = dp_sgd(model, w, shard, 1.0, 1, 1.0, c, 0.0, "wavelet", torch.Generator().manual_seed(0),
                          lot="fixed", calibration=calibration, wavelet_scope=scope, layer_bounds=bounds)
    # float32 gradients against a float64 reference: 1e-5 absolute on O(0.1) steps
    np.testing.assert_allclose(new, expected, atol=1e-5)
    assert info["calibration"] == calibration


def _noise_only_update(mechanism, sigma, calibration="sound"):
    # clip C tiny and lr = L / C: the update is lr/L (sum of clipped + noise) = (sum of clipped)/C + noise/C,
    # with the signal's norm <= the lot size (~6) against a noise norm of sigma sqrt(P) (~1200 here)
    model = _model("mlp")
    w = get_flat(model)
    shard = _shard(SHAPES["mlp"], 60)
    c, q = 1e-4, 0.1
    new, _, info = dp_sgd(model, w, shard, q * 60 / c, 1, q, c, sigma, mechanism,
                          torch.Generator().manual_seed(4), calibration=calibration)
    return (new.astype(np.float64) - w) * -1.0, info


def test_gaussian_noise_std_per_coordinate():
    # 15010 coordinates: the sample variance has relative std sqrt(2/15010) = 1.2%, the signal adds at most
    # 36/15010 = 0.2% of sigma^2 = 100; 5% tolerance is > 3.5 sigma
    upd, info = _noise_only_update("gaussian", 10.0)
    assert upd.var() == pytest.approx(100.0, rel=0.05)
    assert info["sensitivity"] == pytest.approx(1e-4) and info["epsilon_label"] == "epsilon"


@pytest.mark.parametrize("calibration", ["sound", "paper"])
def test_wavelet_noise_std_per_element(calibration):
    # same set-up; per-element noise variance sigma^2 (1/m^2 + sum_j 4^-j) with m = 16384 (about sigma^2/3)
    upd, info = _noise_only_update("wavelet", 10.0, calibration)
    assert upd.var() == pytest.approx(element_noise_variance(16384, 10.0), rel=0.05)
    assert info["epsilon_label"] == ("epsilon_claimed" if calibration == "paper" else "epsilon")
    assert info["effective_noise_multiplier"] == (10.0 if calibration == "sound" else 10.0 / 16384)


def test_accounting_dict_and_dp_event_match_dp_accounting():
    info = accounting(mechanism="gaussian", calibration="sound", noise_multiplier=1.1, q=0.01, steps=500,
                      lot="poisson", n=6000, sensitivity=1.0)
    assert (info["sampling_rate"], info["steps"], info["accounting_noise_multiplier"]) == (0.01, 500, 1.1)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_event(info))
    direct = dp_accounting.rdp.RdpAccountant()
    direct.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 500)
    assert acc.get_epsilon(1e-5) == pytest.approx(direct.get_epsilon(1e-5), rel=1e-12)
    fixed = accounting(mechanism="gaussian", calibration="sound", noise_multiplier=1.1, q=0.01, steps=500,
                       lot="fixed", n=6000, sensitivity=1.0)
    assert fixed["accounting_noise_multiplier"] == pytest.approx(0.55) and fixed["neighbouring"] == "replace_one"
    rep = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    rep.compose(dp_event(fixed))
    assert np.isfinite(rep.get_epsilon(1e-5))


@pytest.mark.parametrize("mechanism,method", [("gaussian", "bookkeeping"), ("gaussian", "vmap"), ("wavelet", "auto")])
def test_empty_poisson_lots_still_get_noise(mechanism, method):
    # n = 10, q = 1e-4: every one of 3 lots is empty with probability 0.9999^30 = 99.7% (and this seed is
    # fixed), so the loss is undefined and the update is pure noise of std lr sigma C / (q n) per step
    model = _model("mlp")
    w = get_flat(model)
    new, loss, info = dp_sgd(model, w, _shard(SHAPES["mlp"], 10), 0.1, 3, 1e-4, 1.0, 1.0, mechanism,
                             torch.Generator().manual_seed(0), grad_method=method)
    assert np.isnan(loss) and info["steps"] == 3
    assert np.std(new - w) > 0.1


def test_per_layer_dp_sgd_and_determinism():
    model = _model("mlp")
    w = get_flat(model)
    shard = _shard(SHAPES["mlp"], 40)
    bounds = [0.5, 0.1, 0.5, 0.1]
    a = dp_sgd(model, w, shard, 0.1, 3, 0.2, 1.0, 1.0, "gaussian", torch.Generator().manual_seed(9), layer_bounds=bounds)
    b = dp_sgd(model, w, shard, 0.1, 3, 0.2, 1.0, 1.0, "gaussian", torch.Generator().manual_seed(9), layer_bounds=bounds)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[2]["sensitivity"] == pytest.approx(np.sqrt(0.52))
    wav = dp_sgd(model, w, shard, 0.1, 2, 0.2, 1.0, 1.0, "wavelet", torch.Generator().manual_seed(9),
                 layer_bounds=bounds, wavelet_scope="per_layer")
    assert np.all(np.isfinite(wav[0])) and wav[2]["wavelet_length"] == 16384 + 256 + 2048 + 16


@pytest.mark.parametrize("kwargs,match", [
    ({"q": 0.0}, "q"), ({"q": 1.5}, "q"), ({"mechanism": "laplace"}, "mechanism"), ({"clip": 0.0}, "clip"),
    ({"noise_multiplier": -1.0}, "noise_multiplier"), ({"lot": "shuffle"}, "lot"), ({"steps": -1}, "steps"),
    ({"calibration": "loose"}, "calibration"), ({"layer_bounds": [1.0]}, "layer_bounds"),
    ({"mechanism": "wavelet", "layer_bounds": [1.0] * 4}, "wavelet_scope"),
    ({"grad_method": "jit"}, "grad_method"),
])
def test_bad_inputs_name_the_parameter(kwargs, match):
    model = _model("mlp")
    args = dict(lr=0.1, steps=1, q=0.1, clip=1.0, noise_multiplier=1.0, mechanism="gaussian")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        dp_sgd(model, get_flat(model), _shard(SHAPES["mlp"], 10), generator=torch.Generator(), **args)
