"""Differential privacy placed by trust: clipping, noise, DP events, accountant, calibration, ledger.

Importing the package registers its pipeline stages (clip_l2, clip_l1, clip_per_layer, gaussian, laplace, wavelet_clip,
wavelet_gaussian) and the
fixed_denominator_sum aggregator. It stays light: no torch, and dp_accounting only in the modules that
need it (events' conversion, accountant, calibration, ledger), which edges never import.
"""
from . import stages  # noqa: F401  (registers the stages)
from .clipping import clip_l2, clip_per_layer, per_layer_sensitivity
from .noise import add_gaussian, add_laplace
from .trust import TRUSTED, UNTRUSTED, effective_trust, resolve_trust, sample_participants

__all__ = ["clip_l2", "clip_per_layer", "per_layer_sensitivity", "add_gaussian", "add_laplace",
           "TRUSTED", "UNTRUSTED", "effective_trust", "resolve_trust", "sample_participants"]
