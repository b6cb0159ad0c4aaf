"""The project's DP-SGD against Opacus' PrivacyEngine (the `bench` extra) on fixed batches: the same clipped sum of
per-example gradients, and the same weights after one full step with the noise off (issue 25). The Opacus side
is benchmarks/bench_dpsgd.py's, so the benchmark's own check is what is tested."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from hfl.common.models import get_flat
from hfl.common.privacy.dpsgd import dp_sgd
from hfl.common.privacy.per_example import _bookkeeping_layers, bookkeeping_clipped_sum

pytest.importorskip("opacus", reason="opacus is the optional `bench` extra (pip install -e '.[bench]'), not installed")

_spec = importlib.util.spec_from_file_location(
    "bench_dpsgd", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_dpsgd.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

# Opacus divides by norm + 1e-6 and the project shrinks clipped rows by 2^-16 (float32 norms stay <= C): the two
# clipped sums differ by ~1.6e-5 of their largest entry (measured); 1e-4 leaves room for summation order
RTOL = 1e-4
BATCH = 32


@pytest.mark.parametrize("name", ["linear", "mlp", "mnist-cnn"])
@pytest.mark.parametrize("clip", [0.05, 1.0, 100.0])
def test_clipped_sum_equals_opacus(name, clip):
    model, _, shard = bench._setup(name, BATCH)
    x, y = shard.batch(torch.arange(BATCH))
    params = {k: v.detach() for k, v in model.named_parameters()}
    ours, _, _ = bookkeeping_clipped_sum(model, params, x, y, torch.tensor([clip], dtype=torch.float64), False,
                                         _bookkeeping_layers(model))
    ref = bench.opacus_clipped_sum(model, x, y, clip, "hooks")
    assert ref.abs().max() > 0
    assert float((ours - ref).abs().max() / ref.abs().max()) < RTOL


@pytest.mark.parametrize("name", ["linear", "mlp"])
def test_clipped_sum_equals_opacus_ghost(name):
    model, _, shard = bench._setup(name, BATCH)
    x, y = shard.batch(torch.arange(BATCH))
    params = {k: v.detach() for k, v in model.named_parameters()}
    ours, _, _ = bookkeeping_clipped_sum(model, params, x, y, torch.tensor([1.0], dtype=torch.float64), False,
                                         _bookkeeping_layers(model))
    ref = bench.opacus_clipped_sum(model, x, y, 1.0, "ghost")
    assert float((ours - ref).abs().max() / ref.abs().max()) < RTOL


@pytest.mark.parametrize("name", ["linear", "mlp", "mnist-cnn"])
@pytest.mark.parametrize("grad_method", ["bookkeeping", "vmap"])
def test_full_step_equals_opacus_without_noise(name, grad_method):
    # the whole shard is the lot (q = 1, fixed lots): both take one step on the same 32 examples
    model, w, shard = bench._setup(name, BATCH)
    x, y = shard.batch(torch.arange(BATCH))
    lr, clip = 0.5, 0.1
    ref = bench.opacus_step(model, x, y, clip, lr).numpy()
    assert np.array_equal(get_flat(model), w)  # Opacus stepped a copy: dp_sgd starts from the same weights
    ours, _, _ = dp_sgd(model, w, shard, lr, 1, 1.0, clip, 0.0, "gaussian", torch.Generator().manual_seed(3),
                        lot="fixed", grad_method=grad_method)
    step = np.abs(ref - w).max()
    assert step > 1e-4  # the step moved the weights, so the comparison is not of w with itself
    assert np.abs(ours - ref).max() < RTOL * step
