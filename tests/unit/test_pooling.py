"""common/pooling.MaxPool2d against torch.nn.MaxPool2d: the same values, the same input gradients (so the same
indices: ties go to the first maximum in the window's scan order) and the same parameter gradients of every shipped
CNN, bit for bit."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hfl.common.models import build, init_parameters
from hfl.common.pooling import MaxPool2d


def _inputs():
    gen = torch.Generator().manual_seed(0)
    yield torch.randn(6, 5, 26, 26, generator=gen)                        # even sides
    yield torch.randn(4, 7, 11, 13, generator=gen)                        # odd sides: the last row and column dropped
    yield torch.randn(3, 4, 12, 12, generator=gen).relu()                 # ties at 0 (ReLU before the pool)
    yield torch.randint(-2, 3, (3, 4, 12, 12), generator=gen).float()     # ties at every value
    yield torch.full((2, 3, 8, 8), 1.5)                                   # one value everywhere
    x = torch.randn(2, 3, 8, 8, generator=gen)
    x[0, 0, 0, 1] = float("nan")
    x[1, 2, 5, 5] = float("-inf")
    yield x                                                               # NaN wins its window; -inf loses


@pytest.mark.parametrize("x", list(_inputs()), ids=lambda x: "x".join(map(str, x.shape)))
@pytest.mark.parametrize("args", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                  dict(kernel_size=2, ceil_mode=True)])
def test_values_and_gradients_equal_nn_maxpool2d(x, args):
    ours, theirs = MaxPool2d(**args), nn.MaxPool2d(**args)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = ours(a), theirs(b)
    assert torch.equal(ya.isnan(), yb.isnan()) and torch.equal(ya.nan_to_num(), yb.nan_to_num())
    assert ya.is_contiguous()
    grad = torch.randn(ya.shape, generator=torch.Generator().manual_seed(1))
    ya.backward(grad)
    yb.backward(grad)
    assert torch.equal(a.grad, b.grad)
    with torch.no_grad():  # the path without autograd (evaluation)
        assert torch.equal(ours(x).nan_to_num(), theirs(x).nan_to_num())


def test_double_backward_equals_nn_maxpool2d():
    """d(grad . v)/d(grad_output) through the pool, as a gradient-inversion attack differentiates a gradient."""
    x = torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(2))
    out = []
    for pool in (MaxPool2d(2), nn.MaxPool2d(2)):
        a = x.clone().requires_grad_(True)
        g = torch.ones(2, 3, 5, 5, requires_grad=True)
        (ga,) = torch.autograd.grad(pool(a), a, g, create_graph=True)
        (gg,) = torch.autograd.grad((ga * x).sum(), g)
        out.append(gg)
    assert torch.equal(*out)


def test_under_torch_func_transforms_it_takes_the_plain_path():
    """vmap over examples of 3-D or (unsqueezed) 4-D inputs, and grad of a loss through the pool."""
    x = torch.randn(4, 3, 9, 9, generator=torch.Generator().manual_seed(3))
    assert torch.equal(torch.func.vmap(MaxPool2d(2))(x), F.max_pool2d(x, 2))
    assert torch.equal(torch.func.vmap(lambda xi: MaxPool2d(2)(xi[None])[0])(x), F.max_pool2d(x, 2))
    g = torch.func.vmap(torch.func.grad(lambda xi: (MaxPool2d(2)(xi[None]) ** 2).sum()))(x)
    a = x.clone().requires_grad_(True)
    (F.max_pool2d(a, 2) ** 2).sum().backward()
    assert torch.equal(g, a.grad)


@pytest.mark.parametrize("name, shape", [("mnist-cnn", (1, 28, 28)), ("cifar-cnn", (3, 32, 32)),
                                         ("ota-cnn", (1, 28, 28))])
def test_every_cnn_gives_the_gradients_of_nn_maxpool2d(name, shape):
    model = build(name, shape, 10)
    assert sum(isinstance(m, MaxPool2d) for m in model.modules()) == 2
    init_parameters(model, torch.Generator().manual_seed(4))
    plain = build(name, shape, 10)
    plain.load_state_dict(model.state_dict())
    for i, m in enumerate(plain):
        if isinstance(m, MaxPool2d):
            plain[i] = nn.MaxPool2d(2)
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(16, *shape, generator=gen), torch.randint(0, 10, (16,), generator=gen)
    grads = []
    for net in (model, plain):
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()
        grads.append([p.grad for p in net.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
