"""Round modes: how a round's uploads travel and where they meet (DESIGN: round modes).

A mode is chosen once, from the algorithm (`plans.Algorithm.mode`), and each tier builds its own object for it;
the services call that object at fixed points and never ask which mode runs. `digital` (device -> edge -> cloud
model deltas), `relay` (the edges forward every device upload unchanged to the cloud's fusion, paper 004) and `air`
(analog uploads through the cloud's wireless medium, paper 003) are registered here; a plugin adds a mode with
`MODES.register(name, Mode(...))` and its tier classes, no service edit.

Tier classes are named by import path ("package.module:Class") so that this module imports none of them.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from .registry import Registry

TIERS = ("cloud", "edge", "device")


@dataclass(frozen=True)
class Mode:
    name: str
    channel_models: tuple[str, ...]  # the channel.model values the mode runs on
    cloud: str | type                # "module:Class" or the class itself; built with the tier's ports
    edge: str | type
    device: str | type
    wire: str = ""                   # what travels, for the README's algorithm table

    def tier(self, which: str) -> type:
        if which not in TIERS:
            raise ValueError(f"tier {which!r}: one of {', '.join(TIERS)}")
        target = getattr(self, which)
        if isinstance(target, str):
            module, _, attr = target.partition(":")
            target = getattr(importlib.import_module(module), attr)
        return target


MODES: Registry[Mode] = Registry("round mode")

MODES.register("digital", Mode(
    "digital", ("ideal",), "hfl.cloud_server.modes:DigitalCloud", "hfl.edge_server.modes:DigitalEdge",
    "hfl.device_client.modes:DigitalDevice",
    "device -> edge -> cloud model deltas (or gradients), `pipeline.*_encoding`"))
MODES.register("relay", Mode(
    "relay", ("ideal",), "hfl.cloud_server.modes:RelayCloud", "hfl.edge_server.modes:RelayEdge",
    "hfl.device_client.modes:RelayDevice",
    "quantized device uploads, relayed unchanged by the edges to the cloud's fusion"))
MODES.register("air", Mode(
    "air", ("ota", "orthogonal"), "hfl.cloud_server.modes:AirCloud", "hfl.edge_server.modes:AirEdge",
    "hfl.device_client.modes:AirDevice",
    "analog model / gradient over the air (the cloud's medium), devices -> edge -> cloud"))


def mode_of(cfg) -> Mode:
    from .plans import ALGORITHMS

    return MODES.get(ALGORITHMS.get(cfg.run.algorithm).mode)


def build(cfg, which: str, ports):
    """The tier's object of the configured algorithm's mode."""
    return mode_of(cfg).tier(which)(ports)
