"""DP-Adam and DP-AdaGrad (paper 002 Table III): the same clipped, noised lot gradient fed to another update rule.
The rules against torch.optim's, and the release (hence the epsilon) unchanged by the rule."""
import numpy as np
import pytest
import torch

from hfl.common import config, plans
from hfl.common.models import build, get_flat, init_parameters
from hfl.common.privacy import accountant as acct
from hfl.common.privacy import instructions, optimizers
from hfl.common.privacy.optimizers import OPTIMIZERS
from hfl.device_client.training import local_dp_sgd, make_shard


@pytest.mark.parametrize("name, reference", [("adam", lambda p, lr: torch.optim.Adam([p], lr=lr)),
                                             ("adagrad", lambda p, lr: torch.optim.Adagrad([p], lr=lr)),
                                             ("sgd", lambda p, lr: torch.optim.SGD([p], lr=lr))])
def test_rules_match_torch_optim(name, reference):
    gen = torch.Generator().manual_seed(3)
    start = torch.randn(200, generator=gen, dtype=torch.float64)
    lots = [torch.randn(200, generator=gen, dtype=torch.float64) * 5 for _ in range(6)]
    lot, lr = 4.0, 0.01
    theta = start.clone()
    rule = OPTIMIZERS.get(name)(theta)
    ref = start.clone().requires_grad_(False)
    opt = reference(ref, lr)
    for total in lots:
        rule.step(theta, total.clone(), lr, lot)  # the noisy lot sum; the rule divides by the lot size
        ref.grad = total / lot
        opt.step()
    np.testing.assert_allclose(theta.numpy(), ref.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_codes_round_trip_and_reject_unknown():
    for name in OPTIMIZERS.names():
        assert optimizers.from_code(optimizers.code(name)) == name
    with pytest.raises(ValueError):
        optimizers.from_code(7.0)
    with pytest.raises(KeyError):
        optimizers.code("rmsprop")


@pytest.fixture(scope="module")
def mlp_shard():
    model = build("mlp", (1, 28, 28), 10)
    init_parameters(model, torch.Generator().manual_seed(0))
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(30, 1, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, size=30)
    return model, get_flat(model), make_shard(x, y, mean=(0.5,), std=(0.25,))


@pytest.mark.parametrize("wavelet", [0, 1])
def test_the_release_and_its_epsilon_do_not_depend_on_the_rule(mlp_shard, wavelet):
    model, w0, shard = mlp_shard
    phase = {"lr": 0.01, "steps": 4, "q": 0.2, "clip": 1.0, "fixed": 0, "per_layer": 0}
    noise = instructions.parse(instructions.build("device-sample", "sample", "wavelet_gaussian" if wavelet else "gaussian",
                                                  1.1, 1.0))
    out = {}
    for name in ("sgd", "adam", "adagrad"):
        w, _, rec = local_dp_sgd(model, w0, shard, {**phase, "optimizer": optimizers.code(name)},
                                 noise, torch.Generator().manual_seed(5), "dev-00001", 2)
        out[name] = (w, rec)
    records = {name: rec for name, (_, rec) in out.items()}
    assert records["adam"] == records["sgd"] == records["adagrad"]  # post-processing: the same DP event
    eps = {name: acct.epsilon([rec], 1e-5) for name, rec in records.items()}
    assert eps["adam"] == eps["sgd"] == eps["adagrad"] > 0
    assert not np.array_equal(out["adam"][0], out["sgd"][0]) and not np.array_equal(out["adagrad"][0], out["sgd"][0])
    # the rules did act: one Adam (or AdaGrad) step moves a coordinate by lr |g| / (|g| + eps) <= lr (= lr but
    # where |g| is near eps)
    for name in ("adam", "adagrad"):
        w, _, _ = local_dp_sgd(model, w0, shard, {**phase, "steps": 1, "optimizer": optimizers.code(name)},
                               noise, torch.Generator().manual_seed(5), "dev-00001", 2)
        step = np.abs(w.astype(np.float64) - w0)
        assert np.all(step <= 0.01 * (1 + 1e-4)) and np.median(step) == pytest.approx(0.01, rel=1e-4)


def test_the_plan_carries_the_rule():
    cfg = config.load(None, ["run.algorithm=dp-sgd", "privacy.optimizer=adagrad"])
    phase = next(p for p in plans.build_plan(cfg) if p.kind == plans.LOCAL_DP_SGD)
    assert optimizers.from_code(phase.params["optimizer"]) == "adagrad"
    with pytest.raises(config.ConfigError, match=r"privacy\.optimizer"):
        config.load(None, ["run.algorithm=dp-fedavg", "privacy.trust=trusted", "privacy.optimizer=adam"])
