"""A device's round keeps the model it started from as its anchor without a copy (device_client/host.py, where 500
devices of a host wait their turn with a model each): sound only while nothing the round runs writes into a model
array. Every function it runs on one leaves its input as it was and hands back a new array."""
import numpy as np
import pytest
import torch

from hfl.common.channel import power
from hfl.common.models import build, get_flat, init_parameters
from hfl.common.privacy import instructions
from hfl.device_client.training import local_dp_sgd, local_sgd, make_shard, minibatch_gradient, smoothness


@pytest.fixture(scope="module")
def setup():
    model = build("mnist-cnn", (1, 28, 28), 10)
    init_parameters(model, torch.Generator().manual_seed(0))
    rng = np.random.default_rng(0)
    shard = make_shard(rng.integers(0, 256, (40, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 40), (0.5,), (0.25,))
    return model, get_flat(model), shard


def _runs(model, w, shard):
    gen = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    noise = instructions.parse(instructions.build("device-sample", "sample", "gaussian", 1.1, 1.0))
    dp_phase = {"lr": 0.05, "steps": 2, "q": 0.25, "clip": 1.0, "fixed": 0, "per_layer": 0}
    return {
        "local_sgd": lambda: local_sgd(model, w, shard, 0.05, 8, gen(), epochs=1)[0],
        "local_sgd clipped": lambda: local_sgd(model, w, shard, 0.05, 8, gen(), steps=3, clip=0.5)[0],
        "local_dp_sgd": lambda: local_dp_sgd(model, w, shard, dp_phase, noise, gen(), "dev-00000", 0)[0],
        "minibatch_gradient": lambda: minibatch_gradient(model, w, shard, 8, gen())[0],
        "smoothness": lambda: smoothness(model, w, w + np.float32(0.01), shard, 8, gen()),
        "air normalise": lambda: power.normalise(w[None, :])[0],
    }


@pytest.mark.parametrize("name", ["local_sgd", "local_sgd clipped", "local_dp_sgd", "minibatch_gradient", "smoothness",
                                  "air normalise"])
def test_a_rounds_functions_leave_the_model_they_start_from_unchanged(setup, name):
    model, w0, shard = setup
    w = w0.copy()
    out = _runs(model, w, shard)[name]()
    assert np.array_equal(w, w0)  # bitwise: the anchor a round keeps is still the model it started from
    if isinstance(out, np.ndarray):
        assert not np.shares_memory(out, w)
        assert not np.array_equal(out, w0)  # it did compute something from it


def test_a_hosts_devices_share_one_array_for_a_model_they_received_alike():
    """Trainer.shared: a model equal to one received before (any of the last 16) is that array; a different one, even
    with the same first values, is kept as it came; the host holds at most 16."""
    from hfl.device_client.host import Trainer

    trainer = Trainer(None, None)
    w = np.arange(1000, dtype=np.float32)
    first = trainer.shared(w.copy())
    assert trainer.shared(w.copy()) is first
    tail = w.copy()
    tail[-1] += 1  # the same first 64 values, another model
    assert trainer.shared(tail) is not first and trainer.shared(tail.copy()) is not first
    for i in range(20):
        trainer.shared(w + np.float32(i + 1))
    assert len(trainer.received) == 16 and trainer.shared(w.copy()) is not first  # pushed out: kept as it came
