"""Update rules fed the private lot gradient of DP-SGD, registered by name (privacy.optimizer).

DP-SGD releases g^_t = (sum of clipped per-example gradients + noise) / L once per lot; what the device does with it
is post-processing, so DP-Adam and DP-AdaGrad (paper 002 Table III) are the same release fed to another rule, and
the accounting is DP-SGD's. Each rule is a small object holding its moments, vectorised over the flat parameters:

    sgd:     theta -= lr g
    adam:    m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, theta -= lr m^ / (sqrt(v^) + eps), with the bias
             corrections m^ = m / (1 - b1^t), v^ = v / (1 - b2^t) (Kingma and Ba 2015, Alg. 1; torch.optim.Adam's
             defaults b1 = 0.9, b2 = 0.999, eps = 1e-8)
    adagrad: G += g^2, theta -= lr g / (sqrt(G) + eps) (Duchi et al. 2011; torch.optim.Adagrad's defaults: G_0 = 0,
             eps = 1e-10)

Torch is never imported here (the rules only call tensor methods): edges validate plans that name a rule.
Reading chosen here: a rule's state lives for one local phase (devices start each round from the global model and
keep nothing between rounds), so the moments restart with every local_dp_sgd phase.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hfl.common.registry import Registry

if TYPE_CHECKING:
    import torch

OPTIMIZERS: Registry = Registry("DP-SGD update rule")


class Sgd:
    def __init__(self, like: "torch.Tensor"):
        pass

    def step(self, theta: "torch.Tensor", total: "torch.Tensor", lr: float, lot: float = 1.0) -> None:
        """One update from the lot's noisy sum `total` (g = total / lot; `total` may be overwritten)."""
        theta.sub_(total, alpha=lr / lot)


class Adam(Sgd):
    def __init__(self, like: "torch.Tensor", betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.m, self.v = like.new_zeros(like.shape), like.new_zeros(like.shape)
        self.b1, self.b2, self.eps, self.t = betas[0], betas[1], eps, 0

    def step(self, theta, total, lr, lot=1.0):
        grad = total.div_(lot)
        self.t += 1
        self.m.mul_(self.b1).add_(grad, alpha=1 - self.b1)
        self.v.mul_(self.b2).addcmul_(grad, grad, value=1 - self.b2)
        denom = (self.v / (1 - self.b2 ** self.t)).sqrt_().add_(self.eps)
        theta.addcdiv_(self.m, denom, value=-lr / (1 - self.b1 ** self.t))


class Adagrad(Sgd):
    def __init__(self, like: "torch.Tensor", eps: float = 1e-10):
        self.sum, self.eps = like.new_zeros(like.shape), eps

    def step(self, theta, total, lr, lot=1.0):
        grad = total.div_(lot)
        self.sum.addcmul_(grad, grad)
        theta.addcdiv_(grad, self.sum.sqrt().add_(self.eps), value=-lr)


OPTIMIZERS.register("sgd", Sgd)
OPTIMIZERS.register("adam", Adam)
OPTIMIZERS.register("adagrad", Adagrad)


def code(name: str) -> float:
    """The rule as a plan parameter (a number): its index in the registry's sorted names."""
    OPTIMIZERS.get(name)
    return float(OPTIMIZERS.names().index(name))


def from_code(value: float) -> str:
    names = OPTIMIZERS.names()
    if value != int(value) or not 0 <= int(value) < len(names):
        raise ValueError(f"optimizer code must index {names}, got {value!r}")
    return names[int(value)]
