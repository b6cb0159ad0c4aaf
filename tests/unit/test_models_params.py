"""Parameter counts of the papers' models (issue 19): they set d in the latency and air-time models."""
import pytest
import torch

from hfl.common.models import MODELS, build, num_parameters


@pytest.mark.parametrize("name,shape,d", [
    ("linear", (1, 28, 28), 7_850),  # paper 000 (M = 7,840 + 10 biases)
    ("linear-nobias", (1, 28, 28), 7_840),  # paper 000's M as stated
    ("ota-cnn", (1, 28, 28), 225_034),  # paper 003, MNIST, valid padding
    ("cifar-cnn", (3, 32, 32), 591_274),  # paper 001, CIFAR-10, same padding
    ("cifar-cnn", (1, 28, 28), 467_818),  # paper 001's CNN on (F-)MNIST
    ("mlp", (1, 28, 28), 159_010),  # paper 004: 784-200-10
])
def test_parameter_counts_match_the_papers(name, shape, d):
    model = build(name, shape, 10)
    assert num_parameters(model) == d
    assert model(torch.zeros(2, *shape)).shape == (2, 10)


def test_registered():
    assert {"linear", "linear-nobias", "ota-cnn", "cifar-cnn", "mlp", "mnist-cnn"} <= set(MODELS.names())
