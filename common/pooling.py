"""Max-pooling with the values and gradients of torch.nn.MaxPool2d, faster on CPU.

torch's CPU max_pool2d forward is ~10x slower on contiguous NCHW input than on a channels-last copy of it (6.7 ms
against 0.5 ms for [60, 32, 26, 26] on one thread, torch 2.13), while its backward is fast on NCHW and slow on
channels-last (benchmarks/bench_pooling.py). Both forward kernels scan a window in the same order with the same test
(`val > max or isnan(val)`, aten/src/ATen/native/cpu/MaxPoolKernel.cpp), so they return the same values and indices:
the forward here runs on a channels-last copy, the backward on NCHW with those indices (tests/unit/test_pooling.py
checks values and gradients equal bit for bit).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules.utils import _pair


# torch.func's wrapped tensors (grad, vmap) need an autograd.Function with a functorch rule; those take nn.MaxPool2d's
# path. Private API (torch 2.x): without it, every input does.
_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda x: True)


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last)


class _PoolFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, kernel_size, stride, padding, dilation, ceil_mode):
        y, indices = F.max_pool2d(_channels_last(x), kernel_size, stride, padding, dilation, ceil_mode,
                                  return_indices=True)
        indices = indices.contiguous()
        ctx.save_for_backward(x, indices)
        ctx.args = (_pair(kernel_size), _pair(stride), _pair(padding), _pair(dilation), ceil_mode)
        return y.contiguous()

    @staticmethod
    def backward(ctx, grad):
        x, indices = ctx.saved_tensors
        grad_x = torch.ops.aten.max_pool2d_with_indices_backward(grad.contiguous(), x, *ctx.args, indices)
        return grad_x, None, None, None, None, None


class MaxPool2d(nn.MaxPool2d):
    """nn.MaxPool2d (same arguments, values and gradients) whose forward runs on a channels-last copy on CPU. Inputs
    it does not speed up (not 4-D; not on the CPU; under torch.func's transforms; indices asked for) take
    nn.MaxPool2d's own path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.device.type != "cpu" or self.return_indices or _wrapped(x):
            return super().forward(x)
        stride = self.stride if self.stride is not None else self.kernel_size
        if not (torch.is_grad_enabled() and x.requires_grad):
            return F.max_pool2d(_channels_last(x), self.kernel_size, stride, self.padding, self.dilation,
                                self.ceil_mode).contiguous()
        return _PoolFunction.apply(x, self.kernel_size, stride, self.padding, self.dilation, self.ceil_mode)
