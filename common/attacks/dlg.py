"""Deep Leakage from Gradients (Zhu, Liu, Han, NeurIPS 2019) against one device's quantized update (paper 004,
Sec. 4 / Fig. 2b-c, Table I).

Victim (paper 004 Algorithm 1 with L = 1 local step on a single image): v = -eta grad l(w; x, y), l1-clipped to C,
then perturbed by the uplink mechanism (SQ-FL, DP-SQ, ...) into the target the eavesdropper sees.

Attacker (DLG): dummy image x~ ~ N(0, 1) and dummy label logits y~ ~ N(0, 1); loss l is cross-entropy against the
soft label softmax(y~) (DLG eq. 4 and its reference code), and L-BFGS (lr 1) minimises the gradient-matching
distance ||u(x~, y~) - target||^2 over (x~, y~). Paper 004 does not say how the attacker treats eta, clipping and
the quantizer (digest 004 P9); our reading: the attacker knows eta and C, applies the same l1 clipping to the dummy
update, and treats the quantizer as unknown noise. Distances are measured in gradient units (update / -eta) so
L-BFGS's absolute tolerances do not depend on eta.

An "iteration" is one L-BFGS step (up to `max_inner` function evaluations, torch's default 20, as in DLG's
reference loop). Reconstructions are scored by SSIM against the original (skimage, data_range = 1, pixels in [0, 1]).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from skimage.metrics import structural_similarity
from torch import nn

Perturbation = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def soft_cross_entropy(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """mean over the batch of -sum_k p_k log softmax(z)_k (DLG's cross_entropy_for_onehot)."""
    return torch.mean(torch.sum(-target_probs * F.log_softmax(logits, dim=-1), dim=-1))


def flat_gradient(model: nn.Module, x: torch.Tensor, label_probs: torch.Tensor, create_graph: bool = False
                  ) -> torch.Tensor:
    """grad_w l(w; x, p) flattened in parameter order."""
    loss = soft_cross_entropy(model(x), label_probs)
    grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=create_graph)
    return torch.cat([g.reshape(-1) for g in grads])


def l1_clip_factor(vec: torch.Tensor, clip: float | None) -> torch.Tensor:
    """min(1, C / ||v||_1) (paper 004, Algorithm 1 step 9); 1 when clip is None."""
    if clip is None:
        return torch.ones((), dtype=vec.dtype)
    return torch.clamp(clip / vec.abs().sum().clamp_min(1e-30), max=1.0)


def device_update(model: nn.Module, image: torch.Tensor, label: int, *, lr: float, clip: float | None) -> np.ndarray:
    """The victim's clipped update v^ = min(1, C/||v||_1) v with v = -eta grad l(w; x, y) (one SGD step, batch 1)."""
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    if clip is not None and not clip > 0:
        raise ValueError(f"clip must be > 0 or None (no clipping), got {clip!r}")
    num_classes = model.fc.out_features if hasattr(model, "fc") else int(model(image).shape[-1])
    onehot = F.one_hot(torch.tensor([int(label)]), num_classes).to(image.dtype)
    v = -lr * flat_gradient(model, image, onehot).detach()
    return (v * l1_clip_factor(v, clip)).numpy().astype(np.float64)


