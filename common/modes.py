"""Round modes: how a round's uploads travel and where they meet (DESIGN: round modes).

A mode is chosen once, from the algorithm (`plans.Algorithm.mode`), and each tier builds its own object for it;
the services call that object at fixed points and never ask which mode runs. `digital` (device -> edge -> cloud
model deltas), `relay` (the edges forward every device upload unchanged to the cloud's fusion, paper 004) and `air`
(analog uploads through the cloud's wireless medium, paper 003) are registered here; each tier registers its own
class for a mode (`register_tier`, in the tier's modes module), so this module imports none of them. A plugin adds a
mode with `MODES.register(name, Mode(...))` and the tier classes that differ from the mode it is `like`; no service
edit.
"""
from __future__ import annotations

from dataclasses import dataclass

from .registry import Registry

TIERS = ("cloud", "edge", "device")


@dataclass(frozen=True)
class Mode:
    name: str
    channel_models: tuple[str, ...]  # the channel.model values the mode runs on
    wire: str = ""                   # what travels, for the README's algorithm table
    like: str = ""                   # a tier that registers no class of this mode's builds that mode's


MODES: Registry[Mode] = Registry("round mode")
TIER_CLASSES: dict[str, Registry[type]] = {t: Registry(f"{t} class of round mode") for t in TIERS}

MODES.register("digital", Mode(
    "digital", ("ideal",), "device -> edge -> cloud model deltas (or gradients), `pipeline.*_encoding`"))
MODES.register("relay", Mode(
    "relay", ("ideal",), "quantized device uploads, relayed unchanged by the edges to the cloud's fusion"))
MODES.register("air", Mode(
    "air", ("ota", "orthogonal"),
    "analog model / gradient over the air (the cloud's medium), devices -> edge -> cloud"))


def register_tier(tier: str, mode: str, cls: type | None = None):
    """Register `cls` as `tier`'s class of round mode `mode` (a decorator without `cls`)."""
    if tier not in TIERS:
        raise ValueError(f"tier {tier!r}: one of {', '.join(TIERS)}")
    return TIER_CLASSES[tier].register(mode, cls)


def tier_class(mode: Mode, tier: str) -> type:
    """`tier`'s class of `mode` (its tier module must be imported: the tier's own services import it)."""
    if tier not in TIERS:
        raise ValueError(f"tier {tier!r}: one of {', '.join(TIERS)}")
    classes = TIER_CLASSES[tier]
    return classes.get(mode.name if mode.name in classes or not mode.like else mode.like)


def mode_of(cfg) -> Mode:
    from .plans import ALGORITHMS

    return MODES.get(ALGORITHMS.get(cfg.run.algorithm).mode)


def build(cfg, which: str, ports):
    """The tier's object of the configured algorithm's mode."""
    return tier_class(mode_of(cfg), which)(ports)
