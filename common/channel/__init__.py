"""Wireless physics of the emulator as pure functions: MCP-H geometry, Rayleigh fading, truncated channel
inversion, over-the-air superposition with interference, MultiAirFed's receive factors, and the clock.
No torch here: edges import this package. The names below load on first use (the config sections import
this package in every process; scipy.spatial is only needed where a plane is drawn)."""
import importlib

_EXPORTS = {"Topology": ".geometry", "matern_cluster": ".geometry", "OtaParams": ".ota", "medium_slot": ".ota",
            "medium_broadcast": ".ota"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
