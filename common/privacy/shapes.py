"""Noise shapes a round plan can name (NoiseInstruction.shape): each is a registered noise stage of the pipeline
(stages.py) together with the mechanism its DP event records, the norm its sensitivity is measured in (what a tier
enforces with the instruction's clip) and the multiplier it really gives against that norm.

A new shape is a registration here or from a plugin: NOISE_SHAPES.register(stage_name, NoiseShape(...)), its stage
registered in VECTOR_STAGES first.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hfl.common.pipeline import VECTOR_STAGES
from hfl.common.registry import Registry

from . import stages  # registers the noise stages the shapes name
from .clipping import clip_l2
from .wavelet import WaveletLayout, effective_multiplier, wavelet_clip


@dataclass(frozen=True)
class NoiseShape:
    stage: str          # the VECTOR_STAGES noise stage that draws it
    mechanism: str      # what the DP event records (the accountant's mechanism)
    config: str         # the privacy.mechanism value that selects it
    std_param: str      # the stage's per-coordinate scale argument (std = z x sensitivity)

    def add(self, vec: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
        return VECTOR_STAGES.get(self.stage)(vec, rng, **{self.std_param: std})

    def clip(self, vec: np.ndarray, bound: float, calibration: str) -> tuple[np.ndarray, bool]:
        return clip_l2(vec, bound)

    def effective(self, z: float, dim: int, calibration: str) -> float:
        return z


@dataclass(frozen=True)
class FlatWaveletShape(NoiseShape):
    """Paper 002's wavelet noise over the whole vector (the flat scope): std z S / W_c on coefficient c, against the
    clip ||W (.) HWT(v)|| <= S (sound) or ||HWT(v)|| <= S (paper, where it gives z / max_c W_c: digest P1)."""

    def clip(self, vec, bound, calibration):
        return wavelet_clip(vec, bound, WaveletLayout([len(vec)]), calibration)

    def effective(self, z, dim, calibration):
        return effective_multiplier(z, WaveletLayout([dim]), calibration)


NOISE_SHAPES: Registry[NoiseShape] = Registry("noise shape")


def register(shape: NoiseShape) -> NoiseShape:
    if shape.stage not in VECTOR_STAGES:
        raise ValueError(f"noise shape {shape.stage!r} names no registered pipeline stage")
    stages.NOISE_STAGES.add(shape.stage)  # the pipeline's noise slots refuse it: only a plan's instruction records it
    return NOISE_SHAPES.register(shape.stage, shape)


register(NoiseShape("gaussian", "gaussian", "gaussian", "std"))
register(NoiseShape("laplace", "laplace", "laplace", "scale"))
register(FlatWaveletShape("wavelet_gaussian", "gaussian", "wavelet", "std"))


def for_mechanism(mechanism: str) -> NoiseShape:
    """The shape privacy.mechanism selects."""
    found = [NOISE_SHAPES.get(n) for n in NOISE_SHAPES if NOISE_SHAPES.get(n).config == mechanism]
    if not found:
        raise ValueError(f"privacy.mechanism {mechanism!r} selects no registered noise shape "
                         f"({', '.join(NOISE_SHAPES.get(n).config for n in NOISE_SHAPES)})")
    return found[0]
