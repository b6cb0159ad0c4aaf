"""Model architectures, deterministic initialisation and flat-vector views of the parameters."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import nn

# torch is imported where it is used: the launcher validates model names (config choices) and starts the nodes
# without importing it (~2.5 s of CPU at every `hfl run`; the forkserver imports it once for every node).

MODELS: Registry = Registry("model")


@MODELS.register("linear")
def linear(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Softmax regression 784 -> 10 with bias, M = 7,850 (paper 000's M = 7,840 plus the bias)."""
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


@MODELS.register("linear-nobias")
def linear_nobias(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Paper 000's M = 7,840 exactly: 784 -> 10 without bias."""
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes, bias=False))


@MODELS.register("mlp")
def mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The 784-200-10 perceptron of paper 004 (input size follows the dataset)."""
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 200), nn.ReLU(), nn.Linear(200, num_classes))


@MODELS.register("mnist-cnn")
def mnist_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Small MNIST CNN: conv5x5(16) -> pool -> conv5x5(32) -> pool -> fc."""
    from torch import nn

    from .pooling import MaxPool2d

    c, h, w = input_shape
    return nn.Sequential(
        nn.Conv2d(c, 16, 5, padding=2), nn.ReLU(), MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * (h // 4) * (w // 4), num_classes),
    )


@MODELS.register("cifar-cnn")
def cifar_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Paper 001's CIFAR-10 CNN (and paper 003's): 3x3 convs 32, 32, 64, 64 with ReLU, same padding, 2x2 max-pool
    after each pair, fc 128, fc 10; d = 591,274 on 32x32x3, 467,818 on 28x28x1."""
    from torch import nn

    from .pooling import MaxPool2d

    c, h, w = input_shape
    return nn.Sequential(
        nn.Conv2d(c, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * (h // 4) * (w // 4), 128), nn.ReLU(), nn.Linear(128, num_classes),
    )


@MODELS.register("ota-cnn")
def ota_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Paper 003's MNIST CNN, valid padding: conv3x3(32) -> pool -> conv3x3(64) -> pool -> fc128 -> fc10;
    d = 225,034 on 28x28x1."""
    from torch import nn

    from .pooling import MaxPool2d

    c, h, w = input_shape
    side = lambda n: ((n - 2) // 2 - 2) // 2  # noqa: E731
    return nn.Sequential(
        nn.Conv2d(c, 32, 3), nn.ReLU(), MaxPool2d(2), nn.Conv2d(32, 64, 3), nn.ReLU(), MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * side(h) * side(w), 128), nn.ReLU(), nn.Linear(128, num_classes),
    )


def build(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return MODELS.get(name)(tuple(input_shape), num_classes)


def init_parameters(model: nn.Module, gen: torch.Generator) -> None:
    """PyTorch's default layer initialisation, drawn from an explicit generator (no global RNG)."""
    import torch
    from torch import nn

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=gen)
                if module.bias is not None:
                    fan_in = module.weight[0].numel()
                    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
                    nn.init.uniform_(module.bias, -bound, bound, generator=gen)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def get_flat(model: nn.Module) -> np.ndarray:
    import torch

    # .cpu() of a CPU tensor is the tensor itself: a model on the CPU gives the same bytes as before train.device
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu().numpy().astype(np.float32, copy=True)


def set_flat(model: nn.Module, vec: np.ndarray) -> None:
    """Copy `vec` into the parameters (torch's vector_to_parameters would alias the caller's array)."""
    import torch

    flat = torch.from_numpy(np.asarray(vec, dtype=np.float32))
    if flat.numel() != num_parameters(model):
        raise ValueError(f"vector of {flat.numel()} values for a model of {num_parameters(model)} parameters")
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def cuda_devices() -> int:
    """GPUs torch sees here (0: no CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def no_cuda(where: str = "on this machine") -> str:
    return (f'train.device = "cuda" but torch sees no CUDA GPU {where} (torch.cuda.is_available() is False): set '
            f'train.device = "auto" or "cpu"')


def torch_device(setting: str, index: int = 0) -> torch.device:
    """train.device on a device host: the CPU, or GPU `index` mod the GPUs visible (the hosts of a machine spread
    over its GPUs by their host index; under Ray each host sees the GPUs it reserved)."""
    import torch

    from .config_error import ConfigError

    gpus = cuda_devices() if setting in ("auto", "cuda") else 0
    if setting == "cuda" and not gpus:
        raise ConfigError(no_cuda())
    return torch.device("cuda", index % gpus) if gpus else torch.device("cpu")