def identity(vec: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.asarray(vec, np.float64)


def codec_perturbation(codec_name: str, **params) -> Perturbation:
    """The uplink quantizer as a perturbation: hfl.common.quantization.roundtrip(codec_name, vec, rng, **params)."""
    from hfl.common.quantization import roundtrip

    def perturb(vec: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(roundtrip(codec_name, np.asarray(vec, np.float32), rng, **params), np.float64)

    perturb.__name__ = f"{codec_name}({', '.join(f'{k}={v}' for k, v in sorted(params.items()))})"
    return perturb


def perturbation_stats(exact: np.ndarray, perturbed: np.ndarray) -> dict[str, float]:
    """What the uplink mechanism did to the update, measured on this one draw: the empirical variance over
    coordinates of the error e = perturbed - exact (`quantization_variance`), its mean square and mean (a biased
    quantizer such as DP-SQ has E[e] != 0 per coordinate, digest 004 3.3), the update's own variance over
    coordinates, and ||e||^2 / ||exact||^2 (`error_to_signal`)."""
    exact = np.asarray(exact, np.float64).ravel()
    err = np.asarray(perturbed, np.float64).ravel() - exact
    if err.shape != exact.shape:
        raise ValueError(f"perturbed has {err.size} values, exact {exact.size}")
    energy = float(np.dot(exact, exact))
    return {"quantization_variance": float(err.var()), "quantization_mse": float(np.mean(err ** 2)),
            "quantization_bias": float(err.mean()), "update_variance": float(exact.var()),
            "error_to_signal": float(np.dot(err, err) / energy) if energy > 0 else math.inf}


def ssim(reconstruction: np.ndarray, original: np.ndarray) -> float:
    """SSIM of two (C, H, W) or (H, W) images in [0, 1] (reconstruction clipped to it), skimage defaults,
    data_range = 1 (digest 004 P9)."""
    a = np.clip(np.asarray(reconstruction, np.float64), 0, 1).squeeze()
    b = np.asarray(original, np.float64).squeeze()
    if a.shape != b.shape:
        raise ValueError(f"reconstruction shape {a.shape} differs from original {b.shape}")
    channel_axis = 0 if a.ndim == 3 else None
    side = min(a.shape[-2:])
    win = min(7, side if side % 2 else side - 1)
    return float(structural_similarity(a, b, data_range=1.0, channel_axis=channel_axis, win_size=win))


@dataclass
class DLGResult:
    """Reconstructions (pixels, unclipped) and SSIM at each recorded iteration, and the matching loss after each step."""
    iterations: list[int]
    images: list[np.ndarray]
    ssim: list[float]
    losses: list[float] = field(default_factory=list)
    label_guess: int = -1
    diverged_at: int | None = None  # first L-BFGS step whose loss was not finite (images then freeze)
    perturbation: dict[str, float] = field(default_factory=dict)  # perturbation_stats of the attacked target


def dlg_attack(model: nn.Module, target_update: np.ndarray, original: np.ndarray, *, lr: float, clip: float | None,
               record_at: Sequence[int] = (0, 20, 40), generator: torch.Generator, max_inner: int = 20
               ) -> DLGResult:
    """DLG (Zhu et al. 2019, Alg. 1) with L-BFGS (lr 1) on (dummy image, dummy label logits) against `target_update`
    (the eavesdropped, perturbed update). `original` (C, H, W) in [0, 1] is only used for SSIM. The dummy draws come
    from `generator` only."""
    record = sorted({int(i) for i in record_at})
    if not record or record[0] < 0:
        raise ValueError(f"record_at must be non-empty iteration numbers >= 0, got {record_at!r}")
    if max_inner < 1:
        raise ValueError(f"max_inner must be >= 1, got {max_inner!r}")
    for p in model.parameters():
        p.requires_grad_(True)
    shape = (1, *np.asarray(original).shape)
    num_classes = model.fc.out_features
    target = torch.as_tensor(np.asarray(target_update), dtype=torch.float32) / (-lr)
    dummy_x = torch.randn(shape, generator=generator).requires_grad_(True)
    dummy_y = torch.randn((1, num_classes), generator=generator).requires_grad_(True)
    optimizer = torch.optim.LBFGS([dummy_x, dummy_y], lr=1.0, max_iter=max_inner)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        g = flat_gradient(model, dummy_x, F.softmax(dummy_y, dim=-1), create_graph=True)
        # Same clipping as the victim, in gradient units: clip(-eta g) / -eta = g * min(1, C / (eta ||g||_1)).
        g = g * l1_clip_factor(lr * g, clip)
        distance = ((g - target) ** 2).sum()
        distance.backward()
        return distance

    result = DLGResult([], [], [], [])
    last_good = dummy_x.detach().clone()

    def snapshot(step: int) -> None:
        img = last_good[0].numpy().copy()
        result.iterations.append(step)
        result.images.append(img)
        result.ssim.append(ssim(img, original))

    for step in range(record[-1] + 1):
        if step in record:
            snapshot(step)
        if step == record[-1]:
            break
        if result.diverged_at is None:
            loss = float(optimizer.step(closure).detach())
            if math.isfinite(loss) and torch.isfinite(dummy_x).all():
                last_good = dummy_x.detach().clone()
                result.losses.append(loss)
            else:
                result.diverged_at = step + 1
    result.label_guess = int(torch.argmax(dummy_y.detach()))
    return result


def attack_under_mechanisms(model: nn.Module, image: np.ndarray, label: int, mechanisms: Mapping[str, Perturbation],
                            *, lr: float, clip: float | None, record_at: Sequence[int], seed_generator: Callable[[str], torch.Generator],
                            seed_rng: Callable[[str], np.random.Generator], max_inner: int = 20) -> dict[str, DLGResult]:
    """One victim update, perturbed by each mechanism with its own rng (seed_rng(name)), attacked by DLG from the
    dummy init of seed_generator(name). Pass a seed_generator that ignores the name to give every mechanism the same
    starting point."""
    x = torch.as_tensor(np.asarray(image, np.float32))[None]
    clean = device_update(model, x, label, lr=lr, clip=clip)
    out = {}
    for name, perturb in mechanisms.items():
        target = np.asarray(perturb(clean, seed_rng(name)), np.float64)
        if target.shape != clean.shape:
            raise ValueError(f"mechanism {name!r} returned shape {target.shape}, expected {clean.shape}")
        out[name] = dlg_attack(model, target, np.asarray(image, np.float64), lr=lr, clip=clip, record_at=record_at,
                               generator=seed_generator(name), max_inner=max_inner)
        out[name].perturbation = perturbation_stats(clean, target)
    return out
