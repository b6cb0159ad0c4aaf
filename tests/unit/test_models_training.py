import numpy as np
import pytest
import torch
from torch.nn import functional as F

from hfl.common.models import build, get_flat, init_parameters, num_parameters, set_flat
from hfl.common.seeding import numpy_rng, torch_generator
from hfl.device_client.training import clip_norm_, evaluate, local_sgd, make_shard, minibatch_gradient, smoothness


def test_parameter_counts_match_the_papers():
    assert num_parameters(build("mlp", (1, 28, 28), 10)) == 784 * 200 + 200 + 200 * 10 + 10
    cifar = build("cifar-cnn", (3, 32, 32), 10)
    convs = (3 * 9 * 32 + 32) + (32 * 9 * 32 + 32) + (32 * 9 * 64 + 64) + (64 * 9 * 64 + 64)
    assert num_parameters(cifar) == convs + (64 * 8 * 8 * 128 + 128) + (128 * 10 + 10)
    assert cifar(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert build("mnist-cnn", (1, 28, 28), 10)(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_init_is_seeded_and_flat_round_trips():
    a, b = build("mnist-cnn", (1, 28, 28), 10), build("mnist-cnn", (1, 28, 28), 10)
    init_parameters(a, torch_generator(7, "cloud", 0))
    init_parameters(b, torch_generator(7, "cloud", 0))
    assert np.array_equal(get_flat(a), get_flat(b))
    init_parameters(b, torch_generator(8, "cloud", 0))
    assert not np.array_equal(get_flat(a), get_flat(b))
    v = np.arange(num_parameters(a), dtype=np.float32)
    set_flat(a, v)
    assert np.array_equal(get_flat(a), v)


def shard(n=64):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (n, 1, 8, 8)).astype(np.uint8)
    y = rng.integers(0, 10, n)
    return make_shard(x, y, (0.5,), (0.25,))


def test_local_sgd_equals_a_plain_torch_loop():
    model = build("mlp", (1, 8, 8), 10)
    init_parameters(model, torch_generator(0, "cloud", 0))
    w0 = get_flat(model)
    s = shard()
    w1, loss, steps = local_sgd(model, w0, s, 0.1, 16, torch_generator(1, "device", 3), steps=5)
    ref = build("mlp", (1, 8, 8), 10)
    set_flat(ref, w0)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    gen = torch_generator(1, "device", 3)
    for _ in range(5):
        idx = torch.randperm(len(s), generator=gen)[:16]
        x, y = s.batch(idx)
        opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        opt.step()
    assert steps == 5 and np.isfinite(loss)
    assert np.allclose(w1, get_flat(ref), atol=1e-6)


def test_epochs_cover_the_shard_once_per_epoch():
    model = build("mlp", (1, 8, 8), 10)
    _, _, steps = local_sgd(model, get_flat(model), shard(50), 0.1, 16, torch_generator(0, "device", 0), epochs=2)
    assert steps == 2 * 4  # ceil(50 / 16) batches per epoch


def test_minibatch_gradient_matches_finite_difference():
    model = build("mlp", (1, 8, 8), 10).double().float()
    w = get_flat(model)
    s = shard(16)
    grad, loss = minibatch_gradient(model, w, s, 16, torch_generator(0, "device", 0))
    e = np.zeros_like(w)
    k = int(np.argmax(np.abs(grad)))
    e[k] = 1e-2
    acc_loss = lambda v: evaluate(model, v, s)[1]
    numeric = (acc_loss(w + e) - acc_loss(w - e)) / 2e-2
    assert abs(numeric - grad[k]) < 1e-2 * max(1.0, abs(grad[k]))


def test_seeded_streams_differ_by_purpose_and_repeat_by_key():
    assert numpy_rng(1, "device", 4, 2, "a").random() == numpy_rng(1, "device", 4, 2, "a").random()
    draws = {numpy_rng(1, t, n, r, p).random() for t in ("edge", "device") for n in (0, 1) for r in (0, 1) for p in ("a", "b")}
    assert len(draws) == 16


def test_smoothness_is_the_gradient_change_over_the_step_on_one_batch():
    model = build("mlp", (1, 8, 8), 10)
    w_a = get_flat(model)
    w_b = w_a + np.random.default_rng(1).standard_normal(w_a.size).astype(np.float32) * 0.05
    s = shard(64)
    g_a, _ = minibatch_gradient(model, w_a, s, 16, torch_generator(0, "device", 0, "beta"))  # the same batch: same generator
    g_b, _ = minibatch_gradient(model, w_b, s, 16, torch_generator(0, "device", 0, "beta"))
    expected = np.linalg.norm(g_b.astype(np.float64) - g_a) / np.linalg.norm(w_b.astype(np.float64) - w_a)
    assert smoothness(model, w_a, w_b, s, 16, torch_generator(0, "device", 0, "beta")) == pytest.approx(expected, rel=1e-5)
    assert smoothness(model, w_a, w_a, s, 16, torch_generator(0, "device", 0, "beta")) == 0.0


def reference_local_sgd(model, w, s, lr, batch, gen, steps, clip):
    """The loop local_sgd replaced: torch's clip_grad_norm_ and one add_ per parameter."""
    set_flat(model, w)
    params = list(model.parameters())
    for _ in range(steps):
        idx = torch.randperm(len(s), generator=gen)[:batch]
        x, y = s.batch(idx)
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-lr)
    return get_flat(model)


@pytest.mark.parametrize("name,clip", [("mlp", 0.0), ("mlp", 0.05), ("mlp", 100.0), ("linear", 1.0),
                                       ("mnist-cnn", 0.5)])
def test_local_sgd_is_bitwise_the_loop_with_torchs_clip(name, clip):
    rng = np.random.default_rng(3)
    s = make_shard(rng.integers(0, 256, (40, 1, 28, 28)).astype(np.uint8), rng.integers(0, 10, 40), (0.3,), (0.3,))
    model = build(name, (1, 28, 28), 10)
    init_parameters(model, torch_generator(0, "cloud", 0))
    w0 = get_flat(model)
    w1, _, steps = local_sgd(model, w0, s, 0.1, 8, torch_generator(2, "device", 1), steps=4, clip=clip)
    ref = reference_local_sgd(build(name, (1, 28, 28), 10), w0, s, 0.1, 8, torch_generator(2, "device", 1), 4, clip)
    assert steps == 4 and not np.array_equal(w1, w0)
    assert np.array_equal(w1, ref)


def test_clip_norm_is_bitwise_torchs_clip_grad_norm():
    gen = torch.Generator().manual_seed(5)
    for scale in (1e-3, 1.0, 1e3):
        grads = [torch.randn(shape, generator=gen) * scale for shape in ((200, 784), (200,), (10, 200), (10,))]
        ours = [torch.zeros_like(g, requires_grad=True) for g in grads]
        theirs = [torch.zeros_like(g, requires_grad=True) for g in grads]
        for a, b, g in zip(ours, theirs, grads):
            a.grad, b.grad = g.clone(), g.clone()
        clip_norm_(ours, 1.0)
        torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours, theirs))
        joint = torch.linalg.vector_norm(torch.cat([a.grad.reshape(-1) for a in ours]))
        assert float(joint) <= 1.0 + 1e-5 and (scale < 1 or float(joint) > 0.99)
